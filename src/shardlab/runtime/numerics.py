"""What the runtime GPT computes beyond the shapes a ModelSpec counts: RoPE base, scaling and rotary width, norm
epsilon, activation, MoE routing normalisation, and the checkpoint's vocabulary when the model's is padded for TP.

The defaults are the runtime's own presets (tiny, small, tiny-gpt2): RoPE base 10,000 on the full head, epsilon
1e-5, SiLU gates (SwiGLU) or tanh-approximated GELU, renormalised top-k routing. A checkpoint's ``config.json``
sets them as transformers reads it (``runtime.checkpoint.config.numerics_from_config``), so a loaded model computes
what transformers computes.

RoPE: Su et al. 2021 (arXiv 2104.09864) eq. 34, rotate-half form (GPT-NeoX), applied to the first
``rotary_fraction`` of each head (GPT-NeoX/Pythia 0.25, Phi-3 ``partial_rotary_factor``). Scaling: 'linear'
(positions / factor, Chen et al. 2023, arXiv 2306.15595) and 'llama3' (Meta's frequency-dependent rescaling,
transformers ``_compute_llama3_parameters``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class RopeScaling:
    """A RoPE frequency rescaling, as in a Hugging Face config's ``rope_scaling``."""

    kind: str
    """'linear' or 'llama3'."""
    factor: float
    """Context extension factor."""
    low_freq_factor: float = 1.0
    """llama3: wavelengths above original_max_positions / low_freq_factor are divided by ``factor``."""
    high_freq_factor: float = 4.0
    """llama3: wavelengths below original_max_positions / high_freq_factor are kept."""
    original_max_positions: int = 8192
    """llama3: the context the model was pre-trained on."""


@dataclass(frozen=True)
class Numerics:
    """How the runtime GPT computes (module doc); one per built model."""

    rope_theta: float = 10000.0
    """RoPE base (Llama-2 value by default)."""
    rotary_fraction: float = 1.0
    """Share of each head's dimensions that RoPE rotates (GPT-NeoX ``rotary_pct``)."""
    rope_scaling: RopeScaling | None = None
    """Frequency rescaling, or None."""
    norm_eps: float = 1e-5
    """Epsilon of every LayerNorm/RMSNorm (q/k norms included)."""
    activation: str = ""
    """'silu', 'gelu' (erf) or 'gelu_tanh'; '' = the spec's default (SiLU for SwiGLU, tanh GELU otherwise)."""
    moe_renormalize: bool = True
    """Top-k routing weights renormalised to sum to 1 (Mixtral; Qwen-MoE ``norm_topk_prob``); else softmax over all
    experts, top k kept as they are."""
    vocab_size: int = 0
    """The vocabulary the logits are cut to when the model's embedding is padded for TP (0: no padding)."""


DEFAULT = Numerics()


def inverse_frequencies(rot_dims: int, numerics: Numerics, device=None):
    """(rot_dims/2,) RoPE inverse frequencies theta^(-2i/d), rescaled per ``numerics.rope_scaling``."""
    import torch

    inv = 1.0 / (numerics.rope_theta ** (torch.arange(0, rot_dims, 2, device=device, dtype=torch.int64).float() / rot_dims))
    sc = numerics.rope_scaling
    if sc is None:
        return inv
    if sc.kind == "linear":
        return inv / sc.factor
    # llama3 (transformers modeling_rope_utils._compute_llama3_parameters)
    low_wavelen = sc.original_max_positions / sc.low_freq_factor
    high_wavelen = sc.original_max_positions / sc.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / sc.factor, inv)
    smooth = (sc.original_max_positions / wavelen - sc.low_freq_factor) / (sc.high_freq_factor - sc.low_freq_factor)
    smoothed = (1 - smooth) * scaled / sc.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope(x, start_pos: int, numerics: Numerics = DEFAULT):
    """Rotary position embedding on the first ``rotary_fraction`` of each head (rotate-half form).

    x: (b, s, heads, head_dim) tensor; position of token j is start_pos + j. Computed on the fly: no buffers.
    (torch is imported here, not at module level: the driver reads a checkpoint's Numerics without torch.)
    """
    import torch

    b, s, _, d = x.shape
    r = int(d * numerics.rotary_fraction)
    inv = inverse_frequencies(r, numerics, x.device)                                                  # (r/2,)
    ang = torch.outer(torch.arange(start_pos, start_pos + s, device=x.device, dtype=torch.float32), inv)  # (s, r/2)
    cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :].to(x.dtype)  # (1, s, 1, r)
    sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :].to(x.dtype)
    rot, keep = x[..., :r], x[..., r:]
    x1, x2 = rot[..., : r // 2], rot[..., r // 2:]
    out = rot * cos + torch.cat([-x2, x1], -1) * sin
    return torch.cat([out, keep], -1) if r < d else out
