"""shardlab plan | estimate | validate: the main job."""

from __future__ import annotations

import argparse

from shardlab.cli.common import (add_cluster_args, add_estimate_args, add_output_args, int_list, positive_int)

PLAN_DEFAULT_MODEL = "llama-3.1-70b"
PLAN_DEFAULT_GPUS = 64

PLAN_EXAMPLES = """examples:
  shardlab plan                                        # Llama-3.1-70B on 8 nodes x 8 H100 (embedded defaults)
  shardlab plan llama-3.1-405b --gpus 1024 --seq-len 8192 --global-batch 2048 --tokens 15e12
  shardlab plan mixtral-8x7b --gpus 32 --gpu a100-80gb --objective cost
  shardlab plan llama-3.1-8b --inference --gpus 8 --batch 32 --prompt-len 2048 --output-len 256
"""
ESTIMATE_EXAMPLES = """examples:
  shardlab estimate llama-3.1-70b --gpus 64 --tp 8 --pp 2 --zero 1 --global-batch 512 --tokens 1e12
  shardlab estimate gpt3-175b --gpus 1024 --gpu a100-80gb --tp 8 --pp 16 --global-batch 1536 --seq-len 2048 --recompute full
  shardlab estimate llama-3.1-8b --inference --tp 2 --batch 16 --prompt-len 1024 --output-len 256
  shardlab estimate llama-3.1-8b --gpus 8 --zero 3 --precision fp8-mixed --seq-len 8192 --global-batch 128
  shardlab estimate llama-3.1-8b --gpus 8 --zero 2 --offload optimizer --seq-len 8192 --global-batch 64
  shardlab estimate llama-2-7b --gpus 1 --gpu rtx-4090 --lora-rank 16 --quantize-base nf4 --seq-len 2048 --global-batch 8
"""


def _add_assumption_args(p) -> None:
    g = p.add_argument_group("assumptions")
    g.add_argument("--no-flash-attention", action="store_true", help="attention stores and computes the full s×s scores")
    g.add_argument("--dropout", action="store_true", help="dropout in the blocks (GPT-3-era training)")
    g.add_argument("--no-dp-overlap", action="store_true", help="gradient reduction starts after the backward (no overlap)")
    g.add_argument("--grad-reduce-fp32", action="store_true", help="reduce gradients in fp32 (Megatron bf16 default)")
    g.add_argument("--overheads", metavar="FILE", help="YAML overriding the memory-overhead defaults")
    g.add_argument("--no-overheads", action="store_true", help="memory: model states and activations only")


def _add_inference_args(p) -> None:
    g = p.add_argument_group("inference (with --inference)")
    g.add_argument("--inference", action="store_true", help="serve instead of train")
    g.add_argument("--batch", type=positive_int, default=1, help="concurrent sequences")
    g.add_argument("--prompt-len", type=positive_int, default=1024, help="prompt tokens per sequence")
    g.add_argument("--output-len", type=positive_int, default=256, help="generated tokens per sequence")


def register(sub) -> None:
    p = sub.add_parser("plan", help="search every layout for a model on a cluster and explain the best (main job)",
                       description="Enumerate every valid (dp, tp, pp, cp, ep, ZeRO, micro-batch, schedule/vpp, recompute, "
                                   "sequence-parallel) layout, reject what does not divide or fit, rank by the objective, "
                                   "and print the design worksheet of the winner.",
                       epilog=PLAN_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_estimate_args(p, model_default=PLAN_DEFAULT_MODEL)
    p.set_defaults(gpus_default=PLAN_DEFAULT_GPUS)
    g = p.add_argument_group("search")
    g.add_argument("--nodes", type=positive_int, default=None, help="nodes (GPUs = nodes × GPUs per node)")
    g.add_argument("--objective", choices=("throughput", "cost", "memory", "latency"), default="throughput",
                   help="throughput: fastest step; cost: least GPU-time per token using up to --gpus; memory: least per-GPU "
                        "memory; latency (with --inference): lowest request latency")
    g.add_argument("--top", type=positive_int, default=5, help="plans to list")
    g.add_argument("--fix", action="append", default=[], metavar="AXIS=VALUE",
                   help="pin an axis (tp, pp, cp, ep, zero, mb, vpp, rc, sp), e.g. --fix tp=8; repeatable")
    _add_assumption_args(p)
    _add_inference_args(p)
    add_output_args(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("estimate", help="step time, throughput, MFU, memory and time-to-train of one layout",
                       description="Estimate one layout: step time from its parts (compute, exposed communication, "
                                   "pipeline bubble, optimizer), tokens/s, MFU/HFU, memory, time and GPU-hours to train.",
                       epilog=ESTIMATE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_estimate_args(p)
    _add_assumption_args(p)
    _add_inference_args(p)
    add_output_args(p)
    p.set_defaults(func=cmd_estimate)

    p = sub.add_parser("validate", help="shardlab's predictions against published training runs",
                       description="Predict every published run in the validation set and compare with what was measured.")
    add_output_args(p)
    p.set_defaults(func=cmd_validate)


# ---- shared ----------------------------------------------------------------------------------------
def _catalog(args):
    from shardlab.catalog import get_catalog

    files = list(args.catalog) + ([args.profile] if getattr(args, "profile", None) else [])
    return get_catalog(files)


def _seq_len(args, spec) -> int:
    return args.seq_len or min(spec.max_seq_len, 4096)


def training_estimate_from_args(args, catalog):
    """A TrainingEstimate from the estimate flags (used by `shardlab estimate` and `shardlab cost`)."""
    from shardlab.cli.common import cluster_from_args, layout_from_args, resolve_model
    from shardlab.errors import ShardlabError
    from shardlab.estimate import estimate_training
    from shardlab.memory import load_overheads
    from shardlab.units import parse_count

    spec, params = resolve_model(args, catalog)
    if spec is None:
        raise ShardlabError("step time needs a model's shapes: give MODEL (a catalog id or config.json), not --params")
    layout = layout_from_args(args)
    gpus = args.gpus or layout.world_size
    cluster = cluster_from_args(args, catalog, gpus)
    recipe = _recipe(args, catalog, cluster)
    return estimate_training(
        spec, layout, cluster, seq_len=_seq_len(args, spec), global_batch=args.global_batch, microbatches=args.microbatches,
        precision=args.precision, optimizer=args.optimizer,
        tokens=parse_count(args.tokens, "--tokens") if args.tokens else None,
        flash_attention=not getattr(args, "no_flash_attention", False), dropout=getattr(args, "dropout", False),
        dp_overlap=not getattr(args, "no_dp_overlap", False) and (catalog.profile or {}).get("comm_overlap", True) is not False,
        grad_reduce_bytes=4 if getattr(args, "grad_reduce_fp32", False) else 0,
        overheads=load_overheads(getattr(args, "overheads", None), getattr(args, "no_overheads", False)), recipe=recipe)


def _recipe(args, catalog, cluster):
    """The FP8/offload/LoRA recipe of the flags, with the accelerator's host link for offload time."""
    from dataclasses import replace

    from shardlab.cli.recipe_args import recipe_from_args

    return replace(recipe_from_args(args), host_link_bytes_per_s=catalog.link(cluster.accelerator.host_link).bytes_per_s)


def _refuse_recipe_flags(args) -> None:
    """--inference estimates serving: the training recipe flags would be ignored, so they are refused."""
    from shardlab.errors import ShardlabError

    given = [f for f, on in (("--offload", getattr(args, "offload", "none") != "none"),
                             ("--lora-rank", getattr(args, "lora_rank", None) is not None),
                             ("--quantize-base", getattr(args, "quantize_base", "none") != "none"),
                             ("--fp8-all-gather", getattr(args, "fp8_all_gather", False)),
                             ("--precision fp8-mixed", getattr(args, "precision", "") == "fp8-mixed")) if on]
    if given:
        raise ShardlabError(f"{', '.join(given)} describe(s) training; drop them with --inference")


# ---- estimate --------------------------------------------------------------------------------------
def cmd_estimate(args):
    if args.inference:
        _refuse_recipe_flags(args)
        from shardlab.cli.inference_cmds import estimate_inference_cmd

        return estimate_inference_cmd(args, _catalog(args))
    from shardlab.estimate.report import render_estimate

    est = training_estimate_from_args(args, _catalog(args))
    return est.to_dict(), render_estimate(est)


# ---- plan ------------------------------------------------------------------------------------------
def _parse_fix(items: list[str]) -> dict:
    from shardlab.errors import ShardlabError
    from shardlab.estimate.step import SCHEDULE_CODES

    out = {}
    for it in items:
        key, _, val = it.partition("=")
        key = key.strip().replace("-", "_")
        if key == "micro_batch":
            key = "mb"
        if key in ("rc", "recompute"):
            key, val = "rc", str({"none": 0, "selective": 1, "full": 2}.get(val, val))
        if key in ("schedule", "sched"):
            if val not in SCHEDULE_CODES:
                raise ShardlabError(f"--fix {it}: schedule is one of {', '.join(SCHEDULE_CODES)}")
            key, val = "sched", str(SCHEDULE_CODES[val])
        if key not in ("tp", "pp", "cp", "ep", "zero", "mb", "vpp", "rc", "sp", "sched") or not val.strip().isdigit():
            raise ShardlabError(f"--fix {it}: use AXIS=VALUE with AXIS in tp, pp, cp, ep, zero, micro_batch, vpp, sp "
                                f"(integers), recompute (none/selective/full) or schedule ({'/'.join(SCHEDULE_CODES)})")
        out[key] = int(val)
    return out


def cmd_plan(args):
    from shardlab.cli.common import cluster_from_args, resolve_model
    from shardlab.errors import ShardlabError
    from shardlab.estimate.step import Workload
    from shardlab.memory import load_overheads
    from shardlab.planner.explain import axis_reasons, comm_table, runner_up
    from shardlab.planner.report import render_plan
    from shardlab.planner.search import plan_training
    from shardlab.units import parse_count

    cat = _catalog(args)
    if args.inference:
        _refuse_recipe_flags(args)
        from shardlab.cli.inference_cmds import plan_inference_cmd

        return plan_inference_cmd(args, cat)
    if args.objective == "latency":
        raise ShardlabError("--objective latency is for --inference; training plans use throughput, cost or memory")
    spec, _ = resolve_model(args, cat)
    if spec is None:
        raise ShardlabError("plan needs a model's shapes: give MODEL, not --params")
    probe = cluster_from_args(args, cat, 1)
    gpus = args.gpus or (args.nodes * probe.gpus_per_node if args.nodes else args.gpus_default)
    if args.nodes and args.gpus and args.gpus != args.nodes * probe.gpus_per_node:
        raise ShardlabError(f"--nodes {args.nodes} × {probe.gpus_per_node} GPUs per node ≠ --gpus {args.gpus}; give one of them")
    cluster = cluster_from_args(args, cat, gpus)
    seq = _seq_len(args, spec)
    gb = args.global_batch or max(1, (4 * 2**20) // seq)  # default: 4M tokens per step
    wl = Workload(seq_len=seq, global_batch=gb, precision=args.precision, optimizer=args.optimizer,
                  flash_attention=not args.no_flash_attention, dropout=args.dropout, dp_overlap=not args.no_dp_overlap,
                  grad_reduce_bytes=4 if args.grad_reduce_fp32 else 0, recipe=_recipe(args, cat, cluster))
    fixed = _parse_fix(args.fix)
    if wl.recipe.offload.params:  # parameter offload exists only with ZeRO-3 shards
        fixed.setdefault("zero", 3)
    res = plan_training(spec, cluster, wl, objective=args.objective, top=args.top, fixed=fixed,
                        overheads=load_overheads(args.overheads, args.no_overheads))
    offload_note = None
    if not res.plans and wl.recipe.offload.what == "none" and wl.recipe.lora is None:
        # nothing fits in GPU memory: try FSDP CPU offload (ZeRO-3, parameters, gradients and optimizer on the host)
        from dataclasses import replace

        from shardlab.memory.offload import Offload

        wl_off = replace(wl, recipe=replace(wl.recipe, offload=Offload("both")))
        res_off = plan_training(spec, cluster, wl_off, objective=args.objective, top=args.top, fixed={**fixed, "zero": 3},
                                overheads=load_overheads(args.overheads, args.no_overheads))
        if res_off.plans:
            res, wl = res_off, wl_off
            offload_note = ("no layout fits in GPU memory without offload: these plans keep parameters, gradients and "
                            "optimizer state in host memory (--zero 3 --offload both, FSDP CPU offload)")
    tokens = parse_count(args.tokens, "--tokens") if args.tokens else None
    doc = {"model": spec.name, "gpus": gpus, "gpu": cluster.accelerator.id, "gpus_per_node": cluster.gpus_per_node,
           "intra_link": cluster.intra_link.id, "inter_link": cluster.inter_link.id, "objective": args.objective,
           "workload": {"seq_len": seq, "global_batch": gb, "precision": args.precision, "optimizer": args.optimizer,
                        "tokens_per_step": seq * gb, "offload": wl.recipe.offload.what,
                        "lora_rank": wl.recipe.lora.rank if wl.recipe.lora else None,
                        "quantize_base": wl.recipe.lora.quantize_base if wl.recipe.lora else "none"},
           "notes": [offload_note] if offload_note else [],
           "evaluated": res.evaluated, "combinations": res.total, "rejected": dict(res.rejected), "search_s": res.search_s,
           "plans": [{k: v for k, v in p.items() if k != "index"} for p in res.plans]}
    if tokens:
        for p in doc["plans"]:
            steps = tokens / (seq * gb)
            p["train_days"] = steps * p["step_time_s"] / 86400
            p["gpu_hours"] = steps * p["step_time_s"] / 3600 * p["gpus"]
    if res.plans:
        doc["worksheet"] = axis_reasons(res)
        doc["runner_up"] = runner_up(res)
        doc["communication"] = comm_table(res)
    return doc, render_plan(doc)


# ---- validate --------------------------------------------------------------------------------------
def cmd_validate(args):
    import numpy as np

    from shardlab.report.table import table
    from shardlab.validation import compare

    rows, docs = [], []
    cmp = compare(catalog=_catalog(args))
    for c in cmp:
        cfg = c.run.config
        lay = f"tp{cfg.get('tp', 1)} pp{cfg.get('pp', 1)}" + (f" cp{cfg['cp']}" if cfg.get("cp", 1) > 1 else "") + \
              f" dp{cfg['gpus'] // (cfg.get('tp', 1) * cfg.get('pp', 1) * cfg.get('cp', 1))}"
        rows.append([c.run.id, f"{cfg['gpus']}×{cfg.get('gpu', 'a100-80gb')}", lay, c.run.convention,
                     f"{c.run.measured_tflops_per_gpu:g}", f"{c.predicted_tflops_per_gpu:.1f}", f"{100 * c.error:+.1f}%",
                     "" if not c.run.informational else "info"])
        docs.append({"id": c.run.id, "gpus": cfg["gpus"], "gpu": cfg.get("gpu", "a100-80gb"), "convention": c.run.convention,
                     "measured_tflops_per_gpu": c.run.measured_tflops_per_gpu,
                     "predicted_tflops_per_gpu": c.predicted_tflops_per_gpu, "error": c.error,
                     "predicted_step_time_s": c.predicted_step_time_s, "measured_step_time_s": c.run.measured_step_time_s,
                     "in_target": not c.run.informational, "source": c.run.source, "assumed": cfg.get("assumed", "")})
    target = np.array([abs(c.error) for c in cmp if not c.run.informational])
    summary = {"runs_in_target": int(len(target)), "mean_abs_error": float(target.mean()), "max_abs_error": float(target.max())}
    text = "\n".join([
        table(["run", "hardware", "layout", "FLOPs", "measured TF/s", "predicted", "error", ""], rows,
              title="predicted vs published TFLOP/s per GPU (docs/validation.md has every source and assumption)"),
        "",
        f"accuracy target (Megatron-LM runs, {summary['runs_in_target']}): mean |error| {100 * summary['mean_abs_error']:.1f}%, "
        f"max {100 * summary['max_abs_error']:.1f}% (goal: each within 10%, mean within 5%)",
        "info = reported, outside the target: DeepSpeed-stack runs (software 20-30% slower than Megatron-LM on the same "
        "layout and hardware) and runs whose settings are not published",
    ])
    return {"runs": docs, "summary": summary}, text
