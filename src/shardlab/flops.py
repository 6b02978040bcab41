"""FLOPs of a decoder-only transformer: per layer, per token, per step; model vs hardware FLOPs.

Convention (Narayanan et al. 2021, arXiv 2104.04473, §5.1 and Eq. 3; Korthikanti et al. 2022, Eq. 7):
2 FLOPs per multiply-add; attention scores counted for the full s×s matrix (no causal halving, as in
those papers); backward = 2 × forward. For a GPT block of width h (MLP 4h) this gives, per layer and
sequence, forward 24·s·h² + 4·s²·h, and for a step of B sequences
    model FLOPs (no recomputation, Korthikanti Eq. 7)  = 72·B·s·L·h²·(1 + s/(6h) + V/(12·L·h))
    with full recomputation (Narayanan Eq. 3)          = 96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)).
MFU divides model FLOP/s by the peak; HFU also counts the recomputed FLOPs (Korthikanti §6.3).
For other blocks the same rule is applied to the real matrices: 2 × tokens × (weights of every linear
layer a token passes through: GQA's narrower K/V, SwiGLU's three matrices, MoE's router + top-k routed +
shared experts, MLA's low-rank projections) + attention 2·s·a·(d_qk + d_v) per token.

Functions accept numpy arrays for seq_len so the planner can evaluate many layouts at once.
"""

from __future__ import annotations

from functools import lru_cache

from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import layer_matmuls, recompute_module


@lru_cache(maxsize=256)
def linear_params_per_layer(spec: ModelSpec) -> tuple[int, ...]:
    """Weights of linear layers a token passes through in each block (biases and norms excluded;
    MoE: router + top_k of the routed experts + shared experts)."""
    out = [0] * spec.num_layers
    for layer in range(spec.num_layers):
        for t in layer_matmuls(spec, layer):
            # stacked routed experts: a token visits top_k of num_experts
            out[layer] += t.numel * spec.moe.top_k // spec.moe.num_experts if t.ep_dim is not None else t.numel
    return tuple(out)


def attention_dims(spec: ModelSpec) -> tuple[int, int]:
    """(a·d_qk, a·d_v): widths of the query/key and value heads summed over heads."""
    if spec.mla is not None:
        m = spec.mla
        return spec.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim), spec.num_heads * m.v_head_dim
    return spec.q_size, spec.q_size


def forward_flops_per_token(spec: ModelSpec, seq_len) -> dict:
    """Forward FLOPs per token, by part: 'linear' (all blocks), 'attention' (scores and context, all
    blocks), 'logits' (output head). Array-safe in seq_len."""
    qk, v = attention_dims(spec)
    return {
        "linear": 2 * sum(linear_params_per_layer(spec)),
        "attention": 2 * seq_len * (qk + v) * spec.num_layers,
        "logits": 2 * spec.hidden_size * spec.vocab_size,
    }


@lru_cache(maxsize=256)
def op_recomputed_linear_params(spec: ModelSpec) -> int:
    """Matmul weights per token that per-op selective checkpointing re-runs (every other matmul in forward order,
    torchtitan's policy: the 2nd, 4th, ... are recomputed); routed experts count top_k of num_experts."""
    n = 0
    for layer in range(spec.num_layers):
        for i, t in enumerate(layer_matmuls(spec, layer)):
            if i % 2 == 1:
                n += t.numel * spec.moe.top_k // spec.moe.num_experts if t.ep_dim is not None else t.numel
    return n


def training_flops_per_token(spec: ModelSpec, seq_len, recompute: str = "none", fraction: float = 1.0,
                             modules: tuple[str, ...] | None = None) -> tuple:
    """(model FLOPs, hardware FLOPs) per token of a training step.

    model = 3 × forward (Korthikanti Eq. 7 convention); hardware adds the recomputed forward of the
    blocks under full recomputation (Narayanan Eq. 3 counts this; logits are not recomputed), of the
    selective ``modules`` (None: the attention core, Korthikanti §5; Megatron-core's modules re-run their matmuls,
    ``module_linear_params``), or of every other matmul under per-op checkpointing ('op'); ``fraction`` of the
    blocks are checkpointed.
    """
    f = forward_flops_per_token(spec, seq_len)
    model = 3 * (f["linear"] + f["attention"] + f["logits"])
    mods = modules or ("core_attn",)
    selective = ("core_attn" in mods) * f["attention"] + 2 * sum(module_linear_params(spec).get(m, 0) for m in mods)
    extra = {"none": 0, "selective": selective, "full": f["linear"] + f["attention"],
             "op": 2 * op_recomputed_linear_params(spec)}[recompute]
    return model, model + fraction * extra


@lru_cache(maxsize=256)
def module_linear_params(spec: ModelSpec) -> dict:
    """Matmul weights per token each Megatron-core recompute module re-runs (``layout.RECOMPUTE_MODULES``), all
    blocks; routed experts count top_k of num_experts."""
    out: dict = {}
    for layer in range(spec.num_layers):
        for t in layer_matmuls(spec, layer):
            mod = recompute_module(t)
            n = t.numel * spec.moe.top_k // spec.moe.num_experts if t.ep_dim is not None else t.numel
            for m in ((mod, "moe") if mod == "shared_experts" else (mod,)) if mod else ():
                out[m] = out.get(m, 0) + n
    return out


def narayanan_eq3(B: int, s: int, L: int, h: int, V: int) -> float:
    """Narayanan et al. 2021 Eq. 3: FLOPs per iteration with full recomputation, GPT block (4h MLP)."""
    return 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))


def korthikanti_eq7(B: int, s: int, L: int, h: int, V: int) -> float:
    """Korthikanti et al. 2022 Eq. 7: model FLOPs per iteration (no recomputation), GPT block."""
    return 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))


def six_psi_d(params: int, tokens: float) -> float:
    """The rule of thumb C ≈ 6ΨD (Kaplan et al. 2020): training compute for D tokens."""
    return 6.0 * params * tokens
