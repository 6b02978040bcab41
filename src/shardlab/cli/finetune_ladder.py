"""`shardlab memory --finetune-ladder`: on one GPU, every catalog model under full training, LoRA and QLoRA.

Answers "single-GPU training stops near 7B with QLoRA" (curriculum item 21) with the learner's GPU, sequence length
and rank: the peak memory of each model under each method, and the largest model each method fits.
"""

from __future__ import annotations

from shardlab.estimate.ladder import METHODS, ladder  # noqa: F401 (re-exported for callers of the CLI module)


def cmd_ladder(args, cat):
    from shardlab.cli.common import layout_from_args, resolve_gpu
    from shardlab.errors import ShardlabError
    from shardlab.memory import load_overheads
    from shardlab.render.table import table
    from shardlab.units import fmt_count

    if args.model or args.params:
        raise ShardlabError("--finetune-ladder runs every catalog model: drop MODEL/--params (or drop --finetune-ladder)")
    given = [f for f, on in (("--offload", args.offload != "none"), ("--quantize-base", args.quantize_base != "none"),
                             ("--precision", args.precision != "bf16-mixed"), ("--optimizer", args.optimizer != "adamw")) if on]
    if given:
        raise ShardlabError(f"--finetune-ladder compares its own three recipes (full bf16-mixed AdamW, LoRA, QLoRA): "
                            f"drop {', '.join(given)}")
    layout = layout_from_args(args)
    if layout.world_size != 1:
        raise ShardlabError("--finetune-ladder answers the single-GPU question: drop --gpus/--dp/--tp/--pp/--cp")
    acc = cat.accelerator(resolve_gpu(args, cat))
    rank = args.lora_rank or 16
    seq = args.seq_len or 2048
    from shardlab.cli.common import resolve_framework

    fw = resolve_framework(args, cat)   # the mechanisms `shardlab memory` assumes for one model
    from shardlab.cli.common import grad_reduce_choice

    rows = ladder(cat, acc, layout, seq_len=seq, rank=rank, targets=tuple(args.lora_targets or ('all-linear',)),
                  overheads=load_overheads(args.overheads, args.no_overheads), framework=fw,
                  grad_reduce_bytes=grad_reduce_choice(args))
    cap = acc.memory_bytes
    largest = {k: max((r for r in rows if r[k] <= cap), key=lambda r: r["params"], default=None) for k, _ in METHODS}
    cell = lambda b: f"{b / 2**30:,.1f} {'fits' if b <= cap else '-'}"
    text = [f"shardlab memory --finetune-ladder: one {acc.id} ({acc.memory_gib:g} GiB), seq {seq}, micro-batch "
            f"{layout.micro_batch}, recompute {layout.recompute}, LoRA r={rank} on {', '.join(args.lora_targets or ('all-linear',))}", "",
            table(["model", "params", "full GiB", "LoRA GiB", "QLoRA GiB"],
                  [[r["model"], fmt_count(r["params"]), cell(r["full"]), cell(r["lora"]), cell(r["qlora"])] for r in rows],
                  align="lrrrr"), ""]
    for key, label in METHODS:
        best = largest[key]
        text.append(f"{label}: " + (f"largest that fits is {best['model']} ({fmt_count(best['params'])} params, "
                                    f"{best[key] / 2**30:.1f} GiB)" if best else "no catalog model fits"))
    text += ["", "each cell: peak memory per GPU = weights + gradients + optimizer + activations + overheads "
                 "(`shardlab memory MODEL --lora-rank R [--quantize-base nf4]` shows one model's derivation); "
                 "--recompute full or a shorter --seq-len moves every boundary up"]
    doc = {"gpu": acc.id, "capacity_bytes": cap, "framework": fw.id, "seq_len": seq, "lora_rank": rank, "lora_targets": list(args.lora_targets or ("all-linear",)),
           "layout": layout.to_dict(), "rows": rows,
           "largest_fitting": {k: (v["model"] if v else None) for k, v in largest.items()}}
    return doc, "\n".join(text)
