"""The capacity search's prefill/decode splits (`plan --inference --serve` with SLOs): the replica layouts each
pool may take, on one GPU kind or, with ``--prefill-gpu KIND``, a prefill pool of another kind on its own nodes
(Splitwise, Patel et al. 2024, arXiv 2311.18677: prompt phases on one generation, token phases on another), each
split at its highest request rate within the SLO means (``serving.disagg_split.search``), with its price per hour where
the catalog prices both kinds."""

from __future__ import annotations


def pool_cases(args, spec, cluster, gpus: int, engine, kw: dict, rejected: dict, errors: dict) -> dict:
    """{(tp, pp, ep, attention ranks): ServeCase} of the replicas a pool of ``cluster``'s GPUs may run: one per TP,
    with PP 2, 4, 8 where they leave the other pool a GPU (a long prompt's prefill split over stages, as
    --prefill-pp / --pp price them); a MoE model adds wide EP with data-parallel attention over N GPUs dividing the
    experts, up to a node, in ranks of TP 1 or more (what ``serve_space._candidates`` searches aggregated)."""
    from shardlab.cli.inference_cmds import reject
    from shardlab.cli.serve_space import moe_kw, wide_ep_layouts
    from shardlab.errors import ShardlabError
    from shardlab.planner.space import tp_ok
    from shardlab.serving.case import prepare

    experts = spec.moe.num_experts + (kw.get("redundant_experts") or 0) if spec.moe is not None else 0
    layouts = [(t, p, 1, 1) for t in range(1, min(gpus, cluster.gpus_per_node) + 1) if tp_ok(spec, t)
               for p in (1, 2, 4, 8) if p == 1 or (t * p < gpus and p <= spec.num_layers)]
    layouts += [(t, 1, n, n // t) for n, t in wide_ep_layouts(spec, cluster, gpus, experts, cluster.gpus_per_node,
                                                                       divides=False, attention_tp=engine.attention_dp_tp)]
    cases = {}
    for tp, pp, ep, dpa in layouts:
        try:
            c = prepare(spec, cluster, engine, tp=tp, pp=pp, **moe_kw(kw, ep, dpa))
        except ShardlabError as e:
            reject(rejected, errors, e)
            continue
        if c.blocks.num_blocks > 0 and c.gpus <= gpus:
            cases[(tp, pp, ep, dpa)] = c
    return cases


def usd_per_hour(catalog, pools: list[tuple[str, int]], spot: bool = False, _memo: dict | None = None) -> float | None:
    """Price per hour of ``pools`` [(GPU id, GPUs)] from the price catalog, or None when a kind has no price.
    ``_memo`` (a dict the caller keeps): each kind's price looked up once across many calls."""
    from shardlab.export.build import price_notes

    memo = {} if _memo is None else _memo
    total = 0.0
    for gpu, n in pools:
        if gpu not in memo:
            memo[gpu] = price_notes(catalog, gpu, spot).get("usd_per_gpu_hour")
        p = memo[gpu]
        if p is None:
            return None
        total += p * n
    return total


def _level(x):
    """``x`` rounded to a part in 10⁹ of its largest value: ties within that rank as ties."""
    import numpy as np

    top = float(np.max(x)) if len(x) else 0.0
    return np.round(x / top * 1e9) if top > 0 else x


def disagg_capacity(args, spec, cluster, gpus: int, prec, engine, slo) -> tuple[list[dict], dict, bool]:
    """The best disaggregated layouts of ``gpus`` GPUs (``serving.disagg_split.search_splits``: every split at its
    highest request rate within the SLO's means), the ``args.top`` best first; counts of what was rejected; and
    whether they rank per dollar. They rank by goodput per GPU, or, with ``--prefill-gpu KIND`` of another kind
    (the prefill pool's replicas on that kind: its server, links and peaks; the decode pool's on ``--gpu``) and a
    catalog price for both kinds, by output tokens per dollar: a GPU of one kind is not one of the other."""
    import numpy as np

    from shardlab.catalog import get_catalog
    from shardlab.cli.disagg_cmds import prefill_cluster
    from shardlab.cli.inference_args import case_kw
    from shardlab.serving.disagg_split import search_splits

    catalog = get_catalog(args.catalog)
    kw = dict(precision=prec, prompt_len=args.prompt_len, output_len=args.output_len,
              prefix_hit_rate=args.prefix_hit_rate, **case_kw(args, spec, catalog))
    if kw.get("speculation"):
        return [], {"speculative decoding with disaggregation is not modelled": 1}, False
    rejected, errors = {}, {}
    cases = pool_cases(args, spec, cluster, gpus, engine, kw, rejected, errors)
    pre_cluster, pre_prec = prefill_cluster(args, catalog, cluster, prec, gpus)
    pre_cases = cases if pre_cluster is cluster else pool_cases(args, spec, pre_cluster, gpus, engine,
                                                                {**kw, "precision": pre_prec}, rejected, errors)
    sp = search_splits(cases, gpus, cluster.gpus_per_node, slo.ttft_s, slo.tpot_s, prefill_cases=pre_cases)
    if not len(sp):
        return [], rejected, False
    O = float(args.output_len)
    spot = getattr(args, "spot", False)
    prices: dict = {}
    kinds = [(pre.cluster.accelerator.id, dec.cluster.accelerator.id) for pre, dec in sp.pairs]
    per_gpu = {g: usd_per_hour(catalog, [(g, 1)], spot, prices) for pair in kinds for g in pair}
    priced = all(v is not None for v in per_gpu.values())
    usd = None
    if priced:   # each pool's GPUs at its kind's price, summed as usd_per_hour sums them
        size = np.array([[pre.gpus, dec.gpus] for pre, dec in sp.pairs], dtype=float)[sp.pair]
        price = np.array([[per_gpu[a], per_gpu[b]] for a, b in kinds])[sp.pair]
        usd = 0.0 + price[:, 0] * (sp.prefill_replicas * size[:, 0]) + price[:, 1] * (sp.decode_replicas * size[:, 1])
    goodput = sp.rate * O / gpus
    # best goodput first (equal within a part in 10⁹: the bisections' last digits are noise), then the lower TPOT,
    # the lower TTFT, then as the search ranked them (highest rate, then the order tried)
    order = np.lexsort((np.arange(len(sp)), -sp.rate, sp.ttft_s, sp.tpot_s, -_level(goodput)))
    per_usd = bool(priced and pre_cluster.accelerator.id != cluster.accelerator.id)
    if per_usd:
        per = sp.rate * O * 3600 / usd
        rank = np.empty(len(sp), dtype=int)
        rank[order] = np.arange(len(sp))
        order = np.lexsort((rank, sp.ttft_s, sp.tpot_s, -_level(per)))
    out = []
    for i in order[: max(1, int(args.top))]:
        d = sp.case(i)
        pre, dec = d.prefill, d.decode
        rate, tpot = float(sp.rate[i]), float(sp.tpot_s[i])
        u = float(usd[i]) if usd is not None else None
        out.append({"prefill": {"gpus": d.prefill_gpus, "gpu": pre.cluster.accelerator.id, "replicas": d.prefill_replicas,
                                "tp": pre.tp, "pp": pre.pp, "layout": pre.layout_label, "ep": pre.ep,
                                "dp_attention": pre.attention_dp},
                    "decode": {"gpus": d.decode_gpus, "gpu": dec.cluster.accelerator.id, "replicas": d.decode_replicas,
                               "tp": dec.tp, "pp": dec.pp, "layout": dec.layout_label, "capacity_per_replica": dec.capacity,
                               "ep": dec.ep, "dp_attention": dec.attention_dp,
                               "kv_blocks_per_gpu": int(dec.blocks.num_blocks)},
                    "gpus": gpus, "kv_transfer_s": d.kv_transfer_s, "kv_link": d.link,
                    "kv_transfer_bytes_per_rank": d.kv_transfer_bytes,
                    "max_request_rate": rate, "meets_slo": rate > 0,
                    "goodput_tokens_per_s_per_gpu": rate * O / gpus,
                    "usd_per_hour": u, "output_tokens_per_usd": rate * O * 3600 / u if u else None,
                    "ttft_s": float(sp.ttft_s[i]), "tpot_s": tpot,
                    "tokens_per_s_per_user": 1.0 / tpot if tpot > 0 else None,
                    "prefill_utilization": float(sp.prefill_utilization[i]),
                    "saturation_rate": float(sp.saturation_rate[i]), "_d": d})
    return out, rejected, per_usd
