"""Inference precision per tensor class: weights, KV cache and activations, and the bytes they take.

Weights of the blocks' linear layers may be quantized; embeddings, the output head, norms, biases and MoE
routers stay 16-bit (AutoAWQ and GPTQ leave ``lm_head`` unquantized; vLLM's and NVIDIA ModelOpt's FP8
checkpoints list it among the ignored layers). Bytes of one quantized (out, in) matrix:

    ceil(bits · out · in / 8)  +  out · ceil(in / g) · (scale_bytes + zero_bits / 8)

- int4 / int8 with a group size g (AWQ, Lin et al. 2023, arXiv 2306.00978 §3; GPTQ, Frantar et al. 2022,
  arXiv 2210.17323 §4): one fp16 scale and one zero point per group of g input features; the zero points are
  packed at the weight's width (AutoAWQ/GPTQ ``qzeros``: eight 4-bit zeros per int32). Default g = 128.
- int8 without a group size (SmoothQuant W8A8, Xiao et al. 2022, arXiv 2211.10438; LLM.int8-style W8A16):
  symmetric, one fp16 scale per output channel, no zero point.
- fp8 (E4M3, Micikevicius et al. 2022, arXiv 2209.05433): per-tensor scaling, one fp32 weight scale and one
  fp32 input scale per matrix (ModelOpt/vLLM FP8 checkpoints).
- fp4 (NVFP4: E2M1 elements, one E4M3 scale per block of 16 elements along the input, one fp32 global scale
  per tensor; NVIDIA, "Introducing NVFP4", 2025, and ModelOpt's NVFP4 checkpoints): 4.5 bits per weight.
- bf16/fp16: 2 bytes, no scales.

KV cache: bf16/fp16 2 bytes per element, fp8 1 byte (per-tensor scales; vLLM ``--kv-cache-dtype fp8``,
TensorRT-LLM FP8 KV cache). Activations set the GEMM's tensor-core rate: weight-only schemes (W4A16,
W8A16) dequantize into 16-bit GEMMs and run at the 16-bit peak; W8A8 runs at the fp8 or int8 peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shardlab.errors import ShardlabError, field_name

WEIGHT_BITS = {"bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4, "fp4": 4}
"""Bits per weight element of each --weights choice."""
KV_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}
"""Bytes per KV-cache element of each --kv-cache-dtype choice."""
ACTIVATION_DTYPES = ("bf16", "fp16", "fp8", "int8", "fp4")
"""--activations choices: the dtype the GEMMs run in (its tensor-core peak applies)."""
NVFP4_BLOCK = 16
"""Elements per E4M3 scale of an NVFP4 tensor (NVIDIA Blackwell block scaling)."""
DEFAULT_GROUP_SIZE = 128
"""AWQ/GPTQ default group size (AutoAWQ ``q_group_size=128``; GPTQ ``group_size=128``)."""
QUANTIZED_COMPONENTS = ("attention", "mlp", "experts", "shared_experts")
"""Tensor components whose matrices a quantized checkpoint stores at the weight precision."""


@dataclass(frozen=True)
class InferencePrecision:
    """Precision of each tensor class of a served model."""

    weights: str = "bf16"
    """Block linear weights: bf16, fp16, fp8, int8, int4 or fp4 (NVFP4)."""
    group_size: int | None = None
    """Input features per scale/zero group (int4/int8); None = per output channel (int8) or per tensor (fp8)."""
    kv_cache: str = "bf16"
    """KV-cache element type: bf16, fp16 or fp8."""
    activations: str = "bf16"
    """Type the GEMMs run in (sets the peak): bf16, fp16, fp8, int8 or fp4 (Blackwell NVFP4 tensor cores)."""
    weights_from_checkpoint: bool = False
    """The weights' type is the model's published checkpoint's (``ModelSpec.checkpoint_weights``), not a flag's."""

    @property
    def weight_bits(self) -> int:
        return WEIGHT_BITS[self.weights]

    @property
    def kv_bytes(self) -> int:
        """Bytes per KV-cache element."""
        return KV_BYTES[self.kv_cache]

    @property
    def gemm_dtype(self) -> str:
        """Catalog peak the linear layers run at."""
        return self.activations

    @property
    def label(self) -> str:
        """Short name, e.g. 'weights int4 g128, activations bf16, KV fp8'."""
        g = f" g{self.group_size}" if self.group_size else ""
        own = " (the checkpoint's)" if self.weights_from_checkpoint else ""
        return f"weights {self.weights}{g}{own}, activations {self.activations}, KV {self.kv_cache}"

    def matrix_bytes(self, out_features: int, in_features: int) -> int:
        """Bytes of one quantized (out, in) weight matrix, scales and zero points included (module doc)."""
        bits = self.weight_bits
        data = -(-bits * out_features * in_features // 8)
        if bits == 16:
            return data
        if self.weights == "fp8":
            return data + 8                                    # fp32 weight scale + fp32 input scale
        if self.weights == "fp4":                              # E4M3 per 16 inputs + fp32 global scales
            return data + out_features * -(-in_features // NVFP4_BLOCK) + 8
        if self.group_size:                                    # AWQ/GPTQ groups: fp16 scale + packed zero
            if in_features % self.group_size:                  # vLLM's AWQ/GPTQ create_weights refuse partial groups
                if self.weights_from_checkpoint:              # the checkpoint's groups are fixed: only the TP can move
                    raise ShardlabError(f"the checkpoint's group_size {self.group_size} (its quantization_config) does "
                                        f"not divide {in_features:,}, the input features of a quantized matrix on each "
                                        f"rank: AWQ/GPTQ kernels need whole groups; use a TP degree that keeps whole "
                                        f"groups")
                fit = next((g for g in (128, 64, 32, 16) if in_features % g == 0), math.gcd(in_features, self.group_size))
                raise ShardlabError(f"{field_name('serve.group_size')} {self.group_size} does not divide "
                                    f"{in_features:,}, the input features "
                                    f"of a quantized matrix on each rank: AWQ/GPTQ kernels need whole groups; use a TP "
                                    f"degree that keeps whole groups, or {field_name('serve.group_size')} {fit}")
            groups = out_features * (in_features // self.group_size)
            return data + groups * 2 + -(-groups * bits // 8)
        return data + 2 * out_features                         # per-channel fp16 scale, symmetric

    def tensor_bytes(self, component: str, local_shape: tuple[int, ...], weight: bool) -> int:
        """Bytes of one rank's shard of a tensor: quantized block matrices, 16-bit everything else."""
        n = math.prod(local_shape)
        if not weight or component not in QUANTIZED_COMPONENTS or len(local_shape) < 2 or self.weight_bits == 16:
            return 2 * n
        stacked = math.prod(local_shape[:-2])                  # routed experts: (E, out, in)
        return stacked * self.matrix_bytes(local_shape[-2], local_shape[-1])


BF16 = InferencePrecision()
"""Unquantized bf16 serving (the default)."""


def make_precision(weights: str = "bf16", group_size: int | None = None, kv_cache: str = "bf16",
                   activations: str | None = None, peaks: dict | None = None,
                   from_checkpoint: bool = False) -> InferencePrecision:
    """Validate a precision choice; ``activations`` defaults to fp8 for fp8 weights on a GPU with an fp8 peak
    (W8A8, what TensorRT-LLM and vLLM run on Hopper), else the 16-bit type (weight-only schemes)."""
    if weights not in WEIGHT_BITS:
        raise ShardlabError(f"{field_name('serve.weights')} {weights}: use one of {', '.join(WEIGHT_BITS)}")
    if kv_cache not in KV_BYTES:
        raise ShardlabError(f"{field_name('serve.kv_cache_dtype')} {kv_cache}: use one of {', '.join(KV_BYTES)}")
    if group_size is not None:
        if weights not in ("int4", "int8"):
            raise ShardlabError(f"{field_name('serve.group_size')} applies to int4/int8 weights, not {weights}; drop "
                                "it")
        if group_size < 1:
            raise ShardlabError(f"{field_name('serve.group_size')} must be a positive number of input features, got "
                                f"{group_size}")
    elif weights == "int4":
        group_size = DEFAULT_GROUP_SIZE
    if activations is None:
        has = {k for k, v in (peaks or {}).items() if v}
        activations = ("fp8" if weights == "fp8" and "fp8" in has else "fp4" if weights == "fp4" and "fp4" in has
                       else "fp16" if weights == "fp16" else "bf16")
    if activations not in ACTIVATION_DTYPES:
        raise ShardlabError(f"{field_name('serve.activations')} {activations}: use one of "
                            f"{', '.join(ACTIVATION_DTYPES)}")
    if WEIGHT_BITS[weights] == 16 and activations in ("fp8", "int8", "fp4"):
        weights_flag = field_name("serve.weights")
        need = f"fp4 weights ({weights_flag} fp4)" if activations == "fp4" else f"8-bit weights ({weights_flag} fp8 or int8)"
        raise ShardlabError(f"{field_name('serve.activations')} {activations} needs {need}: a 16-bit weight cannot "
                            f"feed an {activations} GEMM")
    if not _runs(weights, activations):
        w, a = field_name("serve.weights"), field_name("serve.activations")
        scheme = f"W4A4 ({w} fp4 {a} fp4)" if activations == "fp4" else f"W8A8 ({w} {activations} {a} {activations})"
        raise ShardlabError(f"{field_name('serve.activations')} {activations} with {field_name('serve.weights')} "
                            f"{weights} is not a scheme engines run; "
                            f"use {scheme} or 16-bit activations")
    if peaks is not None and not peaks.get(activations):
        have = [k for k in ACTIVATION_DTYPES if peaks.get(k) and _runs(weights, k)]
        if not have:
            raise ShardlabError(f"this GPU has no tensor-core peak in the catalog that {weights} weights can run on; "
                                f"serve on another {field_name('cluster.gpu')}, or add its peaks with --catalog FILE")
        raise ShardlabError(f"this GPU has no {activations} tensor-core peak in the catalog; use "
                            f"{field_name('serve.activations')} "
                            f"{' or '.join(have)}")
    return InferencePrecision(weights, group_size, kv_cache, activations, from_checkpoint)


def checkpoint_precision(spec, peaks: dict | None, weights: str | None = None, group_size: int | None = None,
                         kv_cache: str = "bf16", activations: str | None = None) -> InferencePrecision:
    """What serving prices ``spec`` in: ``weights`` as given, else its published checkpoint's type
    (``ModelSpec.checkpoint_weights``: what the engines load as it ships), else bf16. Priced at the checkpoint's
    int4/int8 type without a group size, it keeps the checkpoint's groups; it is called "the checkpoint's" only where
    nothing given departs from it (another group size is another file)."""
    ckpt = spec.checkpoint_weights if spec is not None else ""
    w = weights or ckpt or "bf16"
    group = group_size
    if w == ckpt and group is None and spec.checkpoint_group_size:
        group = spec.checkpoint_group_size
    own = not weights and bool(ckpt) and group_size in (None, spec.checkpoint_group_size or None)
    return make_precision(w, group, kv_cache, activations, peaks, from_checkpoint=own)


def _runs(weights: str, activations: str) -> bool:
    """True for a weight/activation pair engines run: 16-bit GEMMs under any weights, int8 GEMMs only on int8
    weights (SmoothQuant W8A8), fp8 GEMMs on fp8 weights or on int4/fp4 weights (W4A8, TensorRT-LLM/ModelOpt),
    fp4 GEMMs on fp4 weights only (NVFP4 W4A4)."""
    if activations in ("bf16", "fp16"):
        return True
    if activations == "fp4":
        return weights == "fp4"
    return weights == "int8" if activations == "int8" else weights in ("fp8", "int4", "fp4")
