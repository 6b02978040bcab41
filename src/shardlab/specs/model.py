"""ModelSpec: the architecture of a decoder-only transformer, enough to count every parameter exactly.

Covers GPT-2/GPT-3 style blocks (LayerNorm, GELU MLP of width f, learned positions, biases, tied
embeddings), GPT-NeoX (parallel residual, untied), Llama-style blocks (RMSNorm, SwiGLU, RoPE, GQA),
Qwen2 (QKV biases), Mixture-of-Experts (Mixtral; DeepSeek-V3 with shared experts and leading dense
layers; Qwen2-MoE's gated shared expert) and Multi-head Latent Attention (DeepSeek-V2/V3). Block
variants that change the count: one shared norm (GPT-J, Falcon-7B), sandwich norms (Gemma 2/3),
post-norms (OLMo 2), per-head or per-projection Q/K norms (Qwen3, Gemma 3; OLMo 2), LayerNorm without
bias (MPT), a head bias (GPT-J), OPT's position offset and embedding projection. The tensor inventory built from it lives in
``shardlab.specs.tensors``.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields, replace
from typing import Literal

from shardlab.errors import ShardlabError

MlpKind = Literal["gelu", "swiglu"]
NormKind = Literal["layernorm", "rmsnorm"]
PositionKind = Literal["learned", "rope", "alibi"]
BlockNorms = Literal["pre", "shared", "sandwich", "post"]
QKNorm = Literal["none", "head", "proj"]
NORMS_PER_BLOCK = {"pre": 2, "shared": 1, "sandwich": 4, "post": 2}
"""Norm modules per block: pre-norm (Llama, GPT-2), one shared by both branches (GPT-J, Falcon-7B), pre and
post around each sublayer (Gemma 2/3), after each sublayer (OLMo 2)."""
CHECKPOINT_WEIGHTS = ("", "fp8", "fp4", "int4", "int8")
"""Published checkpoints' block-weight types shardlab prices as they ship ('' = 16-bit)."""


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-Experts feed-forward (Mixtral: Jiang et al. 2024; DeepSeek-V3: arXiv 2412.19437 §2.1.2)."""

    num_experts: int
    """Routed experts per MoE layer (8 for Mixtral, 256 for DeepSeek-V3)."""
    top_k: int
    """Routed experts each token is sent to (2 for Mixtral, 8 for DeepSeek-V3)."""
    expert_ffn_hidden_size: int
    """Intermediate width of one routed expert (SwiGLU: gate, up and down matrices)."""
    num_shared_experts: int = 0
    """Always-active shared experts (DeepSeek-V3: 1), each of width ``expert_ffn_hidden_size``."""
    first_dense_layers: int = 0
    """Leading layers that keep a dense MLP of ``ModelSpec.ffn_hidden_size`` (DeepSeek-V3: 3)."""
    router_bias: bool = False
    """Router has a per-expert bias parameter (DeepSeek-V3's ``e_score_correction_bias``)."""
    shared_expert_ffn_hidden_size: int = 0
    """Width of the shared expert MLP when it is not num_shared_experts × expert width (Qwen2-MoE: 5632); 0 = that product."""
    shared_expert_gate: bool = False
    """A sigmoid gate (h → 1, no bias) scales the shared expert's output (Qwen2-MoE ``shared_expert_gate``)."""
    expert_bias: bool = False
    """Routed experts' projections have biases (GPT-OSS ``gate_up_proj_bias`` and ``down_proj_bias``)."""

    @property
    def shared_width(self) -> int:
        """Intermediate width of the shared-expert MLP (0 when there is none)."""
        return self.shared_expert_ffn_hidden_size or self.num_shared_experts * self.expert_ffn_hidden_size


@dataclass(frozen=True)
class MLASpec:
    """Multi-head Latent Attention (DeepSeek-V2, arXiv 2405.04434 §2.1): low-rank query and joint KV compression."""

    q_lora_rank: int
    """Rank of the query down-projection (1536 for DeepSeek-V3); 0 means a plain q projection."""
    kv_lora_rank: int
    """Rank of the compressed KV latent c_KV (512 for DeepSeek-V3); this is what the KV cache stores."""
    qk_nope_head_dim: int
    """Per-head query/key dimension without rotary embedding (128)."""
    qk_rope_head_dim: int
    """Per-head decoupled rotary dimension, shared by all heads for the key (64)."""
    v_head_dim: int
    """Per-head value dimension (128)."""


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer. Dimensions follow Hugging Face config.json names where one exists."""

    name: str
    """Catalog id or a label for a user file."""
    family: str
    """Architecture family (the config's model_type): gpt2, gpt_neox, llama, mistral, mixtral, qwen2, deepseek_v3,
    bloom, gemma, gemma2, gemma3, phi3, qwen2_moe, qwen3, qwen3_moe, olmo2, falcon, mpt, gptj, opt."""
    hidden_size: int
    """h: model width."""
    num_layers: int
    """L: transformer blocks."""
    num_heads: int
    """a: query heads."""
    num_kv_heads: int
    """Key/value heads (= num_heads for MHA; fewer for GQA; 1 for MQA)."""
    ffn_hidden_size: int
    """f: MLP intermediate width of a dense layer (4h for GPT; 11008 for Llama-2-7B)."""
    vocab_size: int
    """V: vocabulary (embedding rows), unpadded."""
    max_seq_len: int
    """Longest sequence the model was built for (learned position table size when position='learned')."""
    mlp: MlpKind = "swiglu"
    """'gelu': up/down with activation; 'swiglu': gate, up and down (Shazeer 2020)."""
    norm: NormKind = "rmsnorm"
    """'layernorm' has weight and bias; 'rmsnorm' weight only."""
    position: PositionKind = "rope"
    """'learned' adds a (max_seq_len, h) table; RoPE and ALiBi have no parameters."""
    tied_embeddings: bool = False
    """Output head shares the input embedding matrix."""
    head_dim: int = 0
    """Per-head dimension; 0 means hidden_size // num_heads."""
    qkv_bias: bool = False
    """Q, K and V projections have biases (GPT-2, NeoX, Qwen2)."""
    out_bias: bool = False
    """Attention output projection has a bias (GPT-2, NeoX)."""
    mlp_bias: bool = False
    """MLP projections have biases (GPT-2, NeoX)."""
    embedding_norm: bool = False
    """A norm right after the token embedding (BLOOM's word_embeddings_layernorm)."""
    parallel_residual: bool = False
    """Attention and MLP read the same input (GPT-NeoX, GPT-J, Falcon); does not change parameter counts."""
    block_norms: BlockNorms = "pre"
    """Norms per block: 'pre' (attention_norm, ffn_norm), 'shared' (one norm feeds both parallel branches: GPT-J,
    Falcon-7B), 'sandwich' (pre and post norm around each sublayer: Gemma 2/3), 'post' (after each sublayer: OLMo 2)."""
    norm_bias: bool = True
    """LayerNorms carry a bias (False: MPT's no_bias). RMSNorm never has one."""
    qk_norm: QKNorm = "none"
    """RMSNorm on queries and keys: 'head' (a weight of head_dim each: Qwen3, Gemma 3), 'proj' (over the whole
    projection, q_size and kv_size wide: OLMo 2), 'none'."""
    head_bias: bool = False
    """The output head has a bias (GPT-J's lm_head)."""
    position_offset: int = 0
    """Extra rows of a learned position table (OPT: 2, the table has max_seq_len + 2 rows)."""
    embedding_proj_dim: int = 0
    """Width of the token embedding when it differs from hidden_size (OPT-350m: 512, with project_in/project_out
    matrices); 0 = hidden_size."""
    final_norm: bool = True
    """A norm after the last block (False for OPT-350m, whose layer norms come after each sublayer)."""
    fused_qkv: bool = False
    """The checkpoint stores Q, K and V as one matrix (GPT-2 c_attn, NeoX/BLOOM/Falcon query_key_value, MPT Wqkv,
    Phi-3 qkv_proj): same count, but a LoRA adapter on it is one A and one B (``memory/lora.py``)."""
    fused_gate_up: bool = False
    """The checkpoint stores the gate and up projections as one matrix (Phi-3 gate_up_proj)."""
    sliding_window: int = 0
    """Sliding-window attention span (Mistral 7B v0.1: 4096; GPT-OSS: 128); caps the KV cache of the layers that use
    it; 0 = full attention."""
    full_attention_layers: int = 0
    """Layers that attend to every token although ``sliding_window`` is set: 0 when every layer slides (Mistral 7B
    v0.1); GPT-OSS and Gemma 2 alternate sliding and full layers (half of them), Gemma 3 has one full layer in six.
    The KV cache and attention cost are the layers' average (``memory.inference.held_tokens``)."""
    attention_sinks: bool = False
    """A learned logit per query head joins each softmax (GPT-OSS ``sinks``, Xiao et al. 2024, arXiv 2309.17453):
    num_heads parameters per layer, split with the heads."""
    moe: MoESpec | None = None
    """Mixture-of-Experts settings, or None for a dense model."""
    mla: MLASpec | None = None
    """Multi-head Latent Attention settings, or None for standard (GQA/MHA) attention."""
    params_reference: int = 0
    """Published exact parameter count (all tensors as the checkpoint loads), 0 if none is published."""
    checkpoint_weights: str = ""
    """Type of the block weights in the published checkpoint the serving engines load as they are: 'fp8'
    (DeepSeek-V3's block-scaled FP8), 'fp4' (GPT-OSS's MXFP4 experts), 'int4'/'int8' (AWQ or GPTQ checkpoints), ''
    for a 16-bit checkpoint. It is what ``--inference`` prices when ``--weights`` is not given; training ignores it
    (bf16 master weights)."""
    checkpoint_group_size: int = 0
    """Input features per scale group of an int4/int8 checkpoint (AWQ/GPTQ ``group_size``); 0: per output channel
    (GPTQ's group_size −1) or not grouped."""
    checkpoint_unpriced: str = ""
    """A config.json's ``quantization_config`` that shardlab does not price as it ships (its quant_method and
    settings, e.g. 'compressed-tensors', 'gptq 3 bits'); '' when none or priced. ``--inference`` then needs
    ``--weights``: pricing the file 16-bit would overstate its weights 2-4 times."""
    source: str = ""
    """Where the dimensions come from."""

    # ---- derived ------------------------------------------------------------------------------
    @property
    def head_dim_(self) -> int:
        """Per-head dimension actually used."""
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def embedding_dim(self) -> int:
        """Width of the token embedding rows (and of a tied head)."""
        return self.embedding_proj_dim or self.hidden_size

    @property
    def q_size(self) -> int:
        """Width of the query projection output (a · head_dim)."""
        return self.num_heads * self.head_dim_

    @property
    def kv_size(self) -> int:
        """Width of one of the K or V projection outputs (kv_heads · head_dim)."""
        return self.num_kv_heads * self.head_dim_

    @property
    def windowed_layer_share(self) -> float:
        """Share of the layers that attend within ``sliding_window`` (0 without a window)."""
        if not self.sliding_window:
            return 0.0
        return (self.num_layers - self.full_attention_layers) / self.num_layers

    def is_moe_layer(self, layer: int) -> bool:
        """True when block ``layer`` (0-based) has a MoE feed-forward."""
        return self.moe is not None and layer >= self.moe.first_dense_layers

    @property
    def num_moe_layers(self) -> int:
        return 0 if self.moe is None else self.num_layers - self.moe.first_dense_layers

    def with_(self, **changes) -> ModelSpec:
        return replace(self, **changes)

    def validate(self) -> ModelSpec:
        """Check every field's type and range; raise ShardlabError naming the bad field."""
        _check_fields(self, f"model '{self.name}'")
        if self.mla is None and not self.head_dim and self.hidden_size % self.num_heads:
            raise ShardlabError(
                f"model '{self.name}': hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}; set head_dim")
        if self.num_heads % self.num_kv_heads:
            raise ShardlabError(
                f"model '{self.name}': num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.mlp not in ("gelu", "swiglu"):
            raise ShardlabError(f"model '{self.name}': mlp must be 'gelu' or 'swiglu', got '{self.mlp}'")
        if self.norm not in ("layernorm", "rmsnorm"):
            raise ShardlabError(f"model '{self.name}': norm must be 'layernorm' or 'rmsnorm', got '{self.norm}'")
        if self.position not in ("learned", "rope", "alibi"):
            raise ShardlabError(f"model '{self.name}': position must be learned, rope or alibi, got '{self.position}'")
        if self.block_norms not in NORMS_PER_BLOCK:
            raise ShardlabError(f"model '{self.name}': block_norms must be one of {', '.join(NORMS_PER_BLOCK)}, got '{self.block_norms}'")
        if self.qk_norm not in ("none", "head", "proj"):
            raise ShardlabError(f"model '{self.name}': qk_norm must be none, head or proj, got '{self.qk_norm}'")
        for f in ("position_offset", "embedding_proj_dim"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 0:
                raise ShardlabError(f"model '{self.name}': {f} must be a whole number >= 0, got {getattr(self, f)!r}")
        if self.full_attention_layers and not self.sliding_window:
            raise ShardlabError(f"model '{self.name}': full_attention_layers {self.full_attention_layers} needs a "
                                f"sliding_window for the other layers; set sliding_window or drop full_attention_layers")
        if self.full_attention_layers > self.num_layers:
            raise ShardlabError(f"model '{self.name}': full_attention_layers {self.full_attention_layers} exceeds "
                                f"num_layers {self.num_layers}")
        if self.moe is not None:
            m = self.moe
            if not (0 < m.top_k <= m.num_experts):
                raise ShardlabError(f"model '{self.name}': moe top_k {m.top_k} must be in 1..num_experts ({m.num_experts})")
            if not (0 <= m.first_dense_layers < self.num_layers):
                raise ShardlabError(f"model '{self.name}': moe first_dense_layers must be below num_layers")
        from shardlab.limits import MAX_PARAMS
        from shardlab.specs.tensors import param_counts

        total = param_counts(self).total          # each dimension is capped, but their product can still be absurd
        if total > MAX_PARAMS:
            raise ShardlabError(f"model '{self.name}' has {total:.3g} parameters, above the limit of {MAX_PARAMS:.0e} "
                                f"(1,000× the largest published model); check its sizes")
        return self


def _check_fields(spec: ModelSpec, what: str) -> None:
    """Types and ranges of every field (whole numbers in range, booleans, text), MoE and MLA included."""
    from shardlab.limits import MAX_LAYERS, MAX_MODEL_DIM, MAX_PARAMS, MAX_SEQ_LEN
    from shardlab.numbers import check_number

    def whole(obj, f: str, minimum_zero: bool = False, top: float = MAX_MODEL_DIM) -> None:
        check_number(getattr(obj, f), f"{what}: {f}", integer=True, allow_min=minimum_zero, maximum=top)

    for f in ("hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size"):
        whole(spec, f)
    whole(spec, "num_layers", top=MAX_LAYERS)
    whole(spec, "max_seq_len", top=MAX_SEQ_LEN)
    whole(spec, "head_dim", minimum_zero=True)
    whole(spec, "sliding_window", minimum_zero=True, top=MAX_SEQ_LEN)
    whole(spec, "params_reference", minimum_zero=True, top=MAX_PARAMS)
    whole(spec, "full_attention_layers", minimum_zero=True, top=MAX_LAYERS)
    for f in ("tied_embeddings", "qkv_bias", "out_bias", "mlp_bias", "embedding_norm", "parallel_residual"):
        if not isinstance(getattr(spec, f), bool):
            raise ShardlabError(f"{what}: {f} must be true or false, got {getattr(spec, f)!r}")
    for f in ("name", "family", "source", "mlp", "norm", "position"):
        if not isinstance(getattr(spec, f), str):
            raise ShardlabError(f"{what}: {f} must be text, got {type(getattr(spec, f)).__name__}")
    if spec.checkpoint_weights not in CHECKPOINT_WEIGHTS:
        raise ShardlabError(f"{what}: checkpoint_weights must be one of {', '.join(repr(x) for x in CHECKPOINT_WEIGHTS)} "
                            f"('' for a 16-bit checkpoint), got {str(spec.checkpoint_weights)[:40]!r}")
    if spec.checkpoint_group_size and spec.checkpoint_weights not in ("int4", "int8"):
        raise ShardlabError(f"{what}: checkpoint_group_size applies to an int4 or int8 checkpoint; drop it or set "
                            f"checkpoint_weights")
    if spec.moe is not None:
        for f in ("num_experts", "top_k", "expert_ffn_hidden_size"):
            whole(spec.moe, f)
        whole(spec.moe, "num_shared_experts", minimum_zero=True)
        whole(spec.moe, "first_dense_layers", minimum_zero=True, top=MAX_LAYERS)
        if not isinstance(spec.moe.router_bias, bool):
            raise ShardlabError(f"{what}: moe router_bias must be true or false, got {spec.moe.router_bias!r}")
    if spec.mla is not None:
        for f in ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
            whole(spec.mla, f)
        for f in ("q_lora_rank", "qk_rope_head_dim"):
            whole(spec.mla, f, minimum_zero=True)
    # every other field by its declared type: whole numbers >= 0 up to a model dimension, booleans, text
    done = {"hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size", "num_layers", "max_seq_len",
            "head_dim", "sliding_window", "full_attention_layers", "params_reference", "num_experts", "top_k", "expert_ffn_hidden_size",
            "num_shared_experts", "first_dense_layers", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim", "q_lora_rank",
            "qk_rope_head_dim"}
    for obj in (spec, spec.moe, spec.mla):
        for fld in fields(obj) if obj is not None else ():
            v, kind = getattr(obj, fld.name), str(fld.type)
            if fld.name in done:
                continue
            if kind == "int":
                whole(obj, fld.name, minimum_zero=True)
            elif kind == "bool" and not isinstance(v, bool):
                raise ShardlabError(f"{what}: {fld.name} must be true or false, got {v!r}")
            elif kind == "str" and not isinstance(v, str):
                raise ShardlabError(f"{what}: {fld.name} must be text, got {type(v).__name__}")


# Keys accepted in a catalog or YAML model entry, mapped to the dataclass (strict checking).
MODEL_KEYS = {f.name for f in fields(ModelSpec)} - {"name"}
MOE_KEYS = {f.name for f in fields(MoESpec)}
MLA_KEYS = {f.name for f in fields(MLASpec)}


def model_from_dict(name: str, d: dict, where: str) -> ModelSpec:
    """Build a ModelSpec from a catalog/YAML mapping with strict key checking."""
    if not isinstance(d, dict):
        raise ShardlabError(f"{where}: model '{name}' must be a mapping of fields, got {type(d).__name__}")
    unknown = set(d) - MODEL_KEYS
    if unknown:
        raise ShardlabError(f"{where}: model '{name}' has unknown field(s) {sorted(unknown)}; allowed: {sorted(MODEL_KEYS)}")
    kw = dict(d)

    def require(cls, given: dict, part: str = "") -> None:
        """Name the required fields a mapping lacks, with the fix (not Python's 'missing 7 positional arguments')."""
        lack = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING
                and f.name != "name" and f.name not in given]
        if lack:
            raise ShardlabError(f"{where}: model '{name}'{part} is missing {lack}; add them (`shardlab models ID --json` "
                                f"shows a complete entry)")

    for key, cls, allowed in (("moe", MoESpec, MOE_KEYS), ("mla", MLASpec, MLA_KEYS)):
        if kw.get(key) is not None:
            sub = kw[key]
            if not isinstance(sub, dict) or set(sub) - allowed:
                raise ShardlabError(f"{where}: model '{name}' field '{key}' must be a mapping with keys from {sorted(allowed)}")
            require(cls, sub, f" field '{key}'")
            try:
                kw[key] = cls(**sub)
            except TypeError as e:
                raise ShardlabError(f"{where}: model '{name}' field '{key}': {e}") from None
    require(ModelSpec, kw)
    try:
        spec = ModelSpec(name=name, **kw)
    except TypeError as e:
        raise ShardlabError(f"{where}: model '{name}': {e}") from None
    return spec.validate()
