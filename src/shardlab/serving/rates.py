"""Kernel rates of serving, per GPU generation: what share of the datasheet peaks inference kernels reach.

Rates belong to the silicon, not to the engine: every engine on one GPU generation runs the same cuBLAS /
CUTLASS GEMMs, FlashAttention/FlashInfer-class attention and HBM streams, so ``catalog/data/serving_rates.yaml``
holds one set per generation (ampere, ada, hopper, blackwell, cdna3, ...) that every engine shares; an engine
profile (``serving.engines``) keeps only the engine's mechanisms (scheduler, CUDA graphs, host costs, whether
its decode kernel groups query heads). The values are fitted across every engine's published rows on that
generation (``python benchmarks/fit_engines.py``; ``shardlab validate --inference`` reports how many measured
values stand behind each generation). A generation with no published serving row takes the ``default`` entry:
the fitted generations' mean in logit space, and says so.

GEMM shape: each GEMM class (dense matrices; routed experts, which see T·k/E of a step's T tokens) has a
roofline of its own in the step model (``serving.step``): weight-bound below its knee, above it at the generation's
large-shape share times M/(M + m½) for M token rows (the training estimate's matmul curve, ``rates.hardware``).
Where the training runs measured a generation's curve (``catalog/data/fitted.yaml``), the 16-bit large-shape share
here is that curve's max_fraction, not a serving fit (``validation.inference.pinned_rates``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path

from shardlab.errors import ShardlabError

RATES_FILE = Path(__file__).resolve().parent.parent / "catalog" / "data" / "serving_rates.yaml"
RATE_FIELDS = ("weight_bandwidth_efficiency", "kv_bandwidth_efficiency", "gemm16_efficiency", "gemm8_efficiency",
               "gemm4_efficiency", "attention_efficiency")
"""The fitted shares of one generation (each in (0, 1])."""
DEFAULT = "default"
"""Entry used by generations without published serving rows."""


@dataclass(frozen=True)
class ServingRates:
    """Achieved shares of the datasheet peaks of one GPU generation in serving kernels."""

    generation: str
    """Generation id (the accelerator's ``generation``), or 'default'."""
    weight_bandwidth_efficiency: float
    """Share of HBM bandwidth streaming weights (decode GEMV/skinny GEMM)."""
    kv_bandwidth_efficiency: float
    """Share of HBM bandwidth reading the KV cache (decode attention)."""
    gemm16_efficiency: float
    """Share of the dense 16-bit peak in large GEMMs (prefill, big batches)."""
    gemm8_efficiency: float
    """Share of the dense 8-bit (fp8/int8) peak in large GEMMs."""
    gemm4_efficiency: float
    """Share of the dense fp4 (NVFP4) peak in large GEMMs."""
    attention_efficiency: float
    """Share of the attention dtype's peak in prefill attention (FlashAttention-class kernels)."""
    rows: int
    """Published measurements on this generation behind the fit (0 for the default entry)."""
    source: str
    """Where the values come from."""


def load_rates(path: Path = RATES_FILE) -> dict[str, ServingRates]:
    """Every generation's rates (strict: every field, shares in (0, 1], a source)."""
    from shardlab.catalog import load_yaml

    data = load_yaml(path)
    if not isinstance(data, dict) or DEFAULT not in data:
        raise ShardlabError(f"{path}: a serving-rates file maps generations (and '{DEFAULT}') to rates")
    want = {f.name for f in fields(ServingRates)} - {"generation"}
    out = {}
    for gen, d in data.items():
        if not isinstance(d, dict) or set(d) != want:
            got = set(d) if isinstance(d, dict) else set()
            raise ShardlabError(f"{path}: generation '{gen}' needs exactly {sorted(want)} "
                                f"(missing {sorted(want - got)}, unknown {sorted(got - want)})")
        for k in RATE_FIELDS:
            v = d[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise ShardlabError(f"{path}: generation '{gen}' {k} must be a share in (0, 1], got {v!r}")
        if isinstance(d["rows"], bool) or not isinstance(d["rows"], int) or d["rows"] < 0 or not isinstance(d["source"], str):
            raise ShardlabError(f"{path}: generation '{gen}' needs rows (a count ≥ 0) and a source (text)")
        out[str(gen)] = ServingRates(generation=str(gen), **d)
    return out


@lru_cache(maxsize=1)
def builtin_rates() -> dict[str, ServingRates]:
    return load_rates()


def rates_for(generation: str) -> ServingRates:
    """The rates of ``generation``, or the default entry when no published row covers it."""
    table = builtin_rates()
    return table.get(generation) or table[DEFAULT]
