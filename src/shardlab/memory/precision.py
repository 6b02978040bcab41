"""Bytes per parameter for weights, gradients and optimizer state under each precision and optimizer.

Mixed precision with Adam (ZeRO paper, Rajbhandari et al. 2019, arXiv 1910.02054 §3.1): 2 bytes of
fp16/bf16 weights + 2 of gradients + K = 12 bytes of optimizer state (fp32 master weights 4, momentum 4,
variance 4) = 16 bytes per parameter.

FP8 mixed precision (``fp8-mixed``, Transformer Engine style; Micikevicius et al. 2022, "FP8 Formats for Deep
Learning", arXiv 2209.05433 §4): the model states are those of bf16-mixed (bf16 working weights and gradients,
fp32 master weights and moments); the GEMMs of the linear layers run in FP8 (E4M3 forward, E5M2 gradients), so the
extra state is the FP8 copies of those weights and their per-tensor scaling factors (``memory/fp8.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.errors import ShardlabError, field_name

PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed", "bf16", "fp8-mixed")
OPTIMIZERS = ("adamw", "sgd", "adam-8bit")


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of each model-state category."""

    weights: int
    """Weights in the compute dtype (fp32: 4, bf16/fp16: 2)."""
    gradients: int
    """Gradients as accumulated (same dtype as the weights)."""
    master: int
    """fp32 master copy of the weights kept by the optimizer under mixed precision (4), else 0."""
    moments: float
    """Optimizer moments: AdamW 2 × 4 bytes (fp32) or 2 × 2 (pure bf16); SGD momentum 1 × 4 (or 2); 8-bit Adam 2 × 1
    (bitsandbytes; its per-block absmax adds about 0.2%, not counted)."""
    compute_dtype: str
    """dtype whose peak FLOP/s applies (fp32, bf16, fp16), and in which activations are kept."""
    gemm_dtype: str = ""
    """dtype of the linear layers' GEMMs when it differs from compute_dtype ('fp8' under fp8-mixed), else ''."""

    @property
    def optimizer(self) -> float:
        """Everything the optimizer holds: master weights + moments (the ZeRO paper's K)."""
        return self.master + self.moments

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


def state_bytes(precision: str, optimizer: str, grad_bytes: int = 0) -> StateBytes:
    """Bytes per parameter for ``precision`` (fp32, bf16-mixed, fp16-mixed, bf16, fp8-mixed) and ``optimizer``
    (adamw, sgd, adam-8bit); ``grad_bytes`` (not 0) holds the gradients in another dtype: Megatron-LM's fp32 main_grad
    buffer under bf16 gives 2 + 4 + 12 = 18 bytes per parameter (Megatron-LM docs, distributed optimizer:
    "bf16 param, fp32 grads")."""
    if precision not in PRECISIONS:
        raise ShardlabError(f"{field_name('workload.precision')} must be one of {', '.join(PRECISIONS)}, got "
                            f"'{precision}'")
    if optimizer not in OPTIMIZERS:
        raise ShardlabError(f"{field_name('workload.optimizer')} must be one of {', '.join(OPTIMIZERS)}, got "
                            f"'{optimizer}'")
    if precision == "fp32":
        w, master, state, dtype = 4, 0, 4, "fp32"
    elif precision == "bf16":  # pure bf16: no master copy, optimizer states in bf16
        w, master, state, dtype = 2, 0, 2, "bf16"
    elif precision == "fp8-mixed":  # bf16 working weights and activations, FP8 GEMMs (Transformer Engine)
        w, master, state, dtype = 2, 4, 4, "bf16"
    else:
        w, master, state, dtype = 2, 4, 4, precision.split("-")[0]
    moments = {"adamw": 2 * state, "sgd": state, "adam-8bit": 2}[optimizer]
    if grad_bytes not in (0, 2, 4):
        raise ShardlabError(f"gradient bytes must be 2 or 4, got {grad_bytes}")
    return StateBytes(weights=w, gradients=grad_bytes or w, master=master, moments=moments, compute_dtype=dtype,
                      gemm_dtype="fp8" if precision == "fp8-mixed" else "")
