"""Measured step time of a run from the ranks' per-step records: each rank's whole step (compute + collectives +
waiting), the job's step and the slowest rank by one rule; shared by ``run train`` and ``run infer``.
Pure functions over the ranks' documents (no torch)."""

from __future__ import annotations

import statistics


STEP_TIME_DEFINITIONS = {
    "step_time_s": "per rank: time_split.step_s, its whole step (compute + collectives + wait)",
    "step_times_s": "per rank: each step's own time (forward, backward, optimizer), the wait at the step-end barrier "
                    "not included; steps 0 and 1 instrumented",
    "measured_median_s": "step_time: the median over ranks of step_time_s",
    "spread": "step_time: (largest - smallest) / median of the ranks' compute_s"}
"""What the step-time numbers of ``run train --json`` are, beside ``TIME_SPLIT_DEFINITIONS``."""


def injected_rank(observe) -> int | None:
    """The rank slowed with ``--slow-rank`` (``ObserveOptions.slow_rank``), or None."""
    slow = getattr(observe, "slow_rank", None)
    return slow.rank if slow is not None else None


def apply_time_split(ranks: list[dict], split: dict[int, dict], tokens_per_step: int) -> None:
    """Give each rank document its ``time_split`` (``observe.summary.rank_time_split``) and make its
    ``step_time_s`` the whole step, waits included (compute + collectives + wait), with ``tokens_per_s`` from it.
    A rank without records keeps the median of its own steps (waits at the step end not included) and no split."""
    for d in ranks:
        sp = split.get(d["rank"])
        d["time_split"] = sp
        if sp is not None:
            d["step_time_s"] = sp["step_s"]
            d["tokens_per_s"] = tokens_per_step / sp["step_s"] if sp["step_s"] > 0 else None


def measured_step_time(ranks: list[dict], split: dict[int, dict], injected: int | None) -> tuple[dict, dict | None]:
    """(the document's ``step_time`` measurements, the slowest rank).

    Over every rank of the job when the split has them (each node reads the whole job's records), else over this
    node's ranks: the median whole step, the job's step (the longest: synchronous ranks move at the slowest's pace),
    the slowest rank by the one rule (``observe.summary.slowest_rank``: the ``--slow-rank`` one, else the longest
    compute) and the spread of compute (slowest − fastest) / median. Without a split compute is not separated from
    waiting: the ranks' own step times stand in for it."""
    from shardlab.runtime.observe.summary import slowest_of_split, slowest_rank

    if split:
        times = {k: v["step_s"] for k, v in split.items()}
        compute = {k: v["compute_s"] for k, v in split.items()}
        slowest = slowest_of_split(split, injected)
    else:
        times = compute = {d["rank"]: d["step_time_s"] for d in ranks}
        slowest = slowest_rank(compute, injected)
    med, cmed = statistics.median(times.values()), statistics.median(compute.values())
    return {"measured_median_s": med, "job_step_s": max(times.values()),
            "slowest_rank": slowest["rank"], "slowest_rank_from": slowest["from"],
            "slowest_s": times[slowest["rank"]], "slowest_compute_s": slowest["compute_s"],
            "fastest_s": min(times.values()),
            "spread": (max(compute.values()) - min(compute.values())) / cmed if cmed else None,
            "spread_of": "compute" if split else "step"}, slowest
