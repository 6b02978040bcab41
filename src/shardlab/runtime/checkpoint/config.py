"""A checkpoint folder and what its ``config.json`` says beyond the shapes: ``Numerics`` as transformers reads them.

Families loaded (their transformers modeling files name the tensors ``runtime.checkpoint.names`` maps): llama,
mistral, qwen2, qwen3 (q/k norms), phi3 (fused qkv and gate/up), gpt2 (Conv1D, fused c_attn), gpt_neox (per-head
interleaved query_key_value, partial rotary), and the mixtures of experts mixtral, qwen2_moe (gated shared expert)
and qwen3_moe. Others are refused by name: the runtime GPT does not compute them as transformers does (Gemma's
scaled embeddings and (1 + w) norms, OLMo 2's post-norms, Falcon's and GPT-J's layouts, ALiBi, MLA).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from shardlab.errors import ShardlabError
from shardlab.runtime.numerics import Numerics, RopeScaling

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gpt2", "gpt_neox", "mixtral", "qwen2_moe", "qwen3_moe")
"""model_type values whose checkpoints the runtime loads."""
WEIGHT_FILES = ("model.safetensors.index.json", "model.safetensors")
"""What a folder must hold (a sharded checkpoint's index, or one file)."""
MAX_CONFIG_BYTES = 4 << 20
"""A config.json larger than this is refused (published ones are a few KiB)."""


def is_checkpoint(ref: str) -> bool:
    """True for ``hf:ORG/NAME`` and for a folder holding a config.json and safetensors weights."""
    if ref.startswith("hf:"):
        return True
    p = Path(ref)
    try:
        return p.is_dir() and (p / "config.json").is_file() and any((p / f).is_file() for f in WEIGHT_FILES)
    except OSError:
        return False


def checkpoint_dir(ref: str) -> Path:
    """The local folder of a checkpoint: ``ref`` itself, or the hub snapshot of ``hf:ORG/NAME[@rev]`` (config, weights
    and tokenizer files only; needs the hub extra)."""
    if not ref.startswith("hf:"):
        p = Path(ref)
        if not p.is_dir():
            raise ShardlabError(f"checkpoint {ref} is not a folder; give a folder with config.json and model.safetensors "
                                f"(or model.safetensors.index.json), or hf:ORG/NAME")
        if not (p / "config.json").is_file():
            raise ShardlabError(f"checkpoint {ref} has no config.json; save the model with save_pretrained()")
        if not any((p / f).is_file() for f in WEIGHT_FILES):
            raise ShardlabError(f"checkpoint {ref} has no model.safetensors or model.safetensors.index.json; save it with "
                                f"save_pretrained(safe_serialization=True) (pickled .bin weights are not read)")
        return p
    from shardlab.catalog.hub import _offline, cache_dir, fetch_config, parse_ref

    fetch_config(ref)       # the config first: its errors (gated, missing, offline and not cached) are the catalog's
    repo, rev = parse_ref(ref)
    from huggingface_hub import snapshot_download

    try:
        # model*.safetensors: the transformers weights only (repositories may also hold consolidated.safetensors)
        folder = Path(snapshot_download(repo, revision=rev, cache_dir=cache_dir(), local_files_only=_offline(),
                                        token=os.environ.get("HF_TOKEN") or None,
                                        allow_patterns=["*.json", "model*.safetensors", "tokenizer*"]))
    except Exception as e:  # network, authentication, an incomplete cache: one line
        raise ShardlabError(f"{ref}: could not fetch the checkpoint's weights ({type(e).__name__}); check the network or "
                            f"HF_TOKEN (offline: the weights must be in the cache), or download it and pass the folder") from None
    if not any((folder / f).is_file() for f in WEIGHT_FILES):
        raise ShardlabError(f"{ref}: the cache holds its config.json but not its safetensors weights (offline, or a "
                            f"repository without model*.safetensors); fetch them with a connection, or pass a folder")
    return folder


def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ShardlabError(f"{path} is larger than {MAX_CONFIG_BYTES >> 20} MiB; it is not a model config")
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise ShardlabError(f"{path} is not valid JSON ({type(e).__name__}); fix or re-save the checkpoint") from None
    if not isinstance(d, dict):
        raise ShardlabError(f"{path} must hold a JSON object")
    return d


def family_of(config: dict, where: str) -> str:
    from shardlab.specs.hf import model_type

    mt = model_type(config, where)
    if mt not in FAMILIES:
        raise ShardlabError(f"{where}: the runtime loads {', '.join(FAMILIES)} checkpoints, not {mt} (its layers are not "
                            f"computed as transformers does); use it in the analytic commands, or a supported family")
    return mt


def _number(d: dict, key: str, default: float, where: str) -> float:
    v = d.get(key, default)
    v = default if v is None else v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ShardlabError(f"{where}: '{key}' must be a positive number, got {v!r}; fix the config")
    return float(v)


def _rope_scaling(d: dict, where: str, max_positions: int) -> RopeScaling | None:
    rs = d.get("rope_scaling")
    if rs is None:
        return None
    if not isinstance(rs, dict):
        raise ShardlabError(f"{where}: rope_scaling must be an object or null")
    kind = rs.get("rope_type", rs.get("type"))
    if kind in (None, "default"):
        return None
    if kind == "linear":
        return RopeScaling("linear", _number(rs, "factor", 1.0, where))
    if kind == "llama3":
        return RopeScaling("llama3", _number(rs, "factor", 8.0, where), _number(rs, "low_freq_factor", 1.0, where),
                           _number(rs, "high_freq_factor", 4.0, where),
                           int(_number(rs, "original_max_position_embeddings", max_positions, where)))
    raise ShardlabError(f"{where}: rope_scaling type {kind!r} is not computed by the runtime (linear and llama3 are); "
                        f"use a checkpoint without it")


def numerics_from_config(config: dict, family: str, where: str, vocab_size: int = 0) -> Numerics:
    """The ``Numerics`` transformers uses for this config (its *Config defaults where a field is absent)."""
    if family == "gpt2":
        eps = _number(config, "layer_norm_epsilon", 1e-5, where)
        act = config.get("activation_function", "gelu_new")
    elif family == "gpt_neox":
        eps = _number(config, "layer_norm_eps", 1e-5, where)
        act = config.get("hidden_act", "gelu")
    else:
        eps = _number(config, "rms_norm_eps", 1e-5 if family in ("phi3", "mixtral") else 1e-6, where)
        act = config.get("hidden_act", "silu")
    acts = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
            "gelu_fast": "gelu_tanh"}
    if not isinstance(act, str) or act not in acts:
        raise ShardlabError(f"{where}: activation {str(act)[:40]!r} is not computed by the runtime ({', '.join(acts)} are)")
    if family == "gpt_neox":
        theta = _number(config, "rotary_emb_base", _number(config, "rope_theta", 10000.0, where), where)
        rotary = _number(config, "rotary_pct", _number(config, "partial_rotary_factor", 0.25, where), where)
    else:
        theta = _number(config, "rope_theta", 1e6 if family == "mixtral" else 10000.0, where)
        rotary = _number(config, "partial_rotary_factor", 1.0, where)
    if rotary > 1:
        raise ShardlabError(f"{where}: the rotary fraction must be at most 1, got {rotary}")
    if family in ("qwen2_moe", "qwen3_moe"):
        renorm = config.get("norm_topk_prob", False)
    else:
        renorm = True   # Mixtral renormalises the top-k weights (MixtralSparseMoeBlock)
    if not isinstance(renorm, bool):
        raise ShardlabError(f"{where}: 'norm_topk_prob' must be true or false, got {renorm!r}")
    max_pos = int(_number(config, "max_position_embeddings", 2048, where)) if family != "gpt2" else 1024
    return Numerics(rope_theta=theta, rotary_fraction=rotary, rope_scaling=_rope_scaling(config, where, max_pos),
                    norm_eps=eps, activation=acts[act], moe_renormalize=renorm, vocab_size=vocab_size)


def tokenizer_present(folder: Path) -> bool:
    return any(os.path.exists(folder / f) for f in ("tokenizer.json", "tokenizer.model", "vocab.json"))


class CheckpointSource:
    """A checkpoint folder with its config read: family, ModelSpec (the checkpoint's vocabulary), Numerics."""

    def __init__(self, ref: str):
        from shardlab.specs.hf import from_hf_config

        self.ref = ref
        self.folder = checkpoint_dir(ref)
        where = str(self.folder / "config.json")
        self.config = read_config(self.folder)
        self.family = family_of(self.config, where)
        name = ref if ref.startswith("hf:") else (self.folder.resolve().name or "checkpoint")
        self.spec = from_hf_config(self.config, name=name, where=where)
        self.where = where

    def numerics(self, padded_from: int = 0) -> Numerics:
        """Numerics of this config; ``padded_from``: the vocabulary the logits are cut to (when padded for TP)."""
        return numerics_from_config(self.config, self.family, self.where, padded_from)

    def open(self):
        from shardlab.runtime.checkpoint.reader import Checkpoint

        return Checkpoint(self.folder)

    def check(self) -> list[str]:
        """Refuse a checkpoint whose tensors do not match the config (first mismatch named); the unused tensors."""
        from shardlab.runtime.checkpoint.load import check_checkpoint

        self.numerics()   # refuses an activation or a RoPE scaling the runtime does not compute
        return check_checkpoint(self.spec, self.family, self.open())
