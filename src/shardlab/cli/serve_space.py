"""The replica layouts a serving search tries (`plan --inference --serve`, at capacity and under a load): TP × PP
with TP-sliced experts, and for a MoE model the expert-parallel layouts (``serving.moe``); the keywords that prepare
each, and their names in tables."""

from __future__ import annotations


def layout_pins(args) -> dict:
    """The replica axes a user wrote on `plan --inference` (``--tp``, ``--pp``): the search keeps only layouts with
    those values, as the training plan pins what is written."""
    from shardlab.cli.common import given_flags

    given = given_flags(args) or set()
    return {k: getattr(args, k) for k in ("tp", "pp") if k in given and getattr(args, k, None) is not None}


def _candidates(spec, cluster, gpus, engine, redundant: int = 0, pins: dict | None = None):
    """(tp, pp, max-num-seqs, ep, attention DP ranks) of every replica layout of ``gpus`` GPUs. A MoE model adds,
    beside its TP-sliced experts: experts whole over the TP group (ep = tp > 1), and wide expert parallelism with
    data-parallel attention, N = ep GPUs per replica (pp 1), N dividing the experts (+ ``redundant`` slots), as
    SGLang, vLLM and TensorRT-LLM run DeepSeek and Qwen3 MoE (``serving.moe``): N attention ranks of TP 1, or N/t
    ranks of TP t for every t > 1 dividing N inside a node (SGLang's --tp N --dp N/t --enable-dp-attention).
    ``pins`` (``layout_pins``): only layouts with those TP and PP degrees."""
    from shardlab.planner.space import tp_ok

    pins = pins or {}
    keep = lambda tp, pp: pins.get("tp", tp) == tp and pins.get("pp", pp) == pp   # noqa: E731

    engine = engine.for_gpu(cluster.accelerator)                 # the cap the engine takes on this GPU, and below
    caps = sorted({engine.max_num_seqs} | {2**i for i in range(3, 12) if 2**i < engine.max_num_seqs}, reverse=True)
    experts = spec.moe.num_experts + redundant if spec.moe is not None else 0
    for tp in [d for d in range(1, gpus + 1) if gpus % d == 0 and d <= cluster.gpus_per_node and tp_ok(spec, d)]:
        for pp in [d for d in range(1, gpus // tp + 1) if (gpus // tp) % d == 0 and d <= spec.num_layers]:
            if not keep(tp, pp):
                continue
            moe = [(1, 1)] + ([(tp, 1)] if experts and tp > 1 and experts % tp == 0 else [])
            for ep, dpa in moe:
                for cap in caps:
                    yield tp, pp, cap, ep, dpa
    for n, t in wide_ep_layouts(spec, cluster, gpus, experts, attention_tp=engine.attention_dp_tp):
        if not keep(t, 1):
            continue
        for cap in caps:
            yield t, 1, cap, n, n // t


def wide_ep_layouts(spec, cluster, gpus: int, experts: int, most: int | None = None,
                    divides: bool = True, attention_tp: bool = True) -> list[tuple[int, int]]:
    """(ep GPUs N, attention TP t) of the wide-EP replicas: N dividing the ``experts`` slots and (``divides``)
    ``gpus``, at most ``most``, in N/t attention ranks of TP t for t = 1 or, where the engine runs them
    (``attention_tp``: ``EngineProfile.attention_dp_tp``), any t < N dividing N inside a node (a disaggregated
    pool takes any N up to a node: ``divides`` False)."""
    from shardlab.planner.space import tp_ok

    if not experts:
        return []
    return [(n, t) for n in range(2, min(gpus, most or gpus) + 1) if (gpus % n == 0 or not divides) and experts % n == 0
            for t in range(1, n) if n % t == 0 and t <= cluster.gpus_per_node and (t == 1 or attention_tp and tp_ok(spec, t))]


def moe_kw(spec_kw: dict, ep: int, dpa: int) -> dict:
    """``prepare``'s keywords for a searched MoE layout: the flags' settings (--expert-imbalance,
    --two-batch-overlap, --redundant-experts) where the layout takes them."""
    base = {k: v for k, v in spec_kw.items() if k not in ("ep", "dp_attention", "expert_imbalance",
                                                           "two_batch_overlap", "redundant_experts")}
    if ep == 1:
        return base
    return {**base, "ep": ep, "dp_attention": dpa > 1, "expert_imbalance": spec_kw.get("expert_imbalance"),
            "two_batch_overlap": bool(spec_kw.get("two_batch_overlap")) and dpa > 1,
            "redundant_experts": spec_kw.get("redundant_experts") or 0}


def _ep_cell(p: dict) -> str:
    """The EP column of a MoE plan table: 'EP (attention ranks)', or TP-sliced experts."""
    return "— (TP experts)" if p.get("ep", 1) == 1 else f"{p['ep']} ({p.get('dp_attention', 1)})"
