"""Pipeline schedules: the order of passes per rank (``schedules``), an event simulation of one step
(``simulate``), the closed-form bubbles and the fewest micro-batches under a bubble bound (``closed_form``),
and the terminal timeline (``render``)."""

from shardlab.pipeline.closed_form import bubble_fraction_closed_form, bubble_time_closed_form, min_microbatches
from shardlab.pipeline.schedules import SCHEDULES
from shardlab.pipeline.simulate import PipelineResult, simulate

__all__ = ["SCHEDULES", "PipelineResult", "simulate", "bubble_fraction_closed_form", "bubble_time_closed_form",
           "min_microbatches"]
