"""Fine-tuning memory on one GPU: full training vs LoRA vs QLoRA, and the largest model each fits (curriculum item 21).

Every number comes from ``memory.training_memory`` with a LoRA/QLoRA ``Recipe`` (the function ``shardlab memory
--lora-rank R --quantize-base nf4`` calls), the base/adapter split from ``memory.recipe.rank_states`` and the
largest fitting catalog model from the ladder ``shardlab memory --finetune-ladder`` prints.
"""

from __future__ import annotations

from shardlab.teach.explanation import Explanation
from shardlab.teach.params import Param
from shardlab.teach.registry import Topic
from shardlab.teach.topics._common import catalog, cluster, gib, gpu, model
from shardlab.units import fmt_count

LABELS = {"full": "full fine-tuning", "lora": "LoRA (bf16 base)", "qlora": "QLoRA (NF4 base)"}
"""The three methods, in the ladder's keys."""


def finetune_memory(v: dict) -> Explanation:
    """Weights, gradients, optimizer state and activations of full training, LoRA and QLoRA on one GPU."""
    from shardlab.estimate.ladder import ladder
    from shardlab.estimate import estimate_training
    from shardlab.layout import Layout
    from shardlab.memory.lora import LoraSpec, adapter_param_count, nf4_bits_per_weight
    from shardlab.memory.overheads import Overheads
    from shardlab.memory.precision import state_bytes
    from shardlab.memory.recipe import Recipe, rank_states
    from shardlab.specs.tensors import model_tensors

    cat = catalog()
    spec, cl, fw = cat.model(v["model"]), cluster(v["gpu"], 1), cat.framework(v["framework"])
    acc = cl.accelerator
    seq, r = min(v["seq"], spec.max_seq_len), v["rank"]
    lay = Layout(recompute=v["recompute"])
    recipes = {"full": Recipe(), "lora": Recipe(lora=LoraSpec(r)), "qlora": Recipe(lora=LoraSpec(r, quantize_base="nf4"))}
    reps = {k: estimate_training(spec, lay, cl, seq_len=seq, global_batch=1, framework=fw, recipe=rec).memory.worst
            for k, rec in recipes.items()}
    from shardlab.specs.framework import effective_grad_bytes

    sb = state_bytes("bf16-mixed", "adamw", effective_grad_bytes(fw, "bf16-mixed")[1])   # megatron-lm: fp32 gradients
    grad = "an fp32 gradient (the framework's main_grad buffer)" if sb.gradients == 4 else "a bf16 gradient"
    parts = rank_states(model_tensors(spec), spec, lay, sb, recipes["qlora"], "bf16-mixed").parts
    lparts = rank_states(model_tensors(spec), spec, lay, sb, recipes["lora"], "bf16-mixed").parts
    trainable = adapter_param_count(spec, recipes["lora"].lora)
    bits = nf4_bits_per_weight(recipes["qlora"].lora)
    cap = acc.memory_bytes
    rows_all = ladder(cat, acc, lay, seq_len=v["seq"], rank=r, targets=("all-linear",), overheads=Overheads(), framework=fw)
    largest = {k: max((x for x in rows_all if x[k] <= cap), key=lambda x: x["params"], default=None) for k in LABELS}
    stop = {k: (f"{x['model']} ({fmt_count(x['params'])})" if x else "none") for k, x in largest.items()}
    f, lo, q = reps["full"], reps["lora"], reps["qlora"]
    fits = lambda w: "fits" if w.total <= cap else "does NOT fit"  # noqa: E731
    rows = [[LABELS[k], gib(w.weights), gib(w.gradients), gib(w.optimizer), gib(w.activations), gib(w.other_total),
             gib(w.total), "yes" if w.total <= cap else "no", stop[k]] for k, w in reps.items()]
    return Explanation(
        "finetune-memory", "Fine-tuning on one GPU: full, LoRA, QLoRA",
        f"Fine-tuning {spec.name} ({fmt_count(f.params)} parameters) on one {acc.id} ({gib(cap)}) at {seq} tokens: how much "
        f"memory do full training, LoRA (r = {r}) and QLoRA take, and where does single-GPU training stop?",
        dict(v),
        [f"full: every parameter has a bf16 weight, {grad} and fp32 master + Adam moments: {sb.total:g} B × "
         f"{fmt_count(f.params)} = {gib(f.model_states)} of model states; {fits(f)} ({gib(f.total)} with activations)",
         f"LoRA freezes the base (2 B per weight, no gradient, no optimizer state: {gib(lparts['base_bf16_bytes'])}) and "
         f"trains adapters A (r × in) and B (out × r) on every linear: {fmt_count(trainable)} parameters "
         f"({trainable / f.params:.2%}), each with the full {sb.total:g} B: gradients {gib(lo.gradients)}, optimizer "
         f"{gib(lo.optimizer)}; total {gib(lo.total)}, {fits(lo)}",
         f"QLoRA stores the frozen base linears in 4-bit NormalFloat: 4-bit codes + an 8-bit scale per 64 weights + an "
         f"fp32 scale per 256 blocks = {bits:.3f} bits per weight: {gib(parts['base_quantized_bytes'])} (+ embeddings, "
         f"norms and head in bf16, {gib(parts['base_bf16_bytes'])}); the adapters stay bf16 with fp32 optimizer state; "
         f"total {gib(q.total)}, {fits(q)}",
         f"activations do not shrink: backward still runs through every frozen layer, so all three keep about "
         f"{gib(f.activations)} of activations at {seq} tokens (LoRA adds its r-wide intermediates: {gib(lo.activations)})"
         + (f"; --recompute {v['recompute']} is in effect" if v["recompute"] != "none" else "; recompute=full cuts them"),
         f"where single-GPU training stops on the {acc.id} (every catalog model at {v['seq']} tokens): full fine-tuning "
         f"{stop['full']}, LoRA {stop['lora']}, QLoRA {stop['qlora']}"],
        f"Full fine-tuning pays {sb.total:g} bytes for every parameter, so one {acc.id} stops at {stop['full']}. LoRA freezes the "
        f"model and trains small adapters ({trainable / f.params:.2%} of the parameters here): the optimizer state almost "
        f"vanishes, but the frozen weights still take 2 bytes each. QLoRA stores them in about half a byte, which is why a "
        f"single {acc.id} reaches {stop['qlora']}. What is left is mostly activations, which no adapter trick removes; "
        f"recomputation or shorter sequences move every boundary up.",
        {k: {"weights_bytes": w.weights, "gradients_bytes": w.gradients, "optimizer_bytes": w.optimizer,
             "activations_bytes": w.activations, "total_bytes": w.total, "fits": w.total <= cap} for k, w in reps.items()}
        | {"trainable_params": trainable, "nf4_bits_per_weight": bits,
           "largest_fitting": {k: (x["model"] if x else None) for k, x in largest.items()}},
        table=(["method", "weights", "grads", "optimizer", "activations", "other", "total", "fits", "largest that fits"], rows),
        sources=["lora", "qlora", "zero"], code=["peft-lora", "peft-layer"],
        commands=[f"memory {spec.name} --gpus 1 --gpu {acc.id} --seq-len {seq} --lora-rank {r} --quantize-base nf4 "
                  f"--framework {fw.id}" + (f" --recompute {v['recompute']}" if v["recompute"] != "none" else ""),
                  f"memory --finetune-ladder --gpu {acc.id} --seq-len {v['seq']} --lora-rank {r} --framework {fw.id}"],
        notes=[f"AdamW with bf16 weights and fp32 master/moments for what trains; LoRA on all linear layers with dropout 0; "
               f"{fw.id}'s memory mechanisms (catalog/data/frameworks.yaml); the ladder checks every catalog model of at "
               "least 100M parameters (memory --finetune-ladder)"])


TOPICS = [
    Topic("finetune-memory", "Fine-tuning memory", "full vs LoRA vs QLoRA on one GPU, and where each stops", (21,),
          (model("llama-2-7b"), gpu("rtx-4090"), Param("rank", "int", 16, "LoRA rank r"),
           Param("seq", "int", 2048, "tokens per sequence"),
           Param("recompute", "str", "none", "activation recomputation", ("none", "selective", "full")),
           Param("framework", "str", "pytorch-fsdp", "framework profile (catalog/data/frameworks.yaml)")), finetune_memory),
]
