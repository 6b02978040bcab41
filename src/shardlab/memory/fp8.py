"""FP8 training memory beyond the bf16-mixed model states (``--precision fp8-mixed``).

Recipe modelled: NVIDIA Transformer Engine's (TE) FP8 linear layers with delayed scaling, as Megatron-LM and NeMo
use them, following Micikevicius et al. 2022, "FP8 Formats for Deep Learning" (arXiv 2209.05433): E4M3 for weights
and activations in the forward pass, E5M2 for gradients, one scaling factor per tensor derived from a history of
absolute maxima (§3-4). Weights and gradients keep their bf16-mixed bytes (fp32 master and moments); what FP8 adds:

- FP8 weight copies: TE casts each linear weight to FP8 once per optimizer step (on the first micro-batch) and keeps
  the copy for the other micro-batches; on Hopper it keeps the transposed copy too (the backward's data-gradient GEMM
  needs Wᵀ, and FP8 tensor cores take only the "TN" layout): 2 bytes per GEMM weight element (TE docs, "FP8 weight
  caching", ``is_first_microbatch``). Under ZeRO-3/FSDP the copy is made per all-gathered unit and freed with it
  (counted in the FSDP buffers); with FP8 all-gather (torchtitan ``enable_fsdp_float8_all_gather``) the weights are
  cast before the all-gather and the gathered unit is FP8 (1 byte + 1 for its transpose instead of 2 + 2).
- Scaling state: per FP8 GEMM, TE's ``fp8_meta`` holds 3 forward tensors (input, weight, output) and 2 backward
  tensors (output gradient, input gradient), each with an fp32 amax history of ``amax_history_len`` entries, a
  scale and an inverse scale (TE ``DelayedScaling``, default history 1024; Megatron-LM ``--fp8-amax-history-len``).
- Activations: the linear layers save their FP8 input for the weight-gradient GEMM (1 byte instead of 2); norm
  inputs, Q/K/V (the attention core runs in bf16), the activation function's inputs and the fp32 log-sum-exp stay
  as they are (``memory/activations.py`` with ``ActivationContext.linear_input_bytes = 1``).
Embedding, output head and MoE routers stay in bf16 (they are not TE linear layers in Megatron-LM), and so does any
GEMM whose dimensions are not multiples of 16 (FP8 tensor cores require it; TE refuses such shapes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import TensorSpec, is_matmul_weight

FP8_TENSORS_PER_GEMM = 5
"""Scaled FP8 tensors per GEMM in TE: forward input, weight, output; backward output gradient, input gradient."""
FP8_COPIES_BYTES = 2
"""Bytes per weight element of TE's cached FP8 copies on Hopper: the weight and its transpose, 1 byte each."""
ALIGN = 16
"""FP8 GEMM dimensions must be multiples of 16 (cuBLASLt FP8 requirement, enforced by TE)."""


@dataclass(frozen=True)
class Fp8Recipe:
    """Choices of an FP8 training recipe that change memory and time."""

    amax_history_len: int = 1024
    """Entries of the per-tensor amax history (TE DelayedScaling default 1024; Megatron-LM default 1)."""
    weight_cache: bool = True
    """Keep the FP8 weight copies across micro-batches (TE); False casts every micro-batch (torchao dynamic scaling)."""
    all_gather: bool = False
    """ZeRO-3/FSDP all-gathers FP8 weights instead of bf16 (torchtitan enable_fsdp_float8_all_gather)."""
    primary_weights: bool = False
    """The FP8 GEMM weights exist only in FP8, the fp32 master in the optimizer (Megatron-Core ``--fp8-param-gather``,
    Transformer Engine ``fp8_model_init``): no bf16 copy beside the FP8 weight and its transpose, and the
    distributed optimizer / FSDP gathers them in FP8 (``primary_weight_saving``)."""


def is_fp8_gemm(t: TensorSpec, spec: ModelSpec) -> bool:
    """True for a block's linear weight that runs as an FP8 GEMM (not routers, embedding, head, norms, biases)."""
    return (0 <= t.layer < spec.num_layers and is_matmul_weight(t)
            and t.component != "router" and t.shape[-1] % ALIGN == 0 and t.shape[-2] % ALIGN == 0)


def fp8_gemms(tensors, spec: ModelSpec, ep: int = 1) -> int:
    """FP8 GEMMs (each with its own scaling state) among ``tensors``: one per linear weight, E/ep per stacked expert tensor."""
    n = 0
    for t in tensors:
        if is_fp8_gemm(t, spec):
            n += -(-t.shape[0] // ep) if t.ep_dim is not None else 1
    return n


def scaling_state_bytes(n_gemms: int, recipe: Fp8Recipe) -> int:
    """fp32 amax history + scale + inverse scale for the 5 scaled tensors of each GEMM."""
    return n_gemms * FP8_TENSORS_PER_GEMM * (recipe.amax_history_len + 2) * 4


def primary_weight_saving(fp8_local_numel, fp8_shard_numel, zero, weight_bytes: int):
    """Bytes FP8 primary weights save on a rank (array-safe): without ZeRO-3 the bf16 weights of the FP8 GEMMs
    (``weight_bytes`` each; the cached FP8 copy and its transpose become the weights), under ZeRO-3 the shard's
    ``weight_bytes`` − 1 per element (stored in FP8; the gathered copies live and die with their unit)."""
    return np.where(np.asarray(zero) >= 3, (weight_bytes - 1) * np.asarray(fp8_shard_numel, dtype=float),
                    weight_bytes * np.asarray(fp8_local_numel, dtype=float))


def fp8_extra_bytes(tensors, spec: ModelSpec, layout, recipe: Fp8Recipe) -> dict[str, int]:
    """{'fp8_weight_cache', 'fp8_scaling_state'} bytes on one rank holding ``tensors`` (after TP/EP splits).

    The weight cache is persistent only without ZeRO-3 (with it, the copies live and die with each gathered unit)."""
    cache = 0
    if recipe.weight_cache and layout.zero < 3:
        cache = FP8_COPIES_BYTES * sum(t.local_numel(spec, layout.tp, layout.ep, None, layout.etp) for t in tensors
                                     if is_fp8_gemm(t, spec))
    return {"fp8_weight_cache": int(cache), "fp8_scaling_state": scaling_state_bytes(fp8_gemms(tensors, spec, layout.ep), recipe)}


def fsdp_unit_weight_bytes(recipe: Fp8Recipe) -> int:
    """Bytes per element of an all-gathered ZeRO-3 unit's weights under FP8: bf16 gather + FP8 copy and transpose
    (2 + 2), or an FP8 gather + transpose (1 + 1) with FP8 all-gather."""
    return 2 if recipe.all_gather else 2 + FP8_COPIES_BYTES
