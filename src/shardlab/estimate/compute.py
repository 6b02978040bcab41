"""Compute time of one transformer block (and of the head) per micro-batch on one GPU.

time = GEMMs at a size-dependent share of peak (``hardware.gemm_time_s``) + memory-bound kernels at
HBM speed (``hardware.memory_time_s``). Everything is array-safe over candidate layouts (tp, cp, ep,
micro-batch, sequence parallel), so the planner and the single estimate share these functions.

GEMMs come from the tensor inventory: each linear weight (out, in), split by TP as recorded, is one
(tokens × in)·(in × out) GEMM; routed experts run on tokens·top_k·ep/E tokens each, E/ep of them per
rank. Backward = 2 × forward (data gradient and weight gradient have the forward's dimensions). The
attention core is two batched GEMMs per head, QKᵀ (s × d_qk)·(d_qk × s) and PV (s × s)·(s × d_v); with
(causal) flash attention half of the score blocks are skipped (Dao 2023, FlashAttention-2 §3.1).

Memory-bound traffic per block, forward, derived op by op (e = bytes per element, T = tokens on the
rank, tsh = tp with sequence parallelism else 1; fused kernels as in Megatron-LM):
  2 norms: read + write            2 · 2e·T·h/tsh
  2 residual (bias-dropout-)adds:  2 · (3e + mask)·T·h/tsh
  RoPE on q and k:                 2e·T·(q + kv)/tp
  unfused softmax (no flash):      2e·(a/tp)·T·s, plus dropout (2e + 1)·(a/tp)·T·s
  GELU (read + write) / SwiGLU:    2e·T·f/tp  /  3e·T·f/tp (silu(gate)·up fused)
  MoE: router 8·T·E (fp32), dispatch and combine 4e·T·k·h + 2e·T·h, expert activations on T·k tokens
Backward moves about twice the forward bytes (reads the saved input and the incoming gradient, writes
a gradient). These counts are estimates of fused-kernel traffic; docs/estimate.md explains them.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from shardlab.estimate.hardware import gemm_time_s, memory_time_s
from shardlab.specs.hardware import Accelerator, MatmulEfficiency
from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import TensorSpec, kv_heads_local, model_tensors


ELEMENTWISE_OPS_PER_BLOCK = 20
"""Non-GEMM operators of one block's forward in eager PyTorch (two RMSNorms of ~4 kernels, RoPE on q and k
~6, attention 1, two residual adds, the activation and its product, views and copies): an estimate."""
HEAD_OPS = 8
"""Final norm, output GEMM, log-softmax, loss and their glue in forward: an estimate."""


@lru_cache(maxsize=512)
def _layer_linears(spec: ModelSpec, layer: int) -> tuple[TensorSpec, ...]:
    return tuple(t for t in model_tensors(spec) if t.layer == layer and t.name.endswith("weight") and len(t.shape) >= 2)


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
                flash_attention: bool = True, dropout: bool = False, gemm_dtype: str = "") -> dict:
    """Forward times of block ``layer`` for one micro-batch on one rank: 'gemm_s', 'attn_s' (attention
    core), 'elem_s' (memory-bound). Arrays over candidates. ``gemm_dtype='fp8'`` runs the linear layers' GEMMs
    at the FP8 peak and adds their casts, 'cast_fwd_s' and 'cast_bwd_s' (``estimate/fp8.py``)."""
    from shardlab.estimate.fp8 import linear_cast_bytes
    from shardlab.memory.fp8 import is_fp8_gemm

    peak = acc.peak_flops(dtype)
    fp8_peak = acc.peak_flops("fp8") if gemm_dtype == "fp8" else peak
    cast_f = cast_b = 0.0
    tp, cp, ep, mb = (np.asarray(x) for x in (tp, cp, ep, micro_batch))
    sp = np.asarray(sequence_parallel, dtype=bool)
    e = elem_bytes
    T = mb * seq_len / cp
    tsh = np.where(sp, tp, 1)
    h = spec.hidden_size
    gemm = 0.0
    for t in _layer_linears(spec, layer):
        n_out, n_in = _local_dims(spec, t, tp)
        fp8 = gemm_dtype == "fp8" and is_fp8_gemm(t, spec)
        if t.ep_dim is not None:
            E, k = spec.moe.num_experts, spec.moe.top_k
            tokens_per_expert = T * ep * k / E
            gemm = gemm + (E / ep) * gemm_time_s(tokens_per_expert, n_out, n_in, fp8_peak if fp8 else peak, curve)
            tokens = T * k
        else:
            gemm = gemm + gemm_time_s(T, n_out, n_in, fp8_peak if fp8 else peak, curve)
            tokens = T
        if fp8:
            c = linear_cast_bytes(tokens, n_out, n_in)
            cast_f, cast_b = cast_f + c["forward"], cast_b + c["backward"]

    # attention core: QK^T and PV, batched over the local heads and the micro-batch
    from shardlab.flops import attention_dims

    qk, v = attention_dims(spec)
    heads_local = spec.num_heads / tp
    d_qk, d_v = qk / spec.num_heads, v / spec.num_heads
    skip = 0.5 if flash_attention else 1.0
    attn = skip * heads_local * (gemm_time_s(T, seq_len, d_qk, peak, curve) + gemm_time_s(T, d_v, seq_len, peak, curve))

    mask = 1 if dropout else 0
    elem = 2 * 2 * e * T * h / tsh + 2 * (3 * e + mask) * T * h / tsh
    if spec.position == "rope":
        if spec.mla is None:
            elem = elem + 2 * e * T * (spec.q_size / tp + kv_heads_local(spec.num_kv_heads, np.asarray(tp)) * spec.head_dim_)
        else:
            m = spec.mla
            elem = elem + 2 * e * T * (m.q_lora_rank + m.kv_lora_rank) + 2 * e * T * (heads_local + 1) * m.qk_rope_head_dim
    if not flash_attention:
        elem = elem + (2 * e + mask * (2 * e + 1)) * heads_local * T * seq_len
    act = 3 if spec.mlp == "swiglu" else 2
    if spec.is_moe_layer(layer):
        moe = spec.moe
        k = moe.top_k
        elem = elem + 8 * T * moe.num_experts + 4 * e * T * k * h + 2 * e * T * h
        elem = elem + act * e * T * k * moe.expert_ffn_hidden_size / tp
        if moe.num_shared_experts:
            elem = elem + act * e * T * moe.expert_ffn_hidden_size * moe.num_shared_experts / tp
    else:
        elem = elem + act * e * T * spec.ffn_hidden_size / tp
    ops = len(_layer_linears(spec, layer)) + ELEMENTWISE_OPS_PER_BLOCK
    return {"gemm_s": gemm, "attn_s": attn, "elem_s": memory_time_s(elem, acc) + ops * acc.op_overhead_us * 1e-6,
            "cast_fwd_s": memory_time_s(cast_f, acc), "cast_bwd_s": memory_time_s(cast_b, acc)}


def block_step_times(lt: dict, recompute: str | np.ndarray) -> dict:
    """Per micro-batch: forward, backward and recomputation times of a block from ``layer_times``.

    recompute: 'none' | 'selective' (attention core re-run in backward) | 'full' (whole forward re-run),
    or an integer array 0/1/2 over candidates.
    """
    fwd = lt["gemm_s"] + lt["attn_s"] + lt["elem_s"]
    bwd = 2.0 * fwd + lt.get("cast_bwd_s", 0.0)   # FP8: output-gradient casts (estimate/fp8.py)
    fwd = fwd + lt.get("cast_fwd_s", 0.0)         # FP8: input casts
    code = {"none": 0, "selective": 1, "full": 2}[recompute] if isinstance(recompute, str) else np.asarray(recompute)
    rec = np.where(code == 2, fwd, np.where(code == 1, lt["attn_s"], 0.0))
    return {"fwd_s": fwd, "bwd_s": bwd, "recompute_s": rec}


def head_times(spec: ModelSpec, acc: Accelerator, curve: MatmulEfficiency, dtype: str, *, seq_len: int, tp, cp,
               micro_batch, sequence_parallel, elem_bytes: int) -> dict:
    """Final norm, output head GEMM and cross-entropy per micro-batch: forward and backward seconds."""
    tp, cp, mb = (np.asarray(x) for x in (tp, cp, micro_batch))
    T = mb * seq_len / cp
    tsh = np.where(np.asarray(sequence_parallel, dtype=bool), tp, 1)
    e = elem_bytes
    v_local = -(-spec.vocab_size // tp)
    gemm = gemm_time_s(T, v_local, spec.hidden_size, acc.peak_flops(dtype), curve)
    # final norm (read + write) and the loss: logits read, fp32 copy, log-softmax, gradient written
    elem = memory_time_s(2 * e * T * spec.hidden_size / tsh + (e + 4 + 4 + 4) * T * v_local, acc) \
        + HEAD_OPS * acc.op_overhead_us * 1e-6
    fwd = gemm + elem
    return {"fwd_s": fwd, "bwd_s": 2.0 * gemm + elem}
