"""Memory-bound traffic of a transformer block by kernel level: fused, eager or compiled.

Everything in a block that is not a GEMM or the attention core is memory-bound: its time is the bytes it moves
over HBM. How many bytes depends on how the framework runs those operators (a framework profile's ``kernels``):

- fused: hand-written fused kernels (Megatron-LM, Narayanan et al. 2021 §4.2; Transformer Engine): one kernel per
  norm, bias+GeLU or SwiGLU, bias+dropout+add, RoPE and scale+mask+softmax; each reads its inputs once and writes
  its output once.
- eager: one CUDA kernel per PyTorch operator, each a round trip through HBM. Derived from the eager code of the
  blocks the published runs use (torchtitan/models/llama3/model.py, fms-fsdp's Llama, llm-foundry's MPT):
  RMSNorm ``_norm(x.float()).type_as(x) * weight`` = cast, pow, mean, rsqrt-multiply, cast back, weight multiply
  (bytes per element 4e + 28); LayerNorm is PyTorch's single native kernel (2e); RoPE as complex multiplication
  ``view_as_complex(xq.float()) * freqs_cis`` then ``view_as_real(...).type_as(xq)`` (2e + 16 per element of q and
  k); grouped-query attention materialises K and V for every query head before SDPA (``repeat_kv``: read kv, write
  q, for K and V); the attention output is transposed back with a copy (2e per element of q); SwiGLU
  ``silu(w1 x) * w3 x`` is two kernels (5e per element of f); GeLU one (2e); residual adds 3e.
- compiled: torch.compile (Inductor, Ansel et al. 2024, ASPLOS) fuses each chain of elementwise operators into one
  kernel: a residual add and the next norm become one kernel reading two tensors and writing two; RoPE, SwiGLU,
  GeLU read their inputs and write their outputs once; layout copies (repeat_kv, the output transpose) remain.

Bytes are per token of one block's forward on one rank; ``tp`` divides the column/row-parallel widths and ``tsh``
the sequence-parallel ones. Backward moves about twice the forward's bytes (it reads the saved input and the
incoming gradient and writes a gradient; docs/estimate.md). e = bytes per activation element; masks are 1 byte.
"""

from __future__ import annotations

import numpy as np

from shardlab.layout import expert_tp_of

from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import kv_heads_local

EAGER_RMSNORM_EXTRA_BYTES = 28
"""fp32 round trips of eager RMSNorm beyond reading and writing the bf16 tensor: cast (write 4), pow (read 4,
write 4), mean (read 4), scale (read 4, write 4), cast back (read 4): 28 bytes per element."""
EAGER_ROPE_EXTRA_BYTES = 16
"""fp32 complex RoPE: write the fp32 copy (4), complex multiply (read 4, write 4), cast back (read 4)."""
OPS_PER_BLOCK = {"fused": 12, "eager": 40, "compiled": 10}
"""Memory-bound kernels launched per block forward (dispatch cost on hosts with a per-operator overhead)."""


def block_elementwise_bytes(spec: ModelSpec, layer: int, kernels: str, *, tokens, tp, tsh, elem_bytes: int,
                            dropout: bool, flash_attention: bool, seq_len: int, etp=None):
    """Bytes the memory-bound kernels of block ``layer`` move in forward for ``tokens`` tokens on one rank
    (array-safe in tokens, tp, tsh; ``etp``: the experts' tensor-parallel degree, whose ranks permute the copies of
    etp/tp of the TP group's tokens, ``layout.expert_grid``)."""
    e = elem_bytes
    T = np.asarray(tokens, dtype=float)
    tp = np.asarray(tp)
    h = spec.hidden_size
    mask = 1 if dropout else 0
    kv = kv_heads_local(spec.num_kv_heads, tp) * spec.head_dim_ if spec.mla is None else 0
    q = spec.q_size / tp if spec.mla is None else spec.num_heads / tp * spec.mla.v_head_dim
    heads_local = spec.num_heads / tp
    rope_width = 0.0
    if spec.position == "rope":
        rope_width = (q + kv) if spec.mla is None else \
            spec.mla.q_lora_rank + spec.mla.kv_lora_rank + (heads_local + 1) * spec.mla.qk_rope_head_dim

    # norms and residual adds (per element of h, split by sequence parallelism)
    if kernels == "eager":
        norm = 2 * e + (EAGER_RMSNORM_EXTRA_BYTES + 2 * e if spec.norm == "rmsnorm" else 0)
        per_h = 2 * norm + 2 * (3 * e + mask * (2 * e + 1))     # dropout: a separate kernel writing a mask
        rope = (2 * e + EAGER_ROPE_EXTRA_BYTES) * rope_width
    elif kernels == "compiled":
        per_h = 2 * (4 * e) + mask * 2                         # add + norm in one kernel, twice (masks recomputed)
        rope = 2 * e * rope_width
    else:   # fused
        per_h = 2 * 2 * e + 2 * (3 * e + mask)
        rope = 2 * e * rope_width
    total = T * per_h * h / np.asarray(tsh)
    total = total + T * rope

    # attention layout copies of eager/compiled PyTorch code (fused kernels take strided or packed inputs)
    if kernels != "fused" and spec.mla is None:
        copies = 2 * e * q                                      # output transpose back to (b, s, h)
        if spec.num_kv_heads < spec.num_heads:
            copies = copies + 2 * e * (kv + q)                  # repeat_kv for K and V
        total = total + T * copies
    if not flash_attention:                                     # materialised softmax (+ dropout) over s x s
        total = total + (2 * e + mask * (2 * e + 1)) * heads_local * T * seq_len

    # MLP (or MoE) activation
    act = {"swiglu": {"eager": 5, "compiled": 3, "fused": 3}, "gelu": {"eager": 2, "compiled": 2, "fused": 2}}[spec.mlp][kernels]
    if spec.is_moe_layer(layer):
        moe = spec.moe
        k = moe.top_k
        share = expert_tp_of(tp, etp) / tp
        total = total + T * (8 * moe.num_experts + 2 * e * h) + share * T * 4 * e * k * h   # router (fp32), dispatch, combine
        total = total + act * e * T * k * moe.expert_ffn_hidden_size / tp
        if moe.shared_width:   # Qwen2-MoE's shared expert has its own width (shared_expert_intermediate_size)
            total = total + act * e * T * moe.shared_width / tp
    else:
        total = total + act * e * T * spec.ffn_hidden_size / tp
    return total


def head_elementwise_bytes(spec: ModelSpec, kernels: str, *, tokens, tp, tsh, elem_bytes: int, fused_loss: bool = False):
    """Forward bytes of the final norm and the loss over the (local) vocabulary: eager/compiled cross-entropy upcasts
    the logits to fp32 and keeps log-softmax (read e, write 4, read 4, write 4, read 4); a fused loss kernel
    (Megatron's vocab-parallel cross entropy, flash-attn's xentropy) reads the logits and writes their gradient."""
    e = elem_bytes
    T = np.asarray(tokens, dtype=float)
    v_local = -(-spec.vocab_size // np.asarray(tp))
    norm = 2 * e + (EAGER_RMSNORM_EXTRA_BYTES + 2 * e if kernels == "eager" and spec.norm == "rmsnorm" else 0)
    loss = (2 * e) if fused_loss else (e + 4 + 4 + 4 + 4)
    return T * norm * spec.hidden_size / np.asarray(tsh) + T * loss * v_local
