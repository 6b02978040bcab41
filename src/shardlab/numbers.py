"""The one number parser behind every numeric flag and every number read from a user's text.

``parse_number`` turns text ('8', '1e3', '0.25', '1_000') into an int or a float and refuses, with the
flag's name and the fix: text that is not a number, NaN and ±infinity, values that overflow a float
(1e400), values past the flag's upper bound (``shardlab.limits``), a fraction where a whole number is
needed, values that round to zero, and negative or zero values where they mean nothing.
``check_number`` applies the same rules to a value already parsed (a YAML field, a computed count).
"""

from __future__ import annotations

import math
import re

from shardlab.errors import ShardlabError

_NUMBER_RE = re.compile(r"^[+-]?(\d[\d_]*\.?[\d_]*|\.\d[\d_]*)([eE][+-]?\d+)?$", re.ASCII)   # digits 0-9 only (int() also reads other scripts' digits)


def _fmt(v: float | int) -> str:
    if isinstance(v, int) and abs(v) < 10**15:
        return f"{v:,}"
    if isinstance(v, int) and v.bit_length() > 1000:          # beyond any float: say how many digits, never overflow
        return f"{'-' if v < 0 else ''}a {len(str(abs(v))) if v.bit_length() < 14000 else 'more than 4,000'}-digit number"
    f = float(v)
    if 1e4 <= abs(f) < 1e15:                                  # 604,800 and 604,800.5, not 6.048e+05
        return f"{int(f):,}" if f.is_integer() else f"{f:,.7g}"
    return f"{f:.4g}"


SMALLEST = 1e-12
"""The smallest positive value any quantity may take: below it (5e-324, 1e-300) a number means nothing and
dividing by it overflows. Quantities with a larger floor pass their own ``smallest``."""


def check_number(value, what: str, *, integer: bool = False, minimum: float = 0.0, allow_min: bool = False,
                 maximum: float | None = None, reason: str = "", smallest: float = SMALLEST) -> int | float:
    """Return ``value`` when it is a finite number (a whole one with ``integer``) above ``minimum`` (or equal,
    with ``allow_min``), at most ``maximum``, and not a positive value below ``smallest``; else raise a
    ShardlabError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "a whole number" if integer else "a number"
        raise ShardlabError(f"{what} must be {kind}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ShardlabError(f"{what} must be a finite number, got {value}")
    if integer and isinstance(value, float):
        raise ShardlabError(f"{what} must be a whole number, got {value!r}")
    if value < minimum or (value == minimum and not allow_min):
        if minimum == 0:
            bound = "zero or more" if allow_min else ("a positive whole number" if integer else "a positive number")
        else:
            bound = f"{'at least' if allow_min else 'more than'} {_fmt(minimum)}"
        raise ShardlabError(f"{what} must be {bound}, got {_fmt(value)}")
    if 0 < value < smallest:
        zero = "0 or " if allow_min and minimum == 0 else ""
        raise ShardlabError(f"{what} {value:.3g} is too small to mean anything (below {smallest:g}); use {zero}a larger value")
    if maximum is not None and value > maximum:
        raise ShardlabError(f"{what} {_fmt(value)} is above the limit of {_fmt(maximum)}"
                            f"{' (' + reason + ')' if reason else ''}; use a smaller value")
    return value


def parse_number(text, what: str, *, integer: bool = False, minimum: float = 0.0, allow_min: bool = False,
                 maximum: float | None = None, reason: str = "", scale: float = 1.0,
                 round_to_int: bool = False, smallest: float = SMALLEST) -> int | float:
    """Parse ``text`` as a number (times ``scale``, for unit suffixes handled by the caller) and check it
    like ``check_number``. With ``integer``, a fraction is refused, or rounded with ``round_to_int`` (counts
    such as '7.5B' parameters); a value that rounds to zero is refused either way."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        raw = text
    else:
        s = str(text).strip()
        low = s.lower().lstrip("+-")
        if low in ("nan", "inf", "infinity"):
            raise ShardlabError(f"{what} must be a finite number, got '{text}'")
        if not _NUMBER_RE.match(s) or "__" in s or s.endswith("_"):
            kind = "a whole number" if integer else "a number"
            raise ShardlabError(f"{what} '{text}' is not {kind} ({'e.g. 8 or 1e3' if integer else 'e.g. 8, 1e3 or 0.25'})")
        if integer and scale == 1.0 and re.fullmatch(r"[+-]?\d[\d_]*", s, re.ASCII):
            raw = int(s)                              # exact, any size; the bound below refuses huge ones
        else:
            raw = float(s)
            if not math.isfinite(raw):
                raise ShardlabError(f"{what} '{text}' is too large to be a number (overflows); use a smaller value")
    value = raw * scale if scale != 1.0 else raw
    if isinstance(value, float) and not math.isfinite(value):
        raise ShardlabError(f"{what} '{text}' is too large (overflows); use a smaller value")
    if integer and isinstance(value, float):
        if round_to_int and math.isfinite(value) and abs(value) < 2**63:
            rounded = round(value)                    # '7.5B' → 7,500,000,000
            if rounded == 0 and value > 0:
                raise ShardlabError(f"{what} '{text}' rounds to zero; give a whole number of at least 1")
            value = rounded
        elif value.is_integer():
            value = int(value)                        # '1e3' → 1000
    return check_number(value, what, integer=integer, minimum=minimum, allow_min=allow_min, maximum=maximum,
                        reason=reason, smallest=smallest)


def finite(value: float, what: str) -> float:
    """``value`` when finite; a ShardlabError naming ``what`` otherwise (for numbers computed from input)."""
    if not math.isfinite(value):
        raise ShardlabError(f"{what} comes out as {value} (too large to compute); use smaller inputs")
    return value
