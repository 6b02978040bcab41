"""Inference memory per rank: weights and KV cache (exact, from the tensor inventory).

Weights: each rank holds its TP shard of its pipeline stage's tensors (``shardlab.memory.states``).
KV cache per token (formulas.md, "Inference memory"): 2 (K and V) × layers on the stage × KV heads per
rank × head_dim × bytes. KV heads are split across TP ranks, one head per rank when tp > kv_heads
(replicated; vLLM does the same). Multi-head Latent Attention caches the compressed latent c_KV and the
shared rotary key, (kv_lora_rank + qk_rope_head_dim) × bytes per layer, replicated across TP ranks
(DeepSeek-V2 §2.1.2). A sliding window caps the cached tokens at the window (Mistral 7B v0.1).
"""

from __future__ import annotations

import math

from shardlab.layout import Layout
from shardlab.memory.states import stage_tensors
from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import kv_heads_local


def weight_bytes_per_rank(spec: ModelSpec, tp: int = 1, pp: int = 1, elem_bytes: int = 2) -> list[int]:
    """Weight bytes held by one rank of each pipeline stage (index = stage)."""
    lay = Layout(tp=tp, pp=pp)
    return [sum(math.prod(t.local_shape(spec, tp)) for t in st.tensors) * elem_bytes for st in stage_tensors(spec, lay)]


def kv_cache_bytes_per_token(spec: ModelSpec, tp: int = 1, pp: int = 1, elem_bytes: int = 2) -> list[int]:
    """KV-cache bytes per cached token held by one rank of each pipeline stage."""
    lay = Layout(tp=tp, pp=pp)
    if spec.mla is not None:
        per_layer = (spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim) * elem_bytes
    else:
        per_layer = 2 * kv_heads_local(spec.num_kv_heads, tp) * spec.head_dim_ * elem_bytes
    return [len(st.layers) * per_layer for st in stage_tensors(spec, lay)]


def cached_tokens(spec: ModelSpec, seq_len: int) -> int:
    """Tokens a sequence keeps in its cache: all of them, or the sliding window."""
    return min(seq_len, spec.sliding_window) if spec.sliding_window else seq_len


def kv_cache_bytes(spec: ModelSpec, batch: int, seq_len: int, tp: int = 1, pp: int = 1, elem_bytes: int = 2) -> int:
    """KV-cache bytes on the worst rank for ``batch`` sequences of ``seq_len`` tokens."""
    return max(kv_cache_bytes_per_token(spec, tp, pp, elem_bytes)) * batch * cached_tokens(spec, seq_len)


def kv_cache_blocks(free_bytes: int, kv_bytes_per_token: int, block_tokens: int = 16) -> int:
    """KV-cache blocks a paged serving engine carves out of ``free_bytes`` on one rank: ⌊free / (block_tokens ×
    KV bytes per token)⌋ (vLLM's PagedAttention, Kwon et al. 2023, arXiv 2309.06180: blocks of 16 tokens; what vLLM
    logs as "# GPU blocks")."""
    return max(0, int(free_bytes) // (block_tokens * kv_bytes_per_token))
