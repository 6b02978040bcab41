"""`shardlab estimate --inference --serve --disaggregated P:D`: a prefill pool and a decode pool (serving.disagg)."""

from __future__ import annotations

import math
import re

_POOLS = re.compile(r"^\s*(\d{1,6})\s*:\s*(\d{1,6})\s*$")


def parse_pools(text: str) -> tuple[int, int]:
    """(prefill GPUs, decode GPUs) of a --disaggregated P:D value, or one line saying what is wrong."""
    from shardlab.errors import ShardlabError

    m = _POOLS.match(text or "")
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise ShardlabError(f"--disaggregated takes P:D, the prefill and decode pools' GPU counts (e.g. 8:8), got "
                            f"{text!r}")
    return int(m.group(1)), int(m.group(2))


def check_disagg_flags(args) -> None:
    """One line for flags a disaggregated estimate cannot take."""
    from shardlab.errors import ShardlabError

    if getattr(args, "prefill_tp", None) is not None and not args.disaggregated:
        raise ShardlabError("--prefill-tp sets the prefill pool's TP of --disaggregated P:D: add --disaggregated")
    if getattr(args, "prefill_pp", None) is not None and not args.disaggregated:
        raise ShardlabError("--prefill-pp sets the prefill pool's pipeline stages of --disaggregated P:D: add "
                            "--disaggregated")
    if getattr(args, "prefill_gpu", None) is not None and not args.disaggregated:
        raise ShardlabError("--prefill-gpu sets the prefill pool's GPU kind of --disaggregated P:D: add --disaggregated")
    if not args.disaggregated:
        return
    if not args.serve:
        raise ShardlabError("--disaggregated describes serving under load: add --serve")
    if getattr(args, "speculative_tokens", None):
        raise ShardlabError("--speculative-tokens with --disaggregated is not modelled: drop one of them")


def build(args, spec, cluster, prec, engine, catalog, pools: tuple[int, int]):
    """The DisaggCase of the flags: prefill replicas of --prefill-tp (default --tp), decode replicas of --tp."""
    from shardlab.cli.inference_args import case_kw
    from shardlab.serving.case import prepare
    from shardlab.serving.disagg import make_disagg

    kw = dict(prompt_len=args.prompt_len, output_len=args.output_len, prefix_hit_rate=args.prefix_hit_rate,
              **case_kw(args, spec, catalog))
    pre_cluster, pre_prec = prefill_cluster(args, catalog, cluster, prec, pools[0])
    pre = prepare(spec, pre_cluster, engine, tp=args.prefill_tp or args.tp, pp=args.prefill_pp or args.pp,
                  precision=pre_prec, **kw)
    dec = prepare(spec, cluster, engine, tp=args.tp, pp=args.pp, precision=prec, **kw)
    return make_disagg(pre, dec, *pools)


def prefill_cluster(args, catalog, cluster, prec, gpus: int):
    """(cluster, precision) of the prefill pool: --prefill-gpu's kind in its usual server (its own links and
    peaks), else the decode pool's."""
    from shardlab.serving.precision import make_precision
    from shardlab.specs.hardware import Cluster

    kind = getattr(args, "prefill_gpu", None)
    if not kind:
        return cluster, prec
    acc = catalog.accelerator(kind)
    if acc.id == cluster.accelerator.id:
        return cluster, prec
    c = Cluster(accelerator=acc, num_gpus=gpus, gpus_per_node=acc.system["gpus_per_node"],
                intra_link=catalog.link(acc.system["intra_link"]), inter_link=catalog.link(acc.system["inter_link"]))
    # the decode pool's weights and KV types (the checkpoint's when --weights is not given), this GPU's GEMM peaks
    return c, make_precision(prec.weights, prec.group_size, prec.kv_cache, args.activations, acc.peak_tflops,
                             from_checkpoint=prec.weights_from_checkpoint)


def export_job(args, cat, spec):
    """The LaunchJob of `export --to ENGINE --inference --disaggregated P:D`: the decode replicas' layout, the prefill
    TP, each decode server's sequences (its KV capacity, or --max-num-seqs) and KV blocks from the serving model."""
    from shardlab.cli.common import cluster_from_args
    from shardlab.cli.inference_args import precision_from_args
    from shardlab.errors import ShardlabError
    from shardlab.cli.export_cmds import serving_not_carried
    from shardlab.export.build import price_notes
    from shardlab.export.job import LaunchJob, Pools, Serve
    from shardlab.layout import Layout
    from shardlab.layout_checks import validate

    pools = parse_pools(args.disaggregated)
    if args.gpus and args.gpus != sum(pools):
        raise ShardlabError(f"--gpus {args.gpus} is not the pools' {pools[0]} + {pools[1]} GPUs of --disaggregated; "
                            f"drop --gpus")
    cluster = cluster_from_args(args, cat, sum(pools))
    prec = precision_from_args(args, cluster.accelerator, spec)
    from shardlab.cli.export_cmds import serving_engine

    engine, fw = serving_engine(args)
    d = build(args, spec, cluster, prec, engine, cat, pools)
    dec = d.decode
    per = max(1, dec.capacity // (dec.pp * dec.attention_dp))   # --max-num-seqs is per scheduler (serving.case)
    cap = min(per, args.max_num_seqs or per)
    serve = Serve(cap, args.prompt_len, args.output_len, 1, kv_blocks=int(dec.blocks.num_blocks),
                  gpu_memory_utilization=engine.gpu_memory_utilization,
                  kv_cache_dtype="fp8" if prec.kv_cache == "fp8" else "auto", weights=prec.weights,
                  group_size=prec.group_size, activations=prec.activations,
                  weights_from_checkpoint=prec.weights_from_checkpoint, ep=dec.ep,
                  dp_attention=dec.attention_dp,
                  pools=Pools(pools[0], pools[1], d.prefill.tp,
                              None if d.prefill.cluster.accelerator.id == cluster.accelerator.id
                              else d.prefill.cluster.accelerator.id, d.prefill.pp),
                  load=getattr(args, "file_load", None))
    return LaunchJob(spec.name, validate(Layout(tp=dec.tp, pp=dec.pp), spec), args.prompt_len + args.output_len, cap,
                     "fp16-mixed" if prec.weights == "fp16" else args.precision, gpu=cluster.accelerator.id,
                     gpus_per_node=cluster.gpus_per_node, framework=fw,
                     serve=serve, notes={**price_notes(cat, cluster.accelerator.id, getattr(args, "spot", False)),
                                         **serving_not_carried(args)})


def aggregated_line(d, res: dict, rate: float) -> tuple[dict | None, str]:
    """The same GPUs serving the same rate aggregated (replicas of the decode pool's layout), steady state."""
    from shardlab.serving.steady import arrays, fluid

    reps = d.gpus // d.decode.gpus
    if reps < 1 or d.gpus % d.decode.gpus:
        return None, ""
    agg = {k: float(v[0]) for k, v in fluid(arrays([d.decode]), [2], [rate / reps]).items()}
    over = bool(agg["overloaded"])
    doc = {"replicas": reps, "layout": d.decode.layout_label, "ttft_s": None if over else agg["ttft_s"],
           "tpot_s": agg["tpot_s"], "overloaded": over}
    mixed = d.prefill.cluster.accelerator.id != d.decode.cluster.accelerator.id
    where = f"{d.gpus} {d.decode.cluster.accelerator.id} GPUs" if mixed else f"the same {d.gpus} GPUs"
    words = (f"aggregated instead ({reps} × {d.decode.layout_label} on {where}, the same "
             f"{rate:.3g} requests/s): " + ("overloaded" if over else
                                           f"TTFT {1e3 * agg['ttft_s']:,.1f} ms, TPOT {1e3 * agg['tpot_s']:,.2f} ms")
             + f" against {1e3 * res['ttft_s']:,.1f} ms and {1e3 * res['tpot_s']:,.2f} ms disaggregated"
             if math.isfinite(res["ttft_s"]) else "")
    return doc, words


def estimate_disagg(args, spec, cluster, prec, engine):
    from shardlab.catalog import get_catalog
    from shardlab.cli.inference_cmds import finite
    from shardlab.cli.serve_cmds import _load, _ms, _with_ms, sim_notes
    from shardlab.render.table import table
    from shardlab.serving.disagg import steady_concurrency, steady_rate
    from shardlab.serving.disagg_sim import simulate_disagg
    from shardlab.serving.moe import ep_caveat

    pools = parse_pools(args.disaggregated)
    d = build(args, spec, cluster, prec, engine, get_catalog(args.catalog), pools)
    if args.concurrency is None and args.arrival_rate is None:     # no load: as many clients as the decode pool holds
        args.concurrency = d.decode_replicas * d.decode.capacity
    mode, load, words = _load(args)
    res = steady_concurrency(d, int(load)) if mode == 1 else steady_rate(d, load)
    sim = simulate_disagg(d, concurrency=args.concurrency, arrival_rate=args.arrival_rate, requests=args.requests,
                          seed=args.seed, lifetime_s=res["e2e_s"] if math.isfinite(res["e2e_s"]) else 0.0)
    agg_doc, agg_words = aggregated_line(d, res, res["requests_per_s"])
    sat = res["saturation_rate"]
    from shardlab.cli.serve_cmds import slo_verdict, slo_words

    slo = slo_verdict(args, res, sim)
    doc = {"model": spec.name, "gpu": cluster.accelerator.id, "gpus": d.gpus, "engine": engine.id,
           "engine_version": engine.version, "precision": prec.label, "prompt_len": args.prompt_len,
           "output_len": args.output_len, "load": {"concurrency": args.concurrency, "arrival_rate": args.arrival_rate},
           "disaggregated": d.to_dict(), "kv_transfer_s": d.kv_transfer_s, "steady_state": res,
           "simulation": sim.to_dict(), "saturation_rate": sat, "aggregated": agg_doc, "slo": slo,
           **({"notes": [ep_caveat()]} if d.decode.attention_dp > 1 else {})}
    mixed = d.prefill.cluster.accelerator.id != cluster.accelerator.id
    c = lambda case, n: [n * case.gpus, *([case.cluster.accelerator.id] if mixed else []), n, case.layout_label,  # noqa: E731
                         case.capacity, f"{case.blocks.weights_bytes / 2**30:.2f}", f"{case.blocks.num_blocks:,}"]
    pools_t = table(["pool", "GPUs", *(["GPU"] if mixed else []), "replicas", "layout", "sequences/replica",
                     "weights GiB/GPU", "KV blocks/GPU"],
                    [["prefill", *c(d.prefill, d.prefill_replicas)], ["decode", *c(d.decode, d.decode_replicas)]])
    on = (f"{d.prefill_gpus} × {d.prefill.cluster.accelerator.id} + {d.decode_gpus} × {cluster.accelerator.id}"
          if mixed else f"{d.gpus} × {cluster.accelerator.id}")
    per_tok = d.kv_transfer_bytes / max(args.prompt_len, 1)
    link = d.prefill.cluster.intra_link if d.link == "intra" else d.prefill.cluster.inter_link
    rows = [["TTFT (ms)", _ms(res["ttft_s"]), _ms(sim.ttft_s.mean), _ms(sim.ttft_s.p50), _ms(sim.ttft_s.p99)],
            ["TPOT (ms)", _ms(res["tpot_s"]), _ms(sim.tpot_s.mean), _ms(sim.tpot_s.p50), _ms(sim.tpot_s.p99)],
            ["request latency (ms)", _ms(res["e2e_s"]), _ms(sim.e2e_s.mean), _ms(sim.e2e_s.p50), _ms(sim.e2e_s.p99)],
            ["output tokens/s", f"{res['output_tokens_per_s']:,.0f}", f"{sim.output_tokens_per_s:,.0f}", "", ""],
            ["requests/s", f"{res['requests_per_s']:,.2f}", f"{sim.requests_per_s:,.2f}", "", ""]]
    lines = [
        f"shardlab estimate --inference --serve --disaggregated {pools[0]}:{pools[1]}: {spec.name} on {on}, "
        f"{engine.id} ({engine.name}, version {engine.version})",
        f"workload: {words}, prompt {args.prompt_len} + output {args.output_len} tokens", "",
        pools_t, "",
        f"KV transfer per request: {args.prompt_len:,} prompt tokens × {per_tok:,.0f} B/token on each prefill rank = "
        f"{d.kv_transfer_bytes / 1e6:,.1f} MB, over {'NVLink (both pools in one node)' if d.link == 'intra' else 'the NIC'}"
        f" ({link.name}) = {1e3 * d.kv_transfer_s:,.2f} ms (α–β send-recv, after the prefill)", "",
        table(["", "mean (steady state)", "mean (simulated)", "p50", "p99"], rows,
              title=f"latency and throughput (simulation: {sim.requests} requests measured, seed {args.seed})"),
        "",
        f"prefill pool {100 * res['prefill_utilization']:.0f}% busy (one prompt {1e3 * res['prefill_s']:,.1f} ms, "
        f"queue {_with_ms(res['prefill_wait_s'])}, M/D/1), KV link {100 * res['kv_link_utilization']:.1f}% busy, decode "
        f"replicas at {res['decode_batch']:,.1f} sequences each; the pools saturate at {sat:,.2f} requests/s",
        *([agg_words] if agg_words else []),
        *([f"SLO {'met' if slo['met'] else 'MISSED'} at this load{slo_words(slo)}"] if args.ttft_slo or args.tpot_slo
          else []),
        *sim_notes(sim, args.concurrency),
        *([ep_caveat()] if d.decode.attention_dp > 1 else []),
        "", "disaggregated prefill/decode (DistServe, Zhong et al. 2024): TTFT = queue + prefill + KV transfer + the "
            "first decode step; TPOT from decode steps that carry no prefill (serving.disagg; percentiles: "
            "serving.disagg_sim)"]
    return finite(doc), "\n".join(lines)


def disagg_section(args, spec, cluster, gpus: int, prec, engine, slo, capacity: dict) -> dict:
    """The capacity search's disaggregated part: ``disaggregated`` (the layouts, best goodput per GPU first, their
    pools and KV transfer), ``best_disaggregated_simulated`` and ``comparison`` with the aggregated winner. With a
    prefill pool of another GPU kind (``--prefill-gpu``) a GPU of one kind is not one of the other: where the catalog
    prices both, the splits rank, and the comparison runs, per dollar (output tokens per USD)."""
    from shardlab.catalog import get_catalog
    from shardlab.cli.disagg_search import disagg_capacity, usd_per_hour
    from shardlab.serving.disagg_sim import simulate_disagg
    from shardlab.serving.moe import two_kinds

    found, rejected, per_usd = disagg_capacity(args, spec, cluster, gpus, prec, engine, slo)
    catalog = get_catalog(args.catalog)
    agg = capacity.get("goodput_tokens_per_s_per_gpu") or 0.0
    agg_usd = usd_per_hour(catalog, [(cluster.accelerator.id, gpus)], getattr(args, "spot", False))
    agg_per_usd = agg * gpus * 3600 / agg_usd if agg_usd else None
    mixed = two_kinds(found[:1])
    per_usd = per_usd and agg_per_usd is not None
    sim = None
    if found and found[0]["meets_slo"] and slo.percentile == "p99":     # the means rank; p99 checks the best by simulation
        best = found[0]
        sim = simulate_disagg(best["_d"], arrival_rate=best["max_request_rate"], seed=args.seed,
                              requests=args.requests, lifetime_s=best["ttft_s"]
                              + (args.output_len - 1) * best["tpot_s"])
    for p in found:
        p.pop("_d")
    dis = found[0]["goodput_tokens_per_s_per_gpu"] if found else 0.0
    agg_b, dis_b = (agg_per_usd, found[0]["output_tokens_per_usd"]) if per_usd else (agg, dis)
    winner = "disaggregated" if dis_b > agg_b else "aggregated" if agg_b > 0 else None
    unpriced = [g for g in dict.fromkeys((found[0]["prefill"]["gpu"], cluster.accelerator.id))
                if usd_per_hour(catalog, [(g, 1)]) is None] if mixed and not per_usd else []
    return {"disaggregated": found[: args.top], "disaggregated_rejected": rejected,
            "best_disaggregated_simulated": sim.to_dict() if sim else None,
            "comparison": {"aggregated_goodput_tokens_per_s_per_gpu": agg,
                           "disaggregated_goodput_tokens_per_s_per_gpu": dis, "winner": winner,
                           "ratio": dis_b / agg_b if agg_b > 0 else None, "statistic": "mean",
                           "basis": "per dollar" if per_usd else "per GPU",
                           "aggregated_usd_per_hour": agg_usd, "aggregated_output_tokens_per_usd": agg_per_usd,
                           "disaggregated_usd_per_hour": found[0]["usd_per_hour"] if found else None,
                           "disaggregated_output_tokens_per_usd": found[0]["output_tokens_per_usd"] if found else None,
                           **({"note": f"no catalog price for {' or '.join(unpriced)}: two GPU kinds compared per GPU "
                                       f"(--catalog FILE adds prices)"} if unpriced else {})}}


def disagg_text(doc: dict, args) -> list[str]:
    """The capacity report's disaggregated table and verdict (empty when the search did not run)."""
    from shardlab.cli.serve_cmds import _ms
    from shardlab.render.table import table
    from shardlab.serving.moe import pool_label as pool_words, two_kinds

    if "disaggregated" not in doc:
        return []
    found = doc["disaggregated"]
    if not found:
        return ["disaggregated prefill/decode: no layout of these GPUs holds the model in both pools", ""]
    c = doc["comparison"]
    dollars = c.get("basis") == "per dollar"
    kind = (lambda pool: f" × {pool['gpu']}") if two_kinds(found) else (lambda pool: "")
    rows = [[f"{p['prefill']['gpus']}{kind(p['prefill'])} ({pool_words(p['prefill'])})",
             f"{p['decode']['gpus']}{kind(p['decode'])} ({pool_words(p['decode'])})",
             f"{p['max_request_rate']:,.2f}", _ms(p["ttft_s"]), _ms(p["tpot_s"]), f"{p['goodput_tokens_per_s_per_gpu']:,.0f}",
             _ms(p["kv_transfer_s"]), f"{100 * p['prefill_utilization']:.0f}%"]
            + ([f"{p['output_tokens_per_usd']:,.0f}"] if dollars else []) for p in found]
    best = (f"{c['disaggregated_output_tokens_per_usd']:,.0f} output tokens per dollar against "
            f"{c['aggregated_output_tokens_per_usd']:,.0f} for the aggregated winner on {doc['gpu']} "
            f"(${c['disaggregated_usd_per_hour']:,.2f} and ${c['aggregated_usd_per_hour']:,.2f} an hour; two GPU "
            f"kinds compare per dollar, prices from the catalog)" if dollars else
            f"{c['disaggregated_goodput_tokens_per_s_per_gpu']:,.0f} output tokens/s per GPU "
            f"against {c['aggregated_goodput_tokens_per_s_per_gpu']:,.0f} aggregated")
    verdict = ("no disaggregated layout meets the SLO at any load" if not found[0]["meets_slo"] else
               (f"{c['note']}; " if c.get("note") else "") + f"best disaggregated: {best}: "
               + ("about the same (within 5%): splitting buys nothing here"
                  + ("; the split, ahead by that little, is the plan's winner, which --export and --save write"
                     if c["winner"] == "disaggregated" else "") if abs((c["ratio"] or 0) - 1) <= 0.05 else
                  "splitting the phases pays here: the plan's winner, over the best aggregated layout recommended "
                  "above (--export and --save write this split)" if c["winner"] == "disaggregated" else
                  "keep prefill and decode together here"))
    sim = doc.get("best_disaggregated_simulated")
    one = ("one layout (TP × PP, or EP over attention ranks, the same in both pools)"
           if any(p["decode"].get("dp_attention", 1) > 1 for p in found) else "one TP × PP")
    pools = (f"a prefill pool of {found[0]['prefill']['gpu']} and a decode pool of {found[0]['decode']['gpu']} on "
             "nodes of their own (Splitwise)" if two_kinds(found[:1]) else
             "a prefill pool and a decode pool of the same GPUs")
    return [f"disaggregated prefill/decode (DistServe): {pools}, each "
            f"pool's replicas at {one}, the prompt's KV sent between them; capacity = the largest Poisson rate whose "
            "steady-state mean TTFT and TPOT meet the targets (serving.disagg)",
            table(["prefill GPUs", "decode GPUs", "max req/s", "TTFT ms", "TPOT ms", "tok/s/GPU", "KV send ms",
                   "prefill busy"] + (["tokens/$"] if dollars else []), rows),
            verdict + (f"; simulated at its capacity ({sim['requests']} requests): TTFT p99 {_ms(sim['ttft_s']['p99'])} "
                       f"ms, TPOT p99 {_ms(sim['tpot_s']['p99'])} ms" if sim else ""), ""]
