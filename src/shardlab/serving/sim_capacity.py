"""Capacity under a simulated percentile (p99): the largest Poisson rate per replica whose simulated TTFT and TPOT
percentiles meet their targets (``serving.capacity`` has the p50 search and the SLO types).

The deterministic simulation (``serving.simulate``, fixed seed) gives percentiles; a few runs per layout pin its
rate (``simulated_capacity``: from the p50 capacity down to a passing rate, then regula falsi on the measured
ratios to 5%). Only the layouts that can still win are simulated (``refine``: branch and bound, best first, on the
p50 capacity, an upper bound here since the search never goes above it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shardlab.errors import ShardlabError
from shardlab.serving.capacity import FluidCapacity, Slo
from shardlab.serving.case import ServeCase
from shardlab.serving.sim_measure import SimResult
from shardlab.serving.simulate import simulate

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
"""Simulated cycles one p99 plan may spend in all (about 15 s at 0.1 ms a cycle; the benchmark's takes about 23,000)."""


@dataclass(frozen=True)
class SimCapacity:
    """One layout's capacity under a simulated percentile: a bracket [request_rate_per_replica, missed_rate)."""

    request_rate_per_replica: float
    """The largest simulated rate whose percentile met the targets, requests/s per replica (0: none met them)."""
    missed_rate_per_replica: float
    """The smallest simulated rate whose percentile missed them (inf: none missed; the search's upper bound, the
    p50 capacity, met them); where the search stopped at its budget before running its upper bound, that bound
    (not simulated: ``binds`` is then None)."""
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
    missed_ratio: float = math.nan
    """Percentile / target measured at missed_rate_per_replica (nan where no run measured it), so that a later
    search from that rate interpolates from it."""


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


def _next_rate(lo: float, q_lo: float, hi: float, q_hi: float) -> float:
    """The next rate to simulate inside the bracket (lo met the targets with ratio q_lo ≤ 1, hi missed with q_hi > 1):
    where ln q, interpolated linearly in ln rate, reaches 0 (regula falsi on the measured ratios: the tail latencies
    climb steeply near capacity, so this lands nearer the capacity than the bracket's midpoint), kept within the
    middle 60% of the bracket in ln rate so that each run narrows it by a fifth at least; the geometric midpoint
    when a ratio is unknown (nan, inf or not positive)."""
    span = math.log(hi / lo)
    if not (0 < q_lo <= 1 < q_hi < math.inf):
        return math.sqrt(lo * hi)
    frac = -math.log(q_lo) / (math.log(q_hi) - math.log(q_lo))
    return lo * math.exp(span * min(0.8, max(0.2, frac)))


def simulated_capacity(case: ServeCase, slo: Slo, upper_rate: float, *, lifetime_s: float = 0.0,
                       requests: int = SIM_REQUESTS, seed: int = 0, rel_tol: float = SIM_REL_TOL,
                       max_runs: int = SIM_MAX_RUNS, max_cycles: int = SIM_CYCLE_BUDGET,
                       upper_missed: tuple[float, str] | None = None, floor_rate: float = 0.0,
                       run_cycles: int = 60000, sizer=None) -> SimCapacity:
    """The largest Poisson rate per replica (at most ``upper_rate``) whose simulated ``slo.percentile`` of TTFT and
    TPOT meet the targets. Runs at ``upper_rate`` (``upper_missed`` = (ratio, target) when that run is already known
    to have missed); when it misses by a ratio q (percentile / target), tries upper / q² (within a quarter and 0.9 of
    it), halving on until a run meets the targets (down to 1/64 of ``upper_rate``: then 0), and narrows the bracket
    (``_next_rate``: regula falsi on the measured ratios) until it is within ``rel_tol`` or ``max_runs`` runs (or ``max_cycles`` simulated cycles) are
    spent; ``run_cycles`` bounds one run (``simulate``'s max_cycles); ``sizer``(rate) -> (requests, run_cycles) sizes
    each run for its rate instead. ``floor_rate`` > 0: only a rate above it matters (a better layout serves that
    much): the first run is at the floor (unless the upper bound is known to miss, then too), and a miss there ends
    the search; a pass runs the upper bound next, then narrows. Every run uses the same seed, so the arrivals are one
    pattern scaled in time (common random numbers) and the result is deterministic; a percentile of a few hundred
    requests is noisy, so the rate is only as good as ``rel_tol`` and that noise."""
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

    def at_upper():
        """(ratio, target missed, the result when the upper bound meets the targets) of the upper bound's run."""
        if upper_missed is not None:
            return upper_missed[0], upper_missed[1], None
        q, why, sim = run(upper_rate)
        return q, why, (SimCapacity(upper_rate, math.inf, True, None, sim, runs, cycles) if q <= 1 else None)

    if upper_rate <= 0:
        return SimCapacity(0.0, math.inf, True, None, None, 0)
    if spent():                                   # no run allowed: only the p50 bound is known
        return SimCapacity(0.0, upper_rate, False, None, None, 0)
    if floor_rate >= upper_rate:                  # only the upper bound can beat the floor: one run there at most
        q_hi, miss, met = at_upper()
        return met or SimCapacity(0.0, upper_rate, False, miss, None, runs, cycles, missed_ratio=q_hi)
    if floor_rate > 0:                            # a contender: can it beat the best at all?
        q_lo, why, sim_lo = run(floor_rate)
        if q_lo > 1:
            return SimCapacity(0.0, floor_rate, False, why, None, runs, cycles, missed_ratio=q_lo)
        lo, hi = floor_rate, upper_rate
        if upper_missed is None and spent():
            return SimCapacity(lo, upper_rate, False, None, sim_lo, runs, cycles)
        q_hi, miss, met = at_upper()
        if met:
            return met
    else:
        q_hi, miss, met = at_upper()
        if met:
            return met
        hi = upper_rate
        lo = upper_rate * min(0.9, max(0.25, 1 / q_hi**2)) if math.isfinite(q_hi) else upper_rate / 2
        while True:
            if spent():
                return SimCapacity(0.0, hi, False, miss, None, runs, cycles, missed_ratio=q_hi)
            q_lo, why, sim_lo = run(lo)
            if q_lo <= 1:
                break
            hi, q_hi, miss = lo, q_lo, why
            if lo <= upper_rate / 64:
                return SimCapacity(0.0, hi, True, miss, None, runs, cycles, missed_ratio=q_hi)
            lo /= 2
    while hi / lo - 1 > rel_tol and not spent():
        mid = _next_rate(lo, q_lo, hi, q_hi)
        q, why, sim = run(mid)
        if q <= 1:
            lo, q_lo, sim_lo = mid, q, sim
        else:
            hi, q_hi, miss = mid, q, why
    return SimCapacity(lo, hi, hi / lo - 1 <= rel_tol, miss, sim_lo, runs, cycles, missed_ratio=q_hi)


def refine(cases: list[ServeCase], cap: FluidCapacity, gpus_per_replica: np.ndarray, slo: Slo, *,
           seed: int = 0, requests: int = SIM_REQUESTS, must: tuple[int, ...] = (), max_runs: int = SIM_BUDGET,
           max_cycles: int = SIM_CYCLE_BUDGET, must_runs: int = 3,
           known: dict[int, SimCapacity] | None = None) -> tuple[dict[int, SimCapacity], bool]:
    """Simulated capacities of the layouts that can have the most goodput per GPU, by branch and bound, best first.
    A layout's p50 capacity bounds its simulated one (the search starts there), so its goodput bound is that rate ×
    output tokens / GPUs. In bound order: the first layout's capacity is searched in full (``simulated_capacity``)
    and its goodput is the best so far; each next layout whose bound still beats the best gets one run at the rate
    that would tie the best: a miss drops it (its capacity is below), a pass searches above it and raises the best;
    the first layout whose bound does not beat the best ends the search (neither it nor any after it can win).
    Then the layouts in ``must`` (e.g. those on the p50 Pareto front) get at most ``must_runs`` runs each.
    ``known`` results are reused; at most ``max_runs`` simulations and about ``max_cycles`` simulated cycles in
    all. Returns (results by case position, stopped at that budget)."""
    out = dict(known or {})
    O = np.array([c.output_len for c in cases], dtype=float)
    upper = cap.request_rate_per_replica
    bound = upper * O / gpus_per_replica
    spent, cycles, cut = 0, 0, False

    def life(i: int) -> float:
        v = float(cap.at_capacity["e2e_s"][i])
        return v if math.isfinite(v) else 0.0

    def goodput(i: int) -> float:                          # a rate that met the targets: a lower bound
        return out[i].request_rate_per_replica * O[i] / gpus_per_replica[i]

    best = max([goodput(i) for i in out] + [0.0])
    for i in (int(i) for i in np.argsort(-bound, kind="stable") if bound[i] > 0):
        if bound[i] <= best:
            break
        if i in out:
            continue
        if spent >= max_runs or cycles >= max_cycles:
            cut = True
            break
        floor = best * gpus_per_replica[i] / O[i] * (1 + 1e-9) if best > 0 else 0.0
        r = simulated_capacity(cases[i], slo, float(upper[i]), lifetime_s=life(i), requests=requests, seed=seed,
                               max_runs=min(SIM_MAX_RUNS, max_runs - spent), max_cycles=max_cycles - cycles,
                               floor_rate=floor)
        out[i] = r
        spent, cycles = spent + r.runs, cycles + r.cycles
        best = max(best, goodput(i))
    for i in must:                                            # the front's layouts: a few runs each
        if i in out and (out[i].settled or out[i].request_rate_per_replica > 0):
            continue
        if spent >= max_runs or cycles >= max_cycles:
            cut = True
            break
        top, known_miss = float(upper[i]), None
        if i in out and out[i].missed_rate_per_replica <= top and out[i].binds:   # it missed at that rate (dropped
            top = out[i].missed_rate_per_replica                                   # as a contender, or earlier)
            known_miss = (out[i].missed_ratio, out[i].binds)
        r = simulated_capacity(cases[i], slo, top, lifetime_s=life(i), requests=requests, seed=seed,
                               max_runs=min(must_runs - (known_miss is not None), max_runs - spent),
                               max_cycles=max_cycles - cycles, upper_missed=known_miss)
        out[i] = r
        spent, cycles = spent + r.runs, cycles + r.cycles
    return out, cut
