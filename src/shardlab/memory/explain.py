"""The derivation lines of a training memory report (``MemoryReport.explain``): each number with the formula
and the values that made it (ZeRO paper §3.1 for model states, Korthikanti et al. 2022 Table 2 for activations)."""

from __future__ import annotations

from shardlab.memory.activations import ActivationContext
from shardlab.memory.precision import StateBytes
from shardlab.specs.model import ModelSpec
from shardlab.units import fmt_bytes, fmt_count


def explain_states(rep, sb: StateBytes, params_local: int, expert_params: int = 0) -> dict[str, str]:
    """The model-state lines: parameters × bytes per parameter ÷ the ZeRO group, dense and expert terms apart."""
    lay = rep.layout
    w = rep.worst
    mp = (f" after TP {lay.tp} × PP {lay.pp}" + (f" × EP {lay.ep}" if lay.ep > 1 else "")
          + (f" (experts over ETP {lay.expert_tp})" if lay.expert_tp != lay.tp else "")) if lay.tp * lay.pp * lay.ep > 1 else ""

    def term(z: int) -> str:
        D, De = lay.dp_shard, lay.expert_dp
        dense = params_local - expert_params
        dense_s = f"{fmt_count(dense)}{f' / {D}' if lay.zero >= z and D > 1 else ''}"
        if not expert_params:
            return f"{fmt_count(params_local)} params{mp}" + (f" / {D} (ZeRO-{lay.zero} over dp·cp)" if lay.zero >= z and D > 1 else "")
        exp_s = f"{fmt_count(expert_params)} expert{f' / {De}' if lay.zero >= z and De > 1 else ''}"
        return f"({dense_s} dense + {exp_s}) params{mp}" + (f" (ZeRO-{lay.zero} over dp·cp = {D}, experts over "
                                                              f"{'dp·cp/ep' if lay.expert_tp == lay.tp else 'tp·cp·dp/(ep·etp)'} = {De})"
                                                              if lay.zero >= z else "")
    return {
        "model_states": f"= {w.model_states / 1e9:,.2f} GB (1e9 bytes, the ZeRO paper's unit)",
        "weights": f"{term(3)} × {sb.weights} B = {fmt_bytes(w.weights)}" + (" (FSDP2 shards padded per tensor)" if lay.zero >= 3 else ""),
        "gradients": f"{term(2)} × {sb.gradients} B = {fmt_bytes(w.gradients)}"
                     + (" [fp32 main_grad buffer: Megatron-LM's default under bf16 (or --grad-reduce-fp32); "
                        "--grad-reduce-bf16 for 2 B]"
                        if sb.gradients > sb.weights else ""),
        "optimizer": (f"{term(1)} × ({sb.master} B fp32 master + {sb.moments:g} B moments) = {fmt_bytes(w.optimizer)}  "
                      f"[ZeRO paper §3.1: K = {sb.optimizer:g}]"),
    }


def explain_report(rep, spec: ModelSpec, sb: StateBytes, ctx: ActivationContext, parts: dict) -> dict[str, str]:
    """Every line of ``rep.explain``: the model-state lines and the activation sum of the worst stage, whose
    per-term bytes ``parts`` are ``memory.training.stage_activation_parts``."""
    w, lay = rep.worst, rep.layout
    out = explain_states(rep, sb, w.params, w.expert_params)
    kind = "GPT block (Korthikanti 2022 Table 2)" if spec.mlp == "gelu" and spec.norm == "layernorm" else \
        "derived like Korthikanti 2022 Table 2 for RMSNorm/SwiGLU/GQA/MoE blocks"
    mode = {"none": "no recomputation", "selective": "selective recomputation (attention core)",
            "full": "full recomputation (block input only)", "op": "per-op checkpointing (every other matmul output)"}
    per = " + ".join(f"{fmt_bytes(v)} ({k.split(':')[1]})" for k, v in parts.items() if k.startswith("per_layer"))
    terms = [f"[{per} per block per micro-batch: {kind}; s={ctx.seq_len}, b={lay.micro_batch}, tp={lay.tp}"
             f"{', SP' if lay.sequence_parallel else ''}{', flash attention' if ctx.flash_attention else ''}, "
             + (f"selective recomputation ({', '.join(lay.recompute_modules)})" if lay.recompute == "selective"
                and lay.recompute_modules else mode[lay.recompute])
             + (f" on {lay.recompute_fraction:.0%} of the blocks" if lay.recompute_fraction < 1
                and lay.recompute != "none" else "")
             + f"] × {w.layers} blocks × {w.in_flight:g} micro-batches in flight = {fmt_bytes(parts['blocks'])}"]
    for key, label in (("working_set", "one block re-materialised in backward"), ("embedding_mask", "embedding dropout mask"),
                       ("head_inputs", "final-norm and head inputs"), ("adapters", "LoRA adapters' r-wide intermediates")):
        if parts.get(key):
            terms.append(f"{label} {fmt_bytes(parts[key])}")
    out["activations"] = " + ".join(terms) + (f" = {fmt_bytes(w.activations)}" if len(terms) > 1 else "")
    out["other"] = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in w.other.items())
    return out
