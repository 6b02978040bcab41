"""The worksheet's risk column: for each axis of a layout and each collective it issues, the concrete thing
that can go wrong, with its number (share of the step time, bubble, bytes over which link, memory headroom).

Pure functions over the numbers a plan document already holds (the step breakdown, the communication
inventory of ``comm.inventory.layout_collectives``, memory and capacity) plus the cluster's two links; the
only extra arithmetic is re-pricing TP traffic on the inter-node link with the same α–β model
(``comm.collectives.collective_time``, Hockney 1994; a flat ring, as NCCL runs it). ``shardlab plan`` puts the
sentences in its worksheet and communication table (terminal, ``--json``, ``--html``); the teaching commands
call the same functions.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.comm.collectives import collective_time
from shardlab.specs.hardware import Link
from shardlab.units import fmt_bytes, fmt_time

DP_AXES = ("DP", "ZeRO", "FSDP")
"""Inventory axes of the data-parallel gradient/parameter traffic."""


@dataclass(frozen=True)
class RiskInputs:
    """One layout's numbers, as its plan document holds them."""

    layout: dict
    """``Layout.to_dict()`` plus ``microbatches`` (dp, tp, pp, cp, ep, zero, vpp, micro_batch, schedule, ...)."""
    step_time_s: float
    """Estimated step time, seconds."""
    breakdown: dict
    """The step's parts in seconds (compute_s, tp_comm_s, pp_bubble_s, dp_comm_s, ...); missing keys count as 0."""
    comm: tuple
    """The layout's collectives as dicts (``CommItem`` fields: axis, op, bytes_per_call, calls_per_step, ...)."""
    intra_link: Link
    """The link inside a node."""
    inter_link: Link
    """The link between nodes."""
    gpus_per_node: int
    """GPUs per node."""
    memory_bytes: int
    """Peak memory of the worst rank, bytes."""
    capacity_bytes: int
    """GPU memory capacity, bytes."""
    stage_layers: int
    """Transformer blocks on the busiest pipeline rank."""
    seq_len: int
    """Tokens per sequence."""


def _pct(x_s: float, inp: RiskInputs) -> str:
    return f"{100 * x_s / inp.step_time_s:.1f}%" if inp.step_time_s > 0 else "n/a"


def _b(inp: RiskInputs, key: str) -> float:
    return float(inp.breakdown.get(key, 0.0) or 0.0)


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def headroom(inp: RiskInputs) -> str:
    """'61.2 of 80.0 GiB used, 23% headroom' (what an activation spike or fragmentation has left)."""
    room = inp.capacity_bytes - inp.memory_bytes
    share = 100 * room / inp.capacity_bytes if inp.capacity_bytes else 0.0
    return f"{_gib(inp.memory_bytes)} of {_gib(inp.capacity_bytes)} used, {share:.{1 if share < 10 else 0}f}% headroom"


def _items(inp: RiskInputs, axes: tuple[str, ...], op: str | None = None) -> list[dict]:
    return [c for c in inp.comm if c["axis"] in axes and (op is None or c["op"] == op)]


def _per_layer(items: list[dict], inp: RiskInputs) -> int:
    """Collectives per layer per micro-batch (forward + backward) of the block-level items (those issued per layer)."""
    m = max(1, int(inp.layout.get("microbatches", 1)))
    unit = m * max(1, inp.stage_layers)
    return sum(c["calls_per_step"] // unit for c in items if c["calls_per_step"] >= unit)


def _link(inp: RiskInputs, link_id: str) -> Link:
    return inp.inter_link if link_id == inp.inter_link.id else inp.intra_link


def _bw(link: Link) -> str:
    return f"{link.bandwidth_gbps:g} GB/s {link.id}"


def tp_across_nodes_s(inp: RiskInputs) -> float:
    """Extra seconds per step if each TP rank sat on another node (what a rank order with tp not fastest does):
    every TP/SP collective re-priced as a flat ring on ``inter_link`` with ``collective_time``; 0 without TP."""
    extra = 0.0
    for c in _items(inp, ("TP", "SP")):
        n = int(c["group_size"])
        if n < 2 or c["nodes_spanned"] > 1:
            continue
        flat = collective_time(c["op"], int(c["bytes_per_call"]), n, inp.inter_link)
        extra += (flat.time_s - c["time_per_call_s"]) * c["calls_per_step"]
    return extra


def _tp(inp: RiskInputs) -> str:
    t = int(inp.layout["tp"])
    if t == 1:
        return f"TP 1: every GPU holds whole weight matrices; memory is the limit ({headroom(inp)})"
    items = _items(inp, ("TP", "SP"))
    k, tp_s = _per_layer(items, inp), _b(inp, "tp_comm_s")
    crossing = [c for c in items if c["nodes_spanned"] > 1]
    if crossing:
        return (f"TP {t} across {crossing[0]['nodes_spanned']} nodes puts {k} collectives per layer per micro-batch on "
                f"{_bw(inp.inter_link)}: {tp_s:.2f} s exposed = {_pct(tp_s, inp)} of the step")
    extra = tp_across_nodes_s(inp)
    return (f"TP {t} inside a node: {k} collectives per layer per micro-batch on {_bw(inp.intra_link)} cost {tp_s:.2f} s "
            f"({_pct(tp_s, inp)}); a rank order putting them on {t} nodes ({_bw(inp.inter_link)}) would add "
            f"+{_pct(extra, inp)} step time")


def _pp(inp: RiskInputs) -> str:
    p, m = int(inp.layout["pp"]), int(inp.layout.get("microbatches", 1))
    if p == 1:
        return f"PP 1: no bubble; each GPU keeps all {inp.stage_layers} layers ({headroom(inp)})"
    bub, p2p = _b(inp, "pp_bubble_s"), _b(inp, "pp_p2p_s")
    link = _items(inp, ("PP",))
    lk = _link(inp, link[0]["link_id"]) if link else inp.intra_link
    return (f"PP {p} with {m} micro-batches: bubble {_pct(bub, inp)} ({bub:.2f} s), plus {p2p:.2f} s of stage-to-stage "
            f"sends on {_bw(lk)}; a straggling stage stalls all {p}")


def _dp(inp: RiskInputs) -> str:
    dp, cp = int(inp.layout["dp"]), int(inp.layout["cp"])
    d = dp * cp                                     # gradients reduce over every data- and context-parallel rank
    items = _items(inp, DP_AXES)
    if d == 1 or not items:
        return "DP 1: no gradient reduction; throughput scales only through the other axes (0 s)"
    total = sum(c["time_per_step_s"] for c in items)
    exposed = _b(inp, "dp_comm_s") + _b(inp, "zero3_comm_s")
    lk = _link(inp, items[0]["link_id"])
    where = f"across {items[0]['nodes_spanned']} nodes" if items[0]["nodes_spanned"] > 1 else "inside a node"
    # total: the collectives as `comm plan` prices them, bucket by bucket; exposed: the step model's share (the same
    # rings priced once for the whole gradient, so without the buckets' latency terms)
    group = f"DP × CP {d} ({dp} × {cp})" if cp > 1 else f"DP {d}"
    more = sum(c["time_per_step_s"] for c in items if c["overlap"] == "overlappable") - exposed
    worse = (f"up to +{_pct(more, inp)} step time (its overlappable traffic, bucket by bucket; `estimate "
             f"--no-dp-overlap` prices it with the step model)" if more > 5e-4 * inp.step_time_s else
             "little more than now (what could overlap is already about as long as what is exposed)")
    return (f"{group} {where} on {_bw(lk)}: {total:.2f} s of gradient/parameter traffic per step (comm plan), "
            f"{exposed:.2f} s exposed in the step time; if it stops overlapping backward: {worse}")


def _cp(inp: RiskInputs) -> str:
    c = int(inp.layout["cp"])
    if c == 1:
        return f"CP 1: each GPU holds the activations of whole {inp.seq_len:,}-token sequences ({headroom(inp)})"
    items = _items(inp, ("CP",))
    total, exposed = sum(i["time_per_step_s"] for i in items), _b(inp, "cp_comm_s")
    lk = _link(inp, items[0]["link_id"]) if items else inp.intra_link
    return (f"CP {c}: ring attention passes K/V blocks on {_bw(lk)}, {total:.2f} s per step of which {exposed:.2f} s "
            f"exposed; if attention cannot hide it: +{_pct(max(0.0, total - exposed), inp)}")


def _ep(inp: RiskInputs) -> str:
    e = int(inp.layout["ep"])
    if e == 1:
        return f"EP 1: every GPU holds all experts of its layers ({headroom(inp)})"
    items = _items(inp, ("EP",))
    a2as = [i for i in items if i["op"] == "all-to-all"]
    lk = _link(inp, a2as[0]["link_id"]) if a2as else inp.intra_link
    a2a = _b(inp, "ep_comm_s")
    e_tp = int(inp.layout.get("etp") or inp.layout["tp"])
    etp = " (with the expert-TP gathers and scatters)" if e_tp > 1 else ""
    return (f"EP {e}: {_per_layer(a2as, inp)} all-to-alls per layer per micro-batch on {_bw(lk)}, {a2a:.2f} s on the "
            f"critical path{etp} ({_pct(a2a, inp)}); uneven routing makes the busiest expert rank slower still")


def _zero(inp: RiskInputs) -> str:
    z = int(inp.layout["zero"])
    if z == 3:
        ag = _items(inp, ("FSDP",), "all-gather")
        if not ag:
            return "ZeRO-3 with nothing to shard (dp·cp = 1)"
        lk = _link(inp, ag[0]["link_id"])
        total = sum(c["time_per_step_s"] for c in ag)
        # a block unit's forward gathers: the dense weights and, with MoE, the expert weights (their own group)
        unit = [c for c in ag if c["phase"] == "forward" and c["calls_per_step"] == max(x["calls_per_step"] for x in ag)]
        parts = (f" ({' + '.join(fmt_bytes(c['bytes_per_call']) for c in unit)}: dense and expert weights)"
                 if len(unit) > 1 else "")
        return (f"ZeRO-3 gathers {fmt_bytes(sum(c['bytes_per_call'] for c in unit))}{parts} per unit per micro-batch over "
                f"{_bw(lk)}: exposed {total:.2f} s ({_pct(total, inp)}) if prefetch fails "
                f"(now {_b(inp, 'zero3_comm_s'):.2f} s)")
    if z in (1, 2):
        ag = _items(inp, ("ZeRO",), "all-gather")
        t = sum(c["time_per_step_s"] for c in ag)
        lk = _link(inp, ag[0]["link_id"]) if ag else inp.intra_link
        return (f"ZeRO-{z}: the parameter all-gather after the optimizer step takes {t:.2f} s on {_bw(lk)}, on the "
                f"critical path ({_pct(t, inp)} of the step; Megatron's --overlap-param-gather can hide it behind the "
                f"next forward); {headroom(inp)}")
    return f"ZeRO-0: optimizer states replicated on every DP rank ({headroom(inp)})"


def _mb(inp: RiskInputs) -> str:
    b, m = int(inp.layout["micro_batch"]), int(inp.layout.get("microbatches", 1))
    return f"micro-batch {b} × {m} per step: activation peaks scale with it ({headroom(inp)})"


def _sched(inp: RiskInputs) -> str:
    lay = inp.layout
    if int(lay["pp"]) == 1:
        return "no pipeline: bubble 0%"
    bub = _pct(_b(inp, "pp_bubble_s"), inp)
    if lay["schedule"] == "interleaved":
        return (f"interleaved v={lay['vpp']}: bubble {bub}, but {lay['vpp']}× the stage-to-stage sends "
                f"({_b(inp, 'pp_p2p_s'):.2f} s exposed)")
    if lay["schedule"] == "zb-h1":
        return f"ZB-H1: bubble {bub}; deferred weight-gradient passes keep their inputs in memory ({headroom(inp)})"
    return f"{lay['schedule']}: bubble {bub} of the step"


def _rc(inp: RiskInputs) -> str:
    rc = inp.layout["recompute"]
    if rc == "none":
        return f"no recomputation: all activations stay in memory ({headroom(inp)})"
    r = _b(inp, "recompute_s")
    return f"{rc} recomputation re-runs forward work: +{r:.2f} s ({_pct(r, inp)} of the step)"


def _sp(inp: RiskInputs) -> str:
    t = int(inp.layout["tp"])
    if t == 1:
        return "no TP group: sequence parallelism does not apply (0 s)"
    if inp.layout["sequence_parallel"]:
        sp = sum(c["time_per_step_s"] for c in _items(inp, ("SP",)))
        return (f"SP on: all-gather + reduce-scatter instead of all-reduce, same volume ({sp:.2f} s per step), "
                f"all on the critical path")
    return f"SP off: norm and dropout activations replicated on all {t} TP ranks ({headroom(inp)})"


_AXIS_RISKS = {"tp": _tp, "pp": _pp, "dp": _dp, "cp": _cp, "ep": _ep, "zero": _zero, "mb": _mb, "sched": _sched,
               "rc": _rc, "sp": _sp}
AXIS_KEYS = tuple(_AXIS_RISKS)
"""Worksheet axis keys (planner.explain.AXES) with a risk sentence."""


def axis_risk(key: str, inp: RiskInputs) -> str:
    """The risk of the layout's choice on axis ``key`` (tp, pp, dp, cp, ep, zero, mb, sched, rc, sp), with its number."""
    return _AXIS_RISKS[key](inp)


def collective_risk(item: dict, inp: RiskInputs) -> str:
    """The risk of one collective: what it costs when it is exposed, over which link; the inventory's own warnings
    (group crossing nodes, latency-bound) come after."""
    lk = _link(inp, item["link_id"])
    t = item["time_per_step_s"]
    per = f"{item['calls_per_step']:,} × {fmt_time(item['time_per_call_s'])}"
    if item["overlap"] == "critical":
        s = f"critical path: {per} = {fmt_time(t)} per step ({_pct(t, inp)}) on {_bw(lk)}"
    else:
        s = f"hidden behind compute while overlap holds; if it fails +{fmt_time(t)} ({_pct(t, inp)}) on {_bw(lk)}"
    if item.get("regime") == "latency":
        s += f"; latency-bound ({fmt_bytes(item['bytes_per_call'])} messages)"
    extra = item.get("risk") or ""
    return f"{s}; {extra}" if extra else s
