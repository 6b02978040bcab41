"""Which checkpoint rows make each runtime parameter: the name map of every family loaded.

A runtime parameter (name and full shape, as in ``shardlab.specs.tensors.model_tensors``, vocabulary padded for TP)
is its dim 0 cut into :class:`Piece` s, each a run of rows of one checkpoint tensor:
- separate projections map one to one (Llama's ``q_proj`` -> ``attention.wq``);
- fused ones are cut by rows: Phi-3's ``qkv_proj`` is [q | k | v] and ``gate_up_proj`` [gate | up]; GPT-NeoX's
  ``query_key_value`` interleaves them per head, [q_i | k_i | v_i] for head i (GPTNeoXAttention's
  ``view(..., -1, 3 * head_size)``), so q is one piece per head;
- GPT-2's Conv1D matrices are stored (in, out): a piece reads columns and transposes;
- routed experts are stacked (E, out, in) here and separate tensors there: one piece per expert (``whole``);
- padded vocabulary rows and KV heads duplicated for TP > KV heads get zero rows and repeated heads.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.errors import ShardlabError


@dataclass(frozen=True)
class Piece:
    """A run of rows of a runtime parameter and where they come from."""

    tensor: str | None
    """Checkpoint tensor name; None for zero rows (vocabulary padding)."""
    rows: int
    """Rows of the runtime parameter (dim 0) this piece fills."""
    start: int = 0
    """First source row (a column of the stored matrix when ``transpose``)."""
    transpose: bool = False
    """The source is stored (in, out) (GPT-2 Conv1D): read columns, transpose."""
    whole: bool = False
    """Each row of ours is one whole source tensor (stacked experts: ``rows`` is 1)."""


_LLAMA_LAYER = {"attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                "attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj", "attention.wv": "self_attn.v_proj",
                "attention.wo": "self_attn.o_proj", "attention.q_norm": "self_attn.q_norm",
                "attention.k_norm": "self_attn.k_norm",
                "mlp.w1": "mlp.gate_proj", "mlp.w3": "mlp.up_proj", "mlp.w2": "mlp.down_proj"}
_QWEN_MOE = {"moe.router": "mlp.gate", "moe.shared.w1": "mlp.shared_expert.gate_proj",
             "moe.shared.w3": "mlp.shared_expert.up_proj", "moe.shared.w2": "mlp.shared_expert.down_proj",
             "moe.shared_gate": "mlp.shared_expert_gate"}
_EXPERTS = {"mixtral": ("block_sparse_moe.experts.{e}.", {"w1": "w1", "w3": "w3", "w2": "w2"}),
            "qwen2_moe": ("mlp.experts.{e}.", {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}),
            "qwen3_moe": ("mlp.experts.{e}.", {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"})}
_GPT2_LAYER = {"attention_norm": "ln_1", "ffn_norm": "ln_2", "attention.wo": "attn.c_proj", "mlp.w1": "mlp.c_fc",
               "mlp.w2": "mlp.c_proj"}
_NEOX_LAYER = {"attention_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attention.wo": "attention.dense",
               "mlp.w1": "mlp.dense_h_to_4h", "mlp.w2": "mlp.dense_4h_to_h"}
_TOP = {"gpt2": {"tok_embeddings": "transformer.wte", "pos_embeddings": "transformer.wpe", "norm": "transformer.ln_f",
                 "output": "lm_head"},
        "gpt_neox": {"tok_embeddings": "gpt_neox.embed_in", "norm": "gpt_neox.final_layer_norm", "output": "embed_out"}}
_LLAMA_TOP = {"tok_embeddings": "model.embed_tokens", "norm": "model.norm", "output": "lm_head"}


def _heads(rows: int, head_dim: int, heads_stored: int, base) -> list[Piece]:
    """One piece per head of a (rows, ...) K or V weight: heads beyond those stored repeat them (TP > KV heads)."""
    n = rows // head_dim
    rep = max(1, n // heads_stored)
    return [base(j // rep) for j in range(n)]


def pieces(family: str, spec, name: str, shape: tuple[int, ...], vocab: int) -> list[Piece]:
    """The pieces of runtime parameter ``name`` of full ``shape`` (``vocab``: the checkpoint's vocabulary)."""
    rows = shape[0]
    if ".moe.experts.w" in name:               # 'layers.0.moe.experts.w1': stacked (E, out, in), no '.weight'
        _, i, _, _, w = name.split(".")
        fmt, names = _EXPERTS[family]
        return [Piece(f"model.layers.{i}.{fmt.format(e=e)}{names[w]}.weight", 1, whole=True) for e in range(rows)]
    stem, _, kind = name.rpartition(".")       # 'layers.0.attention.wq', 'weight'
    if stem in ("tok_embeddings", "output"):   # vocabulary rows, then zeros up to the padded size
        # a tied head (the last pipeline stage's copy) is the embedding
        top = _TOP.get(family, _LLAMA_TOP)["tok_embeddings" if spec.tied_embeddings else stem]
        out = [Piece(f"{top}.{kind}", min(rows, vocab))]
        return out + [Piece(None, rows - vocab)] if rows > vocab else out
    if not stem.startswith("layers."):
        top = _TOP.get(family, _LLAMA_TOP)
        if stem not in top:
            raise ShardlabError(f"no checkpoint tensor for runtime parameter {name} ({family})")
        return [Piece(f"{top[stem]}.{kind}", rows)]
    _, i, local = stem.split(".", 2)           # '0', 'attention.wq'
    if family == "gpt2":
        return _gpt2(spec, f"transformer.h.{i}.", local, kind, rows)
    if family == "gpt_neox":
        return _neox(spec, f"gpt_neox.layers.{i}.", local, kind, rows)
    prefix = f"model.layers.{i}."
    if family == "phi3" and local in ("attention.wq", "attention.wk", "attention.wv", "mlp.w1", "mlp.w3"):
        return _phi3(spec, prefix, local, kind, rows)
    table = {**_LLAMA_LAYER, **_QWEN_MOE, "moe.router": "block_sparse_moe.gate" if family == "mixtral" else "mlp.gate"}
    if local not in table:
        raise ShardlabError(f"no checkpoint tensor for runtime parameter {name} ({family})")
    src = f"{prefix}{table[local]}.{kind}"
    if local in ("attention.wk", "attention.wv") and rows > spec.kv_size:  # KV heads duplicated for TP > KV heads
        return _heads(rows, spec.head_dim_, spec.num_kv_heads, lambda h: Piece(src, spec.head_dim_, h * spec.head_dim_))
    return [Piece(src, rows)]


def _phi3(spec, prefix: str, local: str, kind: str, rows: int) -> list[Piece]:
    """Phi3Attention.qkv_proj = [q | k | v] rows, Phi3MLP.gate_up_proj = [gate | up] rows."""
    q, kv, hd, f = spec.q_size, spec.kv_size, spec.head_dim_, spec.ffn_hidden_size
    if local == "mlp.w1":
        return [Piece(f"{prefix}mlp.gate_up_proj.{kind}", rows, 0)]
    if local == "mlp.w3":
        return [Piece(f"{prefix}mlp.gate_up_proj.{kind}", rows, f)]
    src = f"{prefix}self_attn.qkv_proj.{kind}"
    if local == "attention.wq":
        return [Piece(src, rows, 0)]
    base = q if local == "attention.wk" else q + kv
    if rows > kv:
        return _heads(rows, hd, spec.num_kv_heads, lambda h: Piece(src, hd, base + h * hd))
    return [Piece(src, rows, base)]


def _gpt2(spec, prefix: str, local: str, kind: str, rows: int) -> list[Piece]:
    """GPT-2: Conv1D weights (in, out), c_attn = [q | k | v] columns; norms and biases as they are."""
    h = spec.hidden_size
    weight = kind == "weight"
    if local in ("attention.wq", "attention.wk", "attention.wv"):
        start = {"attention.wq": 0, "attention.wk": h, "attention.wv": 2 * h}[local]
        return [Piece(f"{prefix}attn.c_attn.{kind}", rows, start, transpose=weight)]
    if local not in _GPT2_LAYER:
        raise ShardlabError(f"no GPT-2 checkpoint tensor for runtime parameter layers.*.{local}.{kind}")
    conv = local in ("attention.wo", "mlp.w1", "mlp.w2")
    return [Piece(f"{prefix}{_GPT2_LAYER[local]}.{kind}", rows, transpose=conv and weight)]


def _neox(spec, prefix: str, local: str, kind: str, rows: int) -> list[Piece]:
    """GPT-NeoX: query_key_value rows are [q_i | k_i | v_i] per head i."""
    hd = spec.head_dim_
    if local in ("attention.wq", "attention.wk", "attention.wv"):
        which = {"attention.wq": 0, "attention.wk": 1, "attention.wv": 2}[local]
        src = f"{prefix}attention.query_key_value.{kind}"
        return [Piece(src, hd, (3 * j + which) * hd) for j in range(rows // hd)]
    if local not in _NEOX_LAYER:
        raise ShardlabError(f"no GPT-NeoX checkpoint tensor for runtime parameter layers.*.{local}.{kind}")
    return [Piece(f"{prefix}{_NEOX_LAYER[local]}.{kind}", rows)]
