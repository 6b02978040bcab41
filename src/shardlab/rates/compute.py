"""Compute time of one transformer block (and of the head) per micro-batch on one GPU.

time = GEMMs at a size-dependent share of peak (``hardware.gemm_time_s``) + the attention core + memory-bound
kernels at HBM speed (``hardware.memory_time_s``). Everything is array-safe over candidate layouts (tp, cp, ep,
micro-batch, sequence parallel), so the planner and the single estimate share these functions.

GEMMs come from the tensor inventory: each linear weight (out, in), split by TP as recorded, is one
(tokens × in)·(in × out) GEMM; routed experts run on tokens·top_k·ep/E tokens each, E/ep of them per
rank. Backward = 2 × forward (data gradient and weight gradient have the forward's dimensions). The
attention core is two batched GEMMs per head, QKᵀ (s × d_qk)·(d_qk × s) and PV (s × s)·(s × d_v); with
(causal) flash attention half of the score blocks are skipped (Dao 2023, FlashAttention-2 §3.1).

Memory-bound traffic per block comes from ``estimate.kernels`` (fused, eager or compiled kernels, derived
op by op); it streams at the accelerator's memory efficiency. Flash attention runs at the accelerator's
attention-kernel share of peak (``hardware.attention_time_s``); unfused attention runs as batched GEMMs.
"""

from __future__ import annotations

import numpy as np

from shardlab.layout import expert_tp_of
from shardlab.rates.hardware import attention_time_s, gemm_time_s, memory_time_s
from shardlab.rates.kernels import OPS_PER_BLOCK, block_elementwise_bytes, head_elementwise_bytes
from shardlab.specs.hardware import Accelerator, MatmulEfficiency
from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import TensorSpec, kv_heads_local, layer_matmuls, recompute_module


HEAD_OPS = 8
"""Final norm, output GEMM, log-softmax, loss and their glue in forward: an estimate."""


def _local_dims(spec: ModelSpec, t: TensorSpec, tp):
    """(out, in) of the per-rank matrix (arrays over tp)."""
    out, inn = t.shape[-2], t.shape[-1]
    d = t.tp_dim - (len(t.shape) - 2) if t.tp_dim is not None else None  # index within (out, in)
    if d == 0:
        out = kv_heads_local(spec.num_kv_heads, np.asarray(tp)) * spec.head_dim_ if t.kv else -(-out // np.asarray(tp))
    elif d == 1:
        inn = -(-inn // np.asarray(tp))
    return np.asarray(out), np.asarray(inn)


def layer_times(spec: ModelSpec, layer: int, acc: Accelerator, curve: MatmulEfficiency, dtype: str, *,
                seq_len: int, tp, cp, ep, micro_batch, sequence_parallel, elem_bytes: int,
                flash_attention: bool = True, dropout: bool = False, kernels: str = "fused",
                attention_kernel: str = "flash2", gemm_dtype: str = "", etp=None) -> dict:
    """Forward times of block ``layer`` for one micro-batch on one rank: 'gemm_s', 'attn_s' (attention
    core), 'elem_s' (memory-bound, at the ``kernels`` level of rates/kernels.py), 'gemm_op_recompute_s'
    (the matmuls per-op checkpointing re-runs), 'module_recompute_s' (what each Megatron-core recompute module
    re-runs), 'expert_gemm_s' (the routed experts' GEMMs, part of 'gemm_s'). Arrays over candidates. ``gemm_dtype='fp8'`` runs the linear
    layers' GEMMs at the FP8 peak and adds their casts, 'cast_fwd_s' and 'cast_bwd_s' (``rates/fp8.py``). ``etp``: the
    routed experts' tensor-parallel degree (``Layout.etp``; None or 0: tp): their matrices split etp ways, run on the
    tokens of etp ranks' sequence shards, T·etp/tp (``layout.expert_grid``)."""
    from shardlab.rates.fp8 import linear_cast_bytes
    from shardlab.memory.fp8 import is_fp8_gemm

    peak = acc.peak_flops(dtype)
    fp8_peak = acc.peak_flops("fp8") if gemm_dtype == "fp8" else peak
    cast_f = cast_b = 0.0
    tp, cp, ep, mb = (np.asarray(x) for x in (tp, cp, ep, micro_batch))
    etp = expert_tp_of(tp, None if etp is None else np.asarray(etp))
    sp = np.asarray(sequence_parallel, dtype=bool)
    T = mb * seq_len / cp
    Te = T * etp / tp                   # the tokens a rank's expert GEMMs see (T without a narrower expert TP)
    tsh = np.where(sp, tp, 1)
    gemm = gemm_odd = expert_gemm = 0.0
    by_module = {"mla_up_proj": 0.0, "mlp": 0.0, "moe": 0.0, "shared_experts": 0.0}   # GEMMs a module re-runs
    for i, t in enumerate(layer_matmuls(spec, layer)):
        n_out, n_in = _local_dims(spec, t, etp if t.ep_dim is not None else tp)
        fp8 = gemm_dtype == "fp8" and is_fp8_gemm(t, spec)
        if t.ep_dim is not None:
            E, k = spec.moe.num_experts, spec.moe.top_k
            tokens_per_expert = Te * ep * k / E
            g = (E / ep) * gemm_time_s(tokens_per_expert, n_out, n_in, fp8_peak if fp8 else peak, curve)
            expert_gemm = expert_gemm + g
            tokens = Te * k
        else:
            g = gemm_time_s(T, n_out, n_in, fp8_peak if fp8 else peak, curve)
            tokens = T
        gemm = gemm + g
        mod = recompute_module(t)
        if mod:
            by_module[mod] = by_module[mod] + g
        if mod == "shared_experts":          # the MoE layer's recomputation re-runs its shared experts too
            by_module["moe"] = by_module["moe"] + g
        if i % 2 == 1:      # re-run by per-op selective checkpointing (every other matmul)
            gemm_odd = gemm_odd + g
        if fp8:
            c = linear_cast_bytes(tokens, n_out, n_in)
            cast_f, cast_b = cast_f + c["forward"], cast_b + c["backward"]

    # attention core: QK^T and PV over the local heads; T queries (s/cp per sequence) against s keys
    from shardlab.flops import attention_dims

    qk, v = attention_dims(spec)
    heads_local = spec.num_heads / tp
    d_qk, d_v = qk / spec.num_heads, v / spec.num_heads
    if flash_attention:   # causal blocks skipped (Dao 2023, FlashAttention-2 §3.1); fused kernel's own efficiency
        # a query attends to seq_len/2 keys on average; within a sliding window w, to w − w²/(2·seq_len) (the kernel
        # skips the blocks outside it), averaged over the layers that slide (GPT-OSS: half of them)
        keys = 0.5 * seq_len
        if spec.sliding_window and spec.sliding_window < seq_len:
            w, share = spec.sliding_window, spec.windowed_layer_share
            keys = share * (w - w * w / (2.0 * seq_len)) + (1.0 - share) * keys
        attn = attention_time_s(heads_local * 2 * T * keys * (d_qk + d_v), acc, dtype, attention_kernel)
    else:                 # two batched GEMMs per head (QK^T, PV) at the GEMM curve
        attn = heads_local * (gemm_time_s(T, seq_len, d_qk, peak, curve) + gemm_time_s(T, d_v, seq_len, peak, curve))

    elem = block_elementwise_bytes(spec, layer, kernels, tokens=T, tp=tp, tsh=tsh, elem_bytes=elem_bytes,
                                   dropout=dropout, flash_attention=flash_attention, seq_len=seq_len, etp=etp)
    ops = len(layer_matmuls(spec, layer)) + OPS_PER_BLOCK[kernels]
    # what each Megatron-core recompute module re-runs in backward (layout.RECOMPUTE_MODULES): its GEMMs, and the
    # memory-bound kernels that re-make its outputs (a norm reads its input and writes its output; an activation
    # reads the gate and up outputs and writes its own; MoE layers also re-route, re-permute and re-weight)
    e = elem_bytes
    # the norms Megatron-core keeps apart from their GEMMs (memory.activations: MLA's input norm, a MoE pre-MLP norm)
    norms = (spec.mla is not None) + spec.is_moe_layer(layer)
    norm_b = norms * 2 * e * T * spec.hidden_size / np.where(sp, tp, 1)
    act_w = 3 * e if spec.mlp == "swiglu" else 2 * e
    if spec.is_moe_layer(layer):
        moe = spec.moe
        act_b = act_w * T * moe.top_k * moe.expert_ffn_hidden_size / tp
        shared_act_b = act_w * T * moe.shared_width / tp
        moe_b = T * (8 * moe.num_experts + 2 * e * spec.hidden_size) + Te * 4 * e * moe.top_k * spec.hidden_size \
            + act_b + shared_act_b
        mlp_b = 0.0
    else:
        act_b = shared_act_b = moe_b = 0.0
        mlp_b = act_w * T * spec.ffn_hidden_size / tp
    recompute = {"core_attn": attn, "layernorm": memory_time_s(norm_b, acc), "moe_act": memory_time_s(act_b, acc),
                 "mla_up_proj": by_module["mla_up_proj"], "mlp": by_module["mlp"] + memory_time_s(mlp_b, acc),
                 "moe": by_module["moe"] + memory_time_s(moe_b, acc),
                 "shared_experts": by_module["shared_experts"] + memory_time_s(shared_act_b, acc)}
    return {"gemm_s": gemm, "attn_s": attn, "elem_s": memory_time_s(elem, acc) + ops * acc.op_overhead_us * 1e-6,
            "gemm_op_recompute_s": gemm_odd, "module_recompute_s": recompute, "expert_gemm_s": expert_gemm,
            "cast_fwd_s": memory_time_s(cast_f, acc), "cast_bwd_s": memory_time_s(cast_b, acc)}



def block_step_times(lt: dict, recompute: str | np.ndarray, fraction=1.0, modules=None) -> dict:
    """Per micro-batch: forward, backward and recomputation times of a block from ``layer_times``.

    recompute: 'none' | 'selective' (the ``modules`` re-run in backward; None: the attention core) | 'full' (whole
    forward re-run) | 'op' (every other matmul and all memory-bound kernels re-run), or an integer array 0-3 over
    candidates; ``fraction``: share of the blocks checkpointed (the average block's recomputation scales with it).
    """
    from shardlab.memory.training import recompute_code

    fwd = lt["gemm_s"] + lt["attn_s"] + lt["elem_s"]
    bwd = 2.0 * fwd + lt.get("cast_bwd_s", 0.0)   # FP8: output-gradient casts (rates/fp8.py)
    fwd = fwd + lt.get("cast_fwd_s", 0.0)         # FP8: input casts
    code = np.asarray(recompute_code(recompute))
    selective = sum(lt["module_recompute_s"][m] for m in modules) if modules else lt["attn_s"]
    rec = np.where(code == 2, fwd, np.where(code == 1, selective,
                                            np.where(code == 3, lt["gemm_op_recompute_s"] + lt["elem_s"], 0.0)))
    return {"fwd_s": fwd, "bwd_s": bwd, "recompute_s": np.asarray(fraction) * rec}


def head_times(spec: ModelSpec, acc: Accelerator, curve: MatmulEfficiency, dtype: str, *, seq_len: int, tp, cp,
               micro_batch, sequence_parallel, elem_bytes: int, kernels: str = "fused", fused_loss: bool = False) -> dict:
    """Final norm, output head GEMM and cross-entropy per micro-batch: forward and backward seconds."""
    tp, cp, mb = (np.asarray(x) for x in (tp, cp, micro_batch))
    T = mb * seq_len / cp
    tsh = np.where(np.asarray(sequence_parallel, dtype=bool), tp, 1)
    v_local = -(-spec.vocab_size // tp)
    gemm = gemm_time_s(T, v_local, spec.hidden_size, acc.peak_flops(dtype), curve)
    elem = memory_time_s(head_elementwise_bytes(spec, kernels, tokens=T, tp=tp, tsh=tsh, elem_bytes=elem_bytes,
                                                fused_loss=fused_loss), acc) \
        + HEAD_OPS * acc.op_overhead_us * 1e-6
    return {"fwd_s": gemm + elem, "bwd_s": 2.0 * gemm + elem}
