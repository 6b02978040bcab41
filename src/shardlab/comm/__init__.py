"""Communication models: the α–β cost of one collective (``collectives``), the collectives a training
layout issues per step (``inventory``), and tensor-parallel inference communication (``inference``).

Import the submodules directly; this package imports nothing heavy so that ``shardlab comm`` starts fast.
"""
