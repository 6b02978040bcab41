"""The inference flags of `shardlab estimate|plan` (the 'inference' argument group) and the serving settings they
give: the engine, the precision, the model and cluster, ``prepare``'s speculative and MoE keywords, and the checks of
what does not go together (one line each). The commands that use them are in ``cli.inference_cmds``."""

from __future__ import annotations

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
    g.add_argument("--weights", choices=tuple(WEIGHT_BITS), default=None,
                   help="block weights: 16-bit, fp8, int8, int4 (AWQ/GPTQ groups) or fp4 (NVFP4); head and embeddings "
                        "stay 16-bit (default: the checkpoint's own type, fp8 for DeepSeek-V3, fp4 for GPT-OSS; else bf16)")
    g.add_argument("--group-size", type=BOUNDED["dim"], default=None, help="int4/int8 input features per scale/zero group "
                                                                        "(int4 default 128)")
    g.add_argument("--kv-cache-dtype", choices=tuple(KV_BYTES), default="bf16", help="KV-cache element type")
    g.add_argument("--activations", choices=ACTIVATION_DTYPES, default=None,
                   help="GEMM input type (sets the peak; default fp8 for fp8 weights on GPUs with fp8, else 16-bit)")
    g.add_argument("--serve", action="store_true",
                   help="continuous batching under load (--concurrency or --arrival-rate); plan with --ttft-slo/--tpot-slo "
                        "and no load: each layout's capacity under the SLO; estimate does so for its layout with "
                        "--slo-percentile (docs/capacity.md)")
    g.add_argument("--concurrency", type=BOUNDED["batch"], default=None, help="--serve: closed loop of C clients")
    g.add_argument("--arrival-rate", type=BOUNDED["rate"], default=None, metavar="R", help="--serve: Poisson arrivals, requests/s")
    g.add_argument("--ttft-slo", type=BOUNDED["seconds"], default=None, metavar="S", help="--serve: time-to-first-token target, s")
    g.add_argument("--tpot-slo", type=BOUNDED["seconds"], default=None, metavar="S", help="--serve: time-per-output-token target, s")
    g.add_argument("--slo-percentile", choices=("p50", "p99"), default=None,      # serving.capacity.PERCENTILES
                   help="--serve with --ttft-slo/--tpot-slo and no load: the statistic the SLO holds for; p50 (plan's "
                        "default: the steady state's mean stands for the median, fast) or p99 (the simulation's, a few "
                        "runs per layout, slower); estimate then prices its one layout at its capacity (MLPerf "
                        "Inference Server's measure)")
    g.add_argument("--target-rate", type=BOUNDED["rate"], default=None, metavar="R",
                   help="plan --serve with --ttft-slo/--tpot-slo: the fewest GPUs (up to --gpus, else 1024) and the layout "
                        "that serve R requests/s within the SLO")
    g.add_argument("--gpu-memory-utilization", type=BOUNDED["factor"], default=None, metavar="F",
                   help="share of GPU memory the engine takes (vLLM default 0.9)")
    g.add_argument("--max-num-seqs", type=BOUNDED["batch"], default=None, help="most sequences per step (engine default)")
    g.add_argument("--max-num-batched-tokens", type=BOUNDED["seq_len"], default=None, help="token budget per step (engine default)")
    g.add_argument("--chunked-prefill", action="store_true", help="split prompts into chunks that fill the token budget")
    g.add_argument("--sliding-window-cache", action="store_true",
                   help="keep only each sliding layer's window in the KV cache and attend within it (vLLM V1 does by "
                        "default; TensorRT-LLM with a per-layer max_attention_window)")
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
                   help="with --ep: busiest rank's routed tokens over the mean (serving default 1.18, SGLang EPLB measurement; training default 1, balanced routing)")
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
    g.add_argument("--prefill-pp", type=BOUNDED["gpus"], default=None, metavar="P",
                   help="with --disaggregated: the prefill pool's pipeline stages (default --pp)")
    g.add_argument("--prefill-gpu", default=None, metavar="GPU",
                   help="with --disaggregated: the prefill pool's GPU kind (default --gpu; other kinds sit on other "
                        "nodes, the KV cache crosses the NIC); plan's capacity search splits over the two kinds, "
                        "per dollar")
    g.add_argument("--scheduler-steps", type=BOUNDED["scheduler_steps"], default=None, metavar="K",
                   help="decode steps per scheduling round (vLLM's --num-scheduler-steps; engine default 1)")
    g.add_argument("--requests", type=BOUNDED["requests"], default=None, help="--serve: requests simulated for the percentiles")
    g.add_argument("--seed", type=BOUNDED["seed"], default=0, help="--serve: seed of the simulated arrivals")


def serving_settings(prec, engine, max_num_seqs) -> dict:
    """A serving plan's ``serving`` block: the precision and engine settings `export --plan` writes into the launch file."""
    return {"weights": prec.weights, "group_size": prec.group_size, "kv_cache_dtype": prec.kv_cache,
            "activations": prec.activations, "weights_from_checkpoint": prec.weights_from_checkpoint,
            "gpu_memory_utilization": engine.gpu_memory_utilization, "max_num_seqs": max_num_seqs}


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
        sliding_window_cache=True if getattr(args, "sliding_window_cache", False) else None,
        cuda_graph_max_batch=getattr(args, "cuda_graph_max_batch", None))


def precision_from_args(args, accelerator, spec=None):
    """The serving precision of the flags; without --weights, ``spec``'s checkpoint type
    (``serving.precision.checkpoint_precision``)."""
    from shardlab.errors import ShardlabError
    from shardlab.serving.precision import checkpoint_precision

    if args.precision != "bf16-mixed":
        raise ShardlabError(f"--precision {args.precision} is a training setting; under --inference give --weights, "
                            f"--kv-cache-dtype and --activations")
    if spec is not None and spec.checkpoint_unpriced and not args.weights:
        raise ShardlabError(f"{spec.name}'s quantization_config ({spec.checkpoint_unpriced}) is not a scheme shardlab "
                            f"prices as it ships; give --weights (int4, int8, fp8 or fp4 as its bits say, bf16 for the "
                            f"16-bit model)")
    return checkpoint_precision(spec, accelerator.peak_tflops, args.weights, args.group_size, args.kv_cache_dtype,
                                args.activations)


def spec_cluster(args, catalog, gpus: int):
    from shardlab.cli.common import cluster_from_args, resolve_model
    from shardlab.errors import ShardlabError

    spec, _ = resolve_model(args, catalog)
    if spec is None:
        raise ShardlabError("inference estimates need a model's shapes: give MODEL, not --params")
    return spec, cluster_from_args(args, catalog, gpus)


def check_serve_flags(args, plan: bool = False) -> None:
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
    if getattr(args, "batch", 1) not in (None, 1):
        raise ShardlabError(f"--batch {args.batch} is a static batch; under --serve the load is --concurrency or "
                            f"--arrival-rate, and --max-num-seqs caps the sequences a replica runs: use those")
    if args.tpot_slo is not None and getattr(args, "output_len", 2) == 1:
        raise ShardlabError("--tpot-slo: with --output-len 1 a request has no second token, so no time per output "
                            "token; drop --tpot-slo (--ttft-slo bounds the whole request)")
    loads = [f for f, v in (("--concurrency", args.concurrency), ("--arrival-rate", args.arrival_rate)) if v is not None]
    slo = args.ttft_slo is not None or args.tpot_slo is not None
    if not plan and target is not None:
        raise ShardlabError("--target-rate belongs to the capacity search of `shardlab plan --inference --serve "
                            "--ttft-slo S` (no load), which tries GPU counts; estimate --serve prices one layout")
    if not plan and pct == "p99" and args.requests:
        raise ShardlabError("--requests sets the report's own simulation; with --slo-percentile p99 the report shows the "
                            "run the capacity search accepted (its requests follow the load): drop --requests")
    if not plan and pct and getattr(args, "disaggregated", None):
        raise ShardlabError("--slo-percentile asks for one aggregated layout's capacity; for disaggregated pools use "
                            "`shardlab plan --inference --serve --ttft-slo S` (it searches the splits) or give "
                            "--arrival-rate R")
    if not plan and pct and not slo:
        raise ShardlabError("--slo-percentile asks for this layout's capacity under latency targets: add --ttft-slo S "
                            "and/or --tpot-slo S (and no load)")
    if target is not None and loads:
        raise ShardlabError(f"--target-rate asks how many GPUs a rate needs; drop {' and '.join(loads)} (the rate is "
                            f"the load)")
    if target is not None and not slo:
        raise ShardlabError("--target-rate needs the latency it must be served within: add --ttft-slo S and/or "
                            "--tpot-slo S")
    if pct and loads:
        raise ShardlabError(f"--slo-percentile applies to the capacity search (no load); under {loads[0]} the "
                            f"simulated p50 and p99 are printed: drop --slo-percentile")
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
    from shardlab.serving.speculative import DEFAULT_ACCEPTANCE_RATE, draft_spec, make_speculation

    draft = getattr(args, "draft", None)
    if getattr(args, "speculative_tokens", None) and draft and draft not in DEFAULT_ACCEPTANCE_RATE \
            and draft not in ("eagle", "eagle3", "mtp"):
        catalog.model(draft)        # an unknown draft is named first (its acceptance is asked for after)
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


def add_validate_args(p) -> None:
    """The `validate --inference` flag (the validate parser belongs to cli/plan_cmds.py)."""
    p.add_argument("--inference", action="store_true",
                   help="serving engines against published measurements (in-sample and leave-one-source-out)")


def refuse_serving_flags(args) -> None:
    """Serving flags on a training estimate or plan would be silently ignored: one line instead."""
    from shardlab.errors import ShardlabError

    given = [flag for flag, attr in (("--serve", "serve"), ("--concurrency", "concurrency"),
                                     ("--arrival-rate", "arrival_rate"), ("--ttft-slo", "ttft_slo"),
                                     ("--tpot-slo", "tpot_slo"), ("--target-rate", "target_rate"),
                                     ("--slo-percentile", "slo_percentile"), ("--scheduler-steps", "scheduler_steps"),
                                     ("--chunked-prefill", "chunked_prefill"),
                                     ("--sliding-window-cache", "sliding_window_cache"),
                                     ("--prefix-hit-rate", "prefix_hit_rate"), ("--engine", "engine"),
                                     ("--weights", "weights"), ("--group-size", "group_size"),
                                     ("--activations", "activations"),
                                     ("--gpu-memory-utilization", "gpu_memory_utilization"),
                                     ("--max-num-seqs", "max_num_seqs"),
                                     ("--max-num-batched-tokens", "max_num_batched_tokens"),
                                     ("--speculative-tokens", "speculative_tokens"), ("--draft", "draft"),
                                     ("--acceptance-rate", "acceptance_rate"),
                                     ("--acceptance-length", "acceptance_length"),
                                     ("--dp-attention", "dp_attention"), ("--redundant-experts", "redundant_experts"),
                                     ("--two-batch-overlap", "two_batch_overlap"),
                                     ("--disaggregated", "disaggregated"), ("--prefill-tp", "prefill_tp"),
                                     ("--prefill-pp", "prefill_pp"), ("--prefill-gpu", "prefill_gpu"),
                                     ("--requests", "requests")) if getattr(args, attr, None)]
    given += [flag for flag, attr, default in (("--batch", "batch", 1), ("--kv-cache-dtype", "kv_cache_dtype", "bf16"),
                                               ("--prompt-len", "prompt_len", 1024), ("--output-len", "output_len", 256))
              if getattr(args, attr, default) not in (default, None)]
    if getattr(args, "cuda_graph_max_batch", None) is not None:              # 0 (no graphs) is a setting too
        given.append("--cuda-graph-max-batch")
    if given:
        raise ShardlabError(f"{', '.join(given)} describe(s) serving: add --inference (training ignores them)")
