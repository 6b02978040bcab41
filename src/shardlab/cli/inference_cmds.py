"""The inference paths of `shardlab estimate|plan --inference` (static batch, or --serve under load) and
`shardlab validate --inference`; the inference flags and the settings they give are in ``cli.inference_args``."""

from __future__ import annotations

import math

from shardlab.cli.inference_args import (case_kw, check_serve_flags, engine_from_args, precision_from_args,
                                          replica_gpus, serving_settings, spec_cluster)


def finite(x):
    """A JSON-safe copy: inf/nan floats become None (one valid JSON document, no Infinity)."""
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def estimate_inference_cmd(args, catalog):
    from shardlab.errors import ShardlabError

    from shardlab.cli.disagg_cmds import check_disagg_flags, parse_pools

    check_disagg_flags(args)
    n = sum(parse_pools(args.disaggregated)) if args.disaggregated else replica_gpus(args)
    ignored = [f for f, bad in (("--cp", args.cp != 1), ("--dp", args.dp not in (None, 1)),
                                ("--zero", args.zero != 0), ("--gpus", args.gpus not in (None, n)))
               if bad]
    if ignored:
        raise ShardlabError(f"{', '.join(ignored)} do(es) not apply to --inference, which estimates one replica of "
                            f"--tp × --pp GPUs ({n} here; × ep/tp with --dp-attention); for replicas across more GPUs use "
                            f"`shardlab plan --inference --gpus N`")
    check_serve_flags(args)
    spec, cluster = spec_cluster(args, catalog, n)
    prec, engine = precision_from_args(args, cluster.accelerator, spec), engine_from_args(args)
    if args.serve and args.disaggregated:
        from shardlab.cli.disagg_cmds import estimate_disagg

        return estimate_disagg(args, spec, cluster, prec, engine)
    if args.serve:
        from shardlab.cli.serve_cmds import estimate_serve

        return estimate_serve(args, spec, cluster, prec, engine)
    return _estimate_static(args, spec, cluster, prec, engine)


def _estimate_static(args, spec, cluster, prec, engine):
    from shardlab.cli.serve_cmds import speculation_line
    from shardlab.estimate.inference import estimate_inference, tp_versus_replicas
    from shardlab.render.table import kv_lines

    from shardlab.catalog import get_catalog

    kw = dict(prompt_len=args.prompt_len, output_len=args.output_len, precision=prec, engine=engine,
              prefix_hit_rate=args.prefix_hit_rate, **case_kw(args, spec, get_catalog(args.catalog)))
    per_mb = -(-args.batch // args.pp)           # --batch is what is in flight, as plan reads it: pp micro-batches
    est = estimate_inference(spec, cluster, tp=args.tp, pp=args.pp, batch=per_mb, **kw)
    if args.batch % args.pp:
        est.notes.append(f"--batch {args.batch} over {args.pp} pipeline micro-batches: {args.pp} of {per_mb} "
                         f"({per_mb * args.pp} in flight)")
    cmp = tp_versus_replicas(spec, cluster, tp=args.tp, batch=args.batch, **kw) if args.tp > 1 and args.pp == 1 else None
    doc = est.to_dict()
    doc["tp_vs_replicas"] = cmp
    doc["speculation"] = est.case.speculation.to_dict() if est.case.speculation else None
    gib = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
    acc, b = cluster.accelerator, est.case.blocks
    seq = est.full_length_tokens
    lines = [f"shardlab estimate --inference: {spec.name} on {est.case.layout_label} {acc.id}, {est.pp} micro-batch(es) "
             f"of {per_mb}, prompt {args.prompt_len} + output {args.output_len} tokens",
             f"precision: {prec.label}; engine: {engine.id} ({engine.name}, version {engine.version})",
             *([speculation_line(est.case.speculation)] if est.case.speculation else []), "",
             kv_lines([("weights per GPU", f"{gib(est.weights_bytes)} (exact: this rank's shard; block matrices at "
                                           f"{prec.weights}, scales/zero points included; head and embeddings 16-bit)"),
                       ("KV cache per GPU", f"{gib(est.kv_cache_bytes)} = "
                                            + (f"({est.in_flight_per_gpu} sequences × {est.own_tokens:,} own tokens + a "
                                               f"{est.shared_prefix_tokens:,}-token cached prefix, held once)"
                                               if est.case.prefix_hit_rate else f"{est.in_flight_per_gpu} sequences × {seq} tokens")
                                            + f" × {est.kv_cache_bytes_per_token:,} B/token ({prec.kv_cache}), in blocks of {b.block_size}"
                                            + _window_note(spec, est)),
                       ("other", f"{gib(est.workspace_bytes)} (activation peak of a {est.case.step_budget_per_rank}-token step, "
                                 f"CUDA context, workspaces: estimates)"),
                       ("KV blocks", f"{b.num_blocks:,} blocks of {b.block_size} tokens ({gib(b.kv_bytes)}) in the engine's "
                                     f"{gib(b.reserved_bytes)} of {acc.memory_gib:g} GiB: "
                                     + ('fits' if est.fits else 'the prompts fit, the full lengths do not (the engine '
                                        'preempts: note below)' if est.outgrown else 'DOES NOT FIT')),
                       ("largest batch", f"{est.max_batch} sequences of {seq} tokens per micro-batch"
                        + (" (beside their shared prefix)" if est.case.prefix_hit_rate else ""))]),
             "", f"prefill ({est.prefill['bound']}-bound): {1e3 * est.prefill_s:.2f} ms", *["  " + x for x in est.prefill["lines"]],
             "", f"decode ({est.decode['bound']}-bound): {1e3 * est.decode_s_per_token:.3f} ms per token (at the mean context)",
             *["  " + x for x in est.decode["lines"]],
             "", f"request latency {est.request_latency_s:.3f} s; throughput {est.tokens_per_s:,.0f} generated tokens/s for this group"]
    if cmp:
        lines += ["", f"TP {args.tp} vs {cmp['replicas']['count']} × TP {cmp['replicas']['tp']} replicas: {cmp['verdict']}"]
    lines += [f"note: {n}" for n in est.notes]
    rep = file_replicas(args, doc, est.case.gpus, est.tokens_per_s, None)
    if rep:
        lines.append(f"note: {rep}")
    gen = cluster.accelerator.generation or "default"
    lines.append(f"estimates: the serving step model with the {gen} generation's kernel rates (serving_rates.yaml, shared "
                 f"by every engine) and {engine.id}'s host costs (engines.yaml), both fitted to published measurements "
                 f"(docs/inference.md; `shardlab validate --inference` shows their errors)")
    return finite(doc), "\n".join(lines)


def file_replicas(args, doc: dict, gpus: int, tokens_per_s: float, requests_per_s: float | None,
                  lighter: tuple[float, float] | None = None) -> str | None:
    """A job file of N replicas read by estimate, which prices one replica: ``doc['replicas']`` gets the count, the
    GPUs and the N replicas' totals (the file's load is one replica's, as the estimate reads it), and the line that
    says so; None for one replica. ``lighter``: (output tokens/s, requests/s) of a replica with a client fewer, when
    the file's C clients do not split evenly (``args.file_clients``): C mod N replicas run ⌈C/N⌉ (the one priced),
    the rest ⌊C/N⌋."""
    n = int(getattr(args, "file_replicas", 1) or 1)
    if n <= 1:
        return None
    split = getattr(args, "file_clients", None)
    if split and lighter is not None and requests_per_s is not None:
        c = split[0]
        busy, hi, lo = c % n, -(-c // n), c // n
        tok, req = busy * tokens_per_s + (n - busy) * lighter[0], busy * requests_per_s + (n - busy) * lighter[1]
        doc["replicas"] = {"count": n, "gpus": n * gpus, "output_tokens_per_s": tok, "requests_per_s": req,
                           "clients": {"total": c, "busiest": hi, "replicas_busiest": busy, "others": lo}}
        return (f"{args.from_file} runs {n} replicas of this layout ({n * gpus} GPUs), and its {c} clients split "
                f"{busy} × {hi} + {n - busy} × {lo}: the figures above are a replica of {hi} (the busiest); the {n} "
                f"serve {tok:,.0f} output tokens/s and {req:,.2f} requests/s in all")
    doc["replicas"] = {"count": n, "gpus": n * gpus, "output_tokens_per_s": n * tokens_per_s,
                       "requests_per_s": None if requests_per_s is None else n * requests_per_s}
    if requests_per_s is None:     # a static batch per replica: a plan's batch may leave replicas idle
        return (f"{args.from_file} runs {n} replicas of this layout ({n * gpus} GPUs); the figures above are one "
                f"replica's static batch: the {n} serve up to {n * tokens_per_s:,.0f} output tokens/s with every one "
                f"holding such a batch (fewer where the plan's batch leaves replicas idle)")
    return (f"{args.from_file} runs {n} replicas of this layout ({n * gpus} GPUs); the figures above are one "
            f"replica's, at one replica's load: the {n} serve {n * tokens_per_s:,.0f} output tokens/s and "
            f"{n * requests_per_s:,.2f} requests/s in all")


def reject(rejected: dict, errors: dict, e: Exception) -> None:
    """Count a layout a plan loop skipped: by the reason (the message up to its fix) and by the whole message."""
    why = str(e).split(": ")[0][:100]
    rejected[why] = rejected.get(why, 0) + 1
    errors[str(e)] = errors.get(str(e), 0) + 1


def raise_common_error(errors: dict, rejected: dict, capacity_reason: str) -> None:
    """When every layout failed with an error (none for lack of memory), the most common one: it names its fix."""
    from shardlab.errors import ShardlabError

    if errors and not any(k.startswith(capacity_reason) for k in rejected):
        raise ShardlabError(max(errors, key=errors.get))


def check_pins(args, spec, cluster, gpus: int) -> None:
    """A --tp/--pp written on `plan --inference` (``serve_space.layout_pins``) that no replica of ``gpus`` GPUs can
    take: one line naming why, not a search that finds nothing. --target-rate searches GPU counts: its own."""
    from shardlab.cli.serve_space import layout_pins
    from shardlab.errors import ShardlabError
    from shardlab.planner.space import tp_ok

    pins = layout_pins(args)
    tp, pp = pins.get("tp"), pins.get("pp")
    if tp is not None and (tp > cluster.gpus_per_node or not tp_ok(spec, tp)):
        raise ShardlabError(f"--tp {tp}: a replica's TP group must fit one node ({cluster.gpus_per_node} GPUs) and divide "
                            f"{spec.name}'s heads, KV heads and FFN; pick another --tp or drop it to search")
    if pp is not None and pp > spec.num_layers:
        raise ShardlabError(f"--pp {pp}: more pipeline stages than {spec.name}'s {spec.num_layers} layers; lower it")
    if getattr(args, "target_rate", None) is None and gpus % ((tp or 1) * (pp or 1)):
        raise ShardlabError(f"--tp {tp or 1} × --pp {pp or 1} does not divide {gpus} GPUs into whole replicas; change "
                            f"--gpus or the pinned degrees")


def plan_inference_cmd(args, catalog):
    from shardlab.errors import ShardlabError
    from shardlab.estimate.inference import serve_over_replicas
    from shardlab.planner.space import tp_ok
    from shardlab.render.table import table

    check_serve_flags(args, plan=True)
    moe = [f for f, on in (("--ep", getattr(args, "ep", 1) != 1), ("--dp-attention", getattr(args, "dp_attention", False)),
                           ("--disaggregated", bool(getattr(args, "disaggregated", None))),
                           ("--prefill-tp", getattr(args, "prefill_tp", None) is not None),
                           ("--prefill-pp", getattr(args, "prefill_pp", None) is not None)) if on]
    if getattr(args, "prefill_gpu", None) is not None and not (
            getattr(args, "serve", False) and args.concurrency is None and args.arrival_rate is None
            and getattr(args, "target_rate", None) is None and (args.ttft_slo is not None or args.tpot_slo is not None)):
        raise ShardlabError("--prefill-gpu: plan splits prefill and decode over two GPU kinds in its capacity search "
                            "(--serve with --ttft-slo/--tpot-slo, no load, no --target-rate); price one split with "
                            "`shardlab estimate --inference --serve --disaggregated P:D --prefill-gpu KIND`")
    if moe:
        raise ShardlabError(f"{', '.join(moe)}: plan searches them (a MoE model's TP-sliced, TP-group and wide "
                            f"expert-parallel layouts with data-parallel attention under --serve; in the capacity "
                            f"search, every prefill/decode split); price one such layout with `shardlab estimate "
                            f"--inference --serve` and these flags")
    tuning = [f for f, on in (("--expert-imbalance", getattr(args, "expert_imbalance", None) is not None),
                              ("--redundant-experts", bool(getattr(args, "redundant_experts", None))),
                              ("--two-batch-overlap", getattr(args, "two_batch_overlap", False))) if on]
    if tuning and not args.serve:
        raise ShardlabError(f"{', '.join(tuning)}: the static-batch plan searches TP × PP replicas with TP-sliced "
                            f"experts; add --serve to search expert-parallel layouts with these settings")
    if args.fix or args.objective in ("cost", "memory"):
        raise ShardlabError(f"{'--fix' if args.fix else '--objective ' + args.objective} applies to training plans; "
                            f"--inference plans rank by --objective throughput or latency over every TP × PP layout")
    probe_spec, probe = spec_cluster(args, catalog, 1)
    gpus = args.gpus or (args.nodes * probe.gpus_per_node if args.nodes else args.gpus_default)
    spec, cluster = spec_cluster(args, catalog, gpus)
    prec, engine = precision_from_args(args, cluster.accelerator, spec), engine_from_args(args)
    check_pins(args, spec, cluster, gpus)
    if args.serve:
        from shardlab.cli.serve_cmds import plan_serve

        return plan_serve(args, spec, cluster, gpus, prec, engine)
    objective = args.objective
    plans, rejected, errors = [], {}, {}
    from shardlab.layout_checks import divisors

    from shardlab.cli.serve_space import layout_pins

    pins = layout_pins(args)
    for tp in [d for d in divisors(gpus) if d <= cluster.gpus_per_node and pins.get("tp", d) == d]:
        for pp in [d for d in divisors(gpus // tp) if d <= spec.num_layers and pins.get("pp", d) == d]:
            if not tp_ok(spec, tp):
                rejected["tp does not divide the heads, KV heads or FFN"] = rejected.get("tp does not divide the heads, KV heads or FFN", 0) + 1
                continue
            replicas = gpus // (tp * pp)
            try:
                served = serve_over_replicas(spec, cluster, tp=tp, pp=pp, replicas=replicas, batch=args.batch,
                                             prompt_len=args.prompt_len, output_len=args.output_len, precision=prec,
                                             prefix_hit_rate=args.prefix_hit_rate,
                                             **case_kw(args, spec, catalog),
                                             engine=engine)
            except ShardlabError as e:                    # e.g. quantization groups split by this tp
                reject(rejected, errors, e)
                continue
            est = served.largest
            if not est.fits:
                rejected["does not fit in GPU memory"] = rejected.get("does not fit in GPU memory", 0) + 1
                continue
            plans.append({"tp": tp, "pp": pp, "replicas": replicas, "busy_replicas": served.busy_replicas,
                          "batch_per_replica": est.in_flight, "tokens_per_s": served.tokens_per_s,
                          "decode_s_per_token": est.decode_s_per_token, "prefill_s": est.prefill_s,
                          "request_latency_s": est.request_latency_s, "memory_bytes": est.total_bytes,
                          "kv_blocks": est.case.blocks.num_blocks, "max_batch": est.max_batch})
    if not plans:
        raise_common_error(errors, rejected, "does not fit in GPU memory")
        raise ShardlabError(f"no TP×PP layout of {gpus} × {cluster.accelerator.id} holds {spec.name} with batch {args.batch}; "
                            f"add GPUs, quantize (--weights), or lower the batch")
    key = (lambda p: -p["tokens_per_s"]) if objective == "throughput" else (lambda p: p["request_latency_s"])
    plans.sort(key=key)
    from shardlab.cli.plan_cmds import _model_ref

    doc = {"model": spec.name, **_model_ref(catalog, args), "gpus": gpus, "gpu": cluster.accelerator.id,
           "engine": engine.id, "engine_version": engine.version, "objective": objective,
           "batch": args.batch, "prompt_len": args.prompt_len, "output_len": args.output_len, "precision": prec.label,
           "serving": serving_settings(prec, engine, args.max_num_seqs),
           "evaluated": len(plans) + sum(rejected.values()), "rejected": rejected, "plans": plans[: args.top]}
    rows = [[p["tp"], p["pp"], f"{p['busy_replicas']}/{p['replicas']}", p["batch_per_replica"], f"{p['tokens_per_s']:,.0f}",
             f"{1e3 * p['decode_s_per_token']:.2f}", f"{1e3 * p['prefill_s']:.1f}", f"{p['request_latency_s']:.2f}",
             f"{p['memory_bytes'] / 2**30:.1f}", f"{p['kv_blocks']:,}", p["max_batch"]] for p in plans[: args.top]]
    best = plans[0]
    text = "\n".join([
        f"shardlab plan --inference: {spec.name} on {gpus} × {cluster.accelerator.id} ({engine.id}, {prec.label}), "
        f"{args.batch} concurrent requests of {args.prompt_len} + {args.output_len} tokens, objective {objective}",
        table(["tp", "pp", "busy/replicas", "batch each", "tokens/s", "decode ms/tok", "prefill ms", "request s", "GiB/GPU",
               "KV blocks", "max batch"], rows),
        f"best: {best['replicas']} replica(s) of TP {best['tp']} × PP {best['pp']}"
        + (f"; rejected: {', '.join(f'{k} ({v})' for k, v in rejected.items())}" if rejected else ""),
        "TP cuts per-token latency until its all-reduces dominate; replicas multiply throughput when the model fits on fewer "
        "GPUs; pipeline stages add sequences in flight, not per-token speed. Under load: add --serve --concurrency C."])
    return finite(doc), text


def validate_inference_cmd(args):
    from shardlab.cli.validate_inference import check_inference_flags, one_inference_run, validate_inference

    check_inference_flags(args)
    return one_inference_run(args) if getattr(args, "run", None) else validate_inference(args)


def _window_note(spec, est) -> str:
    """How a sliding window shapes the tokens a sequence holds (empty when the engine keeps every token)."""
    n = est.case.prompt_len + est.case.output_len
    if not est.windowed or not spec.windowed_layer_share or n <= spec.sliding_window:
        return ""
    if not spec.full_attention_layers:
        return f" (the {spec.sliding_window}-token window of every layer)"
    return (f" (the layers' mean: {spec.num_layers - spec.full_attention_layers} sliding layers keep "
            f"{min(n, spec.sliding_window):,} of the {n:,} tokens, {spec.full_attention_layers} full-attention layers "
            f"keep all)")
