"""The inference paths of `shardlab estimate|plan --inference` (static batch, or --serve under load) and
`shardlab validate --inference`; the inference flags live here (``add_inference_args``)."""

from __future__ import annotations

import math

from shardlab.cli.common import BOUNDED


def add_inference_args(p) -> None:
    """The 'inference' argument group of `estimate` and `plan`."""
    from shardlab.serving.precision import ACTIVATION_DTYPES, KV_BYTES, WEIGHT_BITS

    g = p.add_argument_group("inference (with --inference; serving engine: --engine vllm (V1, default)|sglang|"
                             "tensorrt-llm, or an older version: vllm-0.6|sglang-0.3|tensorrt-llm-0.17)")
    g.add_argument("--inference", action="store_true", help="serve instead of train")
    g.add_argument("--engine", default=None, metavar="NAME",
                   help="serving engine and version: vllm (V1, default), sglang, tensorrt-llm, vllm-0.6, sglang-0.3, "
                        "tensorrt-llm-0.17 (--framework still names it, the older spelling)")
    g.add_argument("--batch", type=BOUNDED["batch"], default=1,
                   help="static batch: requests in flight on the GPUs (estimate: the TP×PP group; plan: all GPUs, "
                        "split over replicas); pipeline stages split them into pp micro-batches")
    g.add_argument("--prompt-len", type=BOUNDED["seq_len"], default=1024, help="prompt tokens per sequence")
    g.add_argument("--output-len", type=BOUNDED["seq_len"], default=256, help="generated tokens per sequence")
    g.add_argument("--weights", choices=tuple(WEIGHT_BITS), default="bf16",
                   help="block weights: 16-bit, fp8, int8, int4 (AWQ/GPTQ groups) or fp4 (NVFP4); head and embeddings stay 16-bit")
    g.add_argument("--group-size", type=BOUNDED["dim"], default=None, help="int4/int8 input features per scale/zero group "
                                                                        "(int4 default 128)")
    g.add_argument("--kv-cache-dtype", choices=tuple(KV_BYTES), default="bf16", help="KV-cache element type")
    g.add_argument("--activations", choices=ACTIVATION_DTYPES, default=None,
                   help="GEMM input type (sets the peak; default fp8 for fp8 weights on GPUs with fp8, else 16-bit)")
    g.add_argument("--serve", action="store_true",
                   help="continuous batching under load (--concurrency or --arrival-rate); plan with --ttft-slo/--tpot-slo "
                        "and no load: each layout's capacity under the SLO (docs/capacity.md)")
    g.add_argument("--concurrency", type=BOUNDED["batch"], default=None, help="--serve: closed loop of C clients")
    g.add_argument("--arrival-rate", type=BOUNDED["rate"], default=None, metavar="R", help="--serve: Poisson arrivals, requests/s")
    g.add_argument("--ttft-slo", type=BOUNDED["seconds"], default=None, metavar="S", help="--serve: time-to-first-token target, s")
    g.add_argument("--tpot-slo", type=BOUNDED["seconds"], default=None, metavar="S", help="--serve: time-per-output-token target, s")
    g.add_argument("--slo-percentile", choices=("p50", "p99"), default=None,      # serving.capacity.PERCENTILES
                   help="plan --serve without a load: the statistic the SLO holds for; p50 (default: the steady state's "
                        "mean stands for the median, fast) or p99 (the simulation's, a few runs per layout, slower)")
    g.add_argument("--target-rate", type=BOUNDED["rate"], default=None, metavar="R",
                   help="plan --serve with --ttft-slo/--tpot-slo: the fewest GPUs (up to --gpus, else 1024) and the layout "
                        "that serve R requests/s within the SLO")
    g.add_argument("--gpu-memory-utilization", type=BOUNDED["factor"], default=None, metavar="F",
                   help="share of GPU memory the engine takes (vLLM default 0.9)")
    g.add_argument("--max-num-seqs", type=BOUNDED["batch"], default=None, help="most sequences per step (engine default)")
    g.add_argument("--max-num-batched-tokens", type=BOUNDED["seq_len"], default=None, help="token budget per step (engine default)")
    g.add_argument("--chunked-prefill", action="store_true", help="split prompts into chunks that fill the token budget")
    g.add_argument("--cuda-graph-max-batch", type=BOUNDED["graph_batch"], default=None, metavar="N",
                   help="largest decode batch the engine replays as a CUDA graph (engine default; 0: none)")
    g.add_argument("--prefix-hit-rate", type=BOUNDED["hit_share"], default=0.0, metavar="H",
                   help="share of each prompt already in the engine's prefix cache (shared system prompts, multi-turn "
                        "chats): not recomputed, its KV blocks shared (default 0)")
    g.add_argument("--speculative-tokens", type=BOUNDED["spec_tokens"], default=None, metavar="K",
                   help="speculative decoding: draft tokens proposed per sequence per step (1-16)")
    g.add_argument("--draft", default=None, metavar="NAME",
                   help="with --speculative-tokens: eagle (default), eagle3, mtp (DeepSeek's MTP module), or a "
                        "catalog model id as the draft")
    g.add_argument("--acceptance-rate", type=BOUNDED["share0"], default=None, metavar="A",
                   help="with --speculative-tokens: per-token acceptance α (default: measured for eagle/eagle3)")
    g.add_argument("--acceptance-length", type=BOUNDED["accept_len"], default=None, metavar="L",
                   help="with --speculative-tokens: measured tokens per verification step instead of α")
    g.add_argument("--dp-attention", action="store_true",
                   help="MoE: attention replicated on ep/tp data-parallel ranks, experts shared across --ep GPUs by "
                        "all-to-all (SGLang --enable-dp-attention, vLLM --data-parallel-size with EP)")
    g.add_argument("--expert-imbalance", type=BOUNDED["imbalance"], default=None, metavar="F",
                   help="with --ep: busiest rank's routed tokens over the mean (default 1.18, SGLang EPLB measurement)")
    g.add_argument("--redundant-experts", type=BOUNDED["experts"], default=None, metavar="R",
                   help="with --ep: R replicated expert slots (EPLB), so (experts + R) / ep per GPU")
    g.add_argument("--two-batch-overlap", action="store_true",
                   help="with --dp-attention: run each step as two halves, one's all-to-alls under the other's compute "
                        "(SGLang --enable-two-batch-overlap, vLLM --enable-dbo)")
    g.add_argument("--disaggregated", default=None, metavar="P:D",
                   help="--serve: a prefill pool of P GPUs and a decode pool of D GPUs, the KV cache sent between "
                        "them (DistServe); the decode pool's replicas use --tp")
    g.add_argument("--prefill-tp", type=BOUNDED["gpus"], default=None, metavar="T",
                   help="with --disaggregated: the prefill pool's TP (default --tp)")
    g.add_argument("--scheduler-steps", type=BOUNDED["scheduler_steps"], default=None, metavar="K",
                   help="decode steps per scheduling round (vLLM's --num-scheduler-steps; engine default 1)")
    g.add_argument("--requests", type=BOUNDED["requests"], default=None, help="--serve: requests simulated for the percentiles")
    g.add_argument("--seed", type=BOUNDED["seed"], default=0, help="--serve: seed of the simulated arrivals")


def finite(x):
    """A JSON-safe copy: inf/nan floats become None (one valid JSON document, no Infinity)."""
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def serving_settings(prec, engine, max_num_seqs) -> dict:
    """A serving plan's ``serving`` block: the precision and engine settings `export --plan` writes into the launch file."""
    return {"weights": prec.weights, "group_size": prec.group_size, "kv_cache_dtype": prec.kv_cache,
            "activations": prec.activations, "gpu_memory_utilization": engine.gpu_memory_utilization,
            "max_num_seqs": max_num_seqs}


def engine_from_args(args):
    """The serving engine (--framework, default vllm) with the settings the flags give."""
    from shardlab.errors import ShardlabError
    from shardlab.serving.engines import get_engine

    util = args.gpu_memory_utilization
    if util is not None and not 0 < util <= 1:
        raise ShardlabError(f"--gpu-memory-utilization must be in (0, 1], got {util}")
    return get_engine(getattr(args, "framework", None)).with_settings(
        gpu_memory_utilization=util, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        chunked_prefill=True if args.chunked_prefill else None, scheduler_steps=getattr(args, "scheduler_steps", None),
        cuda_graph_max_batch=getattr(args, "cuda_graph_max_batch", None))


def precision_from_args(args, accelerator):
    from shardlab.errors import ShardlabError
    from shardlab.serving.precision import make_precision

    if args.precision != "bf16-mixed":
        raise ShardlabError(f"--precision {args.precision} is a training setting; under --inference give --weights, "
                            f"--kv-cache-dtype and --activations")
    return make_precision(args.weights, args.group_size, args.kv_cache_dtype, args.activations, accelerator.peak_tflops)


def spec_cluster(args, catalog, gpus: int):
    from shardlab.cli.common import cluster_from_args, resolve_model
    from shardlab.errors import ShardlabError

    spec, _ = resolve_model(args, catalog)
    if spec is None:
        raise ShardlabError("inference estimates need a model's shapes: give MODEL, not --params")
    return spec, cluster_from_args(args, catalog, gpus)


def _check_serve_flags(args, plan: bool = False) -> None:
    """One line for serving flags that do not go together (``plan``: `plan` also takes a capacity search: SLOs and no
    load, optionally --target-rate and --slo-percentile)."""
    from shardlab.errors import ShardlabError

    target, pct = getattr(args, "target_rate", None), getattr(args, "slo_percentile", None)
    load = [f for f, v in (("--concurrency", args.concurrency), ("--arrival-rate", args.arrival_rate),
                           ("--ttft-slo", args.ttft_slo), ("--tpot-slo", args.tpot_slo), ("--requests", args.requests),
                           ("--target-rate", target), ("--slo-percentile", pct)) if v]
    if not args.serve and load:
        raise ShardlabError(f"{', '.join(load)} describe serving under load: add --serve")
    if not args.serve:
        return
    loads = [f for f, v in (("--concurrency", args.concurrency), ("--arrival-rate", args.arrival_rate)) if v is not None]
    slo = args.ttft_slo is not None or args.tpot_slo is not None
    if not plan and (target is not None or pct):
        raise ShardlabError(f"{'--target-rate' if target is not None else '--slo-percentile'} belongs to the capacity "
                            f"search of `shardlab plan --inference --serve --ttft-slo S` (no load); estimate --serve "
                            f"takes --concurrency or --arrival-rate")
    if target is not None and loads:
        raise ShardlabError(f"--target-rate asks how many GPUs a rate needs; drop {' and '.join(loads)} (the rate is "
                            f"the load)")
    if target is not None and not slo:
        raise ShardlabError("--target-rate needs the latency it must be served within: add --ttft-slo S and/or "
                            "--tpot-slo S")
    if pct and loads:
        raise ShardlabError(f"--slo-percentile applies to the capacity search (no load); under {loads[0]} the plan "
                            f"prints the best layout's simulated p50 and p99: drop --slo-percentile")
    if len(loads) > 1 or (plan and not loads and not slo):
        raise ShardlabError("--serve needs exactly one of --concurrency C (closed loop) or --arrival-rate R (requests/s)"
                            + ("; or, for the capacity under latency targets, --ttft-slo S and/or --tpot-slo S alone"
                               if plan else ""))
    if plan and not loads and getattr(args, "objective", None) == "latency":
        raise ShardlabError("--objective latency ranks layouts at a given load; the capacity search (no load) ranks by "
                            "goodput per GPU: drop --objective or give --concurrency/--arrival-rate")


def case_kw(args, spec, catalog) -> dict:
    """``prepare``'s keywords from the flags: speculation and draft_spec (--speculative-tokens ...), and the MoE
    layout (--ep with --dp-attention and --expert-imbalance under --inference)."""
    from shardlab.serving.speculative import draft_spec, make_speculation

    sp = make_speculation(getattr(args, "speculative_tokens", None), getattr(args, "draft", None),
                          rate=getattr(args, "acceptance_rate", None), length=getattr(args, "acceptance_length", None))
    kw = {} if sp is None else {"speculation": sp, "draft_spec": draft_spec(spec, sp.draft, catalog)}
    ep, dpa, imb = getattr(args, "ep", 1) or 1, bool(getattr(args, "dp_attention", False)), getattr(args, "expert_imbalance", None)
    tbo = bool(getattr(args, "two_batch_overlap", False))
    red = getattr(args, "redundant_experts", None) or 0
    if ep != 1 or dpa or imb is not None or tbo or red:
        kw.update(ep=ep, dp_attention=dpa, expert_imbalance=imb, two_batch_overlap=tbo, redundant_experts=red)
    return kw


def replica_gpus(args) -> int:
    """GPUs of the replica the flags describe: tp × pp, times ep / tp attention replicas under --dp-attention."""
    dp = args.ep // args.tp if getattr(args, "dp_attention", False) and args.ep % args.tp == 0 else 1
    return args.tp * args.pp * max(dp, 1)


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
    _check_serve_flags(args)
    spec, cluster = spec_cluster(args, catalog, n)
    prec, engine = precision_from_args(args, cluster.accelerator), engine_from_args(args)
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
                                            + f" × {est.kv_cache_bytes_per_token:,} B/token ({prec.kv_cache}), in blocks of {b.block_size}"),
                       ("other", f"{gib(est.workspace_bytes)} (activation peak of a {est.case.step_budget_per_rank}-token step, "
                                 f"CUDA context, workspaces: estimates)"),
                       ("KV blocks", f"{b.num_blocks:,} blocks of {b.block_size} tokens ({gib(b.kv_bytes)}) in the engine's "
                                     f"{gib(b.reserved_bytes)} of {acc.memory_gib:g} GiB: {'fits' if est.fits else 'DOES NOT FIT'}"),
                       ("largest batch", f"{est.max_batch} sequences of {seq} tokens per micro-batch"
                        + (" (beside their shared prefix)" if est.case.prefix_hit_rate else ""))]),
             "", f"prefill ({est.prefill['bound']}-bound): {1e3 * est.prefill_s:.2f} ms", *["  " + x for x in est.prefill["lines"]],
             "", f"decode ({est.decode['bound']}-bound): {1e3 * est.decode_s_per_token:.3f} ms per token (at the mean context)",
             *["  " + x for x in est.decode["lines"]],
             "", f"request latency {est.request_latency_s:.3f} s; throughput {est.tokens_per_s:,.0f} generated tokens/s for this group"]
    if cmp:
        lines += ["", f"TP {args.tp} vs {cmp['replicas']['count']} × TP {cmp['replicas']['tp']} replicas: {cmp['verdict']}"]
    lines += [f"note: {n}" for n in est.notes]
    gen = cluster.accelerator.generation or "default"
    lines.append(f"estimates: the serving step model with the {gen} generation's kernel rates (serving_rates.yaml, shared "
                 f"by every engine) and {engine.id}'s host costs (engines.yaml), both fitted to published measurements "
                 f"(docs/inference.md; `shardlab validate --inference` shows their errors)")
    return finite(doc), "\n".join(lines)


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


def plan_inference_cmd(args, catalog):
    from shardlab.errors import ShardlabError
    from shardlab.estimate.inference import serve_over_replicas
    from shardlab.planner.space import tp_ok
    from shardlab.render.table import table

    _check_serve_flags(args, plan=True)
    moe = [f for f, on in (("--ep", getattr(args, "ep", 1) != 1), ("--dp-attention", getattr(args, "dp_attention", False)),
                           ("--expert-imbalance", getattr(args, "expert_imbalance", None) is not None),
                           ("--redundant-experts", bool(getattr(args, "redundant_experts", None))),
                           ("--two-batch-overlap", getattr(args, "two_batch_overlap", False)),
                           ("--disaggregated", bool(getattr(args, "disaggregated", None))),
                           ("--prefill-tp", getattr(args, "prefill_tp", None) is not None)) if on]
    if moe:
        raise ShardlabError(f"{', '.join(moe)}: plan searches TP × PP replicas with TP-sliced experts (and, in the "
                            f"capacity search, every prefill/decode split); price an expert-parallel or disaggregated "
                            f"layout with `shardlab estimate --inference --serve` and these flags")
    if args.fix or args.objective in ("cost", "memory"):
        raise ShardlabError(f"{'--fix' if args.fix else '--objective ' + args.objective} applies to training plans; "
                            f"--inference plans rank by --objective throughput or latency over every TP × PP layout")
    probe_spec, probe = spec_cluster(args, catalog, 1)
    gpus = args.gpus or (args.nodes * probe.gpus_per_node if args.nodes else args.gpus_default)
    spec, cluster = spec_cluster(args, catalog, gpus)
    prec, engine = precision_from_args(args, cluster.accelerator), engine_from_args(args)
    if args.serve:
        from shardlab.cli.serve_cmds import plan_serve

        return plan_serve(args, spec, cluster, gpus, prec, engine)
    objective = args.objective
    plans, rejected, errors = [], {}, {}
    from shardlab.layout import divisors

    for tp in [d for d in divisors(gpus) if d <= cluster.gpus_per_node]:
        for pp in [d for d in divisors(gpus // tp) if d <= spec.num_layers]:
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


def add_validate_args(p) -> None:
    """The `validate --inference` flag (the validate parser belongs to cli/plan_cmds.py)."""
    p.add_argument("--inference", action="store_true",
                   help="serving engines against published measurements (in-sample and leave-one-source-out)")


def validate_inference_cmd(args):
    from shardlab.cli.validate_inference import check_inference_flags, one_inference_run, validate_inference

    check_inference_flags(args)
    return one_inference_run(args) if getattr(args, "run", None) else validate_inference(args)


def refuse_serving_flags(args) -> None:
    """Serving flags on a training estimate or plan would be silently ignored: one line instead."""
    from shardlab.errors import ShardlabError

    given = [flag for flag, attr in (("--serve", "serve"), ("--concurrency", "concurrency"),
                                     ("--arrival-rate", "arrival_rate"), ("--ttft-slo", "ttft_slo"),
                                     ("--tpot-slo", "tpot_slo"), ("--target-rate", "target_rate"),
                                     ("--slo-percentile", "slo_percentile"), ("--scheduler-steps", "scheduler_steps"),
                                     ("--chunked-prefill", "chunked_prefill"),
                                     ("--prefix-hit-rate", "prefix_hit_rate")) if getattr(args, attr, None)]
    if getattr(args, "cuda_graph_max_batch", None) is not None:              # 0 (no graphs) is a setting too
        given.append("--cuda-graph-max-batch")
    if given:
        raise ShardlabError(f"{', '.join(given)} describe(s) serving: add --inference (training ignores them)")
