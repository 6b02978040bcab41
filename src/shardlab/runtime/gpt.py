"""A small GPT of our own whose parameters are, name for name and shape for shape, the inventory of
``shardlab.specs.tensors.model_tensors`` - so a measured rank can be held against the memory model.

Llama-style by default (RMSNorm, SwiGLU, RoPE, grouped-query attention; Touvron et al. 2023) and GPT-2
style when the spec says so (LayerNorm, GELU MLP, learned positions, biases, tied embeddings; Radford
et al. 2019). Mixture-of-Experts layers (stacked experts, top-k routing) are supported for counting and
small runs; Multi-head Latent Attention and ALiBi are not (``build_model`` refuses them).

Parallel-friendly structure (as in torchtitan's ``models/llama3/model.py``):
- ``layers`` is a ModuleDict keyed "0".."L-1", so a pipeline stage deletes blocks and keeps names;
- a stage without ``tok_embeddings`` takes hidden states, one without ``norm`` returns hidden states;
- attention reshapes with ``view(b, s, -1, head_dim)``, so after a TP split it runs on its local heads.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from shardlab.errors import ShardlabError
from shardlab.runtime.numerics import DEFAULT, Numerics, rope
from shardlab.specs.model import ModelSpec

def _preset(name: str) -> ModelSpec:
    from shardlab.catalog import get_catalog

    return get_catalog().models[name]


def tiny_spec() -> ModelSpec:
    """Llama-style, 4 blocks of width 64 (8 heads, 4 KV heads), byte vocabulary: ~0.2M parameters (catalog 'tiny')."""
    return _preset("tiny")


def small_spec() -> ModelSpec:
    """Llama-style, 8 blocks of width 256 (8 heads, 4 KV heads), byte vocabulary: ~5.9M parameters (catalog 'small')."""
    return _preset("small")


def tiny_gpt2_spec() -> ModelSpec:
    """GPT-2 style, 4 blocks of width 64: LayerNorm, GELU, learned positions, biases, tied embeddings (catalog 'tiny-gpt2')."""
    return _preset("tiny-gpt2")


def _norm(spec: ModelSpec, size: int, numerics: Numerics = DEFAULT) -> nn.Module:
    eps = numerics.norm_eps
    return nn.LayerNorm(size, eps=eps) if spec.norm == "layernorm" else nn.RMSNorm(size, eps=eps)


def _activation(spec: ModelSpec, numerics: Numerics):
    kind = numerics.activation or ("silu" if spec.mlp == "swiglu" else "gelu_tanh")
    if kind == "silu":
        return F.silu
    if kind == "gelu":
        return F.gelu
    return lambda x: F.gelu(x, approximate="tanh")


class Attention(nn.Module):
    """Multi-head / grouped-query causal self-attention with separate q, k, v projections."""

    def __init__(self, spec: ModelSpec, numerics: Numerics = DEFAULT):
        super().__init__()
        h, hd = spec.hidden_size, spec.head_dim_
        self.head_dim, self.use_rope, self.numerics = hd, spec.position == "rope", numerics
        self.wq = nn.Linear(h, spec.q_size, bias=spec.qkv_bias)
        self.wk = nn.Linear(h, spec.kv_size, bias=spec.qkv_bias)
        self.wv = nn.Linear(h, spec.kv_size, bias=spec.qkv_bias)
        self.wo = nn.Linear(spec.q_size, h, bias=spec.out_bias)
        if spec.qk_norm == "head":  # Qwen3: RMSNorm over each head's head_dim, on q and k before RoPE (replicated under TP)
            self.q_norm = nn.RMSNorm(hd, eps=numerics.norm_eps)
            self.k_norm = nn.RMSNorm(hd, eps=numerics.norm_eps)

    def forward(self, x: torch.Tensor, start_pos: int = 0, cache: KVCache | None = None, layer: int = 0):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)   # (b, s, a/tp, hd): local heads after a TP split
        k = self.wk(x).view(b, s, -1, self.head_dim)   # (b, s, kv/tp, hd)
        v = self.wv(x).view(b, s, -1, self.head_dim)   # (b, s, kv/tp, hd)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        if self.use_rope:
            q, k = rope(q, start_pos, self.numerics), rope(k, start_pos, self.numerics)
        if cache is not None:
            k, v = cache.update(layer, k, v, start_pos)  # (b, start_pos + s, kv/tp, hd)
        rep = q.shape[2] // k.shape[2]                  # query heads per KV head (GQA)
        q, k, v = q.transpose(1, 2), k.repeat_interleave(rep, 2).transpose(1, 2), v.repeat_interleave(rep, 2).transpose(1, 2)
        mask = None
        if s > 1 and start_pos > 0:  # prefill after a cached prefix: token j sees positions <= start_pos + j
            t = k.shape[2]
            mask = torch.arange(t, device=x.device)[None, :] <= (start_pos + torch.arange(s, device=x.device))[:, None]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and s > 1)  # (b, a/tp, s, hd)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))  # (b, s, h)


class MLP(nn.Module):
    """SwiGLU (Shazeer 2020): w2(silu(w1 x) * w3 x); or GELU: w2(gelu(w1 x))."""

    def __init__(self, spec: ModelSpec, width: int, numerics: Numerics = DEFAULT):
        super().__init__()
        h, bias = spec.hidden_size, spec.mlp_bias
        self.swiglu, self.act = spec.mlp == "swiglu", _activation(spec, numerics)
        self.w1 = nn.Linear(h, width, bias=bias)
        if self.swiglu:
            self.w3 = nn.Linear(h, width, bias=bias)
        self.w2 = nn.Linear(width, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.act(self.w1(x)) * self.w3(x) if self.swiglu else self.act(self.w1(x))  # (b, s, f/tp)
        return self.w2(a)  # (b, s, h)


class Experts(nn.Module):
    """Routed experts stacked into one tensor per matrix: w1/w3 (E, f, h), w2 (E, h, f); EP splits dim 0."""

    def __init__(self, spec: ModelSpec, numerics: Numerics = DEFAULT):
        super().__init__()
        m, h = spec.moe, spec.hidden_size
        self.act = _activation(spec, numerics)
        self.w1 = nn.Parameter(torch.empty(m.num_experts, m.expert_ffn_hidden_size, h))
        if spec.mlp == "swiglu":
            self.w3 = nn.Parameter(torch.empty(m.num_experts, m.expert_ffn_hidden_size, h))
        self.w2 = nn.Parameter(torch.empty(m.num_experts, h, m.expert_ffn_hidden_size))

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e on rows x (n, h) -> (n, h); with TP-sharded (DTensor) stacks, this rank's partial sum."""
        w1, w2 = _local(self.w1), _local(self.w2)
        up = x @ w1[e].t()                                                   # (n, f/tp)
        a = self.act(up) * (x @ _local(self.w3)[e].t()) if hasattr(self, "w3") else self.act(up)
        return a @ w2[e].t()                                                 # (n, h), partial under TP


def _local(p):
    """A DTensor parameter's local shard (differentiable), or the tensor itself."""
    return p.to_local() if hasattr(p, "to_local") else p


def _tp_copy(x, group):
    from shardlab.runtime.parallel.megatron import CollectiveCounter, CopyToTensorParallel

    return CopyToTensorParallel.apply(x, group, CollectiveCounter())


def _tp_reduce(x, group):
    from shardlab.runtime.parallel.megatron import CollectiveCounter, ReduceFromTensorParallel

    return ReduceFromTensorParallel.apply(x, group, CollectiveCounter())


class MoE(nn.Module):
    """Top-k routed mixture of experts (Mixtral, Jiang et al. 2024 eq. 1: softmax over the top-k logits; Qwen-MoE
    without ``norm_topk_prob``: softmax over all experts, the top k kept), an optional shared expert, gated by
    sigmoid(x · g) in Qwen2-MoE."""

    def __init__(self, spec: ModelSpec, numerics: Numerics = DEFAULT):
        super().__init__()
        m = spec.moe
        self.top_k, self.renormalize = m.top_k, numerics.moe_renormalize
        self.router = nn.Linear(spec.hidden_size, m.num_experts, bias=m.router_bias)
        self.experts = Experts(spec, numerics)
        if m.shared_width:
            self.shared = MLP(spec, m.shared_width, numerics)
        if m.shared_expert_gate:
            self.shared_gate = nn.Linear(spec.hidden_size, 1, bias=False)

    def route(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, expert ids), each (tokens, k), for flat (tokens, h)."""
        logits = self.router(flat)                                # (tokens, E)
        if self.renormalize:
            w, idx = logits.topk(self.top_k, dim=-1)
            return w.softmax(-1), idx
        return logits.softmax(-1, dtype=torch.float32).to(flat.dtype).topk(self.top_k, dim=-1)

    def shared_out(self, flat: torch.Tensor) -> torch.Tensor:
        out = self.shared(flat)
        return out * torch.sigmoid(self.shared_gate(flat)) if hasattr(self, "shared_gate") else out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        flat = x.reshape(-1, h)                                   # (b*s, h)
        w, idx = self.route(flat)                                 # (b*s, k)
        group = getattr(self, "tp_group", None)                   # set when TP splits the experts' width
        xe = flat if group is None else _tp_copy(flat, group)     # Megatron's f: the input gradient summed over TP
        rows_, slots_, ys = [], [], []
        for e in range(self.experts.w1.shape[0]):
            rows, slot = (idx == e).nonzero(as_tuple=True)
            if rows.numel():
                rows_.append(rows)
                slots_.append(slot)
                ys.append(self.experts.expert(e, xe[rows]))       # (n_e, h)
        out = torch.zeros_like(flat)
        if ys:
            rows, slot, y = torch.cat(rows_), torch.cat(slots_), torch.cat(ys)   # (b*s*k, h) copies by expert
            if group is not None:                                 # Megatron's g: one all-reduce of the partial outputs,
                y = _tp_reduce(y, group)                          # before the router weights (their gradient stays whole)
            out = out.index_add(0, rows, y * w[rows, slot, None])
        if hasattr(self, "shared"):
            out = out + self.shared_out(flat)
        return out.view(b, s, h)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then + mlp(norm(.)) (or both from x: parallel residual)."""

    def __init__(self, spec: ModelSpec, layer: int, numerics: Numerics = DEFAULT):
        super().__init__()
        self.layer, self.parallel_residual = layer, spec.parallel_residual
        self.attention_norm = _norm(spec, spec.hidden_size, numerics)
        self.attention = Attention(spec, numerics)
        self.ffn_norm = _norm(spec, spec.hidden_size, numerics)
        if spec.is_moe_layer(layer):
            self.moe = MoE(spec, numerics)
        else:
            self.mlp = MLP(spec, spec.ffn_hidden_size, numerics)

    def forward(self, x: torch.Tensor, start_pos: int = 0, cache: KVCache | None = None) -> torch.Tensor:
        ff = self.moe if hasattr(self, "moe") else self.mlp
        a = self.attention(self.attention_norm(x), start_pos=start_pos, cache=cache, layer=self.layer)
        if self.parallel_residual:
            return x + a + ff(self.ffn_norm(x))
        x = x + a
        return x + ff(self.ffn_norm(x))


class _Embedding(nn.Embedding):
    """``nn.Embedding`` without its default N(0, 1) init: ``build_model`` builds on the meta device, where
    ``normal_`` runs through torch's Python reference ops and imports TorchDynamo (2-3 s per process on a CPU), and
    ``init_weights`` then fills every tensor anyway. Same parameters, same state-dict names."""

    def reset_parameters(self) -> None:
        if self.weight.device.type != "meta":
            super().reset_parameters()


class GPT(nn.Module):
    """Embeddings, blocks, final norm and head; a pipeline stage is a GPT with some parts set to None."""

    def __init__(self, spec: ModelSpec, numerics: Numerics = DEFAULT):
        super().__init__()
        self.spec, self.numerics = spec, numerics
        h = spec.hidden_size
        self.tok_embeddings = _Embedding(spec.vocab_size, h)
        if spec.position == "learned":
            self.pos_embeddings = _Embedding(spec.max_seq_len, h)
        if spec.embedding_norm:
            self.emb_norm = _norm(spec, h, numerics)
        self.layers = nn.ModuleDict({str(i): Block(spec, i, numerics) for i in range(spec.num_layers)})
        self.norm = _norm(spec, h, numerics)
        if not spec.tied_embeddings:
            self.output = nn.Linear(h, spec.vocab_size, bias=False)

    def forward(self, x: torch.Tensor, start_pos: int = 0, cache: KVCache | None = None) -> torch.Tensor:
        """tokens (b, s) -> logits (b, s, V); a stage without embeddings takes (b, s, h), one without a head returns it."""
        if getattr(self, "tok_embeddings", None) is not None:
            s = x.shape[1]
            x = self.tok_embeddings(x)  # (b, s, h)
            if getattr(self, "pos_embeddings", None) is not None:
                x = x + self.pos_embeddings(torch.arange(start_pos, start_pos + s, device=x.device))
            if getattr(self, "emb_norm", None) is not None:
                x = self.emb_norm(x)
        for block in self.layers.values():
            x = block(x, start_pos=start_pos, cache=cache)  # (b, s, h)
        if getattr(self, "norm", None) is None:
            return x
        x = self.norm(x)
        if getattr(self, "output", None) is not None:
            logits = self.output(x)  # (b, s, V)
        else:
            logits = tied_logits(x, self.tok_embeddings.weight)
        v = self.numerics.vocab_size
        return logits[..., :v] if v and v < logits.shape[-1] else logits  # padded rows (TP) never reach the caller


def tied_logits(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Head sharing the embedding matrix; with a vocabulary-sharded DTensor weight, gathers the logits."""
    from torch.distributed.tensor import DTensor, Replicate

    if isinstance(weight, DTensor):
        xd = DTensor.from_local(x, weight.device_mesh, [Replicate()], run_check=False)
        return F.linear(xd, weight).full_tensor()  # (b, s, V/tp) per rank, gathered to (b, s, V)
    return F.linear(x, weight)


class KVCache:
    """Pre-allocated key/value cache, one (k, v) pair per block: (batch, max_tokens, kv_heads_local, head_dim)."""

    def __init__(self, layers: list[int], batch: int, max_tokens: int, kv_heads_local: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        shape = (batch, max_tokens, kv_heads_local, head_dim)
        self.k = {i: torch.zeros(shape, dtype=dtype, device=device) for i in layers}
        self.v = {i: torch.zeros(shape, dtype=dtype, device=device) for i in layers}

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, start_pos: int):
        s = k.shape[1]
        self.k[layer][:, start_pos:start_pos + s] = k
        self.v[layer][:, start_pos:start_pos + s] = v
        return self.k[layer][:, : start_pos + s], self.v[layer][:, : start_pos + s]

    @property
    def nbytes(self) -> int:
        """Bytes allocated for the cache on this rank."""
        return sum(t.untyped_storage().nbytes() for d in (self.k, self.v) for t in d.values())


def init_weights(model: nn.Module, seed: int = 0) -> None:
    """Deterministic init from an explicit generator (thread-safe; identical on every rank).

    Matrices ~ N(0, 0.02) (output projections wo/w2 scaled by 1/sqrt(2L), GPT-2 §2.3), norms 1, biases 0.
    """
    g = torch.Generator().manual_seed(seed)
    L = max(1, getattr(model, "spec").num_layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.device.type == "meta":
                continue
            if name.endswith("norm.weight"):
                val = torch.ones(p.shape)
            elif p.dim() == 1:
                val = torch.zeros(p.shape)
            else:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("wo.weight", "w2.weight", "experts.w2")) else 0.02
                val = torch.randn(p.shape, generator=g) * std
            p.copy_(val.to(p.dtype))


def unbuilt(spec: ModelSpec) -> str:
    """What of ``spec`` the runtime GPT does not implement, as the end of a sentence ('' when it builds the model)."""
    if spec.mla is not None:
        return "uses Multi-head Latent Attention, which the runtime GPT does not implement; use a GQA/MHA model"
    if spec.attention_sinks or (spec.moe is not None and spec.moe.expert_bias):
        return ("has attention sinks and expert biases (GPT-OSS), which the runtime GPT does not implement; estimate, "
                "plan and memory model it (`shardlab memory` shows its shards exactly)")
    return ""


def build_model(spec: ModelSpec, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                seed: int = 0, numerics: Numerics = DEFAULT, init: bool = True) -> GPT:
    """The GPT for ``spec`` on ``device`` ('cpu', 'cuda' or 'meta'), deterministically initialised from ``seed``
    (a checkpoint then overwrites the weights: ``runtime.checkpoint.load``). ``init=False`` leaves them uninitialised
    (``torch.empty``), for a loader that fills every tensor."""
    if unbuilt(spec):
        raise ShardlabError(f"model '{spec.name}' {unbuilt(spec)}")
    if spec.position == "alibi" and str(device) != "meta":
        raise ShardlabError(f"model '{spec.name}' uses ALiBi positions, which the runtime GPT does not implement "
                            f"(it can only be built on the meta device)")
    with torch.device("meta"):
        model = GPT(spec, numerics).to(dtype=dtype)
    if str(device) != "meta":
        model = model.to_empty(device="cpu")  # no default init: init_weights (or a checkpoint) fills every tensor
        if init:
            init_weights(model, seed)
        model = model.to(device)
    return model
