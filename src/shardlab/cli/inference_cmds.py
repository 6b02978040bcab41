"""The inference paths of `shardlab estimate --inference` and `shardlab plan --inference`."""

from __future__ import annotations


def _spec_cluster(args, catalog, gpus: int):
    from shardlab.cli.common import cluster_from_args, resolve_model
    from shardlab.errors import ShardlabError

    spec, _ = resolve_model(args, catalog)
    if spec is None:
        raise ShardlabError("inference estimates need a model's shapes: give MODEL, not --params")
    return spec, cluster_from_args(args, catalog, gpus)


def _elem(args) -> tuple[int, str]:
    return (4, "fp32") if args.precision == "fp32" else (2, "fp16" if args.precision.startswith("fp16") else "bf16")


def estimate_inference_cmd(args, catalog):
    from shardlab.estimate.inference import GPU_MEMORY_UTILIZATION, estimate_inference, tp_versus_replicas
    from shardlab.report.table import kv_lines

    from shardlab.errors import ShardlabError

    ignored = [f for f, bad in (("--ep", args.ep != 1), ("--cp", args.cp != 1), ("--dp", args.dp not in (None, 1)),
                                ("--zero", args.zero != 0), ("--gpus", args.gpus not in (None, args.tp * args.pp)))
               if bad]
    if ignored:
        raise ShardlabError(f"{', '.join(ignored)} do(es) not apply to --inference, which estimates one TP×PP group of "
                            f"--tp × --pp GPUs; for replicas across more GPUs use `shardlab plan --inference --gpus N`")
    spec, cluster = _spec_cluster(args, catalog, args.tp * args.pp)
    e, dtype = _elem(args)
    est = estimate_inference(spec, cluster, tp=args.tp, pp=args.pp, batch=args.batch, prompt_len=args.prompt_len,
                             output_len=args.output_len, elem_bytes=e, dtype=dtype)
    cmp = tp_versus_replicas(spec, cluster, tp=args.tp, batch=args.batch, prompt_len=args.prompt_len,
                             output_len=args.output_len, elem_bytes=e, dtype=dtype) if args.tp > 1 else None
    doc = est.to_dict()
    doc["tp_vs_replicas"] = cmp
    gib = lambda b: f"{b / 2**30:.2f} GiB"
    acc = cluster.accelerator
    lines = [f"shardlab estimate --inference: {spec.name} on TP {args.tp} × PP {args.pp} {acc.id}, batch {args.batch}, "
             f"prompt {args.prompt_len} + output {args.output_len} tokens ({dtype})", "",
             kv_lines([("weights per GPU", f"{gib(est.weights_bytes)} (exact: this rank's TP/PP shard × {e} B)"),
                       ("KV cache per GPU", f"{gib(est.kv_cache_bytes)} = {est.kv_cache_bytes_per_token:,} B/token × {args.batch} × "
                                            f"{args.prompt_len + args.output_len} tokens"),
                       ("other", f"{gib(est.workspace_bytes)} (CUDA context, workspaces, prefill activations: estimates)"),
                       ("total", f"{gib(est.total_bytes)} of {gib(acc.memory_bytes * GPU_MEMORY_UTILIZATION)} usable "
                                 f"({GPU_MEMORY_UTILIZATION:.0%} of {acc.memory_gib:g} GiB): {'fits' if est.fits else 'DOES NOT FIT'}"),
                       ("largest batch", f"{est.max_batch} sequences of {args.prompt_len + args.output_len} tokens")]),
             "", f"prefill ({est.prefill.bound}-bound): {1e3 * est.prefill_s:.2f} ms", *["  " + l for l in est.prefill.formula.splitlines()],
             "", f"decode ({est.decode.bound}-bound): {1e3 * est.decode_s_per_token:.3f} ms per token",
             *["  " + l for l in est.decode.formula.splitlines()],
             "", f"request latency {est.request_latency_s:.3f} s; throughput {est.tokens_per_s:,.0f} generated tokens/s for this group"]
    if cmp:
        lines += ["", f"TP {args.tp} vs {cmp['replicas']['count']} × TP {cmp['replicas']['tp']} replicas: {cmp['verdict']}"]
    lines += [f"note: {n}" for n in est.notes]
    lines.append("estimates: roofline of compute vs HBM traffic plus TP all-reduces (shardlab.comm.inference)")
    return doc, "\n".join(lines)


def plan_inference_cmd(args, catalog):
    from shardlab.errors import ShardlabError
    from shardlab.estimate.inference import serve_over_replicas
    from shardlab.report.table import table

    probe_spec, probe = _spec_cluster(args, catalog, 1)
    gpus = args.gpus or (args.nodes * probe.gpus_per_node if args.nodes else args.gpus_default)
    spec, cluster = _spec_cluster(args, catalog, gpus)
    e, dtype = _elem(args)
    objective = args.objective if args.objective in ("throughput", "latency") else "throughput"
    from shardlab.planner.space import tp_ok

    plans, rejected = [], {}
    from shardlab.layout import divisors

    for tp in [d for d in divisors(gpus) if d <= cluster.gpus_per_node]:
        for pp in [d for d in divisors(gpus // tp) if d <= spec.num_layers]:
            reason = None
            if not tp_ok(spec, tp):
                reason = "tp does not divide the heads, KV heads or FFN"
            if reason:
                rejected[reason] = rejected.get(reason, 0) + 1
                continue
            replicas = gpus // (tp * pp)
            served = serve_over_replicas(spec, cluster, tp=tp, pp=pp, replicas=replicas, batch=args.batch,
                                         prompt_len=args.prompt_len, output_len=args.output_len, elem_bytes=e, dtype=dtype)
            est = served.largest
            if not est.fits:
                rejected["does not fit in GPU memory"] = rejected.get("does not fit in GPU memory", 0) + 1
                continue
            plans.append({"tp": tp, "pp": pp, "replicas": replicas, "busy_replicas": served.busy_replicas,
                          "batch_per_replica": est.batch,
                          "tokens_per_s": served.tokens_per_s, "decode_s_per_token": est.decode_s_per_token,
                          "prefill_s": est.prefill_s, "request_latency_s": est.request_latency_s,
                          "memory_bytes": est.total_bytes, "max_batch": est.max_batch})
    if not plans:
        raise ShardlabError(f"no TP×PP layout of {gpus} × {cluster.accelerator.id} holds {spec.name} with batch {args.batch}; "
                            f"add GPUs or lower the batch")
    key = (lambda p: -p["tokens_per_s"]) if objective == "throughput" else (lambda p: p["request_latency_s"])
    plans.sort(key=key)
    doc = {"model": spec.name, "gpus": gpus, "gpu": cluster.accelerator.id, "objective": objective, "batch": args.batch,
           "prompt_len": args.prompt_len, "output_len": args.output_len, "evaluated": len(plans) + sum(rejected.values()),
           "rejected": rejected, "plans": plans[: args.top]}
    rows = [[p["tp"], p["pp"], f"{p['busy_replicas']}/{p['replicas']}", p["batch_per_replica"], f"{p['tokens_per_s']:,.0f}",
             f"{1e3 * p['decode_s_per_token']:.2f}", f"{1e3 * p['prefill_s']:.1f}", f"{p['request_latency_s']:.2f}",
             f"{p['memory_bytes'] / 2**30:.1f}", p["max_batch"]] for p in plans[: args.top]]
    best = plans[0]
    text = "\n".join([
        f"shardlab plan --inference: {spec.name} on {gpus} × {cluster.accelerator.id}, {args.batch} concurrent requests of "
        f"{args.prompt_len} + {args.output_len} tokens, objective {objective}",
        table(["tp", "pp", "busy/replicas", "batch each", "tokens/s", "decode ms/tok", "prefill ms", "request s", "GiB/GPU", "max batch"],
              rows),
        f"best: {best['replicas']} replica(s) of TP {best['tp']} × PP {best['pp']}"
        + (f"; rejected: {', '.join(f'{k} ({v})' for k, v in rejected.items())}" if rejected else ""),
        "TP cuts per-token latency until its all-reduces dominate; replicas multiply throughput when the model fits on fewer GPUs."])
    return doc, text
