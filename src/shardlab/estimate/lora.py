"""Time of LoRA / QLoRA fine-tuning: a frozen base does its forward and the data-gradient half of its backward.

With the base weights frozen (LoRA, Hu et al. 2021, arXiv 2106.09685), backpropagation still needs the gradient with
respect to every layer's input (dgrad: the same FLOPs as the forward GEMM) but no weight gradients (wgrad) for the
base, so a base linear layer costs 1 + 1 forward-GEMM times instead of 1 + 2; attention has no weights and keeps its
full backward; the output head does its dgrad only. The adapters (A: r × in, B: out × r) run forward and both
backward GEMMs; their smallest dimension is r, so they run far from peak (``hardware.gemm_efficiency``).
QLoRA (Dettmers et al. 2023, arXiv 2305.14314 §3): every NF4 weight is dequantized to bf16 before each GEMM that
uses it, forward and dgrad (and the recomputed forward): a memory-bound pass reading the 4.127-bit weight and
writing 2 bytes, per weight per pass.
Model FLOPs for MFU follow what is computed: 2 × (base linear + head) + 3 × (attention + adapters) forward FLOPs.
"""

from __future__ import annotations

import numpy as np

from shardlab.rates.hardware import gemm_time_s, memory_time_s
from shardlab.flops import forward_flops_per_token, op_recomputed_linear_params
from shardlab.memory.lora import LoraSpec, adapter_tensors, is_block_linear, nf4_bits_per_weight
from shardlab.specs.hardware import Accelerator, MatmulEfficiency
from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import layer_matmuls, model_tensors


def _layer_adapters(spec: ModelSpec, layer: int, lora: LoraSpec):
    ts = tuple(t for t in model_tensors(spec) if t.layer == layer)
    return adapter_tensors(spec, lora, ts)


def adapter_flops_per_token(spec: ModelSpec, lora: LoraSpec) -> float:
    """Forward FLOPs of all adapters per token: 2 × (r·in + out·r) per adapted layer."""
    from shardlab.memory.lora import adapter_param_count

    return 2.0 * adapter_param_count(spec, lora)


def lora_training_flops_per_token(spec: ModelSpec, seq_len, lora: LoraSpec, recompute: str = "none",
                                  fraction: float = 1.0, modules: tuple[str, ...] | None = None) -> tuple:
    """(model, hardware) FLOPs per token of a LoRA step: base linears and head forward + dgrad, attention and
    adapters forward + full backward; hardware adds the recomputed forward as ``flops.training_flops_per_token``
    ('selective': the ``modules``' re-run, None the attention core: the attention core if named and the frozen
    base's matmuls of the named modules, ``flops.module_linear_params``; 'op': the frozen base's every other
    matmul, as ``lora_block_step_times`` prices it; under both the adapters' r-wide outputs are always saved,
    ``memory.lora.lora_activation_bytes``); ``fraction`` of the blocks are checkpointed."""
    from shardlab.flops import module_linear_params

    f = forward_flops_per_token(spec, seq_len)
    a = adapter_flops_per_token(spec, lora)
    model = 2 * (f["linear"] + f["logits"]) + 3 * (f["attention"] + a)
    mods = modules or ("core_attn",)
    selective = ("core_attn" in mods) * f["attention"] + 2 * sum(module_linear_params(spec).get(m, 0) for m in mods)
    extra = {"none": 0, "selective": selective, "full": f["linear"] + f["attention"] + a,
             "op": 2 * op_recomputed_linear_params(spec)}[recompute]
    return model, model + fraction * extra


def adapter_gemm_time_s(spec: ModelSpec, layer: int, lora: LoraSpec, tokens, tp, acc: Accelerator,
                        curve: MatmulEfficiency, dtype: str = "bf16"):
    """Forward time of block ``layer``'s adapters per micro-batch: x·Aᵀ (T × in → r) and (x·Aᵀ)·Bᵀ (T × r → out),
    with A and B split by TP like their base layer (arrays over tp)."""
    peak = acc.peak_flops(dtype)
    tp = np.asarray(tp)
    total = 0.0
    for t in _layer_adapters(spec, layer, lora):
        n_out, n_in = t.shape
        if t.tp_dim == 0:
            n_out = -(-n_out // tp)
        elif t.tp_dim == 1:
            n_in = -(-n_in // tp)
        total = total + gemm_time_s(tokens, n_out, n_in, peak, curve)
    return total


def dequant_bytes_per_pass(spec: ModelSpec, layer: int, lora: LoraSpec, tp, ep=1, etp=None,
                           op_only: bool = False, modules: tuple[str, ...] | None = None) -> float:
    """Bytes one dequantization pass over block ``layer``'s NF4 weights moves on one rank: read the NF4 weight
    (bits/8 per element) and write bf16 (2) (arrays over tp; ``etp``: the experts' TP, ``Layout.etp``).
    ``op_only``: only the weights of the matmuls per-op checkpointing re-runs (every other one in forward order,
    ``rates.compute.layer_times``' 'gemm_op_recompute_s'); ``modules``: only those of the matmuls the named
    selective-recompute modules re-run (``specs.tensors.recompute_module``; 'moe' re-runs the shared experts too, as
    ``rates.compute.layer_times``' 'module_recompute_s')."""
    if lora.quantize_base != "nf4":
        return 0.0
    odd = {t.name for i, t in enumerate(layer_matmuls(spec, layer)) if i % 2 == 1} if op_only else None
    if modules is not None:
        from shardlab.specs.tensors import recompute_module

        mods = set(modules) | ({"shared_experts"} if "moe" in modules else set())
        named = {t.name for t in layer_matmuls(spec, layer) if recompute_module(t) in mods}
        odd = named if odd is None else odd & named
    n = 0.0
    for t in model_tensors(spec):
        if t.layer == layer and is_block_linear(t, spec) and (odd is None or t.name in odd):
            n = n + np.prod(np.broadcast_arrays(*t.local_shape(spec, np.asarray(tp), ep, None, etp)), axis=0)
    return n * (nf4_bits_per_weight(lora) / 8 + 2)


def lora_block_step_times(lt: dict, *, adapter_fwd_s, dequant_s, recompute, fraction=1.0, dequant_op_s=0.0,
                          modules: tuple[str, ...] | None = None, dequant_modules_s=0.0) -> dict:
    """Per micro-batch forward, backward and recomputation of a frozen-base block (``compute.layer_times`` parts).

    forward  = base GEMMs + attention + memory-bound + adapters + one dequantization pass
    backward = base GEMMs (dgrad only) + 2 × attention + 2 × memory-bound + 2 × adapters + one dequantization pass
    recompute (as ``compute.block_step_times``): full re-runs the forward; selective what the ``modules`` re-run
    ('module_recompute_s': the frozen base's matmuls and memory-bound kernels of each; None: the attention core), with
    the dequantization of their NF4 weights (``dequant_modules_s``); op the base's every other matmul
    ('gemm_op_recompute_s') and all memory-bound kernels, with the dequantization of the re-run matmuls' NF4 weights
    (``dequant_op_s``). Under selective and op the adapters' r-wide outputs stay saved
    (``memory.lora.lora_activation_bytes``). ``fraction``: share of the blocks checkpointed (the average block's
    recomputation scales with it)."""
    from shardlab.memory.training import recompute_code

    fwd = lt["gemm_s"] + lt["attn_s"] + lt["elem_s"] + adapter_fwd_s + dequant_s
    bwd = lt["gemm_s"] + 2.0 * (lt["attn_s"] + lt["elem_s"] + adapter_fwd_s) + dequant_s
    code = np.asarray(recompute_code(recompute))
    selective = (sum(lt["module_recompute_s"][m] for m in modules) + dequant_modules_s) if modules else lt["attn_s"]
    op = lt.get("gemm_op_recompute_s", 0.0) + lt["elem_s"] + dequant_op_s
    rec = np.where(code == 2, fwd, np.where(code == 1, selective, np.where(code == 3, op, 0.0)))
    return {"fwd_s": fwd, "bwd_s": bwd, "recompute_s": np.asarray(fraction) * rec}


def dequant_time_s(spec: ModelSpec, layer: int, lora: LoraSpec, tp, acc: Accelerator, ep=1, etp=None):
    """Seconds of one dequantization pass over a block's NF4 weights."""
    return memory_time_s(dequant_bytes_per_pass(spec, layer, lora, tp, ep, etp), acc)


def lora_block_times(spec: ModelSpec, layer: int, lora: LoraSpec, lt: dict, tokens, tp, ep, recompute,
                     acc: Accelerator, curve: MatmulEfficiency, dtype: str, etp=None, fraction=1.0,
                     modules: tuple[str, ...] | None = None) -> dict:
    """Forward, backward and recomputation seconds of a frozen-base (LoRA/QLoRA) block per micro-batch: the base
    block's ``lt`` (``rates.compute.layer_times``) with its adapters' GEMMs and the NF4 dequantisation added
    (``lora_block_step_times``; ``fraction``: share of the blocks checkpointed; ``modules``: what selective
    recomputation re-runs, ``Layout.recompute_modules``)."""
    dq = lambda **kw: memory_time_s(dequant_bytes_per_pass(spec, layer, lora, tp, ep, etp, **kw), acc)   # noqa: E731
    return lora_block_step_times(lt, adapter_fwd_s=adapter_gemm_time_s(spec, layer, lora, tokens, tp, acc, curve, dtype),
                                 dequant_s=dequant_time_s(spec, layer, lora, tp, acc, ep, etp), recompute=recompute,
                                 fraction=fraction, dequant_op_s=dq(op_only=True), modules=modules,
                                 dequant_modules_s=dq(modules=modules) if modules else 0.0)
