"""Capacity under latency targets (SLOs): the most Poisson traffic a serving layout carries while its time to first
token (TTFT) and time per output token (TPOT) meet their targets; the Pareto front of throughput per GPU against
speed per user; the fewest GPUs that serve a target rate.

Goodput, after DistServe (Zhong et al., OSDI 2024, arXiv 2401.09670 §2): the highest request rate a system serves
while meeting its latency SLOs, here counted as output tokens/s per GPU at that rate (rate × output tokens /
GPUs). The SLO holds for a statistic of the latencies:
- p50: the steady state's means (``serving.steady.fluid``) stand for the medians. Under Poisson arrivals at λ per
  replica the replica runs B sequences with B = λ·O·cycle(B) (Little's law), TPOT = cycle(B), and
  TTFT = overhead + P(busy)·k·cycle/2 + prefill + the M/D/1 wait ρ·t₁/(2(1−ρ)) for the prefill server
  (Pollaczek–Khinchine; ρ = λ·t₁). Both grow with λ; the largest λ meeting the targets is found for all layouts
  at once (``fluid_capacity``): a log-spaced grid up to the saturation rate brackets it, multisection narrows
  the bracket to 1e-4 of the rate.
- p99: the deterministic simulation gives percentiles (``serving.sim_capacity``: a few runs per layout pin its
  rate, and only the layouts that can still win are simulated).
Pure functions on prepared cases (``serving.case.ServeCase``) and their arrays (``serving.steady.Arrays``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardlab.serving.steady import Arrays, fluid, take

PERCENTILES = ("p50", "p99")
"""SLO statistics: p50 (the steady state's mean stands for the median) or p99 (simulated)."""
RATE_MODE = 2
"""``steady.MODES`` index of Poisson arrivals."""
GRID_POINTS = 24
"""Log-spaced rates per layout that first bracket its capacity (1e-4 × saturation … saturation)."""
SECTION_POINTS = 15
"""Rates tried inside the bracket per narrowing round (each round shrinks it 16×)."""
REL_TOL = 1e-4
"""The p50 capacity's precision, relative to the rate."""
SWEEP_LEVELS = 13
"""Load levels per layout on the Pareto sweep (log-spaced by √2, 1/64 of its capacity up to it)."""
GPU_COUNT_CAP = 1024
"""Where the target search's multiples of a node stop (powers of two go on to the bound)."""


@dataclass(frozen=True)
class Slo:
    """Latency targets and the statistic they hold for."""

    ttft_s: float | None
    """Time to first token target, seconds (None: no target)."""
    tpot_s: float | None
    """Time per output token target, seconds (None: no target)."""
    percentile: str = "p50"
    """'p50' (steady-state means) or 'p99' (simulated)."""

    def ratios(self, ttft_s, tpot_s) -> tuple[np.ndarray, np.ndarray]:
        """Measured / target for TTFT and TPOT (0 where there is no target; inf where the latency is)."""
        z = np.zeros(np.shape(ttft_s))
        with np.errstate(invalid="ignore"):
            rt = z if self.ttft_s is None else np.asarray(ttft_s, dtype=float) / self.ttft_s
            rp = z if self.tpot_s is None else np.asarray(tpot_s, dtype=float) / self.tpot_s
        return np.nan_to_num(rt, nan=np.inf), np.nan_to_num(rp, nan=np.inf)


@dataclass(frozen=True)
class FluidCapacity:
    """Per case (arrays over the cases): the largest Poisson rate whose steady-state means meet the SLO."""

    request_rate_per_replica: np.ndarray
    """Requests/s one replica serves within the targets (0: not at any load tried)."""
    saturation_rate_per_replica: np.ndarray
    """Requests/s one replica completes with its most sequences in flight (arrivals beyond it queue without bound)."""
    binds: np.ndarray
    """What stops the rate: 'ttft', 'tpot' (the target just above it) or 'saturation' (the replica is full)."""
    at_capacity: dict
    """``steady.fluid`` at the capacity (at the lightest rate tried where the capacity is 0)."""


@dataclass(frozen=True)
class Sweep:
    """Steady-state points of every layout from light load up to its capacity (flat arrays, one entry a point)."""

    case: np.ndarray
    """Index of the point's case."""
    request_rate_per_replica: np.ndarray
    """Poisson arrivals per replica, requests/s."""
    in_flight_per_replica: np.ndarray
    """Sequences the replica runs (mean)."""
    ttft_s: np.ndarray
    """Mean time to first token."""
    tpot_s: np.ndarray
    """Mean time per output token."""
    e2e_s: np.ndarray
    """Mean request latency."""
    tokens_per_s_per_gpu: np.ndarray
    """Output tokens/s of a replica over its GPUs."""
    tokens_per_s_per_user: np.ndarray
    """1 / mean TPOT: the speed one request sees while it decodes."""


def _rates(a: Arrays, idx: np.ndarray, rates: np.ndarray) -> dict:
    """``steady.fluid`` of cases ``idx`` under Poisson arrivals ``rates`` (req/s per replica)."""
    return fluid(take(a, idx), np.full(len(idx), RATE_MODE), rates)


def _meets(res: dict, slo: Slo) -> np.ndarray:
    ok = ~np.asarray(res["overloaded"], dtype=bool)
    if slo.ttft_s is not None:
        ok &= res["ttft_s"] <= slo.ttft_s
    if slo.tpot_s is not None:
        ok &= res["tpot_s"] <= slo.tpot_s
    return ok


def _first_miss(ok: np.ndarray) -> np.ndarray:
    """Per row, the column of the first False (the row's length when none)."""
    return np.where(ok.all(axis=1), ok.shape[1], np.argmin(ok, axis=1))


def saturation_rates(a: Arrays) -> np.ndarray:
    """Requests/s each replica completes with its most sequences in flight (the rate ``fluid`` calls overloaded
    beyond), as ``serving.limits`` computes it."""
    n = len(np.atleast_1d(a.S))
    return fluid(a, np.full(n, RATE_MODE), np.full(n, 1e12))["requests_per_s"]


def fluid_capacity(a: Arrays, slo: Slo) -> FluidCapacity:
    """The largest Poisson rate per replica whose steady-state TTFT and TPOT meet ``slo`` (its means), for every case
    at once: rates at ``GRID_POINTS`` log-spaced fractions of the saturation rate bracket it (the last rate meeting
    the targets before the first that misses), and rounds of ``SECTION_POINTS`` evenly spaced rates narrow the
    bracket to ``REL_TOL``. The rate returned met the targets; the bracket's upper end missed them."""
    n = len(np.atleast_1d(a.S))
    sat = saturation_rates(a)
    top = sat * (1 - 1e-6)
    grid = np.geomspace(1e-4, 1.0, GRID_POINTS)
    rates = top[:, None] * grid[None, :]
    ok = _meets(_rates(a, np.repeat(np.arange(n), GRID_POINTS), rates.ravel()), slo).reshape(n, GRID_POINTS)
    miss = _first_miss(ok)
    rows = np.arange(n)
    lo = np.where(miss > 0, rates[rows, np.maximum(miss - 1, 0)], 0.0)
    hi = np.where(miss < GRID_POINTS, rates[rows, np.minimum(miss, GRID_POINTS - 1)], top)
    live = (miss > 0) & (miss < GRID_POINTS)
    frac = np.arange(1, SECTION_POINTS + 1) / (SECTION_POINTS + 1)
    for _ in range(8):
        act = np.nonzero(live & (hi - lo > REL_TOL * hi))[0]
        if not act.size:
            break
        r = lo[act, None] + (hi - lo)[act, None] * frac[None, :]
        ok = _meets(_rates(a, np.repeat(act, SECTION_POINTS), r.ravel()), slo).reshape(len(act), SECTION_POINTS)
        m, i = _first_miss(ok), np.arange(len(act))
        lo[act] = np.where(m > 0, r[i, np.maximum(m - 1, 0)], lo[act])
        hi[act] = np.where(m < SECTION_POINTS, r[i, np.minimum(m, SECTION_POINTS - 1)], hi[act])
    at_hi = _rates(a, rows, hi)
    rt, rp = slo.ratios(np.where(at_hi["overloaded"], np.inf, at_hi["ttft_s"]), at_hi["tpot_s"])
    binds = np.where(miss >= GRID_POINTS, "saturation", np.where(rt >= rp, "ttft", "tpot"))
    at = _rates(a, rows, np.where(lo > 0, lo, top * grid[0]))
    return FluidCapacity(lo, sat, binds, at)


def sweep(a: Arrays, rate_per_replica: np.ndarray, gpus_per_replica: np.ndarray, levels: int = SWEEP_LEVELS) -> Sweep:
    """Steady state of each case at ``levels`` log-spaced loads from 1/64 of ``rate_per_replica`` up to it (cases
    with a rate of 0 give no points)."""
    idx = np.nonzero(np.asarray(rate_per_replica) > 0)[0]
    frac = np.geomspace(1 / 64, 1.0, levels)
    case = np.repeat(idx, levels)
    rate = (np.asarray(rate_per_replica, dtype=float)[idx, None] * frac[None, :]).ravel()
    if not case.size:
        e = np.zeros(0)
        return Sweep(case, e, e, e, e, e, e, e)
    res = _rates(a, case, rate)
    g = np.asarray(gpus_per_replica, dtype=float)[case]
    return Sweep(case, rate, res["in_flight"], res["ttft_s"], res["tpot_s"], res["e2e_s"],
                 res["output_tokens_per_s"] / g, 1.0 / res["tpot_s"])


def pareto_front(x: np.ndarray, y: np.ndarray, rel_tol: float = 0.0) -> np.ndarray:
    """Indices of the points no other point beats on both x and y (more is better on both), by x descending.
    ``rel_tol`` > 0 also drops a point whose y is within that share of a point with more x (near-copies: layouts
    whose curves differ only in a max-num-seqs cap that does not bind)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep, best = [], -np.inf
    for i in np.lexsort((-y, -x)):
        if y[i] > best * (1 + rel_tol) if best > 0 else y[i] > best:
            keep.append(int(i))
            best = y[i]
    return np.array(keep, dtype=int)


def gpu_counts(bound: int, gpus_per_node: int, cap: int = GPU_COUNT_CAP) -> list[int]:
    """GPU counts the target search tries, ascending: powers of two up to ``bound``, multiples of a node up to
    min(bound, ``cap``), and ``bound`` itself."""
    powers = {1 << k for k in range(bound.bit_length()) if 1 << k <= bound}
    nodes = set(range(gpus_per_node, min(bound, cap) + 1, gpus_per_node)) if gpus_per_node > 0 else set()
    return sorted(powers | nodes | {bound})


def fewest_between(rate: float, short: int, serves: int, gpus_per_node: int, gpus_per_replica: np.ndarray,
                   rate_per_replica: np.ndarray) -> tuple[int, int]:
    """(fewest GPUs, the whole-node count before it or ``short``) between ``short`` GPUs, which serve less than
    ``rate`` requests/s, and ``serves``, which serve it: whole nodes only, each count's layouts those of ``serves``
    whose replica size divides it (``serve_space._candidates``), c / g replicas of g GPUs at the rate per replica
    found at ``serves`` (a replica's capacity under the SLO does not depend on how many run beside it: Poisson
    arrivals split evenly). ``gpu_counts`` doubles beyond ``GPU_COUNT_CAP``; this fills the gap between doublings
    without preparing a layout per count."""
    counts = np.arange((short // gpus_per_node + 1) * gpus_per_node, serves, gpus_per_node, dtype=np.int64)
    if not len(counts) or not len(gpus_per_replica):
        return serves, short
    g = np.asarray(gpus_per_replica, dtype=np.int64)
    fits = counts[:, None] % g[None, :] == 0
    total = np.where(fits, (counts[:, None] // g[None, :]) * np.asarray(rate_per_replica, dtype=float)[None, :], 0.0)
    ok = np.flatnonzero(total.max(axis=1) >= rate)
    if not len(ok):
        return serves, short
    return int(counts[ok[0]]), int(counts[ok[0] - 1]) if ok[0] > 0 else short
