"""What a recipe (offload, LoRA/QLoRA, FP8) did to a memory report: a summary for --json and the explanation lines."""

from __future__ import annotations

from shardlab.errors import field_name

from shardlab.memory.fp8 import FP8_COPIES_BYTES, FP8_TENSORS_PER_GEMM
from shardlab.memory.lora import adapter_param_count, nf4_bits_per_weight
from shardlab.memory.precision import StateBytes
from shardlab.units import fmt_bytes, fmt_count


def recipe_summary(rep, model, sb: StateBytes) -> dict:
    """{'offload': ..., 'lora': ..., 'fp8': ...} for the parts in use; rewrites rep.explain's state lines to match."""
    r, w, out = rep.recipe, rep.worst, {}
    if r.lora is not None and model is not None:
        lo = r.lora
        trainable = adapter_param_count(model, lo)
        out["lora"] = {"rank": lo.rank, "targets": list(lo.targets), "quantize_base": lo.quantize_base,
                       "trainable_params": trainable, "trainable_share": trainable / rep.params,
                       "nf4_bits_per_weight": nf4_bits_per_weight(lo) if lo.quantize_base == "nf4" else None}
        base = ("NF4 base linears at 4-bit codes + 8-bit block scales per 64 + fp32 scales per 256 blocks = "
                f"{nf4_bits_per_weight(lo):.3f} bits each (QLoRA §3), embeddings/norms/head bf16"
                if lo.quantize_base == "nf4" else "frozen bf16 base")
        rep.explain["weights"] = (f"{base}, plus {fmt_count(trainable)} adapter params (r={lo.rank}, "
                                  f"{', '.join(lo.targets)}) × {sb.weights} B = {fmt_bytes(w.weights)}")
        rep.explain["gradients"] = f"adapters only (the base is frozen): × {sb.gradients} B = {fmt_bytes(w.gradients)}"
        rep.explain["optimizer"] = (f"adapters only: × ({sb.master} B fp32 master + {sb.moments:g} B moments) = "
                                    f"{fmt_bytes(w.optimizer)}  [LoRA, Hu et al. 2021; ZeRO §3.1]")
    if rep.precision == "fp8-mixed":
        out["fp8"] = {"amax_history_len": r.fp8.amax_history_len, "weight_cache": r.fp8.weight_cache,
                      "fsdp_fp8_all_gather": r.fp8.all_gather, "primary_weights": r.fp8.primary_weights,
                      "weight_cache_bytes": w.other.get("fp8_weight_cache", 0),
                      "scaling_state_bytes": w.other.get("fp8_scaling_state", 0),
                      "saved_linear_inputs": "fp8 (1 byte)", "gemm_dtype": "fp8 (E4M3 forward, E5M2 gradients)"}
        rep.explain["fp8"] = (f"FP8 weight copies {FP8_COPIES_BYTES} B (weight + transpose) per linear weight"
                              f"{' (per gathered unit under ZeRO-3)' if rep.layout.zero >= 3 else ''}, "
                              f"{FP8_TENSORS_PER_GEMM} scaled tensors per GEMM × (amax history {r.fp8.amax_history_len} + 2) × 4 B; "
                              f"linear inputs saved in FP8 [Transformer Engine; Micikevicius 2022]")
        if r.fp8.primary_weights and r.lora is None:   # the weights line: the FP8 GEMM weights keep no bf16 copy
            rep.explain["weights"] = (f"{rep.explain['weights'].rsplit(' = ', 1)[0]}, less the FP8 GEMM weights' bf16 "
                                      f"copies (FP8 primary weights, {field_name('recipe.fp8_params')}: {'1 B' if rep.layout.zero >= 3 else '2 B'}"
                                      f" each{' of the shard' if rep.layout.zero >= 3 else ''}) = {fmt_bytes(w.weights)}")
    if r.offload.what != "none":
        off = r.offload
        out["offload"] = {"what": off.what, "device": off.device, "host_bytes_per_gpu": w.host_total,
                          "host_breakdown": dict(w.host)}
        if rep.accelerator is not None:
            gpn = min(rep.accelerator.system.get("gpus_per_node", 8), rep.layout.world_size)   # a node holds at most the job
            out["offload"].update(gpus_per_node=gpn, host_bytes_per_node=w.host_total * gpn)
        moved = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in w.host.items())
        for key, line in (("weights", "weights"), ("gradients", "gradients"), ("master_weights", "optimizer")):
            if key in w.host:
                off_b = w.host[key] + (w.host.get("moments", 0) if key == "master_weights" else 0)
                rep.explain[line] = (f"{fmt_bytes(off_b)} per GPU kept in {off.device} memory instead "
                                     + ("(the GPU holds only the all-gathered units, in fsdp_buffers)" if key == "weights" else
                                        "(the GPU holds only the reduction buckets)" if key == "gradients" else
                                        "(the optimizer step runs on the CPU)"))
        node = (f"; × {out['offload']['gpus_per_node']} GPUs per node = {fmt_bytes(out['offload']['host_bytes_per_node'])} "
                f"of {off.device} memory per node" if "host_bytes_per_node" in out["offload"] else "")
        rep.explain["offload"] = (f"{off.what} offloaded to {off.device}: {moved} per GPU leave the GPU{node} "
                                  f"[ZeRO-Offload arXiv 2101.06840 §4; ZeRO-Infinity arXiv 2104.07857 §5]")
    return out
