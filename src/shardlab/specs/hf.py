"""Read a Hugging Face ``config.json`` as it is published into a ModelSpec.

Supported ``model_type`` values: llama, mistral, mixtral, qwen2, gpt2 (also a bare GPT-2-style file
with n_embd/n_layer/n_head/vocab_size/n_positions, which describes any GPT-3-style model), gpt_neox,
bloom, deepseek_v3, gemma, gemma2, gemma3 (the text decoder of the multimodal file) and gemma3_text,
phi3, qwen2_moe, qwen3, qwen3_moe, olmo2, gpt_oss, falcon, mpt, gptj and opt. Unknown fields are ignored; a
missing required field is named in the error. Defaults are the ones the transformers library applies
when a field is absent (its ``*Config`` classes); tests/test_hf_families.py builds every family with
transformers on the meta device and compares the counts exactly.
"""

from __future__ import annotations

from dataclasses import replace

from shardlab.errors import ShardlabError
from shardlab.specs.model import MLASpec, ModelSpec, MoESpec

LLAMA_LIKE = ("llama", "mistral", "mixtral", "qwen2", "deepseek_v3", "gemma", "gemma2", "gemma3_text", "phi3",
              "qwen2_moe", "qwen3", "qwen3_moe", "olmo2", "gpt_oss")
SUPPORTED = LLAMA_LIKE + ("gemma3", "gpt2", "gpt_neox", "bloom", "falcon", "mpt", "gptj", "opt")
ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "MixtralForCausalLM": "mixtral",
                 "Qwen2ForCausalLM": "qwen2", "GPT2LMHeadModel": "gpt2", "GPTNeoXForCausalLM": "gpt_neox",
                 "BloomForCausalLM": "bloom", "DeepseekV3ForCausalLM": "deepseek_v3",
                 "GemmaForCausalLM": "gemma", "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3_text",
                 "Gemma3ForConditionalGeneration": "gemma3", "Phi3ForCausalLM": "phi3",
                 "Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3_moe",
                 "Olmo2ForCausalLM": "olmo2", "FalconForCausalLM": "falcon", "MPTForCausalLM": "mpt",
                 "MptForCausalLM": "mpt", "GPTJForCausalLM": "gptj", "OPTForCausalLM": "opt",
                 "GptOssForCausalLM": "gpt_oss"}
"""transformers class names, used when a file has no model_type."""

DEFAULTS = {
    "mistral": {"num_key_value_heads": 8},
    "mixtral": {"num_key_value_heads": 8},
    "qwen2": {"num_key_value_heads": 32, "max_window_layers": 28},
    "gemma": {"tie_word_embeddings": True, "head_dim": 256, "num_key_value_heads": 16},
    "gemma2": {"tie_word_embeddings": True, "head_dim": 256, "num_key_value_heads": 4},
    "gemma3_text": {"tie_word_embeddings": True, "head_dim": 256, "vocab_size": 262208, "max_position_embeddings": 131072,
                    "num_key_value_heads": 4},
    "qwen3": {"head_dim": 128, "num_key_value_heads": 32, "max_window_layers": 28},
    "qwen2_moe": {"num_key_value_heads": 16, "shared_expert_intermediate_size": 5632, "max_window_layers": 28},
    "qwen3_moe": {"num_key_value_heads": 4},
    "deepseek_v3": {"n_shared_experts": 1, "first_k_dense_replace": 3},
    "gpt_oss": {"num_hidden_layers": 36, "num_local_experts": 128, "vocab_size": 201088, "hidden_size": 2880,
                "intermediate_size": 2880, "head_dim": 64, "num_attention_heads": 64, "num_key_value_heads": 8,
                "sliding_window": 128, "max_position_embeddings": 131072, "num_experts_per_tok": 4,
                "attention_bias": True},
    "gpt2": {"n_positions": 1024},
    "falcon": {"vocab_size": 65024, "max_position_embeddings": 2048},
    "mpt": {"vocab_size": 50368, "max_seq_len": 2048, "expansion_ratio": 4},
    "opt": {"max_position_embeddings": 2048},
}
"""transformers' config defaults for fields published files may leave out (its ``*Config`` classes' keyword defaults:
MistralConfig's num_key_value_heads=8, Qwen2MoeConfig's shared_expert_intermediate_size=5632, DeepseekV3Config's
first_k_dense_replace=3, ...). Families not listed default num_key_value_heads to num_attention_heads (LlamaConfig,
Phi3Config, Olmo2Config); Qwen3MoeConfig has no head_dim default (hidden_size / heads)."""


class _Cfg:
    def __init__(self, d: dict, where: str, family: str):
        self.d, self.where, self.family = {**DEFAULTS.get(family, {}), **d}, where, family

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

    def count(self, key: str, default: int, minimum: int = 0) -> int:
        """An optional whole-number field, checked here so that the error names the file's own key."""
        v = self.opt(key, default)
        if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            bound = "a positive integer" if minimum > 0 else "an integer >= 0"
            raise ShardlabError(f"{self.where}: '{key}' must be {bound}, got {v!r}; fix the config")
        return v

    def text(self, key: str, default: str) -> str:
        v = self.opt(key, default)
        if not isinstance(v, str):
            raise ShardlabError(f"{self.where}: '{key}' must be text, got {v!r}; fix the config")
        return v

    def flag(self, key: str, default: bool) -> bool:
        """A true/false field: JSON's true or false (a string "false" is not read as true)."""
        v = self.opt(key, default)
        if not isinstance(v, bool):
            raise ShardlabError(f"{self.where}: '{key}' must be true or false, got {v!r}; fix the config")
        return v


def model_type(d: dict, where: str) -> str:
    """The config's model_type, or the one its ``architectures`` entry names, or gpt2 for a bare GPT-2-style file."""
    mt = d.get("model_type")
    if mt is None:
        archs = d.get("architectures") or []
        archs = archs if isinstance(archs, list) else []
        mt = next((ARCHITECTURES[a] for a in archs if isinstance(a, str) and a in ARCHITECTURES), None)
    if mt is None and "n_embd" in d:
        mt = "gpt2"  # a bare GPT-2-style file (n_embd, n_layer, n_head, vocab_size, n_positions): GPT-3-style models
    if mt is None:
        raise ShardlabError(f"{where}: no model_type (and no known architectures entry); add \"model_type\" "
                            f"(one of {', '.join(SUPPORTED)}) to the file")
    if not isinstance(mt, str):
        raise ShardlabError(f"{where}: model_type must be text, got {type(mt).__name__}; fix the file")
    if mt not in SUPPORTED:
        raise ShardlabError(f"{where}: model_type {mt!r} is not supported; supported: {', '.join(SUPPORTED)} "
                            f"(or describe the model in a YAML file, see `shardlab models --help`)")
    return mt


def from_hf_config(d: dict, name: str = "config", where: str = "config.json") -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config mapping."""
    mt = model_type(d, where)
    source = f"Hugging Face config file {where}"
    d0 = d
    ckpt = checkpoint_weights(d.get("quantization_config"), where)
    if mt == "gemma3":  # multimodal file: the language model is text_config (the SigLIP vision tower is not modelled)
        text = d.get("text_config") or {}
        if not isinstance(text, dict):
            raise ShardlabError(f"{where}: gemma3's text_config must be an object, got {type(text).__name__}; fix the file")
        d, mt = dict(text), "gemma3_text"
        source += " (text decoder only: the vision tower and projector are not counted)"
    c = _Cfg(d, where, mt)
    common = dict(name=name, family=mt, source=source)
    reader = _OTHER.get(mt)
    try:
        spec = reader(c, common) if reader else _llama_like(c, common, mt)
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError) as e:
        raise ShardlabError(f"{where}: a {mt} config field has the wrong type or value ({type(e).__name__}: "
                            f"{str(e)[:100]}); fix the file") from None
    q = d0.get("quantization_config")
    if not ckpt and q not in (None, {}, ""):
        what = (f"{str(q.get('quant_method', '?'))[:40]}" + (f" {str(q.get('quant_algo'))[:20]}" if q.get("quant_algo") else "")
                + (f" {str(q.get('bits'))[:10]} bits" if "bits" in q else "") if isinstance(q, dict) else
                f"a {type(q).__name__}")
        spec = replace(spec, checkpoint_unpriced=what)
    if ckpt:
        spec = replace(spec, checkpoint_weights=ckpt[0], checkpoint_group_size=ckpt[2],
                       source=f"{spec.source}; checkpoint weights {ckpt[0]} ({ckpt[1]})")
    return spec.validate()


def checkpoint_weights(q, where: str = "config.json") -> tuple[str, str, int] | None:
    """(type, why, group size) of a checkpoint's block weights from its config's ``quantization_config``, for the
    types shardlab prices as they ship: 'fp8' (quant_method fp8: DeepSeek-V3's block FP8, vLLM/ModelOpt FP8
    checkpoints), 'fp4' (quant_method mxfp4: GPT-OSS's experts; ModelOpt NVFP4), 'int4'/'int8' with their group
    size (quant_method awq or gptq at 4 or 8 bits: ``bits``, ``group_size``; GPTQ's −1 = per output channel, 0 here,
    at 8 bits only); None for any other or no quantization (the weights are then priced 16-bit unless --weights says
    otherwise); a malformed group_size is refused in one line."""
    if not isinstance(q, dict):
        return None
    method = str(q.get("quant_method", ""))[:40].lower()
    algo = str(q.get("quant_algo", ""))[:40].upper()
    why = f"quantization_config quant_method {method}" + (f" {algo}" if algo else "")
    if method == "fp8" or (method == "modelopt" and algo == "FP8"):
        return "fp8", why, 0
    if method == "mxfp4" or (method == "modelopt" and algo == "NVFP4"):
        return "fp4", why + ": priced as fp4 on every block matrix", 0
    bits, group = q.get("bits", q.get("w_bit")), q.get("group_size", q.get("q_group_size"))
    if method not in ("awq", "gptq"):
        return None
    if type(bits) is not int or bits not in (4, 8):   # 2/3-bit, strings, floats: not a scheme shardlab prices
        return None
    whole = type(group) is int
    if not (whole and (group == -1 or 0 < group <= 2**20)):
        raise ShardlabError(f"{where}: quantization_config group_size must be -1 (per output channel) or a whole number "
                            f"from 1 to 1,048,576, got {str(group)[:40]}; fix the file")
    if group == -1 and (method == "awq" or bits == 4):
        return None           # per-channel 4-bit (and AWQ, grouped by definition): not a layout shardlab prices
    g = max(group, 0)
    return f"int{bits}", f"{why}, {bits} bits" + (f", groups of {g}" if g else ", per output channel"), g


def _gpt2(c: _Cfg, common: dict) -> ModelSpec:
    h = c.req("n_embd")
    return ModelSpec(**common, hidden_size=h, num_layers=c.req("n_layer"), num_heads=c.req("n_head"),
                     num_kv_heads=c.req("n_head"), ffn_hidden_size=c.count("n_inner", 4 * h, 1), vocab_size=c.req("vocab_size"),
                     max_seq_len=c.req("n_positions"), mlp="gelu", norm="layernorm", position="learned",
                     tied_embeddings=c.flag("tie_word_embeddings", True), qkv_bias=True, out_bias=True, mlp_bias=True,
                     fused_qkv=True)


def _bloom(c: _Cfg, common: dict) -> ModelSpec:
    h = c.req("hidden_size", "n_embed")
    a = c.req("n_head", "num_attention_heads")
    return ModelSpec(**common, hidden_size=h, num_layers=c.req("n_layer", "num_hidden_layers"), num_heads=a,
                     num_kv_heads=a, ffn_hidden_size=4 * h, vocab_size=c.req("vocab_size"),
                     max_seq_len=c.count("seq_length", 2048, 1), mlp="gelu", norm="layernorm", position="alibi",
                     tied_embeddings=c.flag("tie_word_embeddings", True), qkv_bias=True, out_bias=True,
                     mlp_bias=True, embedding_norm=True, fused_qkv=True)


def _gpt_neox(c: _Cfg, common: dict) -> ModelSpec:
    a = c.req("num_attention_heads")
    bias = c.flag("attention_bias", True)
    return ModelSpec(**common, hidden_size=c.req("hidden_size"), num_layers=c.req("num_hidden_layers"), num_heads=a,
                     num_kv_heads=a, ffn_hidden_size=c.req("intermediate_size"), vocab_size=c.req("vocab_size"),
                     max_seq_len=c.count("max_position_embeddings", 2048, 1), mlp="gelu", norm="layernorm", position="rope",
                     tied_embeddings=c.flag("tie_word_embeddings", False), qkv_bias=bias, out_bias=bias,
                     mlp_bias=True, parallel_residual=c.flag("use_parallel_residual", True), fused_qkv=True)


def _falcon(c: _Cfg, common: dict) -> ModelSpec:
    """FalconForCausalLM: fused QKV (MQA when multi_query, GQA with the new decoder architecture), GELU MLP, one
    shared LayerNorm per block for parallel attention (Falcon-7B), two with the new architecture (ln_attn, ln_mlp)."""
    h, a = c.req("hidden_size", "n_embed"), c.req("num_attention_heads", "n_head")
    new = c.flag("new_decoder_architecture", False)
    kv = c.count("num_kv_heads", a, 1) if new else (1 if c.flag("multi_query", True) else a)
    parallel = c.flag("parallel_attn", True)
    one_norm = (not new and parallel) or (new and c.count("num_ln_in_parallel_attn", 2, 1) == 1)
    bias = c.flag("bias", False)
    return ModelSpec(**common, hidden_size=h, num_layers=c.req("num_hidden_layers", "n_layer"), num_heads=a, num_kv_heads=kv,
                     ffn_hidden_size=c.count("ffn_hidden_size", 4 * h, 1), vocab_size=c.req("vocab_size"),
                     max_seq_len=c.count("max_position_embeddings", 2048, 1), mlp="gelu", norm="layernorm",
                     position="alibi" if c.flag("alibi", False) else "rope",
                     tied_embeddings=c.flag("tie_word_embeddings", True), qkv_bias=bias, out_bias=bias, mlp_bias=bias,
                     parallel_residual=parallel or new, block_norms="shared" if one_norm else "pre", fused_qkv=True)


def _mpt(c: _Cfg, common: dict) -> ModelSpec:
    """MptForCausalLM: fused Wqkv, GELU MLP of expansion_ratio·d, ALiBi, no biases anywhere (LayerNorms too) when no_bias."""
    h, a = c.req("d_model", "hidden_size"), c.req("n_heads", "num_attention_heads")
    bias = not c.flag("no_bias", True)
    return ModelSpec(**common, hidden_size=h, num_layers=c.req("n_layers", "num_hidden_layers"), num_heads=a, num_kv_heads=a,
                     ffn_hidden_size=c.req("expansion_ratio") * h, vocab_size=c.req("vocab_size"),
                     max_seq_len=c.req("max_seq_len"), mlp="gelu", norm="layernorm", position="alibi",
                     tied_embeddings=c.flag("tie_word_embeddings", True), qkv_bias=bias, out_bias=bias, mlp_bias=bias,
                     norm_bias=bias, fused_qkv=True)


def _gptj(c: _Cfg, common: dict) -> ModelSpec:
    """GPTJForCausalLM: one LayerNorm feeding parallel attention (no biases) and MLP (biases), partial rotary
    (rotary_dim; no parameters), an untied head with a bias."""
    h = c.req("n_embd", "hidden_size")
    return ModelSpec(**common, hidden_size=h, num_layers=c.req("n_layer", "num_hidden_layers"), num_heads=c.req("n_head"),
                     num_kv_heads=c.req("n_head"), ffn_hidden_size=c.count("n_inner", 4 * h, 1), vocab_size=c.req("vocab_size"),
                     max_seq_len=c.req("n_positions", "max_position_embeddings"), mlp="gelu", norm="layernorm",
                     position="rope", tied_embeddings=c.flag("tie_word_embeddings", False), mlp_bias=True,
                     parallel_residual=True, block_norms="shared", head_bias=True)


def _opt(c: _Cfg, common: dict) -> ModelSpec:
    """OPTForCausalLM: learned positions offset by 2 (a table of max_position_embeddings + 2 rows), ReLU MLP of ffn_dim
    (two matrices, counted like GELU), biases (enable_bias), a final LayerNorm only with do_layer_norm_before, and
    project_in/out when word_embed_proj_dim differs from hidden_size (OPT-350m)."""
    h, a = c.req("hidden_size"), c.req("num_attention_heads")
    bias = c.flag("enable_bias", True)
    proj = c.count("word_embed_proj_dim", h, 1)
    return ModelSpec(**common, hidden_size=h, num_layers=c.req("num_hidden_layers"), num_heads=a, num_kv_heads=a,
                     ffn_hidden_size=c.req("ffn_dim"), vocab_size=c.req("vocab_size"),
                     max_seq_len=c.req("max_position_embeddings"), mlp="gelu", norm="layernorm", position="learned",
                     tied_embeddings=c.flag("tie_word_embeddings", True), qkv_bias=bias, out_bias=bias, mlp_bias=bias,
                     position_offset=2, embedding_proj_dim=0 if proj == h else proj,
                     final_norm=c.flag("do_layer_norm_before", True) and not c.flag("_remove_final_layer_norm", False))


_OTHER = {"gpt2": _gpt2, "bloom": _bloom, "gpt_neox": _gpt_neox, "falcon": _falcon, "mpt": _mpt, "gptj": _gptj, "opt": _opt}


def _sparse_layers_check(c: _Cfg) -> None:
    """Qwen MoE files may make some layers dense (decoder_sparse_step, mlp_only_layers); only 'every layer sparse' is modelled."""
    if c.opt("decoder_sparse_step", 1) != 1 or c.opt("mlp_only_layers", []):
        raise ShardlabError(f"{c.where}: decoder_sparse_step != 1 or mlp_only_layers (dense layers between MoE layers) is not "
                            f"modelled; describe the model in a YAML file with moe.first_dense_layers instead")


def _llama_like(c: _Cfg, common: dict, mt: str) -> ModelSpec:
    """Llama-style families: RMSNorm, gated MLP (SwiGLU; Gemma's GeGLU has the same three matrices), RoPE, GQA."""
    a = c.req("num_attention_heads")
    # Mistral, Mixtral and Phi-3 build no attention or MLP biases whatever the file says (their modeling code)
    no_bias_flags = mt in ("mistral", "mixtral", "phi3")
    attn_bias = False if no_bias_flags else c.flag("attention_bias", False)
    kw = dict(hidden_size=c.req("hidden_size"), num_layers=c.req("num_hidden_layers"), num_heads=a,
              num_kv_heads=c.count("num_key_value_heads", a, 1), ffn_hidden_size=c.req("intermediate_size"),
              vocab_size=c.req("vocab_size"), max_seq_len=c.count("max_position_embeddings", 2048, 1), mlp="swiglu",
              norm="rmsnorm", position="rope", tied_embeddings=c.flag("tie_word_embeddings", False),
              head_dim=c.count("head_dim", 0), qkv_bias=attn_bias, out_bias=attn_bias,
              mlp_bias=False if no_bias_flags else c.flag("mlp_bias", False))
    if mt == "qwen2":
        kw.update(qkv_bias=True, out_bias=False)  # Qwen2Attention: q/k/v with bias, o_proj without
    if mt == "qwen2_moe":
        kw.update(qkv_bias=c.flag("qkv_bias", True), out_bias=False)  # Qwen2MoeAttention: bias=config.qkv_bias
    explicit_none = "sliding_window" in c.d and c.d["sliding_window"] is None   # transformers: no window
    if mt in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe") and c.flag("use_sliding_window", False) and not explicit_none:
        window = c.count("sliding_window", 4096)
        # Qwen2, Qwen3 and Qwen2-MoE slide only from layer max_window_layers on (Qwen2Config.layer_types: the first
        # max_window_layers attend fully); Qwen3-MoE slides every layer
        full = c.count("max_window_layers", 0) if mt != "qwen3_moe" else 0
        if full < kw["num_layers"]:
            kw.update(sliding_window=window, full_attention_layers=full)
    if mt in ("mistral", "mixtral", "phi3"):
        kw["sliding_window"] = c.count("sliding_window", 0)
    if mt == "phi3":
        kw.update(fused_qkv=True, fused_gate_up=True)  # Phi3Attention.qkv_proj, Phi3MLP.gate_up_proj
    if mt in ("gemma2", "gemma3_text", "gpt_oss") and not explicit_none:
        # local (sliding) and global layers alternate: Gemma 2 and GPT-OSS every other layer, Gemma 3 one global layer
        # in sliding_window_pattern (6); transformers' layer_types lists them where the file has it
        window = c.count("sliding_window", 4096)
        types = c.d.get("layer_types")
        L = kw["num_layers"]
        if types is not None and not (isinstance(types, list) and len(types) == L
                                      and all(t in ("sliding_attention", "full_attention") for t in types)):
            raise ShardlabError(f"{c.where}: 'layer_types' must list 'sliding_attention' or 'full_attention' for each "
                                f"of the {L} layers (num_hidden_layers); fix or drop it")
        if types is not None:
            full = sum(t == "full_attention" for t in types)
        elif mt == "gemma3_text":
            full = L // max(1, c.count("sliding_window_pattern", 6))
        else:
            full = L // 2
        if window and full < L:
            kw.update(sliding_window=window, full_attention_layers=full)
    if mt in ("gemma2", "gemma3_text"):
        kw["block_norms"] = "sandwich"   # input, post-attention, pre- and post-feed-forward norms
    if mt in ("gemma3_text", "qwen3", "qwen3_moe"):
        kw["qk_norm"] = "head"
    if mt == "olmo2":
        kw.update(block_norms="post", qk_norm="proj")
    if mt == "gpt_oss":   # GptOssAttention: q/k/v/o biases and per-head sinks; experts with biases, a router bias
        kw.update(qkv_bias=c.flag("attention_bias", True), out_bias=c.flag("attention_bias", True), mlp_bias=False,
                  attention_sinks=True)
        kw["moe"] = MoESpec(num_experts=c.req("num_local_experts"), top_k=c.req("num_experts_per_tok"),
                            expert_ffn_hidden_size=c.req("intermediate_size"), router_bias=True, expert_bias=True)
    if mt == "mixtral":
        kw["moe"] = MoESpec(num_experts=c.req("num_local_experts"), top_k=c.req("num_experts_per_tok"),
                            expert_ffn_hidden_size=c.req("intermediate_size"))
    if mt in ("qwen2_moe", "qwen3_moe"):
        _sparse_layers_check(c)
        shared = c.count("shared_expert_intermediate_size", 0) if mt == "qwen2_moe" else 0
        kw["moe"] = MoESpec(num_experts=c.req("num_experts"), top_k=c.req("num_experts_per_tok"),
                            expert_ffn_hidden_size=c.req("moe_intermediate_size"), num_shared_experts=1 if shared else 0,
                            shared_expert_ffn_hidden_size=shared, shared_expert_gate=bool(shared))
    if mt == "deepseek_v3":
        kw["num_kv_heads"] = a
        kw["moe"] = MoESpec(num_experts=c.req("n_routed_experts"), top_k=c.req("num_experts_per_tok"),
                            expert_ffn_hidden_size=c.req("moe_intermediate_size"),
                            num_shared_experts=c.count("n_shared_experts", 0),
                            first_dense_layers=c.count("first_k_dense_replace", 0),
                            router_bias=c.text("topk_method", "") == "noaux_tc")
        kw["mla"] = MLASpec(q_lora_rank=c.count("q_lora_rank", 0), kv_lora_rank=c.req("kv_lora_rank"),
                            qk_nope_head_dim=c.req("qk_nope_head_dim"), qk_rope_head_dim=c.req("qk_rope_head_dim"),
                            v_head_dim=c.req("v_head_dim"))
    return ModelSpec(**common, **kw)
