"""Inference memory per rank: weights and KV cache (exact, from the tensor inventory), the activation
peak, and the KV-cache blocks a paged serving engine allocates.

Weights: each rank holds its TP shard of its pipeline stage's tensors (``shardlab.memory.states``), at the
precision of each tensor class (``shardlab.serving.precision``: quantized block matrices with their group
scales and zero points, 16-bit embeddings, head and norms).
KV cache per token (formulas.md, "Inference memory"): 2 (K and V) × layers on the stage × KV heads per
rank × head_dim × bytes. KV heads are split across TP ranks, one head per rank when tp > kv_heads
(replicated; vLLM does the same). Multi-head Latent Attention caches the compressed latent c_KV and the
shared rotary key, (kv_lora_rank + qk_rope_head_dim) × bytes per layer, replicated across TP ranks
(DeepSeek-V2 §2.1.2). A sliding window caps the cached tokens at the window in the layers that slide (every layer
of Mistral 7B v0.1, every other one of GPT-OSS: ``held_tokens``).
KV blocks (Kwon et al. 2023, "Efficient Memory Management for LLM Serving with PagedAttention", SOSP,
arXiv 2309.06180 §4): the cache is cut into blocks of ``block_size`` tokens; vLLM takes
gpu_memory_utilization × capacity, subtracts weights, the profiled activation peak and non-torch memory,
and divides the rest into blocks (vllm/worker/worker.py ``determine_num_available_blocks``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shardlab.layout import Layout
from shardlab.memory.states import stage_tensors
from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import is_matmul_weight, kv_heads_local


def serving_local_shape(t, spec: ModelSpec, tp: int, ep: int = 1, redundant: int = 0) -> tuple[int, ...]:
    """Shape a serving rank holds: TP slices every tensor, except that under expert parallelism (``ep`` > 1) a
    routed expert stays whole and the experts are split across the ep ranks, E/ep each (vLLM
    ``--enable-expert-parallel``: EP size = TP × DP, experts not TP-sliced; SGLang ``--ep-size``); with
    ``redundant`` replicated experts (DeepSeek's EPLB, arXiv 2412.19437 §3.4) each rank holds (E + redundant)/ep."""
    if ep > 1 and t.ep_dim is not None:
        shape = list(t.local_shape(spec, 1, ep))
        shape[t.ep_dim] = (t.shape[t.ep_dim] + redundant) // ep
        return tuple(shape)
    return t.local_shape(spec, tp)


def weight_bytes_per_rank(spec: ModelSpec, tp: int = 1, pp: int = 1, elem_bytes: int = 2, precision=None,
                          ep: int = 1, redundant: int = 0) -> list[int]:
    """Weight bytes held by one rank of each pipeline stage (index = stage). With ``precision`` (an
    InferencePrecision) block matrices take its bytes; otherwise every tensor takes ``elem_bytes``. ``ep``:
    routed experts split whole across ep ranks (``serving_local_shape``)."""
    lay = Layout(tp=tp, pp=pp)
    if precision is None:
        return [sum(math.prod(serving_local_shape(t, spec, tp, ep, redundant)) for t in st.tensors) * elem_bytes
                for st in stage_tensors(spec, lay)]
    return [sum(precision.tensor_bytes(t.component, serving_local_shape(t, spec, tp, ep, redundant), is_matmul_weight(t))
                for t in st.tensors) for st in stage_tensors(spec, lay)]


def kv_cache_bytes_per_token(spec: ModelSpec, tp: int = 1, pp: int = 1, elem_bytes: int = 2) -> list[int]:
    """KV-cache bytes per cached token held by one rank of each pipeline stage."""
    lay = Layout(tp=tp, pp=pp)
    if spec.mla is not None:
        per_layer = (spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim) * elem_bytes
    else:
        per_layer = 2 * kv_heads_local(spec.num_kv_heads, tp) * spec.head_dim_ * elem_bytes
    return [len(st.layers) * per_layer for st in stage_tensors(spec, lay)]


def held_tokens(spec: ModelSpec, tokens):
    """Tokens of a ``tokens``-long sequence an average layer keeps cached (and a decode step reads): every one in a
    full-attention layer, at most ``sliding_window`` in a sliding one; weighted by the layers' shares
    (``ModelSpec.windowed_layer_share``: all of them for Mistral 7B v0.1, half for GPT-OSS and Gemma 2). Every layer
    caches the same bytes per token, so this average times the whole model's bytes per token is the cache exactly
    (a pipeline stage's mix is taken as the model's). Array-safe; floats."""
    share = spec.windowed_layer_share
    if not share:
        return tokens
    return share * np.minimum(tokens, spec.sliding_window) + (1.0 - share) * np.asarray(tokens, dtype=float)


def cached_tokens(spec: ModelSpec, seq_len: int) -> int:
    """Tokens a sequence keeps in its cache, in whole tokens (``held_tokens`` rounded up)."""
    if not spec.sliding_window:
        return seq_len
    return math.ceil(float(held_tokens(spec, seq_len)) - 1e-9)


def kv_cache_bytes(spec: ModelSpec, batch: int, seq_len: int, tp: int = 1, pp: int = 1, elem_bytes: int = 2) -> int:
    """KV-cache bytes on the worst rank for ``batch`` sequences of ``seq_len`` tokens."""
    return max(kv_cache_bytes_per_token(spec, tp, pp, elem_bytes)) * batch * cached_tokens(spec, seq_len)


def activation_peak_bytes(spec: ModelSpec, tp: int, tokens: int, sequences: int, elem_bytes: int = 2) -> int:
    """Largest transient tensors of one forward over ``tokens`` tokens (estimate): the block's widest
    intermediates e·T·(2h + 2f/t) (residual stream and its normed copy, the gate and up outputs; MoE: top-k
    experts' width) and the fp32 logits of the ``sequences`` sampled rows, 4·n·V/t."""
    f = spec.moe.expert_ffn_hidden_size * spec.moe.top_k if spec.moe else spec.ffn_hidden_size
    return int(elem_bytes * tokens * (2 * spec.hidden_size + 2 * f / tp) + 4 * sequences * -(-spec.vocab_size // tp))


@dataclass(frozen=True)
class KVBlocks:
    """How a paged engine splits one GPU's memory (the worst rank) and how many KV blocks it gets."""

    capacity_bytes: int
    """GPU memory the framework sees."""
    reserved_bytes: int
    """What the engine takes: utilization × capacity (rule 'total'), or weights + activations + other +
    utilization × what they leave free (rule 'free', TensorRT-LLM's kv_cache_free_gpu_mem_fraction)."""
    weights_bytes: int
    """Weights on this rank."""
    activation_bytes: int
    """Activation peak of the largest step (estimate)."""
    other_bytes: int
    """CUDA context, library workspaces, communication buffers, CUDA graphs (estimates)."""
    block_size: int
    """Tokens per block."""
    bytes_per_block: int
    """block_size × KV bytes per token on this rank."""
    num_blocks: int
    """Blocks allocated (0 when the weights do not leave room)."""

    @property
    def kv_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    @property
    def tokens(self) -> int:
        """Tokens the cache holds."""
        return self.num_blocks * self.block_size

    def to_dict(self) -> dict:
        return {"capacity_bytes": self.capacity_bytes, "reserved_bytes": self.reserved_bytes,
                "weights_bytes": self.weights_bytes, "activation_bytes": self.activation_bytes,
                "other_bytes": self.other_bytes, "block_size": self.block_size, "bytes_per_block": self.bytes_per_block,
                "num_blocks": self.num_blocks, "kv_bytes": self.kv_bytes, "tokens": self.tokens}


def kv_blocks(capacity_bytes: int, weights_bytes: int, activation_bytes: int, other_bytes: int,
              kv_bytes_per_token: int, *, block_size: int = 16, utilization: float = 0.9, rule: str = "total") -> KVBlocks:
    """KV blocks of one rank (module doc). rule 'total': vLLM/SGLang, utilization × capacity minus the rest;
    rule 'free': TensorRT-LLM, utilization × (capacity − weights − activations − other)."""
    fixed = weights_bytes + activation_bytes + other_bytes
    if rule == "total":
        reserved = int(capacity_bytes * utilization)
        kv = reserved - fixed
    else:
        kv = int(max(0, capacity_bytes - fixed) * utilization)
        reserved = fixed + kv
    per_block = block_size * kv_bytes_per_token
    return KVBlocks(capacity_bytes, reserved, weights_bytes, activation_bytes, other_bytes, block_size, per_block,
                    max(0, kv // per_block) if per_block else 0)
