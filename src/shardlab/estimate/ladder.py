"""Single-GPU fine-tuning ladder: every catalog model under full training, LoRA and QLoRA (curriculum item 21).

The peak memory of each model under each method on one accelerator, smallest model first; `shardlab memory
--finetune-ladder` and `shardlab explain finetune-memory` print it.
"""

from __future__ import annotations

METHODS = (("full", "full fine-tuning (bf16-mixed AdamW)"), ("lora", "LoRA, frozen bf16 base"),
           ("qlora", "QLoRA, frozen NF4 base"))


def ladder(cat, acc, layout, *, seq_len: int, rank: int, targets: tuple[str, ...], overheads, min_params: float = 1e8,
           framework=None, grad_reduce_bytes: int | None = None):
    """Rows {model, params, full, lora, qlora (bytes)} for catalog models of at least ``min_params``, smallest first.
    ``framework`` (a Framework profile) adds its memory mechanisms (fused loss, compiled blocks, module-wise ZeRO-3
    buffers, gradients held in a main-grad buffer), as `shardlab memory --framework` does; None: none of them.
    ``grad_reduce_bytes``: the user's --grad-reduce-fp32/-bf16 (4, 2), None for the framework's default."""
    from shardlab.estimate.workload import workload_overheads
    from shardlab.memory import training_memory
    from shardlab.memory.lora import LoraSpec
    from shardlab.memory.recipe import Recipe
    from shardlab.specs.framework import effective_grad_bytes
    from shardlab.specs.tensors import param_counts

    recipes = {"full": Recipe(), "lora": Recipe(lora=LoraSpec(rank, targets)),
               "qlora": Recipe(lora=LoraSpec(rank, targets, quantize_base="nf4"))}
    rows = []
    for mid, spec in cat.models.items():
        n = param_counts(spec).total
        if n < min_params:
            continue
        s = min(seq_len, spec.max_seq_len)
        row = {"model": mid, "params": n, "seq_len": s}
        for key, rec in recipes.items():
            rep = training_memory(layout, model=spec, accelerator=acc, seq_len=s, recipe=rec,
                                  overheads=workload_overheads(framework, overheads) if framework else overheads,
                                  fused_loss=bool(framework and framework.fused_loss),
                                  compiled=bool(framework and framework.kernels == "compiled"),
                                  grad_bytes=effective_grad_bytes(framework, "bf16-mixed", grad_reduce_bytes)[1]
                                  if framework else 0)
            row[key] = rep.worst.total
        rows.append(row)
    return sorted(rows, key=lambda r: r["params"])
