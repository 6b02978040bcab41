"""Read a Hugging Face ``config.json`` as it is published into a ModelSpec.

Supported ``model_type`` values: llama, mistral, mixtral, qwen2, gpt2 (also a bare GPT-2-style file
with n_embd/n_layer/n_head/vocab_size/n_positions, which describes any GPT-3-style model), gpt_neox,
bloom and deepseek_v3. Unknown fields are ignored; a missing required field is named in the error.
Defaults are the ones the transformers library applies when a field is absent.
"""

from __future__ import annotations

from shardlab.errors import ShardlabError
from shardlab.specs.model import MLASpec, ModelSpec, MoESpec

SUPPORTED = ("llama", "mistral", "mixtral", "qwen2", "gpt2", "gpt_neox", "bloom", "deepseek_v3")
ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "MixtralForCausalLM": "mixtral",
                 "Qwen2ForCausalLM": "qwen2", "GPT2LMHeadModel": "gpt2", "GPTNeoXForCausalLM": "gpt_neox",
                 "BloomForCausalLM": "bloom", "DeepseekV3ForCausalLM": "deepseek_v3"}
"""transformers class names, used when a file has no model_type."""


class _Cfg:
    def __init__(self, d: dict, where: str, family: str):
        self.d, self.where, self.family = d, where, family

    def req(self, *keys: str) -> int:
        """The first present of ``keys`` (aliases), as a positive int; else a ShardlabError naming it."""
        for k in keys:
            if k in self.d and self.d[k] is not None:
                v = self.d[k]
                if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                    raise ShardlabError(f"{self.where}: '{k}' must be a positive integer, got {v!r}; fix the config")
                return v
        raise ShardlabError(f"{self.where}: {self.family} config is missing required field '{keys[0]}'; add it to the file")

    def opt(self, key: str, default):
        v = self.d.get(key)
        return default if v is None else v


def from_hf_config(d: dict, name: str = "config", where: str = "config.json") -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config mapping."""
    mt = d.get("model_type")
    if mt is None:
        archs = d.get("architectures") or []
        mt = next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), None)
    if mt is None and "n_embd" in d:
        mt = "gpt2"  # a bare GPT-2-style file (n_embd, n_layer, n_head, vocab_size, n_positions): GPT-3-style models
    if mt is None:
        raise ShardlabError(f"{where}: no model_type (and no known architectures entry); add \"model_type\" "
                            f"(one of {', '.join(SUPPORTED)}) to the file")
    if mt not in SUPPORTED:
        raise ShardlabError(f"{where}: model_type {mt!r} is not supported; supported: {', '.join(SUPPORTED)} "
                            f"(or describe the model in a YAML file, see `shardlab models --help`)")
    c = _Cfg(d, where, mt)
    common = dict(name=name, family=mt, source=f"Hugging Face config file {where}")

    if mt == "gpt2":
        h = c.req("n_embd")
        return ModelSpec(**common, hidden_size=h, num_layers=c.req("n_layer"), num_heads=c.req("n_head"),
                         num_kv_heads=c.req("n_head"), ffn_hidden_size=c.opt("n_inner", 4 * h), vocab_size=c.req("vocab_size"),
                         max_seq_len=c.req("n_positions", "n_ctx"), mlp="gelu", norm="layernorm", position="learned",
                         tied_embeddings=bool(c.opt("tie_word_embeddings", True)), qkv_bias=True, out_bias=True,
                         mlp_bias=True).validate()
    if mt == "bloom":
        h = c.req("hidden_size", "n_embed")
        a = c.req("n_head", "num_attention_heads")
        return ModelSpec(**common, hidden_size=h, num_layers=c.req("n_layer", "num_hidden_layers"), num_heads=a,
                         num_kv_heads=a, ffn_hidden_size=4 * h, vocab_size=c.req("vocab_size"),
                         max_seq_len=c.opt("seq_length", 2048), mlp="gelu", norm="layernorm", position="alibi",
                         tied_embeddings=bool(c.opt("tie_word_embeddings", True)), qkv_bias=True, out_bias=True,
                         mlp_bias=True, embedding_norm=True).validate()
    if mt == "gpt_neox":
        a = c.req("num_attention_heads")
        bias = bool(c.opt("attention_bias", True))
        return ModelSpec(**common, hidden_size=c.req("hidden_size"), num_layers=c.req("num_hidden_layers"), num_heads=a,
                         num_kv_heads=a, ffn_hidden_size=c.req("intermediate_size"), vocab_size=c.req("vocab_size"),
                         max_seq_len=c.opt("max_position_embeddings", 2048), mlp="gelu", norm="layernorm", position="rope",
                         tied_embeddings=bool(c.opt("tie_word_embeddings", False)), qkv_bias=bias, out_bias=bias,
                         mlp_bias=True, parallel_residual=bool(c.opt("use_parallel_residual", True))).validate()

    # Llama-style families: RMSNorm, SwiGLU, RoPE, GQA
    a = c.req("num_attention_heads")
    attn_bias = bool(c.opt("attention_bias", False))
    kw = dict(hidden_size=c.req("hidden_size"), num_layers=c.req("num_hidden_layers"), num_heads=a,
              num_kv_heads=c.opt("num_key_value_heads", a), ffn_hidden_size=c.req("intermediate_size"),
              vocab_size=c.req("vocab_size"), max_seq_len=c.opt("max_position_embeddings", 2048), mlp="swiglu",
              norm="rmsnorm", position="rope", tied_embeddings=bool(c.opt("tie_word_embeddings", False)),
              head_dim=c.opt("head_dim", 0) or 0, qkv_bias=attn_bias, out_bias=attn_bias,
              mlp_bias=bool(c.opt("mlp_bias", False)))
    if mt == "qwen2":
        kw.update(qkv_bias=True, out_bias=False)  # Qwen2Attention: q/k/v with bias, o_proj without
        if c.opt("use_sliding_window", False):
            kw["sliding_window"] = c.opt("sliding_window", 0) or 0
    if mt == "mistral":
        kw["sliding_window"] = c.opt("sliding_window", 0) or 0
    if mt == "mixtral":
        kw["sliding_window"] = c.opt("sliding_window", 0) or 0
        kw["moe"] = MoESpec(num_experts=c.req("num_local_experts"), top_k=c.req("num_experts_per_tok"),
                            expert_ffn_hidden_size=c.req("intermediate_size"))
    if mt == "deepseek_v3":
        kw["num_kv_heads"] = a
        kw["moe"] = MoESpec(num_experts=c.req("n_routed_experts"), top_k=c.req("num_experts_per_tok"),
                            expert_ffn_hidden_size=c.req("moe_intermediate_size"),
                            num_shared_experts=c.opt("n_shared_experts", 0) or 0,
                            first_dense_layers=c.opt("first_k_dense_replace", 0) or 0,
                            router_bias=c.opt("topk_method", "") == "noaux_tc")
        kw["mla"] = MLASpec(q_lora_rank=c.opt("q_lora_rank", 0) or 0, kv_lora_rank=c.req("kv_lora_rank"),
                            qk_nope_head_dim=c.req("qk_nope_head_dim"), qk_rope_head_dim=c.req("qk_rope_head_dim"),
                            v_head_dim=c.req("v_head_dim"))
    return ModelSpec(**common, **kw).validate()
