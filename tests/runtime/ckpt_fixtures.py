"""Tiny Hugging Face checkpoints built by transformers itself (``from_config`` + ``save_pretrained``), one per family
the runtime loads: the weights are random (seeded), the tensor names, layouts and numerics are transformers' own."""

from __future__ import annotations

from pathlib import Path

COMMON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
              vocab_size=1001, max_position_embeddings=256)
"""Shapes chosen to be awkward: a vocabulary (1,001) no TP degree divides, GQA with 2 KV heads."""
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)


def configs():
    import transformers as T

    return {
        "llama": T.LlamaConfig(**COMMON, rope_theta=500000.0,
                               rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
        "mistral": T.MistralConfig(**COMMON),
        "qwen2": T.Qwen2Config(**COMMON, tie_word_embeddings=True),
        "qwen3": T.Qwen3Config(**COMMON, head_dim=16),
        "phi3": T.Phi3Config(**COMMON, pad_token_id=0, partial_rotary_factor=0.5),
        "gpt2": T.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=50257, n_positions=256),
        "gpt_neox": T.GPTNeoXConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
                                    vocab_size=1001, max_position_embeddings=256),
        "mixtral": T.MixtralConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2),
        "qwen2_moe": T.Qwen2MoeConfig(**COMMON, **MOE, shared_expert_intermediate_size=48),
        "qwen3_moe": T.Qwen3MoeConfig(**COMMON, **MOE, norm_topk_prob=True),
    }


def build(family: str, folder: Path, dtype=None, max_shard_size: str | None = None, seed: int = 0) -> Path:
    """Save the ``family`` checkpoint into ``folder`` (created), with transformers' random init at ``seed``."""
    import torch
    import transformers as T

    T.logging.set_verbosity_error()
    torch.manual_seed(seed)
    model = T.AutoModelForCausalLM.from_config(configs()[family])
    with torch.no_grad():   # norms start at 1 and biases at 0 in transformers: perturb them so a mix-up shows
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn(p.shape) * 0.1)
    if dtype is not None:
        model = model.to(dtype)
    kw = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, **kw)
    return folder
