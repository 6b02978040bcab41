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
- p99: the deterministic simulation (``serving.simulate``, fixed seed) gives percentiles; a few runs per layout
  pin its rate (``simulated_capacity``: from the p50 capacity down to a passing rate, then geometric
  bisection to 5%). Only the layouts that can still win are simulated (``refine``: branch and bound on
  the p50 capacity, an upper bound here since the search never goes above it).
Pure functions on prepared cases (``serving.case.ServeCase``) and their arrays (``serving.steady.Arrays``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shardlab.errors import ShardlabError
from shardlab.serving.case import ServeCase
from shardlab.serving.sim_measure import SimResult
from shardlab.serving.simulate import simulate
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
SIM_REL_TOL = 0.05
"""The p99 capacity's precision, relative to the rate (a p99 of a few hundred requests is no finer)."""
SIM_BUDGET = 24
"""Simulations one p99 plan may run in all (a run is 0.1-1 s)."""
SIM_MAX_RUNS = 6
"""Simulations one layout's p99 search may run."""
SIM_REQUESTS = 300
"""Requests per simulation of the p99 search, at most (up to a third each of warm-up and drain are not measured)."""
SIM_MIN_REQUESTS = 100
"""... at least."""
SIM_RUN_CYCLES = 20_000
"""Cycles one run aims at (``sim_requests`` takes fewer requests when the replica runs few sequences at once)."""
SIM_CYCLE_BUDGET = 150_000
"""Simulated cycles one p99 plan may spend in all (about 15 s at 0.1 ms a cycle; the benchmark's takes 15,000)."""
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
class SimCapacity:
    """One layout's capacity under a simulated percentile: a bracket [request_rate_per_replica, missed_rate)."""

    request_rate_per_replica: float
    """The largest simulated rate whose percentile met the targets, requests/s per replica (0: none met them)."""
    missed_rate_per_replica: float
    """The smallest simulated rate whose percentile missed them (inf: none missed; the search's upper bound, the
    p50 capacity, met them)."""
    settled: bool
    """The bracket is within the search's tolerance (or the upper bound met the targets): the rate is the capacity.
    False: the search stopped early (its run budget, or it could not beat a better layout), so only the bracket
    is known."""
    binds: str | None
    """'ttft' or 'tpot': the target missed at missed_rate; None when nothing missed."""
    sim: SimResult | None
    """The simulation at request_rate_per_replica (None when no rate met the targets)."""
    runs: int
    """Simulations run."""
    cycles: int = 0
    """Scheduling cycles those runs simulated (their cost: about 0.1 ms each)."""


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


def _sim_ratio(sim: SimResult | None, slo: Slo) -> tuple[float, float]:
    """(TTFT, TPOT) percentile / target of a run (inf for a run that measured nothing or stopped at its bound)."""
    if sim is None or sim.truncated:
        return math.inf, math.inf
    q = slo.percentile
    rt, rp = slo.ratios(getattr(sim.ttft_s, q), getattr(sim.tpot_s, q))
    return float(rt), float(rp)


def sim_requests(rate: float, lifetime_s: float, output_len: int, most: int = SIM_REQUESTS) -> int:
    """Requests for one run at ``rate`` per replica: ``most``, fewer when the replica runs few sequences at once (a run
    takes about requests × output tokens / sequences in flight cycles; in flight ≈ rate × lifetime, Little's law),
    so that a run stays near ``SIM_RUN_CYCLES`` cycles; at least ``SIM_MIN_REQUESTS``."""
    in_flight = max(rate * lifetime_s, 1.0)
    return int(min(most, max(SIM_MIN_REQUESTS, SIM_RUN_CYCLES * in_flight / max(output_len, 1))))


def _run(case: ServeCase, slo: Slo, rate: float, requests: int, seed: int, lifetime_s: float,
         max_cycles: int = 60000):
    """(percentile / target, 'ttft' or 'tpot' for the worse of the two, the run or None, cycles) of one simulation."""
    n = sim_requests(rate, lifetime_s, case.output_len, requests)
    try:
        sim = simulate(case, arrival_rate=rate, requests=n, seed=seed, lifetime_s=lifetime_s, max_cycles=max_cycles,
                       warm_start=True)
    except ShardlabError:
        sim = None
    rt, rp = _sim_ratio(sim, slo)
    return max(rt, rp), ("ttft" if rt >= rp else "tpot"), sim, (sim.cycles if sim else SIM_RUN_CYCLES)


def simulated_capacity(case: ServeCase, slo: Slo, upper_rate: float, *, lifetime_s: float = 0.0,
                       requests: int = SIM_REQUESTS, seed: int = 0, rel_tol: float = SIM_REL_TOL,
                       max_runs: int = SIM_MAX_RUNS, max_cycles: int = SIM_CYCLE_BUDGET,
                       upper_missed: tuple[float, str] | None = None, floor_rate: float = 0.0,
                       run_cycles: int = 60000, sizer=None) -> SimCapacity:
    """The largest Poisson rate per replica (at most ``upper_rate``) whose simulated ``slo.percentile`` of TTFT and
    TPOT meet the targets. Runs at ``upper_rate`` (``upper_missed`` = (ratio, target) when that run is already known
    to have missed); when it misses by a ratio q (percentile / target), tries upper / q² (within a quarter and 0.9 of
    it), halving on until a run meets the targets (down to 1/64 of ``upper_rate``: then 0), and bisects the bracket
    geometrically until it is within ``rel_tol`` or ``max_runs`` runs (or ``max_cycles`` simulated cycles) are
    spent; ``run_cycles`` bounds one run (``simulate``'s max_cycles); ``sizer``(rate) -> (requests, run_cycles) sizes
    each run for its rate instead. ``floor_rate`` > 0: only a rate above it matters (a better layout serves that much): the first try below
    the upper bound is the floor, and a miss there ends the search. Every run uses the same seed, so the arrivals are one pattern scaled in time (common
    random numbers) and the result is deterministic; a percentile of a few hundred requests is noisy, so the rate
    is only as good as ``rel_tol`` and that noise."""
    runs = cycles = 0

    def run(rate: float):
        nonlocal runs, cycles
        runs += 1
        n, mc = sizer(rate) if sizer else (requests, run_cycles)
        q, why, sim, c = _run(case, slo, rate, n, seed, lifetime_s, mc)
        cycles += c
        return q, why, sim

    def spent() -> bool:
        return runs >= max_runs or cycles >= max_cycles

    if upper_rate <= 0:
        return SimCapacity(0.0, math.inf, True, None, None, 0)
    if upper_missed is None:
        q, miss, sim = run(upper_rate)
        if q <= 1:
            return SimCapacity(upper_rate, math.inf, True, None, sim, runs, cycles)
    else:
        q, miss = upper_missed
    hi = upper_rate
    if floor_rate > 0:
        lo = floor_rate
    else:
        lo = upper_rate * min(0.9, max(0.25, 1 / q**2)) if math.isfinite(q) else upper_rate / 2
    while True:
        if spent():
            return SimCapacity(0.0, hi, False, miss, None, runs, cycles)
        q, why, sim_lo = run(lo)
        if q <= 1:
            break
        hi, miss = lo, why
        if floor_rate > 0 or lo <= upper_rate / 64:
            return SimCapacity(0.0, hi, floor_rate <= 0, miss, None, runs, cycles)
        lo /= 2
    while hi / lo - 1 > rel_tol and not spent():
        mid = math.sqrt(lo * hi)
        q, why, sim = run(mid)
        if q <= 1:
            lo, sim_lo = mid, sim
        else:
            hi, miss = mid, why
    return SimCapacity(lo, hi, hi / lo - 1 <= rel_tol, miss, sim_lo, runs, cycles)


def refine(cases: list[ServeCase], cap: FluidCapacity, gpus_per_replica: np.ndarray, slo: Slo, *,
           seed: int = 0, requests: int = SIM_REQUESTS, must: tuple[int, ...] = (), max_runs: int = SIM_BUDGET,
           max_cycles: int = SIM_CYCLE_BUDGET, must_runs: int = 3,
           known: dict[int, SimCapacity] | None = None) -> tuple[dict[int, SimCapacity], bool]:
    """Simulated capacities of the layouts that can have the most goodput per GPU, by branch and bound. A layout's
    p50 capacity bounds its simulated one (the search starts there), so its goodput bound is that rate × output
    tokens / GPUs. (1) In bound order, one run at each layout's upper bound until a layout meets the targets there:
    its capacity is settled, and its goodput the best so far. (2) Each layout that missed, while its bound beats the
    best: one run at the rate that would tie the best; a miss drops it (its capacity is below), a pass searches
    above it and raises the best. Then the layouts in ``must`` (e.g. those on the p50 Pareto front) get at most
    ``must_runs`` runs each. ``known`` results are reused; at most ``max_runs`` simulations and about ``max_cycles``
    simulated cycles in all. Returns (results by case position, stopped at that budget)."""
    out = dict(known or {})
    O = np.array([c.output_len for c in cases], dtype=float)
    upper = cap.request_rate_per_replica
    bound = upper * O / gpus_per_replica
    spent, cycles, cut = 0, 0, False
    missed: dict[int, tuple[float, str]] = {}

    def life(i: int) -> float:
        v = float(cap.at_capacity["e2e_s"][i])
        return v if math.isfinite(v) else 0.0

    def goodput(i: int) -> float:                          # a rate that met the targets: a lower bound
        return out[i].request_rate_per_replica * O[i] / gpus_per_replica[i]

    best = max([goodput(i) for i in out] + [0.0])
    order = [int(i) for i in np.argsort(-bound, kind="stable") if bound[i] > 0]
    for i in order:                                           # (1) screen at the upper bounds
        if bound[i] <= best or spent >= max_runs or cycles >= max_cycles:
            cut = cut or bound[i] > best
            break
        if i in out:
            continue
        q, miss, sim, c = _run(cases[i], slo, float(upper[i]), requests, seed, life(i))
        spent, cycles = spent + 1, cycles + c
        if q <= 1:
            out[i] = SimCapacity(float(upper[i]), math.inf, True, None, sim, 1, c)
            best = max(best, goodput(i))
            break
        missed[i] = (q, miss)
    for i in order:                                           # (2) those that missed, while they can beat the best
        if i not in missed or bound[i] <= best:
            continue
        if spent >= max_runs or cycles >= max_cycles:
            cut = True
            break
        floor = best * gpus_per_replica[i] / O[i] * (1 + 1e-9)
        r = simulated_capacity(cases[i], slo, float(upper[i]), lifetime_s=life(i), requests=requests, seed=seed,
                               max_runs=min(SIM_MAX_RUNS - 1, max_runs - spent), max_cycles=max_cycles - cycles,
                               upper_missed=missed[i], floor_rate=floor)
        out[i] = r
        spent, cycles = spent + r.runs, cycles + r.cycles
        best = max(best, goodput(i))
    for i in must:                                            # the front's layouts: a few runs each
        if i in out and (out[i].settled or out[i].request_rate_per_replica > 0):
            continue
        if spent >= max_runs or cycles >= max_cycles:
            cut = True
            break
        top, known_miss = float(upper[i]), missed.get(i)
        if i in out and out[i].missed_rate_per_replica < top:    # dropped in (2): it missed at that rate
            top = out[i].missed_rate_per_replica
            known_miss = (known_miss[0] if known_miss else 2.0, out[i].binds or "ttft")
        r = simulated_capacity(cases[i], slo, top, lifetime_s=life(i), requests=requests, seed=seed,
                               max_runs=min(must_runs - (known_miss is not None), max_runs - spent),
                               max_cycles=max_cycles - cycles, upper_missed=known_miss)
        out[i] = r
        spent, cycles = spent + r.runs, cycles + r.cycles
    return out, cut


def gpu_counts(bound: int, gpus_per_node: int, cap: int = GPU_COUNT_CAP) -> list[int]:
    """GPU counts the target search tries, ascending: powers of two up to ``bound``, multiples of a node up to
    min(bound, ``cap``), and ``bound`` itself."""
    powers = {1 << k for k in range(bound.bit_length()) if 1 << k <= bound}
    nodes = set(range(gpus_per_node, min(bound, cap) + 1, gpus_per_node)) if gpus_per_node > 0 else set()
    return sorted(powers | nodes | {bound})
