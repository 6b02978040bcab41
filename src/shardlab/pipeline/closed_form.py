"""Closed forms of the pipeline bubble, and the inverse question (fewest micro-batches under a bound).

Bubble as a share of the whole step (formulas.md "Pipeline schedules"), uniform stages, no p2p time:
- GPipe and 1F1B: the pipeline fills and drains once, (p−1)(F+B) of idle time per rank next to m(F+B) of
  work, so bubble = (p−1)/(m+p−1) (Huang et al. 2019; Narayanan et al. 2021 §2.2 give (p−1)/m of the ideal
  time; as a share of the step it is (p−1)/(m+p−1)).
- Interleaved with v chunks per rank: the fill/drain shrinks to (p−1)(F+B)/v, so bubble = (p−1)/(v·m+p−1)
  (Narayanan et al. 2021 §2.2: (1/v)(p−1)/m of the ideal time).
- ZB-H1 (Qi et al. 2024, arXiv 2401.10241 §3.1): the postponed weight-gradient passes fill the drain, leaving
  (p−1)(F + B − W) of idle time for m ≥ p (input-gradient pass B, weight-gradient pass W). With F = B = W this
  is a third of 1F1B's (p−1)(F+B+W). Our extension (derived for this schedule and checked against the
  simulation): each of the first min(m, p) − 1 postponed W passes fills min(B, W) of the drain, so
  idle = (p−1)(F+B) − (min(m, p) − 1)·min(B, W); for m ≥ p and W ≤ B it is the paper's form, with W > B the
  drain is covered and (p−1)F remains.
"""

from __future__ import annotations

import math

from shardlab.errors import ShardlabError
from shardlab.pipeline.simulate import check_inputs, pass_times


def bubble_time_closed_form(schedule: str, p: int, m: int, v: int = 1, forward_s: float = 1.0, backward_s: float = 2.0,
                            weight_grad_s: float | None = None) -> tuple[float, float]:
    """(idle time per rank, work per rank) of one step, in the units of the pass times."""
    f, b, w = pass_times(schedule, forward_s, backward_s, weight_grad_s)[:3]
    work = m * (f + b + w)
    if schedule in ("gpipe", "1f1b"):
        return (p - 1) * (f + b + w), work
    if schedule == "interleaved":
        return (p - 1) * (f + b + w) / v, work
    if schedule == "zb-h1":
        return (p - 1) * (f + b) - (min(m, p) - 1) * min(b, w), work
    raise ShardlabError(f"unknown schedule '{schedule}'")


def bubble_fraction_closed_form(schedule: str, p: int, m: int, v: int = 1, forward_s: float = 1.0, backward_s: float = 2.0,
                                weight_grad_s: float | None = None) -> float:
    """Bubble as a share of the step: idle / (work + idle), see the module doc for each schedule."""
    idle, work = bubble_time_closed_form(schedule, p, m, v, forward_s, backward_s, weight_grad_s)
    return idle / (work + idle)


def min_microbatches(schedule: str, p: int, max_bubble: float, v: int = 1, *, forward_s: float = 1.0,
                     backward_s: float = 2.0, weight_grad_s: float | None = None) -> int:
    """Fewest micro-batches m whose closed-form bubble is at most ``max_bubble`` (a share of the step).

    1F1B/GPipe: (p−1)/(m+p−1) ≤ x  ⇔  m ≥ (p−1)(1−x)/x (p = 8, x = 0.10 → 63). Interleaved needs m to be a
    multiple of p.
    """
    from shardlab.limits import MAX_MICROBATCHES

    if not 0 < max_bubble < 1:
        raise ShardlabError(f"--max-bubble must be a share between 0 and 1 (e.g. 0.10), got {max_bubble}")
    if p == 1:
        return 1
    idle1, work1 = bubble_time_closed_form(schedule, p, 1, v, forward_s, backward_s, weight_grad_s)
    # idle / (m·work1 + idle) ≤ x  ⇔  m ≥ idle (1 − x) / (x · work1)
    need = idle1 * (1 - max_bubble) / (max_bubble * work1)
    if not need <= MAX_MICROBATCHES:
        raise ShardlabError(f"--max-bubble {max_bubble:g} needs about {need:.3g} micro-batches (closed form), over the "
                            f"limit of {MAX_MICROBATCHES:,}; allow a larger bubble")
    step = p if schedule == "interleaved" else 1
    floor = p if schedule == "interleaved" else 1
    ok = lambda k: bubble_fraction_closed_form(schedule, p, k * step, v, forward_s, backward_s,  # noqa: E731
                                               weight_grad_s) <= max_bubble + 1e-12
    # the bubble share falls as m grows; the m = 1 idle time is only a first guess (ZB-H1 idles (p−1)(F+B) at
    # m = 1 but (p−1)(F+B−W) once m ≥ p), so bisect for the smallest multiple of `step` that meets the bound
    lo, hi = floor // step, max(floor // step, -(-max(1, math.ceil(need - 1e-9)) // step))
    while not ok(hi):
        lo, hi = hi, 2 * hi
        if hi * step > MAX_MICROBATCHES:
            raise ShardlabError(f"--max-bubble {max_bubble:g} needs more than {MAX_MICROBATCHES:,} micro-batches "
                                f"(closed form); allow a larger bubble")
    if ok(lo):
        hi = lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    m = hi * step
    check_inputs(schedule, p, m, v)
    return m


def closed_form_text(schedule: str, p: int, m: int, v: int = 1, forward_s: float = 1.0, backward_s: float = 2.0,
                     weight_grad_s: float | None = None) -> str:
    """The closed form with the numbers in it and its source, e.g. '(p−1)/(m+p−1) = 7/39 = 17.9% (...)'."""
    frac = bubble_fraction_closed_form(schedule, p, m, v, forward_s, backward_s, weight_grad_s)
    if schedule in ("gpipe", "1f1b"):
        return f"(p−1)/(m+p−1) = {p - 1}/{m + p - 1} = {100 * frac:.2f}% (Narayanan et al. 2021 §2.2, as a share of the step)"
    if schedule == "interleaved":
        return (f"(p−1)/(v·m+p−1) = {p - 1}/{v * m + p - 1} = {100 * frac:.2f}% "
                f"(interleaved, Narayanan et al. 2021 §2.2, as a share of the step)")
    f, b, w = pass_times(schedule, forward_s, backward_s, weight_grad_s)[:3]
    idle, work = bubble_time_closed_form(schedule, p, m, v, forward_s, backward_s, weight_grad_s)
    return (f"idle (p−1)(F+B) − (min(m,p)−1)·min(B,W) = {idle:.4g} against work m(F+B+W) = {work:.4g}: "
            f"{100 * frac:.2f}% (ZB-H1, Qi et al. 2024 §3.1: (p−1)(F+B−W) for m ≥ p; exact when F = B)")
