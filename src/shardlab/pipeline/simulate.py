"""Event simulation of a pipeline schedule: when each rank runs which pass, the bubble and the memory peak.

Each rank runs its ops (``schedules.stage_orders``) in order; an op starts when the rank is free and its
input has arrived: F(vs, j) needs F(vs−1, j), B(vs, j) needs B(vs+1, j) (the last virtual stage needs its
own F), W(vs, j) needs B(vs, j); crossing to another rank adds ``p2p_s``. One pass over the ops with a
wake-up list (a rank blocked on an input is resumed when that input is produced) makes it O(ops):
p = 64, m = 1024 (131k passes) simulates in a fraction of a second.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

from shardlab.errors import ShardlabError, field_name
from shardlab.pipeline.schedules import KINDS, SCHEDULES, B, F, W, stage_orders


@dataclass(frozen=True)
class PipelineResult:
    """Outcome of one simulated pipeline step."""

    schedule: str
    """gpipe, 1f1b, interleaved or zb-h1."""
    stages: int
    """p: pipeline ranks."""
    microbatches: int
    """m: micro-batches per step."""
    vpp: int
    """v: model chunks per rank (interleaved), else 1."""
    step_time_s: float
    """When the last pass on any rank ends."""
    bubble_fraction: float
    """Share of the step the ranks sit idle, averaged over ranks: 1 − mean(busy) / step."""
    ideal_time_s: float
    """Busy time of the busiest rank (the step time with no bubble)."""
    busy_s: list[float]
    """Compute time of each rank."""
    peak_in_flight: list[int]
    """Per rank, the most (micro-batch, chunk) activation sets held at once (F done, B not yet)."""
    peak_in_flight_stage: list[float]
    """peak_in_flight / v: whole-stage equivalents (= ``memory.activations.in_flight``)."""
    peak_pending_w: list[int]
    """Per rank, the most weight-gradient passes postponed at once (zb-h1; their inputs stay in memory)."""
    durations_s: dict
    """Per-pass times used: forward, backward (B), weight_grad (W, 0 when merged into B), p2p, per chunk."""
    timeline: dict = field(repr=False, default_factory=dict)
    """Every pass as numpy arrays: stage, kind (0 F, 1 B, 2 W), microbatch, chunk, start_s, end_s."""
    notes: list[str] = field(default_factory=list)
    """Assumptions the numbers rest on."""

    @property
    def events(self) -> list[tuple]:
        """(stage, kind 'F'/'B'/'W', microbatch, chunk, start_s, end_s) for every pass, in rank order."""
        t = self.timeline
        kinds = [KINDS[k] for k in t["kind"].tolist()]
        return list(zip(t["stage"].tolist(), kinds, t["microbatch"].tolist(), t["chunk"].tolist(),
                        t["start_s"].tolist(), t["end_s"].tolist()))


def check_inputs(schedule: str, stages: int, microbatches: int, vpp: int) -> None:
    """Raise ShardlabError naming the fix for impossible schedule parameters."""
    if schedule not in SCHEDULES:
        raise ShardlabError(f"unknown schedule '{schedule}'; use one of {', '.join(SCHEDULES)}")
    for name, val in (("--stages", stages), (field_name("workload.microbatches"), microbatches),
                      (field_name("layout.vpp"), vpp)):
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise ShardlabError(f"{name} must be a positive whole number, got {val}")
    if schedule == "interleaved":
        if vpp < 2:
            raise ShardlabError(f"the interleaved schedule needs {field_name('layout.vpp')} 2 or more (model chunks "
                                "per rank)")
        if stages < 2:
            raise ShardlabError("the interleaved schedule needs --stages 2 or more")
        if microbatches < stages:
            raise ShardlabError(f"the interleaved schedule needs {field_name('workload.microbatches')} ≥ --stages "
                                f"({microbatches} < {stages}); "
                                f"use at least {stages} micro-batches")
        if microbatches % stages:
            raise ShardlabError(f"the interleaved schedule runs micro-batches in groups of --stages {stages}: "
                                f"use a multiple of {stages} (e.g. {microbatches + stages - microbatches % stages})")
    elif vpp != 1:
        raise ShardlabError(f"{field_name('layout.vpp')} applies to the interleaved schedule only (got "
                            f"{field_name('layout.schedule')} {schedule} {field_name('layout.vpp')} {vpp})")


def passes(schedule: str, stages: int, microbatches: int, vpp: int) -> int:
    """Passes in one step: every rank runs F and B (and W for zb-h1) for each micro-batch and chunk."""
    return stages * microbatches * vpp * (3 if schedule == "zb-h1" else 2)


def check_size(schedule: str, stages: int, microbatches: int, vpp: int, forward_s: float = 1.0,
               backward_s: float = 2.0, weight_grad_s: float | None = None) -> None:
    """Refuse a step too large to simulate quickly (``limits.MAX_PIPELINE_PASSES``), giving its closed form."""
    from shardlab.limits import MAX_PIPELINE_PASSES

    n = passes(schedule, stages, microbatches, vpp)
    if n <= MAX_PIPELINE_PASSES:
        return
    from shardlab.pipeline.closed_form import closed_form_text

    cf = closed_form_text(schedule, stages, microbatches, vpp, forward_s, backward_s, weight_grad_s)
    raise ShardlabError(f"p = {stages}, m = {microbatches}{f', v = {vpp}' if vpp > 1 else ''}: {n:,} passes to "
                        "simulate, "
                        f"over the limit of {MAX_PIPELINE_PASSES:,} (about half a second); the closed form gives "
                        f"bubble {cf}; simulate fewer stages or micro-batches")


def _slowdowns(stage_slowdown, p: int) -> list[float]:
    if stage_slowdown is None:
        return [1.0] * p
    if isinstance(stage_slowdown, dict):
        out = [1.0] * p
        for s, x in stage_slowdown.items():
            if not 0 <= s < p:
                raise ShardlabError(f"slow stage {s} is outside the pipeline (stages 0..{p - 1})")
            out[s] = float(x)
    else:
        out = [float(x) for x in stage_slowdown]
        if len(out) != p:
            raise ShardlabError(f"give one slowdown per stage ({p}), got {len(out)}")
    if any(not x > 0 for x in out):
        raise ShardlabError("a slowdown must be a positive factor (2 = twice as slow)")
    return out


def pass_times(schedule: str, forward_s: float, backward_s: float, weight_grad_s: float | None) -> tuple[float, float, float, str]:
    """(F, B, W, note): per-stage pass times. W is split off only for zb-h1; when ``weight_grad_s`` is None
    zb-h1 splits the backward in half (B = W, as Qi et al. 2024 assume); other schedules run B and W together."""
    for name, val in (("forward", forward_s), ("backward", backward_s)):
        if not val > 0:
            raise ShardlabError(f"the {name} time must be positive, got {val}")
    if weight_grad_s is not None and weight_grad_s < 0:
        raise ShardlabError(f"the weight-gradient time must be zero or more, got {weight_grad_s}")
    if schedule == "zb-h1":
        if weight_grad_s is None:
            return forward_s, backward_s / 2, backward_s / 2, (
                f"zb-h1: no weight-gradient time given (`shardlab pipeline --weight-grad-s`), the backward "
                f"{backward_s:.4g} s is split in half: input gradient B = weight gradient W = {backward_s / 2:.4g} s")
        return forward_s, backward_s, weight_grad_s, ""
    return forward_s, backward_s + (weight_grad_s or 0.0), 0.0, ""


def simulate(schedule: str, stages: int, microbatches: int, vpp: int = 1, forward_s: float = 1.0, backward_s: float = 2.0,
             weight_grad_s: float | None = None, p2p_s: float = 0.0, stage_slowdown=None) -> PipelineResult:
    """Simulate one step of ``schedule`` on ``stages`` ranks with ``microbatches`` micro-batches.

    forward_s / backward_s: one micro-batch's pass through one whole stage (all its chunks); ``backward_s``
    is the whole backward unless ``weight_grad_s`` is given, then it is the input-gradient pass B and
    ``weight_grad_s`` the weight-gradient pass W. p2p_s: time of one activation transfer between ranks.
    stage_slowdown: {stage: factor} or one factor per stage (a straggler runs every pass factor× slower).
    """
    check_inputs(schedule, stages, microbatches, vpp)
    check_size(schedule, stages, microbatches, vpp, forward_s, backward_s, weight_grad_s)
    if p2p_s < 0:
        raise ShardlabError(f"the p2p time must be zero or more, got {p2p_s}")
    p, m, v = stages, microbatches, vpp
    tf, tb, tw, note = pass_times(schedule, forward_s, backward_s, weight_grad_s)
    slow = _slowdowns(stage_slowdown, p)
    dur = [[tf / v * x, tb / v * x, tw / v * x] for x in slow]
    ops = _flatten(stage_orders(schedule, p, m, v), p)
    start = _run(ops, dur, p, m, v, p2p_s if p > 1 else 0.0)
    return _result(schedule, p, m, v, ops, start, dur, (tf, tb, tw, p2p_s), note)


def _flatten(orders: list, p: int) -> dict:
    """All ranks' ops as numpy arrays (rank order, then execution order) plus each rank's slice."""
    import numpy as np

    lengths = [len(o) for o in orders]
    n = sum(lengths)
    arr = np.fromiter(chain.from_iterable(chain.from_iterable(orders)), dtype=np.int64, count=3 * n).reshape(-1, 3)
    bounds = np.concatenate(([0], np.cumsum(lengths)))
    return {"kind": arr[:, 0], "vs": arr[:, 1], "mb": arr[:, 2], "stage": np.repeat(np.arange(p), lengths),
            "bounds": bounds.tolist()}


def _run(ops: dict, dur: list, p: int, m: int, v: int, hop: float):
    """Start time of every op. Dependencies are resolved to op ids with numpy first; the loop then only
    compares times: start = max(rank free, end of the input's producer + hop if it ran on another rank)."""
    import numpy as np

    kind, vs, mb, stage = ops["kind"], ops["vs"], ops["mb"], ops["stage"]
    n, V = len(kind), p * v
    opid = np.full((3, V * m), -1, dtype=np.int64)
    opid[kind, vs * m + mb] = np.arange(n)
    dep = np.full(n, -1, dtype=np.int64)
    f, b, w = kind == F, kind == B, kind == W
    fu = f & (vs > 0)
    dep[fu] = opid[F, (vs[fu] - 1) * m + mb[fu]]
    bd = b & (vs < V - 1)
    dep[bd] = opid[B, (vs[bd] + 1) * m + mb[bd]]
    bl = b & (vs == V - 1)
    dep[bl] = opid[F, vs[bl] * m + mb[bl]]
    dep[w] = opid[B, vs[w] * m + mb[w]]
    has = dep >= 0
    cross = np.zeros(n, dtype=bool)
    cross[has] = stage[dep[has]] != stage[has]
    waiter = np.full(n, -1, dtype=np.int64)            # rank whose op waits on this one across ranks
    waiter[dep[cross]] = stage[cross]
    durs = np.asarray(dur, dtype=float)[stage, kind].tolist()
    hops = np.where(cross, hop, 0.0).tolist()
    dep_l, waiter_l = dep.tolist(), waiter.tolist()
    bounds = ops["bounds"]
    end = [-1.0] * n
    start = [0.0] * n
    ptr, free, wait = bounds[:-1], [0.0] * p, [-1] * p
    stack = list(range(p - 1, -1, -1))
    while stack:
        r = stack.pop()
        i, stop, t = ptr[r], bounds[r + 1], free[r]
        while i < stop:
            d = dep_l[i]
            if d >= 0:
                e = end[d]
                if e < 0:
                    wait[r] = d
                    break
                e += hops[i]
                if e > t:
                    t = e
            start[i] = t
            t += durs[i]
            end[i] = t
            q = waiter_l[i]
            if q >= 0 and wait[q] == i:
                wait[q] = -1
                stack.append(q)
            i += 1
        ptr[r], free[r] = i, t
    if any(ptr[r] < bounds[r + 1] for r in range(p)):   # a schedule bug, not bad input
        raise RuntimeError(f"p={p} m={m} v={v}: the schedule deadlocked")
    return np.array(start)


def _result(schedule, p, m, v, ops, start, dur, times, note) -> PipelineResult:
    import numpy as np

    kind, vs, mb, stage = ops["kind"], ops["vs"], ops["mb"], ops["stage"]
    offsets = np.asarray(ops["bounds"][:-1])
    end = start + np.asarray(dur, dtype=float)[stage, kind]
    step = float(end.max())
    busy = np.add.reduceat(end - start, offsets)
    # activation sets held: +1 at F, −1 at B; each rank's deltas sum to 0, so one cumsum serves all ranks
    held = np.cumsum(np.where(kind == F, 1, np.where(kind == B, -1, 0)))
    peak = np.maximum.reduceat(held, offsets)
    pend = np.cumsum(np.where(kind == W, -1, np.where(kind == B, 1, 0))) if schedule == "zb-h1" else np.zeros_like(held)
    peak_w = np.maximum.reduceat(pend, offsets)
    bubble = 1.0 - float(busy.sum()) / p / step if step > 0 else 0.0
    tf, tb, tw, p2p = times
    notes = [note] if note else []
    if schedule != "zb-h1":
        notes.append("a backward pass is input gradient + weight gradient together (only zb-h1 splits them)")
    timeline = {"stage": stage, "kind": kind, "microbatch": mb, "chunk": vs // p, "start_s": start, "end_s": end}
    return PipelineResult(schedule, p, m, v, step, bubble, float(busy.max()), busy.tolist(), peak.tolist(),
                          [x / v for x in peak.tolist()], peak_w.tolist(),
                          {"forward_s": tf / v, "backward_s": tb / v, "weight_grad_s": tw / v, "p2p_s": p2p,
                           "per": "chunk" if v > 1 else "stage"}, timeline, notes)
