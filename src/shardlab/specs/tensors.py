"""The parameter inventory of a ModelSpec: every tensor with its shape and how TP/EP split it.

Shapes use PyTorch's ``nn.Linear`` convention (out_features, in_features), and names follow the
runtime's GPT (``shardlab.runtime.gpt``), so a real model's ``named_parameters()`` can be held
against this list tensor by tensor. Q, K and V are separate projections (a fused QKV matrix has the
same count). Routed experts are stacked into one tensor per matrix, shape (E, ...), split on dim 0 by
expert parallelism.

Tensor-parallel rules (Megatron-LM, Shoeybi et al. 2019, arXiv 1909.08053 §3):
- column-parallel (output features split): Q, K, V, MLP gate/up, MLA up-projections;
- row-parallel (input features split): attention output, MLP down; their biases are replicated;
- vocabulary-parallel: token embedding and output head split by vocabulary rows;
- replicated: norms, learned positions, routers, MLA down-projections (low rank, small).
K/V heads split across TP ranks when tp <= kv_heads, and are replicated (one head per rank) when
tp > kv_heads (Megatron GQA; vLLM does the same).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache

from shardlab import xp
from shardlab.layout import expert_tp_of

from shardlab.specs.model import ModelSpec

PRE = -1
"""Layer index used for tensors before the first block (embeddings)."""


@dataclass(frozen=True)
class TensorSpec:
    """One parameter tensor of the model."""

    name: str
    """Dotted name as in the runtime model, e.g. 'layers.3.attention.wq.weight'."""
    shape: tuple[int, ...]
    """Full (unsharded) shape, nn.Linear convention (out, in)."""
    layer: int
    """Block index; PRE (-1) for embeddings, num_layers for the final norm and output head."""
    component: str
    """embedding, position, attention, norm, mlp, router, experts, shared_experts or head."""
    tp_dim: int | None = None
    """Dimension split across tensor-parallel ranks, or None when replicated."""
    kv: bool = False
    """A K/V projection (weight or bias): split by KV heads, replicated when tp > kv_heads."""
    ep_dim: int | None = None
    """Dimension split across expert-parallel ranks (0 for stacked routed experts), or None."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def local_shape(self, spec: ModelSpec, tp: int = 1, ep: int = 1, tp_rank: int | None = None,
                    etp=None) -> tuple[int, ...]:
        """Shape held by one rank after TP and EP splitting (before any ZeRO/FSDP sharding).

        Uneven splits (a vocabulary not divisible by tp) follow ``torch.chunk``, as DTensor's Shard does:
        chunks of ceil(n/tp) rows, the last ranks holding fewer (possibly none). ``tp_rank=None`` gives
        the largest chunk, i.e. the worst rank, which is what memory totals use. ``tp``/``ep`` may be
        numpy arrays (the planner evaluates many layouts at once); then the split dimensions are arrays too.
        ``etp``: the routed experts' own tensor-parallel degree (``Layout.etp``; None or 0: tp).
        """
        if self.ep_dim is not None and etp is not None:
            tp = expert_tp_of(tp, etp)
            if tp_rank is not None:
                tp_rank = tp_rank % tp
        shape = list(self.shape)
        if self.tp_dim is not None:
            if self.kv:
                shape[self.tp_dim] = kv_heads_local(spec.num_kv_heads, tp) * spec.head_dim_
            else:
                shape[self.tp_dim] = chunk_size(shape[self.tp_dim], tp, tp_rank)
        if self.ep_dim is not None:
            shape[self.ep_dim] = -(-shape[self.ep_dim] // ep)
        return tuple(shape)

    def local_numel(self, spec: ModelSpec, tp: int = 1, ep: int = 1, tp_rank: int | None = None, etp=None) -> int:
        return math.prod(self.local_shape(spec, tp, ep, tp_rank, etp))


def chunk_size(n, parts, rank: int | None = None):
    """Rows of chunk ``rank`` when ``n`` rows are split like ``torch.chunk(parts)``: ceil(n/parts) each until
    the rows run out. ``rank=None``: the largest chunk. Array-safe in ``parts`` when rank is None."""
    size = -(-n // parts)
    if rank is None:
        return size
    return max(0, min(size, n - rank * size))


def kv_width_local(spec: ModelSpec, tp):
    """Width of the K and V activations together on one TP rank (what ring attention passes around):
    2 · KV heads per rank · head_dim; for MLA the up-projected keys and values of the local heads,
    (a/t) · (qk_nope + qk_rope + v_head) (DeepSeek-V2 §2.1.2). Array-safe in tp."""
    if spec.mla is not None:
        m = spec.mla
        return spec.num_heads // tp * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
    return 2 * kv_heads_local(spec.num_kv_heads, tp) * spec.head_dim_


def kv_heads_local(num_kv_heads: int, tp):
    """K/V heads per TP rank: split when tp <= kv heads, else one (replicated). Array-safe in tp."""
    return xp.where(tp <= num_kv_heads, num_kv_heads // xp.maximum(tp, 1), 1)


def _linear(out: list, name: str, out_f: int, in_f: int, layer: int, comp: str, tp: str | None,
            bias: bool, kv: bool = False) -> None:
    """Append weight (out_f, in_f) and optional bias (out_f,) of a linear layer.

    tp: 'column' splits the output features (weight dim 0, bias too), 'row' the input features
    (weight dim 1; bias replicated), None replicates.
    """
    wdim = {"column": 0, "row": 1, None: None}[tp]
    out.append(TensorSpec(f"{name}.weight", (out_f, in_f), layer, comp, wdim, kv))
    if bias:
        out.append(TensorSpec(f"{name}.bias", (out_f,), layer, comp, 0 if tp == "column" else None, kv))


def _norm(out: list, spec: ModelSpec, name: str, size: int, layer: int, comp: str = "norm") -> None:
    out.append(TensorSpec(f"{name}.weight", (size,), layer, comp))
    if spec.norm == "layernorm" and spec.norm_bias:
        out.append(TensorSpec(f"{name}.bias", (size,), layer, comp))


BLOCK_NORM_NAMES = {"pre": (("attention_norm",), ("ffn_norm",)), "shared": (("attention_norm",), ()),
                    "sandwich": (("attention_norm", "post_attention_norm"), ("ffn_norm", "post_ffn_norm")),
                    "post": (("post_attention_norm",), ("post_ffn_norm",))}
"""Norms before/around the attention and the feed-forward of a block, per ``ModelSpec.block_norms``."""


def _dense_mlp(out: list, spec: ModelSpec, prefix: str, f: int, layer: int, comp: str) -> None:
    h = spec.hidden_size
    if spec.mlp == "swiglu":
        # SwiGLU (Shazeer 2020): down(silu(gate(x)) * up(x)); gate = w1, up = w3, down = w2 (Llama naming)
        _linear(out, f"{prefix}.w1", f, h, layer, comp, "column", spec.mlp_bias)
        _linear(out, f"{prefix}.w3", f, h, layer, comp, "column", spec.mlp_bias)
    else:
        _linear(out, f"{prefix}.w1", f, h, layer, comp, "column", spec.mlp_bias)
    _linear(out, f"{prefix}.w2", h, f, layer, comp, "row", spec.mlp_bias)


def _attention(out: list, spec: ModelSpec, i: int) -> None:
    h, p = spec.hidden_size, f"layers.{i}.attention"
    if spec.mla is None:
        _linear(out, f"{p}.wq", spec.q_size, h, i, "attention", "column", spec.qkv_bias)
        _linear(out, f"{p}.wk", spec.kv_size, h, i, "attention", "column", spec.qkv_bias, kv=True)
        _linear(out, f"{p}.wv", spec.kv_size, h, i, "attention", "column", spec.qkv_bias, kv=True)
        _linear(out, f"{p}.wo", h, spec.q_size, i, "attention", "row", spec.out_bias)
        if spec.attention_sinks:    # GPT-OSS: one learned logit per query head, split with the heads
            out.append(TensorSpec(f"{p}.sinks", (spec.num_heads,), i, "attention", tp_dim=0))
        if spec.qk_norm != "none":  # Qwen3/Gemma 3: RMSNorm per head (head_dim); OLMo 2: over the projection
            per_head = spec.qk_norm == "head"
            out.append(TensorSpec(f"{p}.q_norm.weight", (spec.head_dim_ if per_head else spec.q_size,), i, "norm"))
            out.append(TensorSpec(f"{p}.k_norm.weight", (spec.head_dim_ if per_head else spec.kv_size,), i, "norm"))
        return
    # Multi-head Latent Attention (DeepSeek-V2 §2.1.2): q = W_qb · norm(W_qa · x);
    # [c_kv, k_rope] = W_kva · x; [k_nope, v] = W_kvb · norm(c_kv); out = W_o · attn.
    m, a = spec.mla, spec.num_heads
    qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim
    if m.q_lora_rank:
        _linear(out, f"{p}.wq_a", m.q_lora_rank, h, i, "attention", None, False)
        out.append(TensorSpec(f"{p}.q_norm.weight", (m.q_lora_rank,), i, "attention"))
        _linear(out, f"{p}.wq_b", a * qk_head, m.q_lora_rank, i, "attention", "column", False)
    else:
        _linear(out, f"{p}.wq", a * qk_head, h, i, "attention", "column", False)
    _linear(out, f"{p}.wkv_a", m.kv_lora_rank + m.qk_rope_head_dim, h, i, "attention", None, False)
    out.append(TensorSpec(f"{p}.kv_norm.weight", (m.kv_lora_rank,), i, "attention"))
    _linear(out, f"{p}.wkv_b", a * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank, i, "attention", "column", False)
    _linear(out, f"{p}.wo", h, a * m.v_head_dim, i, "attention", "row", spec.out_bias)


def _moe(out: list, spec: ModelSpec, i: int) -> None:
    m, h, p = spec.moe, spec.hidden_size, f"layers.{i}.moe"
    E, fe = m.num_experts, m.expert_ffn_hidden_size
    out.append(TensorSpec(f"{p}.router.weight", (E, h), i, "router"))
    if m.router_bias:
        out.append(TensorSpec(f"{p}.router.bias", (E,), i, "router"))
    # stacked routed experts: (E, out, in); EP splits dim 0, TP splits the expert's intermediate width
    out.append(TensorSpec(f"{p}.experts.w1", (E, fe, h), i, "experts", tp_dim=1, ep_dim=0))
    if spec.mlp == "swiglu":
        out.append(TensorSpec(f"{p}.experts.w3", (E, fe, h), i, "experts", tp_dim=1, ep_dim=0))
    out.append(TensorSpec(f"{p}.experts.w2", (E, h, fe), i, "experts", tp_dim=2, ep_dim=0))
    if m.expert_bias:        # GPT-OSS: gate and up biases split with the intermediate width, the down bias replicated
        out.append(TensorSpec(f"{p}.experts.w1_bias", (E, fe), i, "experts", tp_dim=1, ep_dim=0))
        if spec.mlp == "swiglu":
            out.append(TensorSpec(f"{p}.experts.w3_bias", (E, fe), i, "experts", tp_dim=1, ep_dim=0))
        out.append(TensorSpec(f"{p}.experts.w2_bias", (E, h), i, "experts", ep_dim=0))
    if m.shared_width:
        _dense_mlp(out, spec, f"{p}.shared", m.shared_width, i, "shared_experts")
    if m.shared_expert_gate:  # Qwen2-MoE: sigmoid(x · g) scales the shared expert, g of shape (1, h)
        out.append(TensorSpec(f"{p}.shared_gate.weight", (1, h), i, "shared_experts"))


def model_tensors(spec: ModelSpec) -> tuple[TensorSpec, ...]:
    """Every parameter tensor of ``spec`` (the output head is omitted when embeddings are tied). Cached per spec."""
    return _model_tensors(spec)


@lru_cache(maxsize=256)
def _model_tensors(spec: ModelSpec) -> tuple[TensorSpec, ...]:
    h, L, d = spec.hidden_size, spec.num_layers, spec.embedding_dim
    out: list[TensorSpec] = [TensorSpec("tok_embeddings.weight", (spec.vocab_size, d), PRE, "embedding", tp_dim=0)]
    if spec.position == "learned":  # OPT offsets positions by 2: its table has max_seq_len + 2 rows
        out.append(TensorSpec("pos_embeddings.weight", (spec.max_seq_len + spec.position_offset, h), PRE, "position"))
    if spec.embedding_proj_dim:  # OPT-350m: embeddings of width d, projected to h and back (no bias)
        _linear(out, "project_in", h, d, PRE, "embedding", None, False)
    if spec.embedding_norm:
        _norm(out, spec, "emb_norm", h, PRE)
    attn_norms, ffn_norms = BLOCK_NORM_NAMES[spec.block_norms]
    for i in range(L):
        for n in attn_norms:
            _norm(out, spec, f"layers.{i}.{n}", h, i)
        _attention(out, spec, i)
        for n in ffn_norms:
            _norm(out, spec, f"layers.{i}.{n}", h, i)
        if spec.is_moe_layer(i):
            _moe(out, spec, i)
        else:
            _dense_mlp(out, spec, f"layers.{i}.mlp", spec.ffn_hidden_size, i, "mlp")
    if spec.final_norm:
        _norm(out, spec, "norm", h, L)
    if spec.embedding_proj_dim:
        _linear(out, "project_out", d, h, L, "head", None, False)
    if not spec.tied_embeddings:
        out.append(TensorSpec("output.weight", (spec.vocab_size, d), L, "head", tp_dim=0))
    if spec.head_bias:  # GPT-J: lm_head has a bias of V (split with the vocabulary)
        out.append(TensorSpec("output.bias", (spec.vocab_size,), L, "head", tp_dim=0))
    return tuple(out)


@dataclass(frozen=True)
class ParamCounts:
    """Exact parameter counts of a model."""

    total: int
    """All parameters (tied embeddings counted once)."""
    active: int
    """Parameters used per token: routed experts counted top_k / num_experts (= total for dense)."""
    by_component: dict[str, int]
    """embedding, position, attention, norm, mlp, router, experts, shared_experts, head."""
    per_layer: list[int]
    """Parameters of each block (index = layer)."""
    embedding: int
    """Token (+ position, + embedding norm) parameters before the first block."""
    head: int
    """Final norm and untied output head."""


def is_matmul_weight(t: TensorSpec) -> bool:
    """A block's matmul weight: a 2-D linear weight, or the stacked (E, out, in) routed-expert matrices (named
    ``...experts.w1`` without a ``.weight`` suffix; their (E, out) biases are not). Embedding tables and the head
    live outside the blocks."""
    return len(t.shape) >= 2 and (t.name.endswith("weight") or (t.ep_dim is not None and len(t.shape) == 3))


@lru_cache(maxsize=256)
def _matmuls_by_layer(spec: ModelSpec) -> dict[int, tuple[TensorSpec, ...]]:
    out: dict[int, list] = defaultdict(list)
    for t in model_tensors(spec):
        if 0 <= t.layer < spec.num_layers and is_matmul_weight(t):
            out[t.layer].append(t)
    return {k: tuple(v) for k, v in out.items()}


def layer_matmuls(spec: ModelSpec, layer: int) -> tuple[TensorSpec, ...]:
    """The matmul weights of block ``layer`` in forward order (q, k, v, o, gate, up, down; routers; experts)."""
    return _matmuls_by_layer(spec).get(layer, ())


def recompute_module(t: TensorSpec) -> str:
    """The Megatron-core recompute module whose re-run includes matmul ``t`` ('' for none): MLA's up-projections
    (q_b, kv_b), a dense block's MLP, a MoE block's router and routed experts, its shared experts."""
    name = t.name.rsplit(".", 2)[-2] if t.name.count(".") >= 2 else ""
    if t.component == "attention":
        return "mla_up_proj" if name in ("wq_b", "wkv_b") else ""
    return {"mlp": "mlp", "experts": "moe", "router": "moe", "shared_experts": "shared_experts"}.get(t.component, "")


def layer_linear_shapes(spec: ModelSpec, layer: int, tp=1, ep=1) -> list[tuple]:
    """(out features per rank, in features per rank, tokens per token) of each matmul of block ``layer`` in forward
    order. Routed experts: all of a rank's experts together see top_k copies of each token (with or without EP).
    Array-safe in tp and ep."""
    out = []
    for t in layer_matmuls(spec, layer):
        shape = t.local_shape(spec, tp, ep)
        out.append((shape[-2], shape[-1], spec.moe.top_k if t.ep_dim is not None else 1))
    return out


def param_counts(spec: ModelSpec) -> ParamCounts:
    """Count parameters per component, per layer and in total; MoE also active per token."""
    by_comp: dict[str, int] = defaultdict(int)
    per_layer = [0] * spec.num_layers
    emb = head = routed = 0
    for t in model_tensors(spec):
        n = t.numel
        by_comp[t.component] += n
        if t.layer == PRE:
            emb += n
        elif t.layer == spec.num_layers:
            head += n
        else:
            per_layer[t.layer] += n
        if t.component == "experts":
            routed += n
    total = sum(by_comp.values())
    active = total
    if spec.moe is not None:
        active = total - routed + routed * spec.moe.top_k // spec.moe.num_experts
    return ParamCounts(total, active, dict(by_comp), per_layer, emb, head)
