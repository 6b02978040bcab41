"""shardlab plan | estimate | validate: the main job."""

from __future__ import annotations

import argparse
import math

from shardlab.cli import export_cmds
from shardlab.cli.common import add_estimate_args, add_output_args, resolve_framework
from shardlab.cli.plan_args import (ESTIMATE_EXAMPLES, PLAN_EXAMPLES, add_assumption_args, add_inference_args,
                                    add_plan_args, plan_help)
from shardlab.cli.report_cmd import add_html_arg
from shardlab.export.launcher import RUNS_AS

EXPORT_FRAMEWORK = {**RUNS_AS, "slurm": "torchtitan", "skypilot": "torchtitan"}
"""The framework `plan --export TARGET` searches with when --framework is not given (slurm/skypilot: --launch's, else
torchtitan)."""

def register(sub) -> None:
    p = sub.add_parser("plan", help="search every layout for a model on a cluster and explain the best (main job)",
                       description="Enumerate every valid (dp, tp, pp, cp, ep, ZeRO, micro-batch, schedule/vpp, recompute, "
                                   "sequence-parallel) layout, reject what does not divide or fit, rank by the objective, "
                                   "and print the design worksheet of the winner.",
                       epilog=PLAN_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_plan_args(p)
    plan_help(p)
    add_html_arg(p, "plan")
    export_cmds.hook(p, cmd_plan, export=True)

    p = sub.add_parser("estimate", help="step time, throughput, MFU, memory and time-to-train of one layout",
                       description="Estimate one layout: step time from its parts (compute, exposed communication, "
                                   "pipeline bubble, optimizer), tokens/s, MFU/HFU, memory, time and GPU-hours to train.",
                       epilog=ESTIMATE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_estimate_args(p)
    add_assumption_args(p)
    add_inference_args(p)
    p.add_argument("--slow-rank", default=None, metavar="R:FACTOR[:FRACTION]",
                   help="what one rank computing FACTOR x slower costs the job (docs/observability.md)")
    add_output_args(p)
    add_html_arg(p, "estimate")
    export_cmds.hook(p, cmd_estimate)

    p = sub.add_parser("validate", help="shardlab's predictions against published training runs",
                       description="Predict every published run in the validation set and compare with what was measured: "
                                   "in sample (the committed fit) and out of sample (leave-one-source-out), by family "
                                   "(framework × GPU generation); --inference for the serving runs.")
    from shardlab.cli.inference_args import add_validate_args as add_inference_validate_args
    from shardlab.cli.validate_cmd import add_validate_args, cmd_validate

    add_inference_validate_args(p)
    add_validate_args(p)
    add_output_args(p)
    p.set_defaults(func=cmd_validate)


# ---- shared ----------------------------------------------------------------------------------------
def _catalog(args):
    from shardlab.catalog import get_catalog

    return get_catalog(list(args.catalog), profile=getattr(args, "profile", None))


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
    cluster = cluster_from_args(args, catalog, gpus).require_whole_nodes()
    recipe = _recipe(args, catalog, cluster)
    return estimate_training(
        spec, layout, cluster, seq_len=_seq_len(args, spec), global_batch=args.global_batch, microbatches=args.microbatches,
        precision=args.precision, optimizer=args.optimizer,
        tokens=parse_count(args.tokens, "--tokens") if args.tokens else None,
        flash_attention=not getattr(args, "no_flash_attention", False), dropout=getattr(args, "dropout", False),
        framework=resolve_framework(args, catalog), compile=getattr(args, "compile", None), **_overrides(args, catalog),
        overheads=load_overheads(getattr(args, "overheads", None), getattr(args, "no_overheads", False)), recipe=recipe)


def _recipe(args, catalog, cluster):
    """The FP8/offload/LoRA recipe of the flags, with the accelerator's host link for offload time."""
    from dataclasses import replace

    from shardlab.cli.recipe_args import recipe_from_args

    return replace(recipe_from_args(args), host_link_bytes_per_s=catalog.link(cluster.accelerator.host_link).bytes_per_s)


TRAINING_LAYOUT_DESTS = ("cp", "zero", "micro_batch", "recompute", "recompute_fraction", "recompute_modules", "wrap",
                         "dp_replicate", "sequence_parallel", "schedule", "vpp", "etp")
"""Layout flags (recorded when written, even at their default) that --inference has no use for."""
TRAINING_WORKLOAD_FLAGS = (("--microbatches", "microbatches", None), ("--stage-layers", "stage_layers", None),
                           ("--seq-len", "seq_len", None), ("--global-batch", "global_batch", None),
                           ("--tokens", "tokens", None), ("--optimizer", "optimizer", "adamw"),
                           ("--compile", "compile", None), ("--attention-kernel", "attention_kernel", None),
                           ("--fused-loss", "fused_loss", None), ("--dropout", "dropout", False))
"""(flag, dest, default) of training workload flags --inference would ignore."""


def _refuse_recipe_flags(args) -> None:
    """--inference estimates serving: the training recipe flags would be ignored, so they are refused."""
    from shardlab.errors import ShardlabError

    given = [f for f, on in (("--offload", getattr(args, "offload", "none") != "none"),
                             ("--lora-rank", getattr(args, "lora_rank", None) is not None),
                             ("--quantize-base", getattr(args, "quantize_base", "none") != "none"),
                             ("--fp8-all-gather", getattr(args, "fp8_all_gather", False)),
                             ("--fp8-params", getattr(args, "fp8_params", False)),
                             ("--tp-comm-overlap", getattr(args, "tp_comm_overlap", False)),
                             ("--moe-dispatcher", getattr(args, "moe_dispatcher", "alltoall") != "alltoall"),
                             ("--ep-comm-overlap", getattr(args, "ep_comm_overlap", False)),
                             ("--precision fp8-mixed", getattr(args, "precision", "") == "fp8-mixed")) if on]
    written = getattr(args, "given_flags", None) or set()
    given += [f"--{d.replace('_', '-')}" for d in TRAINING_LAYOUT_DESTS if d in written]
    given += [flag for flag, dest, default in TRAINING_WORKLOAD_FLAGS if getattr(args, dest, default) != default]
    if given:
        raise ShardlabError(f"{', '.join(given)} describe(s) training; drop them with --inference (serving takes "
                            f"--tp, --pp, --batch, --prompt-len, --output-len and the precision flags)")


def _overrides(args, catalog) -> dict:
    """Mechanisms the user's flags override (None: the framework's): --no-dp-overlap, a profile that measured no
    overlap, --grad-reduce-fp32/-bf16, --attention-kernel, --fused-loss/--no-fused-loss; a MoE model's
    --moe-dispatcher, --ep-comm-overlap and --expert-imbalance."""
    from shardlab.cli.common import grad_reduce_choice
    from shardlab.comm.moe_dispatch import MoeDispatch

    no_overlap = getattr(args, "no_dp_overlap", False) or (catalog.profile or {}).get("comm_overlap", True) is False
    return {"dp_overlap": False if no_overlap else None,
            "grad_reduce_bytes": grad_reduce_choice(args),
            "attention_kernel": getattr(args, "attention_kernel", None), "fused_loss": getattr(args, "fused_loss", None),
            "tp_comm_overlap": bool(getattr(args, "tp_comm_overlap", False)),
            "moe": MoeDispatch(getattr(args, "moe_dispatcher", "alltoall"), bool(getattr(args, "ep_comm_overlap", False)),
                               getattr(args, "expert_imbalance", None) or 1.0)}


def framework_doc(fw, wl) -> dict:
    """What the estimate assumed of the framework (every estimate and plan prints it)."""
    return {"id": fw.id, "name": fw.name, "kernels": wl.kernels, "attention_kernel": wl.attention_label,
            "dp_overlap": wl.dp_overlap, "tp_comm_overlap": wl.tp_comm_overlap,
            "moe_dispatcher": wl.moe.dispatcher, "ep_comm_overlap": wl.moe.ep_comm_overlap,
            "expert_imbalance": wl.moe.expert_imbalance, "zero3_prefetch": wl.zero3_prefetch,
            "zero3_regather_for_recompute": wl.zero3_regather_for_recompute,
            "grad_reduce_bytes": wl.grad_reduce_bytes, "main_grad_bytes": wl.main_grad_bytes,
            "layer_host_s": wl.layer_host_s, "layer_host_min_zero": wl.layer_host_min_zero,
            "pipeline_host_s": wl.pipeline_host_s, "step_overhead_s": wl.step_overhead_s,
            "source": fw.source}


# ---- estimate --------------------------------------------------------------------------------------
def cmd_estimate(args):
    from shardlab.estimate.straggler import with_slow_rank

    if args.inference:
        _refuse_recipe_flags(args)
        from shardlab.cli.inference_cmds import estimate_inference_cmd

        return with_slow_rank(getattr(args, "slow_rank", None), *estimate_inference_cmd(args, _catalog(args)))
    from shardlab.cli.inference_args import refuse_serving_flags

    refuse_serving_flags(args)
    from shardlab.estimate.report import render_estimate

    from shardlab.planner.detail import layout_detail

    est = training_estimate_from_args(args, _catalog(args))
    doc = est.to_dict()
    doc["assumptions"] = _assumptions(args)
    doc["detail"] = layout_detail(est.model, est.layout, est.cluster, est.memory, seq_len=est.workload.seq_len,
                                  microbatches=est.microbatches, breakdown=est.breakdown, precision=est.workload.precision)
    doc["communication"] = estimate_comm(est)
    from shardlab.comm.exposure import exposure
    from shardlab.comm.moe_dispatch import overlap_applies

    doc["communication_exposure"] = [g.to_dict() for g in exposure(doc["communication"], est.breakdown, est.layout.zero,
                                                                   overlap_applies(est.workload, est.layout))]
    return with_slow_rank(getattr(args, "slow_rank", None), doc, render_estimate(est))


def estimate_comm(est) -> list[dict]:
    """The estimated layout's collectives (comm.inventory) with the worksheet's risk sentence for each."""
    from dataclasses import asdict

    from shardlab.comm.inventory import layout_collectives
    from shardlab.comm.moe_dispatch import overlap_applies
    from shardlab.layout import split_layers
    from shardlab.planner.risk import RiskInputs, collective_risk

    lay, wl, cl = est.layout, est.workload, est.cluster
    items = [asdict(c) for c in layout_collectives(est.model, lay, cl, seq_len=wl.seq_len, microbatches=est.microbatches,
                                                   precision=wl.precision, framework=wl,
                                                   stage=est.slowest_stage if overlap_applies(wl, lay) else None)]
    layers = max(lay.stage_layers or split_layers(est.model.num_layers, lay.pp * lay.vpp)) * lay.vpp
    inp = RiskInputs(layout={**lay.to_dict(), "microbatches": est.microbatches}, step_time_s=est.step_time_s,
                     breakdown=est.breakdown, comm=tuple(items), intra_link=cl.intra_link, inter_link=cl.inter_link,
                     gpus_per_node=cl.gpus_per_node, memory_bytes=est.memory.worst.total,
                     capacity_bytes=cl.accelerator.memory_bytes, stage_layers=layers, seq_len=wl.seq_len)
    return [{**it, "risk": collective_risk(it, inp)} for it in items]


# ---- plan ------------------------------------------------------------------------------------------
def _model_ref(cat, args) -> dict:
    """``{"model_ref": ...}`` when MODEL was a file or an hf: id (how `export --plan` finds the same shapes)."""
    ref = cat.model_ref(args.model) if getattr(args, "model", None) else None
    return {"model_ref": ref} if ref else {}


def cmd_plan(args):
    from shardlab.cli.common import cluster_from_args, resolve_model
    from shardlab.errors import ShardlabError
    from shardlab.estimate.workload import workload_for
    from shardlab.memory import load_overheads
    from shardlab.planner.explain import axis_reasons, comm_table, runner_up
    from shardlab.planner.report import render_plan
    from shardlab.planner.search import plan_training
    from shardlab.teach.plan_story import with_explanation
    from shardlab.units import parse_count

    cat = _catalog(args)
    if args.inference:
        _refuse_recipe_flags(args)
        if args.max_memory_fraction is not None:
            raise ShardlabError("--max-memory-fraction is for training plans; a serving plan leaves memory free with "
                                "--gpu-memory-utilization F (the engine's own setting)")
        from shardlab.cli.inference_cmds import plan_inference_cmd

        return with_explanation(args, *plan_inference_cmd(args, cat))
    if args.max_memory_fraction is None:
        from shardlab.planner.search import DEFAULT_MEMORY_FRACTION

        args.max_memory_fraction = DEFAULT_MEMORY_FRACTION
    if args.objective == "latency":
        raise ShardlabError("--objective latency is for --inference; training plans use throughput, cost or memory")
    from shardlab.cli.inference_args import refuse_serving_flags
    from shardlab.cli.plan_fix import layout_flags_as_fixes, parse_fix

    refuse_serving_flags(args)
    spec, _ = resolve_model(args, cat)
    if spec is None:
        raise ShardlabError("plan needs a model's shapes: give MODEL, not --params")
    probe = cluster_from_args(args, cat, 1)
    gpus = args.gpus or (args.nodes * probe.gpus_per_node if args.nodes else args.gpus_default)
    if args.nodes and args.gpus and args.gpus != args.nodes * probe.gpus_per_node:
        raise ShardlabError(f"--nodes {args.nodes} × {probe.gpus_per_node} GPUs per node ≠ --gpus {args.gpus}; give one of them")
    cluster = cluster_from_args(args, cat, gpus).require_whole_nodes()
    seq = _seq_len(args, spec)
    from shardlab.estimate.training import positions_notes

    seq_notes = positions_notes(spec, seq)      # learned positions: refused; RoPE/ALiBi beyond: said
    from shardlab.layout import TOKENS_PER_STEP

    gb = args.global_batch or max(1, TOKENS_PER_STEP // seq)   # default: 4M tokens per step, as every command
    if getattr(args, "export", None) and not args.framework:   # search what the export target runs
        args.framework = EXPORT_FRAMEWORK.get(getattr(args, "launch", None) or "") or EXPORT_FRAMEWORK.get(args.export)
    fw = resolve_framework(args, cat)
    wl = workload_for(fw, seq_len=seq, global_batch=gb, precision=args.precision, optimizer=args.optimizer,
                      flash_attention=not args.no_flash_attention, dropout=args.dropout, compile=args.compile,
                      recipe=_recipe(args, cat, cluster), **_overrides(args, cat))
    fixed = layout_flags_as_fixes(args, parse_fix(args.fix))
    if args.recompute_modules:      # the search's selective option re-runs these: each must exist in the model
        from shardlab.comm.moe_dispatch import check_overlap_modules
        from shardlab.layout import Layout
        from shardlab.layout_checks import validate

        validate(Layout(recompute="selective", recompute_modules=args.recompute_modules), spec)
        check_overlap_modules(wl.moe, args.recompute_modules)
    if wl.recipe.offload.params:  # parameter offload exists only with ZeRO-3 shards
        fixed.setdefault("zero", 3)
    from shardlab.cli.progress import bar

    with bar(1, "plan", unit="step") as tick:
        res = plan_training(spec, cluster, wl, objective=args.objective, top=args.top, fixed=fixed,
                            overheads=load_overheads(args.overheads, args.no_overheads), progress=tick, framework=fw,
                            memory_fraction=args.max_memory_fraction, recompute_modules=args.recompute_modules)
    offload_note = None
    if not res.plans and wl.recipe.offload.what == "none" and wl.recipe.lora is None and fixed.get("zero", 3) == 3:
        # nothing fits in GPU memory: try FSDP CPU offload (ZeRO-3, parameters, gradients and optimizer on the host);
        # not when the user fixed another ZeRO stage (the search keeps what the user fixed)
        from dataclasses import replace

        from shardlab.memory.offload import Offload

        wl_off = replace(wl, recipe=replace(wl.recipe, offload=Offload("both")))
        try:         # ZeRO-3 has nothing to shard on one GPU (or the framework lacks it): the first search's reasons stand
            res_off = plan_training(spec, cluster, wl_off, objective=args.objective, top=args.top,
                                    fixed={**fixed, "zero": 3}, framework=fw,
                                    overheads=load_overheads(args.overheads, args.no_overheads),
                                    memory_fraction=args.max_memory_fraction, recompute_modules=args.recompute_modules)
        except ShardlabError:
            res_off = None
        if res_off is not None and res_off.plans:
            res, wl = res_off, wl_off
            within = (f"within {100 * args.max_memory_fraction:g}% of GPU memory" if args.max_memory_fraction < 1.0
                      else "in GPU memory")
            offload_note = (f"no layout fits {within} without offload: these plans keep parameters, gradients and "
                            "optimizer state in host memory (--zero 3 --offload both, FSDP CPU offload)")
    tokens = parse_count(args.tokens, "--tokens") if args.tokens else None
    doc = {"model": spec.name, **_model_ref(cat, args), "gpus": gpus, "gpu": cluster.accelerator.id,
           "gpus_per_node": cluster.gpus_per_node, "framework": framework_doc(fw, wl),
           "intra_link": cluster.intra_link.id, "inter_link": cluster.inter_link.id, "objective": args.objective,
           "workload": {"seq_len": seq, "global_batch": gb, "precision": args.precision, "optimizer": args.optimizer,
                        "tokens_per_step": seq * gb, "offload": wl.recipe.offload.what,
                        "lora_rank": wl.recipe.lora.rank if wl.recipe.lora else None,
                        "quantize_base": wl.recipe.lora.quantize_base if wl.recipe.lora else "none",
                        "offload_device": wl.recipe.offload.device,
                        "lora_targets": list(wl.recipe.lora.targets) if wl.recipe.lora else None,
                        "fp8_params": wl.fp8_params},
           "notes": seq_notes + ([offload_note] if offload_note else []),
           "evaluated": res.evaluated, "combinations": res.total, "rejected": dict(res.rejected), "search_s": res.search_s,
           "plans": [{k: v for k, v in p.items() if k != "index"} for p in res.plans]}
    if tokens:
        for p in doc["plans"]:
            steps = math.ceil(tokens / (seq * gb) - 1e-9)          # whole steps, as estimate and cost count them
            p["train_days"] = steps * p["step_time_s"] / 86400
            p["gpu_hours"] = steps * p["step_time_s"] / 3600 * p["gpus"]
    doc["capacity_bytes"] = cluster.accelerator.memory_bytes
    doc["memory_fraction"] = args.max_memory_fraction
    doc["assumptions"] = _assumptions(args)
    if res.plans:
        doc["worksheet"] = axis_reasons(res)
        doc["runner_up"] = runner_up(res)
        doc["communication"] = comm_table(res)
        mem = _winner_memory(res, args)
        doc["detail"] = _winner_detail(res, args, mem)
        if wl.recipe.offload.what != "none":      # chosen here or asked for with --offload
            host = float(mem.worst.host_total)
            # host RAM is not in the catalog, so it cannot be checked: say how much the plan needs
            gpn = min(cluster.gpus_per_node, gpus)
            doc["host_bytes_per_gpu"] = host
            doc["notes"].append(f"host memory the winner needs: {host / 2**30:,.1f} GiB per GPU = "
                                f"{host * gpn / 2**40:,.2f} TiB per node of {gpn} GPUs (`shardlab memory` with its "
                                f"layout and --offload {wl.recipe.offload.what}); check your servers' RAM, which the "
                                f"catalog does not hold")
    return with_explanation(args, doc, render_plan(doc))


def _assumptions(args) -> dict:
    """The modelling switches behind the numbers (shown on the report's inputs section)."""
    return {"flash_attention": not args.no_flash_attention, "dropout": bool(args.dropout),
            "dp_overlap": not args.no_dp_overlap, "tp_comm_overlap": bool(getattr(args, "tp_comm_overlap", False)),
            "grad_reduce": "fp32" if args.grad_reduce_fp32 else "bf16/fp16" if getattr(args, "grad_reduce_bf16", False)
            else "the framework's",
            "attention_kernel": getattr(args, "attention_kernel", None) or "the framework's",
            "fused_loss": {None: "the framework's", True: "yes", False: "no"}[getattr(args, "fused_loss", None)],
            "compile": getattr(args, "compile", None),
            "overheads": "none" if args.no_overheads else (args.overheads or "documented defaults (docs/memory.md)"),
            "profile": getattr(args, "profile", None)}


def _winner_memory(res, args):
    """The memory model's report for the best plan (the page detail and the offload host-RAM note read it)."""
    from shardlab.estimate.workload import workload_memory
    from shardlab.memory import load_overheads
    from shardlab.planner.search import layout_of

    best = res.plans[0]
    return workload_memory(layout_of(res.cands, best["index"]), res.model, res.cluster.accelerator, res.workload,
                           best["layout"]["microbatches"], load_overheads(args.overheads, args.no_overheads))


def _winner_detail(res, args, mem) -> dict:
    """planner.detail for the best plan (rank map, per-stage memory, pipeline, TP diagram)."""
    from shardlab.planner.detail import layout_detail
    from shardlab.planner.search import layout_of

    best, wl = res.plans[0], res.workload
    return layout_detail(res.model, layout_of(res.cands, best["index"]), res.cluster, mem, seq_len=wl.seq_len,
                         microbatches=best["layout"]["microbatches"], breakdown=best["breakdown"], precision=wl.precision)
