"""`plan FILE`: the file's own layout beside the search's best: a training file's step time beside the best plan's,
and a saved serving plan's layout at its capacity beside the best's.

The capacity search ranks layouts by goodput per GPU at the most requests/s their SLO allows. The file's layout (an
aggregated replica set, or two pools) gets the same figure here: its capacity under the plan's targets in the plan's
statistic (``serve_capacity.layout_capacity``: the steady state's means for p50, the seed-fixed simulation for p99;
``serving.disagg.max_rate_within`` for two pools, which the plan also ranks at the means), so that a file planned
under older data, another engine version or by hand says how far it is from what the search finds now."""

from __future__ import annotations

import copy

LAYOUT_KEYS = ("tp", "pp", "ep", "dp_attention", "replicas", "max_num_seqs", "disaggregated", "prefill_tp",
               "prefill_pp", "prefill_gpu")
"""The job file's fields that name a serving layout (kept by ``from_file.apply_import`` before plan drops them)."""


def _find(fl: dict, doc: dict) -> tuple[dict | None, bool]:
    """(the plan's own entry for the file's layout, or None where its table does not list it; whether that entry is
    the layout the plan recommends)."""
    comp = doc.get("comparison") or {}
    dis = doc.get("disaggregated") or []
    split_wins = comp.get("winner") == "disaggregated" and bool(dis)
    if fl.get("disaggregated"):
        for i, w in enumerate(dis):
            pre, dec = w["prefill"], w["decode"]
            if (fl["disaggregated"] == f"{pre['gpus']}:{dec['gpus']}" and fl.get("prefill_tp") == pre["tp"]
                    and (fl.get("prefill_pp") or 1) == pre.get("pp", 1) and (fl.get("tp") or 1) == dec["tp"]
                    and (fl.get("pp") or 1) == dec.get("pp", 1) and (fl.get("ep") or 1) == dec.get("ep", 1)
                    and (fl.get("dp_attention") or 1) == dec.get("dp_attention", 1)):
                return w, split_wins and i == 0
        return None, False
    for i, p in enumerate(doc.get("plans") or []):
        if all((fl.get(k) or 1) == (p.get(k) or 1) for k in ("tp", "pp", "ep", "dp_attention", "replicas")) \
                and fl.get("max_num_seqs") in (None, p.get("max_num_seqs")):
            return p, not split_wins and i == 0
    return None, False


def _file_goodput(args, fl: dict, doc: dict) -> tuple[float, str]:
    """(output tokens/s per GPU at the file's layout's capacity under the plan's targets, its label)."""
    from shardlab.catalog import get_catalog
    from shardlab.cli.inference_args import case_kw, engine_from_args, precision_from_args, spec_cluster
    from shardlab.serving.case import prepare

    catalog = get_catalog(args.catalog)
    ns = copy.copy(args)
    ns.tp, ns.pp = int(fl.get("tp") or 1), int(fl.get("pp") or 1)
    ns.ep = int(fl.get("ep") or 1)
    ns.dp_attention = (fl.get("dp_attention") or 1) > 1
    ns.max_num_seqs = fl.get("max_num_seqs")
    O = float(args.output_len)
    if fl.get("disaggregated"):
        from shardlab.cli.disagg_cmds import build, parse_pools
        from shardlab.serving.disagg import max_rate_within

        pools = parse_pools(fl["disaggregated"])
        ns.disaggregated, ns.prefill_tp, ns.prefill_pp = fl["disaggregated"], fl.get("prefill_tp"), fl.get("prefill_pp")
        ns.prefill_gpu = fl.get("prefill_gpu")
        spec, cluster = spec_cluster(ns, catalog, sum(pools))
        prec = precision_from_args(ns, cluster.accelerator, spec)
        d = build(ns, spec, cluster, prec, engine_from_args(ns), catalog, pools)
        rate = max_rate_within(d, args.ttft_slo, args.tpot_slo)
        return rate * O / d.gpus, f"{fl['disaggregated']} prefill:decode GPUs, decode {d.decode.layout_label}"
    from shardlab.cli.serve_capacity import layout_capacity

    spec, cluster = spec_cluster(ns, catalog, int(doc["gpus"]))
    prec = precision_from_args(ns, cluster.accelerator, spec)
    case = prepare(spec, cluster, engine_from_args(ns), tp=ns.tp, pp=ns.pp, precision=prec,
                   prompt_len=args.prompt_len, output_len=args.output_len, prefix_hit_rate=args.prefix_hit_rate,
                   **case_kw(ns, spec, catalog))
    cap = layout_capacity(case, args.ttft_slo, args.tpot_slo, (doc.get("slo") or {}).get("percentile") or "p50",
                          seed=args.seed)
    reps = int(fl.get("replicas") or 1)
    return cap["max_request_rate"] * O / case.gpus, f"{reps} × {case.layout_label}"


def serve_beside_best(args, doc: dict) -> str:
    """The line `plan FILE` adds for a serving file searched again under its targets (and ``doc['imported_estimate']``),
    or '' where the plan answered another question (a load, a --target-rate). The file's layout takes the plan's own
    figure where the plan's table lists it, else it is priced here."""
    from shardlab.errors import ShardlabError

    fl = getattr(args, "file_serving_layout", None)
    if not fl or not isinstance(doc.get("capacity"), dict) or doc.get("target") is not None:
        return ""
    comp = doc.get("comparison") or {}
    if comp.get("winner") == "disaggregated" and doc.get("disaggregated"):
        best = float(comp["disaggregated_goodput_tokens_per_s_per_gpu"])
    else:
        best = float(doc["capacity"]["goodput_tokens_per_s_per_gpu"] or 0.0)
    entry, is_best = _find(fl, doc)
    out = {"layout": fl, "is_best": is_best, "best_goodput_tokens_per_s_per_gpu": best}
    if is_best:
        doc["imported_estimate"] = out
        return "your file's layout: the plan's best again"
    how = "the plan's table"
    if entry is not None:
        mine = float(entry["goodput_tokens_per_s_per_gpu"] or 0.0)
        label = (f"{entry['replicas']} × {entry['replica_layout']}" if "replica_layout" in entry else
                 f"{fl['disaggregated']} prefill:decode GPUs, decode {entry['decode']['layout']}")
    else:
        try:
            mine, label = _file_goodput(args, fl, doc)
        except ShardlabError as e:
            doc["imported_estimate"] = {**out, "error": str(e)}
            return f"your file's layout: cannot be priced under these targets ({e})"
        p99 = (doc.get("slo") or {}).get("percentile") == "p99" and not fl.get("disaggregated")
        how = ("priced here: its own p99 search, whose longer runs find a little less than the plan's "
               "(docs/capacity.md)" if p99 else "priced here")
    doc["imported_estimate"] = {**out, "goodput_tokens_per_s_per_gpu": mine, "figure": how}
    share = f"{mine / best:.2f}× the best's" if best > 0 else "the best meets nothing"
    return (f"your file's layout ({label}): {mine:,.0f} output tokens/s per GPU within the targets ({how}); the best "
            f"plan: {best:,.0f} ({share})")


def beside_best(args, doc: dict) -> str:
    """plan --from: the imported layout's own estimate beside the search's winner."""
    from shardlab.cli.plan_cmds import _catalog, training_estimate_from_args
    from shardlab.errors import ShardlabError

    if args.inference:
        return serve_beside_best(args, doc)
    if not doc.get("plans"):
        return ""
    args.gpus = args.gpus or doc["gpus"]
    try:
        mine = training_estimate_from_args(args, _catalog(args))
    except ShardlabError as e:
        return f"your file's layout: cannot be estimated on {doc['gpus']} GPUs ({e})"
    best = doc["plans"][0]["step_time_s"]
    doc["imported_estimate"] = {"layout": mine.layout.to_dict(), "step_time_s": mine.step_time_s,
                                "fits": mine.memory.fits if hasattr(mine, "memory") else None,
                                "best_step_time_s": best}
    return (f"your file's layout: {mine.step_time_s:.2f} s/step; the best plan: {best:.2f} s/step "
            f"({mine.step_time_s / best:.2f}× the best's time)")
