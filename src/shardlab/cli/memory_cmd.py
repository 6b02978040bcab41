"""shardlab memory: per-GPU training memory for a model and layout, worst rank named."""

from __future__ import annotations

from shardlab.cli import export_cmds
from shardlab.cli.common import BOUNDED, add_cluster_args, add_layout_args, add_model_args, add_output_args
from shardlab.cli.report_cmd import add_html_arg
from shardlab.layout import recompute_words

EXAMPLES = """examples:
  shardlab memory llama-3.1-8b --gpus 8 --zero 3
  shardlab memory llama-3.1-70b --gpus 64 --tp 8 --pp 2 --zero 1 --sequence-parallel --recompute selective
  shardlab memory --params 7.5e9 --dp 64 --zero 2 --framework deepspeed   # the ZeRO paper's worked example (16.64 GB)
  shardlab memory path/to/config.json --gpus 4 --tp 4 --json
  shardlab memory llama-2-7b --gpu rtx-4090 --lora-rank 16 --quantize-base nf4 --seq-len 2048   # QLoRA on one GPU
  shardlab memory --finetune-ladder --gpu rtx-4090 --seq-len 2048 --lora-rank 16   # where full, LoRA and QLoRA stop
  shardlab memory llama-3.1-70b --gpus 8 --zero 3 --offload both                  # FSDP CPU offload
  shardlab memory llama-3.1-8b --gpus 8 --zero 1 --precision fp8-mixed            # FP8 training (TE style)
"""


def register(sub) -> None:
    import argparse

    p = sub.add_parser("memory", help="per-GPU training memory (weights, grads, optimizer, activations, overheads)",
                       description="Peak memory per GPU for training: model states, activations and the overheads "
                                   "estimators usually forget, for the worst rank, and whether it fits.",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p, default="llama-3.1-8b", bare_count=True)
    add_layout_args(p)
    add_cluster_args(p)
    g = p.add_argument_group("assumptions")
    g.add_argument("--global-batch", type=BOUNDED["batch"], default=None,
                   help="sequences per optimizer step, as estimate and plan take it (sets the micro-batches in flight; "
                        "default: about 4M tokens per step, as every command assumes)")
    g.add_argument("--no-flash-attention", action="store_true", help="store the s×s attention scores (no flash attention)")
    g.add_argument("--dropout", choices=("auto", "on", "off"), default="auto", nargs="?", const="on",
                   help="dropout masks in activations (auto = off, as estimate and plan assume; on, or the bare flag "
                        "as estimate takes it: GPT-3-era training)")
    from shardlab.cli.plan_args import add_fused_loss_args, add_moe_dispatch_args

    add_fused_loss_args(g)
    g.add_argument("--tp-comm-overlap", action="store_true", help="as estimate takes it (no effect on memory)")
    g.add_argument("--attention-kernel", choices=("flash1", "flash2", "native"), default=None,
                   help="as estimate takes it (no effect on memory)")
    g.add_argument("--no-dp-overlap", action="store_true", help="as estimate takes it (no effect on memory)")
    add_moe_dispatch_args(g, imbalance=True)
    g.add_argument("--overheads", metavar="FILE", help="YAML overriding the overhead defaults (see docs/memory.md)")
    g.add_argument("--no-overheads", action="store_true", help="model states and activations only (as other estimators report)")
    from shardlab.cli.common import add_grad_reduce_args

    add_grad_reduce_args(g)
    from shardlab.cli.recipe_args import add_recipe_args

    add_recipe_args(p)
    from shardlab.cli.common import add_framework_args

    add_framework_args(p)
    p.add_argument("--finetune-ladder", action="store_true",
                   help="on one GPU: every catalog model under full training, LoRA and QLoRA, and where each stops fitting")
    add_output_args(p)
    add_html_arg(p, "memory")
    export_cmds.hook(p, cmd_memory)


def cmd_memory(args):
    from shardlab.catalog import get_catalog
    from shardlab.cli.common import layout_from_args, resolve_model
    from shardlab.memory import load_overheads, training_memory

    from shardlab.cli.recipe_args import recipe_from_args

    cat = get_catalog(args.catalog)
    if args.finetune_ladder:
        from shardlab.cli.finetune_ladder import cmd_ladder

        return cmd_ladder(args, cat)
    spec, params = resolve_model(args, cat)
    layout = layout_from_args(args)
    from shardlab.cli.common import resolve_gpu

    from shardlab.cli.common import grad_reduce_choice, resolve_framework
    from shardlab.estimate.workload import workload_overheads
    from shardlab.specs.framework import effective_grad_bytes

    acc = cat.accelerator(resolve_gpu(args, cat))
    seq_notes = []
    if spec is not None and args.seq_len:
        from shardlab.estimate.training import positions_notes

        seq_notes = positions_notes(spec, args.seq_len)   # learned positions: refused; RoPE/ALiBi beyond: said
    fw = resolve_framework(args, cat)   # the same mechanisms `estimate` and `plan` assume for this framework
    compiled = fw.kernels_for(args.compile) == "compiled"
    grad_bytes = effective_grad_bytes(fw, args.precision, grad_reduce_choice(args))[1]   # 0: the gradient dtype
    fused = fw.fused_loss if args.fused_loss is None else args.fused_loss
    imbalance, ep_overlap = 1.0, False
    if spec is not None and spec.moe is not None:     # as estimate prices a MoE job (estimate.workload_memory)
        from shardlab.comm.moe_dispatch import MoeDispatch, overlap_applies
        from shardlab.estimate.workload import workload_for

        moe = MoeDispatch(args.moe_dispatcher, bool(args.ep_comm_overlap), args.expert_imbalance or 1.0)
        wl = workload_for(fw, seq_len=args.seq_len or 4096, global_batch=1, precision=args.precision,
                          optimizer=args.optimizer, moe=moe)
        imbalance, ep_overlap = moe.expert_imbalance, overlap_applies(wl, layout)
    rep = training_memory(
        layout, model=spec, params=params, accelerator=acc, seq_len=args.seq_len, precision=args.precision,
        optimizer=args.optimizer, microbatches=_microbatches(args, layout),
        overheads=workload_overheads(fw, load_overheads(args.overheads, args.no_overheads)),
        flash_attention=not args.no_flash_attention, dropout=args.dropout == "on", num_gpus=args.gpus,
        recipe=recipe_from_args(args), fused_loss=fused, compiled=compiled, grad_bytes=grad_bytes,
        expert_imbalance=imbalance, ep_overlap=ep_overlap)
    mech = [m for m, on in (("fused cross-entropy", fused), ("compiled blocks keep only matmul outputs", compiled),
                            ("ZeRO-3 gathers module by module", fw.zero3_live_params > 0),
                            (f"gradients held in a {grad_bytes * 8}-bit main-grad buffer", fw.main_grad_buffer
                             and grad_bytes > 0)) if on]
    rep.notes.append(f"framework {fw.id}" + (f": {', '.join(mech)}" if mech else "") + " (--framework to change)")
    rep.notes.extend(seq_notes)
    doc = rep.to_dict()
    doc["framework"] = fw.id
    doc["main_grad_bytes"] = grad_bytes               # bytes per gradient element held (0: the gradient dtype)
    hints = _hints(rep, args, spec, fw, grad_bytes) if rep.fits is False and spec is not None else []
    doc["hints"] = hints
    return doc, render(rep, hints)


def _microbatches(args, layout) -> int | None:
    """--microbatches, or --global-batch over micro-batch × dp (the way estimate reads them; one of the two)."""
    from shardlab.errors import ShardlabError

    gb, m = getattr(args, "global_batch", None), args.microbatches
    if gb is None:
        return m
    per = layout.micro_batch * layout.dp
    if gb % per:
        raise ShardlabError(f"--global-batch {gb} is not divisible by micro-batch × dp = {layout.micro_batch}×"
                            f"{layout.dp} = {per}; choose a multiple of {per}")
    if m is not None and m != gb // per:
        raise ShardlabError(f"--microbatches {m} disagrees with --global-batch {gb} / (micro-batch × dp = {per}) = "
                            f"{gb // per}; give one of them")
    return gb // per


def _hints(rep, args, spec, fw, grad_bytes: int = 0) -> list[str]:
    """When the layout does not fit, try the usual remedies and say what each would give."""
    from shardlab.estimate.workload import workload_overheads
    from shardlab.memory import load_overheads, training_memory

    out = []
    lay = rep.layout
    tries = []
    if lay.zero < 3 and lay.dp_shard > 1:
        tries.append(("--zero 3", lay.with_(zero=3)))
    if lay.recompute != "full":
        tries.append(("--recompute full", lay.with_(recompute="full")))
    if lay.zero < 3 and lay.dp_shard > 1 and lay.recompute != "full":
        tries.append(("--zero 3 --recompute full", lay.with_(zero=3, recompute="full")))
    from dataclasses import replace

    from shardlab.memory.offload import Offload

    recipes = [(label, alt, rep.recipe) for label, alt in tries]
    if rep.recipe.offload.what == "none" and rep.recipe.lora is None:  # ZeRO-Offload / FSDP CPU offload (host memory)
        recipes.append(("--zero 3 --offload both", lay.with_(zero=3), replace(rep.recipe, offload=Offload("both"))))
    for label, alt, recipe in recipes:
        r = training_memory(alt, model=spec, accelerator=rep.accelerator, seq_len=rep.seq_len,
                            precision=rep.precision, optimizer=rep.optimizer, microbatches=rep.microbatches,
                            overheads=workload_overheads(fw, load_overheads(args.overheads, args.no_overheads)),
                            flash_attention=not args.no_flash_attention, dropout=args.dropout == "on", recipe=recipe,
                            fused_loss=fw.fused_loss if args.fused_loss is None else args.fused_loss,
                            compiled=fw.kernels_for(args.compile) == "compiled", grad_bytes=grad_bytes,
                            expert_imbalance=getattr(args, "expert_imbalance", None) or 1.0)
        gib = r.worst.total / 2**30
        host = f", {r.worst.host_total / 2**30:.1f} GiB per GPU in host memory" if r.worst.host_total else ""
        out.append(f"{label}: {gib:.1f} GiB per GPU{host} ({'fits' if r.fits else 'still too large'})")
    out.append("`shardlab plan` searches every layout for the fastest one that fits")
    return out


def render(rep, hints: list[str] = ()) -> str:
    from shardlab.render.table import table
    from shardlab.units import fmt_count

    lay, w = rep.layout, rep.worst
    gib = lambda b: f"{b / 2**30:,.2f}"
    gpu = f" on {lay.world_size} × {rep.accelerator.id} ({rep.accelerator.memory_gib:g} GiB)" if rep.accelerator else ""
    head = [f"shardlab memory: {rep.model_name} ({fmt_count(rep.params)} params"
            + (f", {fmt_count(rep.active_params)} active" if rep.active_params != rep.params else "") + f"){gpu}",
            f"layout: dp {lay.dp} × tp {lay.tp} × pp {lay.pp} × cp {lay.cp}" + (f", ep {lay.ep}" if lay.ep > 1 else "")
            + f", ZeRO-{lay.zero}, micro-batch {lay.micro_batch}" + (f", seq {rep.seq_len}" if rep.seq_len else "")
            + (f", {lay.schedule} m={rep.microbatches}" + (f" vpp={lay.vpp}" if lay.vpp > 1 else "") if lay.pp > 1 else "")
            + f", recompute {recompute_words(lay)}" + (", sequence parallel" if lay.sequence_parallel else "")
            + f", {rep.precision}, {rep.optimizer}",
            f"worst rank: rank {w.rank}: {rep.worst_reason()}", ""]
    rows = [["weights", gib(w.weights), rep.explain.get("weights", "")],
            ["gradients", gib(w.gradients), rep.explain.get("gradients", "")],
            ["optimizer", gib(w.optimizer), rep.explain.get("optimizer", "")],
            ["  fp32 master weights", gib(w.master_weights), ""],
            ["  moments", gib(w.moments), ""],
            ["model states", gib(w.model_states), rep.explain.get("model_states", "")],
            ["activations", gib(w.activations), rep.explain.get("activations", "not estimated (parameter count only)")]]
    for k, v in w.other.items():
        rows.append([f"  {k}", gib(v), ""])
    rows.insert(7, ["other (overheads)", gib(w.other_total), "defaults documented in docs/memory.md (estimates)"])
    rows.append(["total", gib(w.total), ""])
    for k, v in w.host.items():
        rows.append([f"{rep.recipe.offload.device}: {k}", gib(v), ""])
    if w.host:
        rows.append([f"{rep.recipe.offload.device} total (off the GPU)", gib(w.host_total), rep.explain.get("offload", "")])
    lines = head + [table(["category", "GiB", "where it comes from"], rows, align="lrl")]
    lines += _recipe_lines(rep)
    if rep.accelerator:
        cap = rep.capacity_bytes
        room = cap - w.total
        verdict = (f"FITS on {rep.accelerator.id}: {gib(room)} GiB headroom ({100 * room / cap:.0f}% of {gib(cap)} GiB)"
                   if room >= 0 else
                   f"DOES NOT FIT on {rep.accelerator.id}: needs {gib(w.total)} GiB of {gib(cap)} GiB ({gib(-room)} GiB over)")
        lines += ["", verdict]
        from shardlab.memory.overheads import margin_note

        if (tight := margin_note(w.total, cap)):
            lines.append(f"  {tight}")
    if len(rep.stages) > 1:
        srows = [[s.stage, s.rank, s.layers, fmt_count(s.params), gib(s.model_states), f"{s.in_flight:g}", gib(s.activations),
                  gib(s.other_total), gib(s.total)] for s in rep.stages]
        lines += ["", table(["stage", "rank", "layers", "params", "states GiB", "in flight", "act GiB", "other GiB", "total GiB"],
                            srows, title="per pipeline stage (every TP/CP/DP rank of a stage holds the same)")]
    if hints:
        lines += ["", "to make it fit:"] + [f"  {h}" for h in hints]
    if rep.notes:
        lines += ["", "notes:"] + [f"  {n}" for n in rep.notes]
    return "\n".join(lines)


def _recipe_lines(rep) -> list[str]:
    """LoRA/QLoRA and FP8 lines under the table (the offload rows are in it)."""
    out = []
    lo = rep.recipe_summary.get("lora")
    if lo:
        out.append(f"LoRA r={lo['rank']} on {', '.join(lo['targets'])}: {lo['trainable_params']:,} trainable parameters "
                   f"({100 * lo['trainable_share']:.2f}% of {rep.params:,}); base "
                   + (f"NF4 ({lo['nf4_bits_per_weight']:.3f} bits per linear weight, QLoRA)" if lo["quantize_base"] == "nf4"
                      else "frozen in bf16"))
    if "fp8" in rep.explain:
        out.append(f"fp8-mixed: {rep.explain['fp8']}")
    return out
