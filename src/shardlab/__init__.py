"""shardlab: will this model fit, how should it be split, how fast will it run, what will it cost.

The analytic core (specs, layout, memory, comm, pipeline, estimate, planner, cost) is pure Python and
never imports torch; ``shardlab.runtime`` holds the torch.distributed execution layer.
"""

__version__ = "0.1.0"
