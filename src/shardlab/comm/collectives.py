"""The α–β cost of one collective: ring, tree and hierarchical (intra-node then inter-node) algorithms.

Model (Hockney 1994; Thakur, Rabenseifner & Gropp 2005, "Optimization of Collective Communication
Operations in MPICH", IJHPCA 19(1)): an algorithm of ``steps`` rounds that pushes ``coeff × S`` bytes
through each rank's link costs

    T = steps · α + coeff · S / β

with α the per-step latency (``Link.latency_s``) and β the achievable bandwidth (``Link.bytes_per_s`` =
line rate × efficiency). S follows nccl-tests (doc/PERFORMANCE.md): the full buffer, i.e. the gathered
output of an all-gather, the input of a reduce-scatter, and for an all-to-all what one rank sends in total.

Reported bandwidths use the nccl-tests definitions: algbw = S / T and busbw = algbw × bus_factor(op, n);
busbw is comparable with the link's bandwidth whatever n is. Everything here is pure and vectorizes over
numpy arrays of sizes and rank counts (the planner prices thousands of layouts at once).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from shardlab.errors import ShardlabError, did_you_mean
from shardlab.specs.hardware import Link

OPS = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "broadcast", "send-recv")
"""Collectives priced here (nccl-tests names, hyphenated)."""
ALGORITHMS = ("ring", "tree")
"""Algorithms; ``auto`` picks the faster where NCCL has both (all-reduce, broadcast), ring otherwise."""

def check_op(op: str) -> str:
    """Return ``op`` if it is a known collective, else raise ShardlabError naming the choices."""
    if op not in OPS:
        raise ShardlabError(f"unknown collective '{op}'{did_you_mean(op, OPS)}; use one of {', '.join(OPS)}")
    return op


def bus_factor(op: str, n):
    """busbw / algbw for ``op`` on ``n`` ranks (nccl-tests, doc/PERFORMANCE.md).

    all-reduce 2(n−1)/n; reduce-scatter, all-gather and all-to-all (n−1)/n; broadcast and send-recv 1.
    Broadcasts over numpy arrays of ``n``.
    """
    check_op(op)
    n = np.maximum(np.asarray(n, dtype=float), 1.0)
    if op == "all-reduce":
        f = 2.0 * (n - 1.0) / n
    elif op in ("reduce-scatter", "all-gather", "all-to-all"):
        f = (n - 1.0) / n
    else:
        f = np.ones_like(n)
    return f.item() if f.ndim == 0 else f


def ab_terms(op: str, n, algorithm: str = "ring"):
    """(steps, coeff) of ``op`` on ``n`` ranks: T = steps·α + coeff·S/β. n == 1 gives (0, 0).

    ring (bandwidth-optimal, Patarasuk & Yuan 2009, JPDC 69(2); Thakur et al. 2005 §4):
      all-reduce = reduce-scatter + all-gather: 2(n−1) steps of S/n each → coeff 2(n−1)/n;
      reduce-scatter, all-gather: (n−1) steps, coeff (n−1)/n;
      all-to-all, pairwise exchange: (n−1) steps of S/n, coeff (n−1)/n;
      broadcast, pipelined chain: (n−1) steps of latency, coeff 1; send-recv: 1 step, coeff 1.
    tree (latency-optimal):
      all-reduce, NCCL's double binary tree (Sanders, Speck & Träff 2009; NCCL 2.4 blog, Jeaugey 2019):
        reduce up then broadcast down, pipelined: 2⌈log₂n⌉ steps; each rank sends S up and S down → coeff 2;
      broadcast, two-tree pipelined: ⌈log₂n⌉ steps, coeff 1;
      reduce-scatter / all-gather, recursive halving / doubling (Thakur et al. 2005 §4.4-4.5): ⌈log₂n⌉
        steps, coeff (n−1)/n (exact for powers of two; NCCL itself only has ring for these);
      all-to-all, Bruck et al. 1997 (IEEE TPDS 8(11)): ⌈log₂n⌉ steps each moving S/2 → coeff ⌈log₂n⌉/2.
    """
    check_op(op)
    if algorithm not in ALGORITHMS:
        raise ShardlabError(f"unknown algorithm '{algorithm}'; use ring, tree or auto")
    raw = np.asarray(n, dtype=float)
    n = np.maximum(raw, 1.0)                       # n ≤ 1 costs nothing (masked below); avoids 1/0
    one = np.ones_like(n)
    if op == "send-recv":
        steps, coeff = one, one
    elif algorithm == "ring":
        if op == "all-reduce":
            steps, coeff = 2 * (n - 1), 2 * (n - 1) / n
        elif op == "broadcast":
            steps, coeff = n - 1, one
        else:                                      # reduce-scatter, all-gather, all-to-all
            steps, coeff = n - 1, (n - 1) / n
    else:
        lg = np.ceil(np.log2(n))
        steps, coeff = {"all-reduce": (lg + lg, 2 * one), "reduce-scatter": (lg, (n - 1) / n),
                        "all-gather": (lg, (n - 1) / n), "all-to-all": (lg, lg / 2), "broadcast": (lg, one)}[op]
    alone = raw <= 1
    return np.where(alone, 0.0, steps), np.where(alone, 0.0, coeff)


def alpha_beta_time(op: str, size_bytes, n, alpha_s, beta_bytes_per_s, algorithm: str = "ring"):
    """T = steps·α + coeff·S/β (see ``ab_terms``); n == 1 costs 0. Broadcasts over numpy arrays.

    Source: the α–β (Hockney) model with the per-algorithm terms of Thakur et al. 2005 and NCCL's
    algorithms; S is the nccl-tests size (full buffer; for all-to-all what one rank sends).
    """
    steps, coeff = ab_terms(op, n, algorithm)
    t = steps * np.asarray(alpha_s, dtype=float) + coeff * np.asarray(size_bytes, dtype=float) / np.asarray(beta_bytes_per_s, dtype=float)
    t = np.asarray(t)
    return t.item() if t.ndim == 0 else t


def crossover_size_bytes(op: str, n, alpha_s, beta_bytes_per_s, algorithm: str = "ring"):
    """Message size where latency and bandwidth terms are equal: S* = steps·α·β / coeff (0 when n == 1).

    Below S* the collective is latency-bound (more steps or a faster link do not help much; fewer,
    larger messages do); above it, bandwidth-bound.
    """
    steps, coeff = ab_terms(op, n, algorithm)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(coeff > 0, steps * np.asarray(alpha_s, dtype=float) * np.asarray(beta_bytes_per_s, dtype=float)
                     / np.where(coeff > 0, coeff, 1.0), 0.0)
    return s.item() if s.ndim == 0 else s


@dataclass(frozen=True)
class Phase:
    """One stage of a (possibly hierarchical) collective, linear in the message size S."""

    label: str
    """What runs, e.g. 'intra reduce-scatter (g=8)'."""
    link_id: str
    """Link the phase runs on."""
    algorithm: str
    """ring or tree."""
    steps: float
    """Latency steps (multiplies α)."""
    coeff: float
    """Bytes through each rank's link per byte of S (multiplies S/β)."""
    alpha_s: float
    """α of the link, seconds."""
    beta_bytes_per_s: float
    """β of the link (line rate × efficiency), bytes/s."""


@dataclass(frozen=True)
class CollectiveCost:
    """The priced collective (``collective_time``)."""

    op: str
    """Collective name (all-reduce, ...)."""
    size_bytes: int
    """S, nccl-tests convention (full buffer; all-to-all: what one rank sends)."""
    ranks: int
    """Group size n."""
    nodes: int
    """Nodes the group spans (hierarchical when > 1 with an intra-node link)."""
    algorithm: str
    """Algorithm used (the one chosen under auto); 'hierarchical(...)' for a two-level collective."""
    time_s: float
    """Estimated time of one call."""
    algbw_gbps: float
    """S / time, GB/s (1e9 bytes); 0 when time is 0."""
    busbw_gbps: float
    """algbw × bus_factor(op, n), GB/s: comparable with the link bandwidth."""
    regime: str
    """'latency' (S below the crossover) or 'bandwidth'; 'none' for n == 1 (nothing to send)."""
    crossover_bytes: float
    """S at which the latency and bandwidth terms are equal."""
    steps: float
    """Latency steps summed over phases."""
    formula: str
    """The formula with the numbers in it and its source."""
    latency_s: float = 0.0
    """Σ steps·α (the size-independent part)."""
    bandwidth_s: float = 0.0
    """Σ coeff·S/β (the part proportional to S)."""
    link_id: str = ""
    """The (inter-node, when hierarchical) link."""
    phases: list[Phase] = field(default_factory=list)
    """The phases summed into time_s."""


def _phase(label: str, op: str, n: int, scale: float, link: Link, algorithm: str) -> Phase:
    """One phase: ``op`` on ``n`` ranks over ``link`` moving ``scale``·S with a concrete ``algorithm``."""
    steps, coeff = ab_terms(op, n, algorithm)
    # a full mesh drives one ring per peer link at once; a ring across CPU sockets stages through host memory
    bw = link.ring_bytes_per_s(n) if op != "send-recv" else link.bytes_per_s
    return Phase(label, link.id, algorithm, float(steps), float(coeff) * scale, link.latency_s, bw)


def _phases(op: str, n: int, link: Link, algorithm: str, nodes: int, intra_link: Link | None) -> list[Phase]:
    """Flat: one phase. Hierarchical (nodes > 1, intra link given; g = n / nodes ranks per node):
    all-reduce = intra reduce-scatter(S) + inter all-reduce(S/g) + intra all-gather(S) (NCCL's
    hierarchical/CollNet pattern; Jeaugey 2019); reduce-scatter = intra RS(S) + inter RS(S/g);
    all-gather = inter AG(S/g) + intra AG(S); broadcast = inter + intra broadcast of S;
    all-to-all = pairwise exchange, g−1 peers on the intra link ((g−1)/n of S) and n−g on the inter link
    ((n−g)/n of S); send-recv crosses the inter link once."""
    if nodes <= 1 or intra_link is None or op == "send-recv":
        return [_phase(f"{op} (n={n})", op, n, 1.0, link, algorithm)]
    g, k = n // nodes, nodes
    intra = "ring"  # NCCL runs the intra-node part of a hierarchical collective as rings (NVLink/NVSwitch)
    if op == "all-reduce":
        return [_phase(f"intra reduce-scatter (g={g})", "reduce-scatter", g, 1.0, intra_link, intra),
                _phase(f"inter all-reduce of S/g (k={k})", "all-reduce", k, 1.0 / g, link, algorithm),
                _phase(f"intra all-gather (g={g})", "all-gather", g, 1.0, intra_link, intra)]
    if op == "reduce-scatter":
        return [_phase(f"intra reduce-scatter (g={g})", op, g, 1.0, intra_link, intra),
                _phase(f"inter reduce-scatter of S/g (k={k})", op, k, 1.0 / g, link, algorithm)]
    if op == "all-gather":
        return [_phase(f"inter all-gather of S/g (k={k})", op, k, 1.0 / g, link, algorithm),
                _phase(f"intra all-gather (g={g})", op, g, 1.0, intra_link, intra)]
    if op == "broadcast":
        return [_phase(f"inter broadcast (k={k})", op, k, 1.0, link, algorithm),
                _phase(f"intra broadcast (g={g})", op, g, 1.0, intra_link, intra)]
    # all-to-all: pairwise exchange, each peer's share S/n priced on the link that reaches it
    return [Phase(f"intra exchange with {g - 1} peers", intra_link.id, "ring", g - 1.0, (g - 1.0) / n,
                  intra_link.latency_s, intra_link.bytes_per_s),
            Phase(f"inter exchange with {n - g} peers", link.id, "ring", n - g + 0.0, (n - g + 0.0) / n,
                  link.latency_s, link.bytes_per_s)]


def _total(phases: list[Phase], size: float, pipelined: bool = True) -> tuple[float, float]:
    """(latency, bandwidth) seconds of ``phases``: latency terms add up; bandwidth terms add up per link,
    and with ``pipelined`` the busiest link sets the pace (NCCL splits a collective into chunks and
    overlaps its intra- and inter-node transfers), otherwise the phases run one after another."""
    lat = sum(p.steps * p.alpha_s for p in phases)
    per_link: dict[str, float] = {}
    for p in phases:
        per_link[p.link_id] = per_link.get(p.link_id, 0.0) + p.coeff * size / p.beta_bytes_per_s
    bw = (max(per_link.values()) if pipelined else sum(per_link.values())) if per_link else 0.0
    return lat, bw


def collective_time(op: str, size_bytes: int, ranks: int, link: Link, algorithm: str = "auto", *,
                    nodes: int = 1, intra_link: Link | None = None, pipelined: bool = True) -> CollectiveCost:
    """Price one ``op`` of ``size_bytes`` on ``ranks`` ranks over ``link`` (α–β model, see module doc).

    ``algorithm``: ring, tree, or auto (the faster of ring and tree for all-reduce and broadcast at this
    size, as NCCL's tuner does; ring for the others). When ``nodes`` > 1 and ``intra_link`` is given the
    collective is hierarchical (``_phases``) with ``link`` between nodes; ``ranks`` must then be a
    multiple of ``nodes``. ``pipelined`` (default) overlaps the phases' transfers so the busiest link
    sets the bandwidth term (NCCL's chunked pipelining); False adds the phases up (an upper bound).
    """
    check_op(op)
    if algorithm not in ALGORITHMS + ("auto",):
        raise ShardlabError(f"unknown algorithm '{algorithm}'; use ring, tree or auto")
    if not isinstance(ranks, (int, np.integer)) or ranks < 1:
        raise ShardlabError(f"ranks must be a positive whole number, got {ranks}")
    if size_bytes < 0:
        raise ShardlabError(f"message size must not be negative, got {size_bytes}")
    if nodes < 1 or nodes > ranks:
        raise ShardlabError(f"nodes must be between 1 and the number of ranks ({ranks}), got {nodes}")
    hier = nodes > 1 and intra_link is not None and op != "send-recv"
    if hier and ranks % nodes:
        raise ShardlabError(f"{ranks} ranks do not split evenly over {nodes} nodes; give a multiple of {nodes} ranks")
    ranks, size = int(ranks), float(size_bytes)
    if algorithm == "auto":
        cands = [a for a in ALGORITHMS if op in ("all-reduce", "broadcast") or a == "ring"]
        best = min(cands, key=lambda a: sum(_total(_phases(op, ranks, link, a, nodes, intra_link), size, pipelined)))
        algorithm = best
    phases = _phases(op, ranks, link, algorithm, nodes, intra_link) if ranks > 1 else []
    lat, bw = _total(phases, size, pipelined)
    t = lat + bw
    slope = _total(phases, 1.0, pipelined)[1]
    cross = lat / slope if slope > 0 else 0.0
    algbw = size / t / 1e9 if t > 0 else 0.0
    regime = "none" if ranks == 1 else ("latency" if size < cross else "bandwidth")
    name = f"hierarchical({algorithm} inter)" if hier else algorithm
    cost = CollectiveCost(op=op, size_bytes=int(size_bytes), ranks=ranks, nodes=nodes, algorithm=name, time_s=t,
                          algbw_gbps=algbw, busbw_gbps=algbw * bus_factor(op, ranks), regime=regime,
                          crossover_bytes=cross, steps=sum(p.steps for p in phases), formula="",
                          latency_s=lat, bandwidth_s=bw, link_id=link.id, phases=phases)
    from shardlab.comm.explain import explain

    object.__setattr__(cost, "formula", explain(cost, hier, pipelined))
    return cost
