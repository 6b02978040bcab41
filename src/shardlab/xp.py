"""Scalar-or-array arithmetic without importing numpy for scalars.

The memory formulas serve two callers: ``shardlab memory`` (plain Python numbers, must answer fast) and
the planner (numpy arrays over thousands of layouts). These helpers use numpy only when handed arrays,
so the scalar path never pays numpy's import time.
"""

from __future__ import annotations


def is_array(*xs) -> bool:
    """True when any argument is a numpy array (duck-typed: has shape and dtype)."""
    return any(hasattr(x, "shape") and hasattr(x, "dtype") for x in xs)


def where(cond, a, b):
    """numpy.where for arrays, a conditional expression for scalars."""
    if is_array(cond, a, b):
        import numpy as np

        return np.where(cond, a, b)
    return a if cond else b


def minimum(a, b):
    if is_array(a, b):
        import numpy as np

        return np.minimum(a, b)
    return min(a, b)


def maximum(a, b):
    if is_array(a, b):
        import numpy as np

        return np.maximum(a, b)
    return max(a, b)
