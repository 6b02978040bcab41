"""The order in which each pipeline rank runs its passes, for every schedule.

An op is ``(kind, virtual_stage, microbatch)`` with kind F (forward), B (backward; the input-gradient part
when W is split off) or W (weight gradient). With v model chunks per rank (interleaved), chunk c of rank r is
virtual stage c·p + r (Megatron-LM), so a micro-batch visits ranks 0..p−1 v times.

- GPipe (Huang et al. 2019, arXiv 1811.06965): all m forwards, then all m backwards (last in, first out).
- 1F1B / PipeDream-Flush (Narayanan et al. 2021, arXiv 2104.04473 §2.2): rank i runs min(p−i−1, m) warm-up
  forwards, then alternates one forward and one backward, then drains the remaining backwards.
- Interleaved 1F1B (Narayanan et al. 2021 §2.2; Megatron-LM ``forward_backward_pipelining_with_interleaving``):
  forwards in groups of p micro-batches, chunk by chunk; warm-up 2(p−i−1) + (v−1)·p passes (capped at m·v);
  backwards visit the chunks in reverse order.
- ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", arXiv 2401.10241 §3.1): 1F1B's forward/backward
  order with the weight-gradient passes W split off; rank i postpones i of them (the last rank p−1 of them)
  and runs one W after every cool-down B, so the W passes fill the drain bubble while at most p − i
  micro-batches hold full activations, as in 1F1B.
"""

from __future__ import annotations

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")
F, B, W = 0, 1, 2
KINDS = "FBW"


def gpipe(p: int, m: int, r: int) -> list[tuple[int, int, int]]:
    return [(F, r, j) for j in range(m)] + [(B, r, j) for j in reversed(range(m))]


def one_f_one_b(p: int, m: int, r: int) -> list[tuple[int, int, int]]:
    w = min(p - r - 1, m)
    ops = [(F, r, j) for j in range(w)]
    for k in range(m - w):
        ops += [(F, r, w + k), (B, r, k)]
    ops += [(B, r, k) for k in range(m - w, m)]
    return ops


def zb_h1(p: int, m: int, r: int) -> list[tuple[int, int, int]]:
    w = min(p - r - 1, m)
    ops = [(F, r, j) for j in range(w)]
    pending: list[int] = []
    for k in range(m - w):
        ops += [(F, r, w + k), (B, r, k)]
        pending.append(k)
        if len(pending) > r:          # rank r keeps r weight-gradient passes postponed
            ops.append((W, r, pending.pop(0)))
    for k in range(m - w, m):
        ops.append((B, r, k))
        pending.append(k)
        ops.append((W, r, pending.pop(0)))
    ops += [(W, r, k) for k in pending]
    return ops


def interleaved_sequences(p: int, m: int, v: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The k-th forward and k-th backward pass of any rank as (chunk, microbatch), Megatron-LM's order:
    micro-batches in groups of p, each group through chunk 0, 1, ..., v−1 (backward: v−1, ..., 0)."""
    fwd = [(c, g + j) for g in range(0, m, p) for c in range(v) for j in range(min(p, m - g))]
    bwd = [(v - 1 - c, j) for c, j in fwd]
    return fwd, bwd


def interleaved(p: int, m: int, r: int, v: int, seqs=None) -> list[tuple[int, int, int]]:
    """Megatron-LM's interleaved order for rank ``r`` (m a multiple of p)."""
    fwd, bwd = seqs or interleaved_sequences(p, m, v)
    total = m * v
    warm = min(2 * (p - r - 1) + (v - 1) * p, total)
    ops = [(F, c * p + r, j) for c, j in fwd[:warm]]
    for (cf, jf), (cb, jb) in zip(fwd[warm:], bwd):
        ops.append((F, cf * p + r, jf))
        ops.append((B, cb * p + r, jb))
    ops += [(B, c * p + r, j) for c, j in bwd[total - warm:]]
    return ops


def stage_orders(schedule: str, p: int, m: int, v: int = 1) -> list[list[tuple[int, int, int]]]:
    """Per rank, the ops in execution order."""
    if schedule == "gpipe":
        return [gpipe(p, m, r) for r in range(p)]
    if schedule == "1f1b":
        return [one_f_one_b(p, m, r) for r in range(p)]
    if schedule == "zb-h1":
        return [zb_h1(p, m, r) for r in range(p)]
    seqs = interleaved_sequences(p, m, v)
    return [interleaved(p, m, r, v, seqs) for r in range(p)]
