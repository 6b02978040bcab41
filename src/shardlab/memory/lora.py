"""LoRA and QLoRA fine-tuning memory: frozen (optionally 4-bit) base weights, trainable low-rank adapters.

LoRA (Hu et al. 2021, arXiv 2106.09685 §4.1): each adapted linear layer W (out × in) gains A (r × in) and B (out × r),
y = W·x + (α/r)·B·A·x; only A and B are trained. With mixed precision the adapters carry the usual 16 bytes per
parameter (bf16 weight and gradient, fp32 master weight, Adam m and v: ZeRO §3.1); the base has weights only,
no gradients and no optimizer state.

QLoRA (Dettmers et al. 2023, arXiv 2305.14314 §3): the frozen base linear weights are stored as 4-bit NormalFloat
(NF4) in blocks of 64 with one absmax scale per block; Double Quantization stores those scales as 8-bit values with
one fp32 second-level scale per 256 blocks: 4 + 8/64 + 32/(64·256) = 4.127 bits per weight (vs 4.5 without it).
bitsandbytes (the paper's implementation) packs two codes per byte, stores the 8-bit scales, the fp32 second-level
scales and one fp32 offset per tensor; that is what ``nf4_bytes`` counts. Every linear weight inside the blocks is
quantized (bitsandbytes replaces nn.Linear modules and keeps lm_head; embeddings and norms stay bf16; GPT-OSS's
experts and router are plain parameters in transformers, so they stay bf16 too). During
forward and backward each quantized weight is dequantized to bf16 for its GEMM, one layer at a time.

Adapter targets follow PEFT's names: q, k, v, o (attention projections), gate, up, down (the MLP; a GELU MLP has up
and down only) or ``all-linear`` (every nn.Linear of the blocks, as PEFT finds them; the QLoRA paper adapts all of
them, §4). Routed MoE experts are not adapted (PEFT targets nn.Linear modules, not stacked expert
tensors). Checkpoints that fuse Q, K and V (GPT-2, GPT-NeoX, BLOOM, Falcon, MPT, Phi-3) or gate and up (Phi-3) get one
adapter per fused matrix, as under PEFT (one A shared by the projections it holds).
Tensor parallelism splits an adapter with its base layer: for a column-parallel W, A is replicated and B is split
on its output rows; for a row-parallel W, A is split on its input columns and B is replicated (as NeMo/Megatron do).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from shardlab.errors import ShardlabError, field_name
from shardlab.memory.precision import StateBytes
from shardlab.memory.states import StateReport, expert_shard_dim, fsdp_shard_numel, state_report
from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import TensorSpec, is_matmul_weight

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
QUANTIZATIONS = ("none", "nf4")
FROZEN = StateBytes(weights=2, gradients=0, master=0, moments=0, compute_dtype="bf16")
"""A frozen bf16 base: weights only."""


@dataclass(frozen=True)
class LoraSpec:
    """A LoRA / QLoRA fine-tuning recipe."""

    rank: int
    """r: inner dimension of the adapters."""
    targets: tuple[str, ...] = ("all-linear",)
    """Adapted layers: names from TARGETS, or 'all-linear'."""
    quantize_base: str = "none"
    """'nf4' stores the frozen base linear weights in 4-bit NormalFloat (QLoRA); 'none' keeps them bf16."""
    double_quant: bool = True
    """QLoRA Double Quantization of the block scales (8-bit scales + fp32 per 256 blocks)."""
    block_size: int = 64
    """Weights per first-level quantization block (QLoRA: 64)."""
    block_size2: int = 256
    """First-level scales per second-level block (QLoRA: 256)."""


def check_lora(lora: LoraSpec) -> LoraSpec:
    if not isinstance(lora.rank, int) or lora.rank < 1:
        raise ShardlabError(f"{field_name('recipe.lora_rank')} must be a positive integer, got {lora.rank!r}")
    bad = [t for t in lora.targets if t not in TARGETS + ("all-linear",)]
    if bad or not lora.targets:
        raise ShardlabError(f"{field_name('recipe.lora_targets')}: unknown {', '.join(bad) or '(empty)'}; use a comma "
                            f"list of {', '.join(TARGETS)} "
                            f"or all-linear")
    if lora.quantize_base not in QUANTIZATIONS:
        raise ShardlabError(f"{field_name('recipe.quantize_base')} must be nf4 or none, got '{lora.quantize_base}'")
    return lora


def _basename(t: TensorSpec) -> str:
    """'layers.3.attention.wq.weight' -> 'wq'; 'layers.0.moe.shared.w1.weight' -> 'w1'."""
    return t.name.split(".")[-2]


def _target_names(spec: ModelSpec, targets: tuple[str, ...]) -> set[str] | None:
    """shardlab tensor basenames for the PEFT-style targets (None = all linear layers of the blocks)."""
    if "all-linear" in targets:
        return None
    mlp = {"gate": "w1", "up": "w3", "down": "w2"} if spec.mlp == "swiglu" else {"up": "w1", "down": "w2"}
    attn = {"q": ("wq", "wq_b") if spec.mla else ("wq",), "k": ("wkv_b",) if spec.mla else ("wk",),
            "v": ("wkv_b",) if spec.mla else ("wv",), "o": ("wo",)}
    out: set[str] = set()
    for t in targets:
        out.update(attn.get(t, ()) or ((mlp[t],) if t in mlp else ()))
    return out


PARAMETER_EXPERT_FAMILIES = ("gpt_oss",)
"""Families whose transformers modules hold the routed experts and the router as nn.Parameter, not nn.Linear
(GptOssExperts, GptOssTopKRouter): bitsandbytes does not replace them, so QLoRA leaves them 16-bit."""


def is_block_linear(t: TensorSpec, spec: ModelSpec) -> bool:
    """A linear weight inside the blocks (what bitsandbytes quantizes): routers and stacked experts included, except
    where the model holds them as plain parameters (``PARAMETER_EXPERT_FAMILIES``)."""
    if spec.family in PARAMETER_EXPERT_FAMILIES and t.component in ("experts", "router"):
        return False
    return 0 <= t.layer < spec.num_layers and is_matmul_weight(t)


def is_target(t: TensorSpec, spec: ModelSpec, lora: LoraSpec) -> bool:
    """An adapted weight: a 2-D linear weight of the blocks named by the targets ('all-linear', as in PEFT, takes every
    nn.Linear of the blocks: shared-expert gates too, but not MoE routers or stacked routed experts, which transformers
    does not build as nn.Linear)."""
    if not is_block_linear(t, spec) or t.ep_dim is not None or t.component == "router":
        return False
    names = _target_names(spec, lora.targets)
    return names is None or _basename(t) in names


FUSED = {"qkv": ("wq", "wk", "wv"), "gate_up": ("w1", "w3")}
"""shardlab's separate projections that a fused checkpoint matrix holds (``ModelSpec.fused_qkv`` / ``fused_gate_up``)."""


@lru_cache(maxsize=64)
def adapter_tensors(spec: ModelSpec, lora: LoraSpec, tensors: tuple[TensorSpec, ...]) -> tuple[TensorSpec, ...]:
    """A (r, in) and B (out, r) for every targeted weight among ``tensors``, split by TP like their base layer.

    A fused checkpoint matrix (Q·K·V, gate·up) gets one adapter, as PEFT attaches it to the module that exists:
    A (r, in) shared, B (sum of the outputs, r)."""
    r, out = lora.rank, []
    groups: dict[tuple, list[TensorSpec]] = {}
    fused = {n: g for g, names in FUSED.items() for n in names
             if (g == "qkv" and spec.fused_qkv) or (g == "gate_up" and spec.fused_gate_up)}
    for t in tensors:
        if is_target(t, spec, lora) or (_basename(t) in fused and _fused_targeted(t, spec, lora)):
            key = (t.layer, t.name.rsplit(".", 2)[0], fused.get(_basename(t), t.name))
            groups.setdefault(key, []).append(t)
    # a rank above min(in, out) of every adapted weight adds parameters but no rank (PEFT still builds it, and a
    # 1-row gate such as a shared-expert gate gets r = 8 as usual: only a rank past all of them is refused)
    widest = max(min(sum(m.shape[0] for m in g), g[0].shape[1]) for g in groups.values()) if groups else None
    if widest and r > widest:
        raise ShardlabError(f"{field_name('recipe.lora_rank')} {r:,} is above the rank of every adapted weight "
                            "(min(in, out) is at most "
                            f"{widest:,}): it adds parameters but no rank; use at most {widest:,}")
    for members in groups.values():
        t = members[0]
        n_out, n_in = sum(m.shape[0] for m in members), t.shape[1]
        stem = t.name[: -len(".weight")] if len(members) == 1 else f"{t.name.rsplit('.', 2)[0]}.{fused[_basename(t)]}"
        col, row = t.tp_dim == 0, t.tp_dim == 1
        out.append(TensorSpec(f"{stem}.lora_A.weight", (r, n_in), t.layer, "lora", 1 if row else None))
        out.append(TensorSpec(f"{stem}.lora_B.weight", (n_out, r), t.layer, "lora", 0 if col else None,
                              kv=t.kv and col and len(members) == 1))
    return tuple(out)


def _fused_targeted(t: TensorSpec, spec: ModelSpec, lora: LoraSpec) -> bool:
    """A fused matrix is adapted when any projection it holds is targeted."""
    if not is_block_linear(t, spec) or t.ep_dim is not None:
        return False
    names = _target_names(spec, lora.targets)
    group = next(g for g in FUSED.values() if _basename(t) in g)
    return names is None or any(n in names for n in group)


def nf4_bytes(numel: int, lora: LoraSpec) -> int:
    """Bytes of one NF4-quantized tensor (bitsandbytes layout): packed 4-bit codes, block scales (8-bit with double
    quantization plus fp32 second-level scales and one fp32 offset; fp32 without)."""
    if numel == 0:
        return 0
    blocks = -(-numel // lora.block_size)
    codes = -(-numel // 2)
    if not lora.double_quant:
        return codes + 4 * blocks
    return codes + blocks + 4 * -(-blocks // lora.block_size2) + 4


def nf4_bits_per_weight(lora: LoraSpec) -> float:
    """The QLoRA paper's per-weight storage: 4 + 8/64 + 32/(64·256) bits (4 + 32/64 without double quantization)."""
    if not lora.double_quant:
        return 4 + 32 / lora.block_size
    return 4 + 8 / lora.block_size + 32 / (lora.block_size * lora.block_size2)


def _stored_numel(t: TensorSpec, spec: ModelSpec, layout) -> int:
    """Elements of ``t`` this rank stores: its TP/EP chunk, and under ZeRO-3 its FSDP2 shard."""
    shape = t.local_shape(spec, layout.tp, layout.ep, None, layout.etp)
    if layout.zero < 3:
        return math.prod(shape)
    if t.ep_dim is not None:
        return fsdp_shard_numel(shape, layout.expert_dp, dim=expert_shard_dim(shape, layout.expert_dp))
    return fsdp_shard_numel(shape, layout.dp_shard)


def base_weight_bytes(tensors, spec: ModelSpec, layout, lora: LoraSpec) -> dict[str, int]:
    """Frozen base weights on this rank: {'quantized': NF4 bytes of the block linears, 'bf16': the rest}."""
    quant = plain = 0
    for t in tensors:
        n = _stored_numel(t, spec, layout)
        if lora.quantize_base == "nf4" and is_block_linear(t, spec):
            quant += nf4_bytes(n, lora)
        else:
            plain += 2 * n
    return {"quantized": quant, "bf16": plain}


def lora_state_report(tensors: tuple[TensorSpec, ...], spec: ModelSpec, layout, sb: StateBytes,
                      lora: LoraSpec) -> tuple[StateReport, dict]:
    """Model states of one rank under LoRA/QLoRA, and the parts: frozen base (weights only) + adapters (full states)."""
    base = state_report(tensors, spec, layout, FROZEN)
    ad = state_report(adapter_tensors(spec, lora, tuple(tensors)), spec, layout, sb)
    bw = base_weight_bytes(tensors, spec, layout, lora)
    rep = StateReport(params_local=base.params_local + ad.params_local, params_stored=base.params_stored + ad.params_stored,
                      expert_params_local=base.expert_params_local, weights=bw["quantized"] + bw["bf16"] + ad.weights,
                      gradients=ad.gradients, master=ad.master, moments=ad.moments)
    parts = {"base_quantized_bytes": bw["quantized"], "base_bf16_bytes": bw["bf16"], "adapter_params_local": ad.params_local,
             "adapter_weight_bytes": ad.weights}
    return rep, parts


def adapter_param_count(spec: ModelSpec, lora: LoraSpec) -> int:
    """Trainable parameters of the whole model (what PEFT's print_trainable_parameters reports)."""
    from shardlab.specs.tensors import model_tensors

    return sum(t.numel for t in adapter_tensors(spec, lora, model_tensors(spec)))


def lora_activation_bytes(spec: ModelSpec, layer: int, layout, ctx, lora: LoraSpec) -> float:
    """Extra activations of one block per micro-batch: each adapter saves A's output (B's input), r wide per token.
    The adapter's input x is the base layer's input, already counted (PEFT with lora_dropout = 0)."""
    from shardlab.specs.tensors import model_tensors

    n = sum(1 for t in model_tensors(spec) if t.layer == layer and is_target(t, spec, lora))
    tokens = ctx.seq_len / layout.cp * layout.micro_batch
    return n * ctx.elem_bytes * tokens * lora.rank


def dequant_buffer_bytes(tensors, spec: ModelSpec, layout, lora: LoraSpec) -> int:
    """Transient bf16 copy of the largest quantized weight while its GEMM runs (bitsandbytes dequantizes per layer)."""
    if lora.quantize_base != "nf4":
        return 0
    one = lambda t: math.prod(t.local_shape(spec, layout.tp, layout.ep, None, layout.etp)[-2:])  # one expert's matrix of a stack
    return 2 * max((one(t) for t in tensors if is_block_linear(t, spec)), default=0)
