"""`shardlab estimate --inference --serve --ttft-slo S --tpot-slo T --slo-percentile p50|p99` (no load): the capacity
of one layout under latency targets, the measure MLPerf Inference's Server scenario reports.

MLPerf Inference's Server scenario (MLCommons ``inference_policies``, ``inference_rules.adoc``, 'Scenarios' and the
LLM latency constraints): LoadGen sends queries as a Poisson process at a target rate; the submitter raises the rate
until the p99 of time to first token or of time per output token would exceed the benchmark's constraint, and the
result is the largest rate that meets both. The engine fills its running batch as the arrivals allow, so at that rate
the batch is the largest the latency caps permit. This is ``serving.capacity`` (and ``serving.sim_capacity``) on one layout: for p50 the steady
state's means (``fluid_capacity``), for p99 the seed-fixed simulation bracketing the rate (``simulated_capacity``,
upper bound the p50 capacity). The estimate is then priced at that rate, so the rest of the report (latencies,
memory, simulation) describes the layout at its capacity.
"""

from __future__ import annotations

import math

SIM_RUNS = 8
"""Simulations one layout's p99 search may run (the plan's budget is shared by its layouts; here there is one)."""
REQUESTS_PER_SLOT = 20
"""Requests per run: this many per sequence the p50 capacity keeps in flight (at least 300, at most 20,000). A p99
over more requests catches rarer bursts, and a run from empty fills slowly near the capacity: Llama-3.1-8B on TP 2
at 6.94 requests/s (87 sequences in flight in the steady state, 4,000 + 500 tokens) averages 77 in flight over 300
requests, 85 over 1,000 and 93 over 3,000, with p99 TPOT 26.1, 34.2 and 39.1 ms. A run that never fills reports the
percentiles of a lighter load (``filled`` says how full the accepted run was)."""
MAX_REQUESTS = 20000
"""... at most."""
FILLED = 0.9
"""An accepted run whose mean sequences in flight are below this share of the steady state's at its rate is named
in the report as not filled (its percentiles describe a lighter load)."""


def layout_capacity(case, ttft_slo: float | None, tpot_slo: float | None, percentile: str, seed: int = 0) -> dict:
    """{'statistic', 'ttft_slo_s', 'tpot_slo_s', 'max_request_rate', 'p50_rate', 'saturation_rate',
    'bracket_upper_rate', 'settled', 'binds', 'method', 'simulations', 'sim'} for one replica (``case``); 'sim' is
    the p99 search's simulation at the rate it returns (None for p50), which the report shows, so its p99 is the one
    the search accepted; each run takes REQUESTS_PER_SLOT requests per slot in flight. A ShardlabError says
    so when no rate tried meets the targets."""
    from shardlab.serving.capacity import RATE_MODE, Slo, fluid_capacity
    from shardlab.serving.sim_capacity import SIM_REQUESTS, simulated_capacity
    from shardlab.serving.steady import arrays, fluid

    slo = Slo(ttft_slo, tpot_slo, percentile)
    fc = fluid_capacity(arrays([case]), slo)
    rate, binds = float(fc.request_rate_per_replica[0]), str(fc.binds[0])
    out = {"statistic": percentile, "ttft_slo_s": ttft_slo, "tpot_slo_s": tpot_slo, "p50_rate": rate,
           "saturation_rate": float(fc.saturation_rate_per_replica[0]), "bracket_upper_rate": None, "settled": True,
           "simulations": 0, "sim": None,
           "method": "steady-state means stand for the medians (serving.capacity.fluid_capacity, to 1e-4 of the rate)"}
    if percentile == "p99" and rate > 0:
        life = float(fc.at_capacity["e2e_s"][0])
        sizes: dict = {}

        def sizer(r: float) -> tuple[int, int]:
            """Requests for a run at rate r (per slot the steady state keeps in flight there) and cycles enough
            that it is never cut short."""
            st = fluid(arrays([case]), [RATE_MODE], [r])
            flight = float(st["in_flight"][0]) if math.isfinite(float(st["in_flight"][0])) else 1.0
            n = int(min(MAX_REQUESTS, max(SIM_REQUESTS, REQUESTS_PER_SLOT * flight)))
            sizes[r] = n
            return n, max(60000, int(3 * n * case.output_len / max(flight, 1.0)) + 10 * case.prompt_len)

        sc = simulated_capacity(case, slo, rate, lifetime_s=life if math.isfinite(life) else 0.0, max_runs=SIM_RUNS,
                                seed=seed, sizer=sizer, max_cycles=10**9)
        most = sizes.get(sc.request_rate_per_replica, max(sizes.values(), default=SIM_REQUESTS))
        # nothing missed: the p99 met the targets at the p50 capacity, the search's upper bound (as plan's "(p50)")
        rate, binds = sc.request_rate_per_replica, (sc.binds or f"{binds} (p50)")
        filled = None
        if sc.sim is not None and rate > 0:
            steady = float(fluid(arrays([case]), [RATE_MODE], [rate])["in_flight"][0])
            filled = sc.sim.mean_running / steady if steady > 0 else None
        out.update(bracket_upper_rate=sc.missed_rate_per_replica if math.isfinite(sc.missed_rate_per_replica) else None,
                   settled=bool(sc.settled), simulations=sc.runs, sim=sc.sim, requests_per_run=most, filled=filled,
                   method=(f"seed-fixed simulation (serving.sim_capacity.simulated_capacity): {sc.runs} run(s) of {most:,} "
                           f"requests (at the rate found; each run sized for its rate) from the p50 capacity down" + (", bracketed to 5% of the rate" if sc.settled else
                                                                      ", stopped at its run budget")))
    if rate <= 0 and not out["settled"]:
        from shardlab.errors import ShardlabError

        raise ShardlabError(f"{case.layout_label}: the p99 search spent its {out['simulations']} simulations before a "
                            f"run met the targets (the p50 capacity is {out['p50_rate']:,.4g} requests/s): use "
                            f"--slo-percentile p50, or loosen the targets")
    if rate <= 0:
        from shardlab.errors import ShardlabError

        at = fc.at_capacity
        raise ShardlabError(
            f"{case.layout_label} misses the SLO at every load tried, down to 1e-4 of its saturation rate (there: "
            f"mean TTFT {1e3 * float(at['ttft_s'][0]):,.1f} ms, mean TPOT {1e3 * float(at['tpot_s'][0]):,.2f} ms): "
            f"loosen the targets, raise --tp, or quantize (--weights)")
    out.update(max_request_rate=rate, binds=binds)
    return out


def capacity_lines(cap: dict, res: dict, gpus: int, output_len: int) -> list[str]:
    """The report's lines: the targets, the rate, what binds, goodput, and how it was found."""
    pct = cap["statistic"]
    targets = " and ".join(f"{pct} {name} ≤ {1e3 * v:g} ms" for name, v in (("TTFT", cap["ttft_slo_s"]),
                                                                          ("TPOT", cap["tpot_slo_s"])) if v is not None)
    kind = cap["binds"].split(" ")[0]
    why = {"ttft": "the TTFT target binds just above it", "tpot": "the TPOT target binds just above it",
           "saturation": "the replica is full (the targets still hold at saturation)"}.get(kind, kind)
    if cap["binds"].endswith("(p50)"):
        why = (f"the simulated p99 met the targets at the p50 capacity, where the search starts (its upper bound); "
               f"there {why.replace('the TTFT', 'the mean TTFT').replace('the TPOT', 'the mean TPOT')}")
    lines = [f"capacity under the SLO ({targets}; MLPerf Inference Server's measure: the largest Poisson rate whose "
             f"latencies meet the caps): {cap['max_request_rate']:,.4g} requests/s; {why}",
             f"  at that rate: {res['in_flight']:,.1f} sequences in flight (Little's law), "
             f"{cap['max_request_rate'] * output_len / gpus:,.0f} output tokens/s per GPU (goodput), "
             f"{cap['max_request_rate'] * output_len:,.0f} in all",
             f"  found by: {cap['method']}"]
    if cap.get("filled") is not None and cap["filled"] < FILLED:
        lines.append(f"  the accepted run kept {cap['filled']:.0%} of the steady state's sequences in flight: its "
                     f"percentiles describe a lighter load, so this capacity is an upper bound")
    if not cap["settled"]:
        lines.append(f"  the search stopped at its run budget: the capacity lies in [{cap['max_request_rate']:,.4g}, "
                     f"{cap['bracket_upper_rate']:,.4g}) requests/s")
    return lines
