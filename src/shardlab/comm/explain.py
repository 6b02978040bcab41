"""The formula of a priced collective with the user's numbers in it (``CollectiveCost.formula``)."""

from __future__ import annotations

from shardlab.comm.collectives import CollectiveCost, bus_factor

_SYMBOLIC = {  # the formula of each (collective, algorithm), see collectives.ab_terms for the sources
    ("all-reduce", "ring"): "2(n−1)·α + 2(n−1)/n·S/β",
    ("reduce-scatter", "ring"): "(n−1)·α + (n−1)/n·S/β",
    ("all-gather", "ring"): "(n−1)·α + (n−1)/n·S/β",
    ("all-to-all", "ring"): "(n−1)·α + (n−1)/n·S/β",
    ("broadcast", "ring"): "(n−1)·α + S/β",
    ("send-recv", "ring"): "α + S/β",
    ("all-reduce", "tree"): "2⌈log₂n⌉·α + 2·S/β",
    ("reduce-scatter", "tree"): "⌈log₂n⌉·α + (n−1)/n·S/β",
    ("all-gather", "tree"): "⌈log₂n⌉·α + (n−1)/n·S/β",
    ("all-to-all", "tree"): "⌈log₂n⌉·α + ⌈log₂n⌉/2·S/β",
    ("broadcast", "tree"): "⌈log₂n⌉·α + S/β",
    ("send-recv", "tree"): "α + S/β",
}


def explain(cost: CollectiveCost, hierarchical: bool = False, pipelined: bool = True) -> str:
    """The formula of ``cost`` with its numbers, one line per phase, and the sources."""
    from shardlab.units import fmt_bytes, fmt_time

    if cost.ranks == 1:
        return "n = 1: a single rank sends nothing (0 s)"
    s = cost.size_bytes
    lines = []
    for p in cost.phases:
        sym = "" if hierarchical else f"{_SYMBOLIC[(cost.op, p.algorithm)]} = "
        lines.append(f"{p.label} on {p.link_id} [{p.algorithm}]: {sym}{p.steps:g} × {fmt_time(p.alpha_s)} + "
                     f"{p.coeff:.4g} × {fmt_bytes(s)} / {p.beta_bytes_per_s / 1e9:.4g} GB/s = "
                     f"{fmt_time(p.steps * p.alpha_s)} + {fmt_time(p.coeff * s / p.beta_bytes_per_s)}")
    if hierarchical:
        lines.append("latency terms add; bandwidth terms add per link and "
                     + ("the busiest link sets the pace (phases pipelined, as NCCL does)" if pipelined else "the phases add up"))
    lines.append(f"total {fmt_time(cost.time_s)} (latency {fmt_time(cost.latency_s)} + bandwidth {fmt_time(cost.bandwidth_s)}); "
                 f"α–β model (Hockney; Thakur et al. 2005), β = line rate × efficiency; "
                 f"busbw = algbw × {bus_factor(cost.op, cost.ranks):.4g} (nccl-tests doc/PERFORMANCE.md)")
    return "\n".join(lines)
