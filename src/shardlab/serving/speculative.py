"""Speculative decoding: a draft proposes k tokens per sequence, the target verifies them in one step.

Each decode cycle of a sequence runs the draft k times (one token each, autoregressively) and the target once over
k + 1 positions (the k drafted tokens and the token after the last one accepted); it keeps the accepted prefix plus
the target's own next token. With each drafted token accepted independently with probability α, the expected tokens
per cycle (the acceptance length) is (1 − α^(k+1)) / (1 − α) (Leviathan, Kalman & Matias 2023, "Fast Inference from
Transformers via Speculative Decoding", ICML, arXiv 2211.17192, Eq. 1); a measured acceptance length can be given
instead. Costs, on the step model (``serving.step``): the verification is a decode step of D sequences whose k extra
positions per sequence each attend to the sequence's cached keys (the KV is read once per sequence, the attention
FLOPs grow k + 1 times), with D·(k + 1) sampled rows; the draft is a model of its own (``draft_spec``) stepped k
times over the D sequences. TPOT = (verification + k × draft step) / acceptance length.

Drafts:
- ``eagle``: EAGLE-1 (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty", ICML,
  arXiv 2401.15077 §3): one decoder layer of the target's shape over [token embedding; target feature] (an fc of
  2h × h in front) and the target's own output head;
- ``eagle3``: EAGLE-3 (Li et al. 2025, arXiv 2503.01840 §3): one decoder layer over three fused target features (fc
  of 3h × h) and a head over a reduced draft vocabulary (32,000 tokens in the published Llama-3.1-8B draft,
  yuhuili/EAGLE3-LLaMA3.1-Instruct-8B config.json ``draft_vocab_size``);
- ``mtp``: DeepSeek-V3's multi-token-prediction module (DeepSeek-AI 2024, arXiv 2412.19437 §2.2), shipped in the
  DeepSeek-V3/R1 checkpoints: one decoder block of the target's own MoE shape over [RMSNorm(h); RMSNorm(Emb(t))]
  through a 2h × h projection, sharing the target's embedding and output head, applied autoregressively for k > 1
  (TensorRT-LLM's and SGLang's MTP speculation);
- a catalog model id (``--draft-model llama-3.2-1b``): a whole smaller model with its own KV cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from shardlab.errors import ShardlabError
from shardlab.specs.model import ModelSpec

DRAFT_KINDS = ("eagle", "eagle3", "mtp")
"""Draft heads priced from the target's shape; any other draft is a catalog model."""
EAGLE3_DRAFT_VOCAB = 32000
"""Draft vocabulary of the published EAGLE-3 Llama-3.1-8B head (its config.json ``draft_vocab_size``)."""
DEFAULT_ACCEPTANCE_RATE = {"eagle": 0.634, "eagle3": 0.763, "mtp": 0.875}
"""Per-token acceptance α when none is given: what vLLM V1 measured for Llama-3.1-8B-Instruct on MT-Bench at k = 3
(vllm-project/vllm issue #20780, 2025-07: acceptance length 2.29 for EAGLE-1 and 2.79 for EAGLE-3; α solves
(1 − α⁴)/(1 − α) = AL: 0.634 and 0.763, ``alpha_for``). The formula's independence assumption then gives other k
(at k = 7 it says 2.66 and 3.73 where the same measurements give 2.47 and 3.54). A draft model has no default:
give --acceptance-rate. MTP: the DeepSeek-V3 report's acceptance of the second token, "between 85% and 90%"
(arXiv 2412.19437 §5.4.3), its middle; applied at depth k > 1 it overstates (TensorRT-LLM measured 2.82 tokens per
step at k = 3 on DeepSeek-R1, where 0.875 gives 3.50: give --acceptance-length there)."""
MTP_FAMILIES = ("deepseek_v3",)
"""Model families whose checkpoints carry an MTP module."""


@dataclass(frozen=True)
class Speculation:
    """Speculative decoding settings of a serving case."""

    tokens: int
    """Draft tokens proposed per sequence per cycle (k)."""
    acceptance_length: float
    """Mean tokens a cycle produces per sequence (accepted drafts + the target's own), 1 ≤ AL ≤ k + 1."""
    draft: str
    """'eagle', 'eagle3', or the draft model's catalog id."""
    source: str
    """Where the acceptance length comes from (given, or α and the formula)."""

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "acceptance_length": self.acceptance_length, "draft": self.draft,
                "source": self.source}


def acceptance_length(alpha: float, k: int) -> float:
    """Expected tokens per verification step, (1 − α^(k+1)) / (1 − α) (Leviathan et al. 2023, Eq. 1); k + 1 at α = 1."""
    return float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def alpha_for(length: float, k: int) -> float:
    """The α whose ``acceptance_length`` at k is ``length`` (bisection; it increases with α)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if acceptance_length(mid, k) < length else (lo, mid)
    return (lo + hi) / 2


def make_speculation(tokens: int | None, draft: str | None, *, rate: float | None = None,
                     length: float | None = None) -> Speculation | None:
    """Settings from the flags (None without --speculative-tokens); one line naming the fix on a bad combination."""
    if tokens is None:
        if draft or rate is not None or length is not None:
            raise ShardlabError("--draft/--acceptance-rate/--acceptance-length need --speculative-tokens K")
        return None
    if not 1 <= tokens <= 16:
        raise ShardlabError(f"--speculative-tokens must be 1 to 16, got {tokens}")
    draft = draft or "eagle"
    if rate is not None and length is not None:
        raise ShardlabError("give --acceptance-rate or --acceptance-length, not both")
    if length is not None:
        if not 1.0 <= length <= tokens + 1:
            raise ShardlabError(f"--acceptance-length must lie in [1, k + 1] = [1, {tokens + 1}], got {length:g}")
        return Speculation(tokens, float(length), draft, "given (--acceptance-length)")
    if rate is None:
        if draft not in DEFAULT_ACCEPTANCE_RATE:
            raise ShardlabError(f"--draft {draft}: no measured acceptance for this draft; give --acceptance-rate A "
                                "(per token, 0-1) or --acceptance-length L")
        rate = DEFAULT_ACCEPTANCE_RATE[draft]
        src = (f"α = {rate:g} for mtp (DeepSeek-V3 report §5.4.3: 85-90% of second tokens accepted) and "
               f"(1 − α^(k+1))/(1 − α)" if draft == "mtp" else
               f"α = {rate:g} for {draft} (vLLM issue #20780, Llama-3.1-8B on MT-Bench) and (1 − α^(k+1))/(1 − α)")
    else:
        if not 0.0 <= rate <= 1.0 or math.isnan(rate):
            raise ShardlabError(f"--acceptance-rate is a share in [0, 1], got {rate:g}")
        src = f"α = {rate:g} (given) and (1 − α^(k+1))/(1 − α), Leviathan et al. 2023"
    return Speculation(tokens, acceptance_length(rate, tokens), draft, src)


def draft_spec(target: ModelSpec, draft: str, catalog) -> ModelSpec:
    """The draft as a model the step model can price (module doc)."""
    if draft == "eagle":
        return replace(target, name=f"{target.name} EAGLE head", num_layers=1, moe=None, sliding_window=0,
                       full_attention_layers=0)
    if draft == "eagle3":
        return replace(target, name=f"{target.name} EAGLE-3 head", num_layers=1, moe=None, vocab_size=EAGLE3_DRAFT_VOCAB,
                       sliding_window=0, full_attention_layers=0)
    if draft == "mtp":
        if target.family not in MTP_FAMILIES or target.moe is None:
            raise ShardlabError(f"--draft mtp: {target.name} has no multi-token-prediction module (DeepSeek-V3 and R1 "
                                f"ship one); use eagle, eagle3 or a draft model")
        return replace(target, name=f"{target.name} MTP module", num_layers=1,
                       moe=replace(target.moe, first_dense_layers=0), full_attention_layers=0)
    spec = catalog.model(draft)
    if spec.vocab_size != target.vocab_size:
        raise ShardlabError(f"--draft {draft}: its vocabulary ({spec.vocab_size:,}) differs from {target.name}'s "
                            f"({target.vocab_size:,}); a draft model must share the target's tokenizer")
    return spec


def draft_extra_params(target: ModelSpec, draft: str) -> int:
    """Parameters of an EAGLE head outside its decoder layer: the fc fusing the target's features, 2h × h (EAGLE-1:
    token embedding and top feature) or 3h × h (EAGLE-3: low, middle and top features); 0 for a draft model."""
    h = target.hidden_size
    return {"eagle": 2 * h * h, "eagle3": 3 * h * h, "mtp": 2 * h * h}.get(draft, 0)
