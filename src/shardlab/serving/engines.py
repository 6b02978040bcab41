"""Serving-engine profiles (vLLM, TensorRT-LLM, SGLang): the physical mechanisms an engine has, as data.

``catalog/data/engines.yaml`` holds one entry per engine. Scheduler and memory settings are the engines'
documented defaults (each with the file or page it comes from); the kernel rates and overheads are
fitted to published measurements (``shardlab.validation.inference``; ``python benchmarks/fit_engines.py``
writes them here, and ``shardlab validate --inference`` says when a refit would move them) and say so in
their source. The loader is strict: every field is required, carries a source, and is range-checked;
unknown keys are errors.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import lru_cache
from pathlib import Path

from shardlab.errors import ShardlabError, did_you_mean
from shardlab.serving.step import Kernels

ENGINES_FILE = Path(__file__).resolve().parent.parent / "catalog" / "data" / "engines.yaml"
SCHEDULING = ("prefill-first", "mixed")
"""prefill-first: a step runs prompts or decodes, prompts first (vLLM v0, SGLang); mixed: prompts join the
decode batch in one step (TensorRT-LLM in-flight batching, vLLM/SGLang with chunked prefill)."""
KV_RULES = ("total", "free")
ADMISSION = ("on-demand", "reserve")
"""on-demand: blocks are allocated as a sequence grows (vLLM, SGLang); reserve: a request is admitted only
when its prompt and all its output fit (TensorRT-LLM GUARANTEED_NO_EVICT)."""
TRAINING_FRAMEWORKS = ("megatron-lm", "deepspeed", "pytorch-fsdp", "torchtitan")
"""Training framework ids (``--framework`` for training); refused under --inference."""


@dataclass(frozen=True)
class EngineProfile:
    """One serving engine's mechanisms (every field has a source in ``sources``)."""

    id: str
    """Catalog id (vllm, tensorrt-llm, sglang)."""
    name: str
    """Readable name and the version the defaults describe."""
    kv_block_size: int
    """Tokens per KV-cache block."""
    gpu_memory_utilization: float
    """Share of memory the engine takes (rule 'total') or of the free memory its KV cache takes (rule 'free')."""
    kv_memory_rule: str
    """'total' (vLLM, SGLang) or 'free' (TensorRT-LLM), see ``memory.inference.kv_blocks``."""
    kv_admission: str
    """'on-demand' or 'reserve' (see ADMISSION)."""
    max_num_seqs: int
    """Most sequences in one step (vLLM max_num_seqs, TensorRT-LLM max_batch_size)."""
    max_num_batched_tokens: int
    """Token budget of one step (vLLM max_num_batched_tokens, TensorRT-LLM max_num_tokens)."""
    scheduling: str
    """'prefill-first' or 'mixed' (see SCHEDULING)."""
    chunked_prefill: bool
    """Long prompts are split into chunks that fill the token budget (Sarathi-Serve)."""
    chunked_scheduling: str
    """The scheduling the engine switches to when chunked prefill is turned on (vLLM: mixed)."""
    scheduler_steps: int
    """Decode steps scheduled at once (vLLM --num-scheduler-steps); new requests join every that many steps."""
    sliding_window_cache: bool
    """The KV cache drops tokens outside a sliding-window model's window (else it keeps every token)."""
    weight_bandwidth_efficiency: float
    """Achieved share of HBM bandwidth streaming weights (decode GEMV/GEMM)."""
    kv_bandwidth_efficiency: float
    """Achieved share of HBM bandwidth reading the KV cache (decode attention)."""
    gemm_efficiency: float
    """Achieved share of the dense 16-bit tensor-core peak in large (prefill, big-batch) GEMMs."""
    gemm8_efficiency: float
    """Achieved share of the dense 8-bit (fp8/int8) peak in large GEMMs (8-bit GEMMs reach a lower share)."""
    attention_efficiency: float
    """Achieved share of the peak in prefill attention (flash attention FLOPs)."""
    step_overhead_us: float
    """Per step: scheduling, sampling, CUDA-graph launch and synchronisation the GPU waits for, µs."""
    seq_overhead_us: float
    """Per sequence in a step: host-side bookkeeping (block tables, detokenisation, output processing), µs."""
    layer_overhead_us: float
    """Per block per step: kernel launches and inter-kernel gaps the GPU waits for, µs (CUDA graphs shrink it)."""
    request_overhead_us: float
    """Per request before its first token: API server, tokenisation, admission, µs (online serving only)."""
    sources: dict
    """Field name -> where its value comes from."""

    def kernels(self, scheduler_steps: int | None = None) -> Kernels:
        """The achieved rates and overheads in the step model's units (multi-step scheduling spreads the
        host part of the step overhead over its steps)."""
        n = scheduler_steps or self.scheduler_steps
        return Kernels(self.weight_bandwidth_efficiency, self.kv_bandwidth_efficiency, self.gemm_efficiency,
                       self.gemm8_efficiency, self.attention_efficiency, self.step_overhead_us * 1e-6 / n, self.seq_overhead_us * 1e-6 / n,
                       self.layer_overhead_us * 1e-6)

    def with_settings(self, **kw) -> EngineProfile:
        """A copy with settings replaced (None values ignored), for flags such as --gpu-memory-utilization;
        turning chunked prefill on also selects the engine's chunked scheduling."""
        kw = {k: v for k, v in kw.items() if v is not None}
        if kw.get("chunked_prefill") and not self.chunked_prefill:
            kw.setdefault("scheduling", self.chunked_scheduling)
        return replace(self, **kw)


FRACTIONS = ("weight_bandwidth_efficiency", "kv_bandwidth_efficiency", "gemm_efficiency", "gemm8_efficiency",
             "attention_efficiency")
"""Fitted fields that are shares in (0, 1]."""
FITTED = FRACTIONS + ("step_overhead_us", "seq_overhead_us", "layer_overhead_us", "request_overhead_us")
"""Fields fitted to published measurements (``shardlab.validation.inference``)."""
_FRACTIONS = ("gpu_memory_utilization",) + FRACTIONS
_FIELDS = {f.name for f in fields(EngineProfile)} - {"id"}


def _check(name: str, d: object, where: str) -> EngineProfile:
    if not isinstance(d, dict):
        raise ShardlabError(f"{where}: engine '{name}' must be a mapping")
    missing, unknown = _FIELDS - set(d), set(d) - _FIELDS
    if missing or unknown:
        raise ShardlabError(f"{where}: engine '{name}' " + (f"is missing {sorted(missing)}" if missing else
                                                             f"has unknown field(s) {sorted(unknown)}") +
                            f"; fields: {sorted(_FIELDS)}")
    src = d["sources"]
    if not isinstance(src, dict) or set(src) != _FIELDS - {"name", "sources"}:
        lacking = sorted(_FIELDS - {"name", "sources"} - set(src or {}))
        raise ShardlabError(f"{where}: engine '{name}' needs a source for every field (missing: {lacking})")
    for key, choices in (("kv_memory_rule", KV_RULES), ("kv_admission", ADMISSION), ("scheduling", SCHEDULING),
                         ("chunked_scheduling", SCHEDULING)):
        if d[key] not in choices:
            raise ShardlabError(f"{where}: engine '{name}' {key} must be one of {', '.join(choices)}, got {d[key]!r}")
    for key in _FIELDS - {"name", "sources", "kv_memory_rule", "kv_admission", "scheduling", "chunked_scheduling",
                          "chunked_prefill", "sliding_window_cache"}:
        v = d[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (key in _FRACTIONS and not 0 < v <= 1):
            raise ShardlabError(f"{where}: engine '{name}' field '{key}' must be a "
                                f"{'share in (0, 1]' if key in _FRACTIONS else 'number ≥ 0'}, got {v!r}")
    for key in ("chunked_prefill", "sliding_window_cache"):
        if not isinstance(d[key], bool):
            raise ShardlabError(f"{where}: engine '{name}' {key} must be true or false")
    ints = ("kv_block_size", "max_num_seqs", "max_num_batched_tokens", "scheduler_steps")
    vals = {k: (int(d[k]) if k in ints else d[k]) for k in _FIELDS}
    if any(vals[k] < 1 for k in ints):
        raise ShardlabError(f"{where}: engine '{name}' {', '.join(ints)} must be at least 1")
    return EngineProfile(id=name, **vals)


def load_engines(path: Path = ENGINES_FILE) -> dict[str, EngineProfile]:
    """Every engine of a YAML file (strict)."""
    from shardlab.catalog import load_yaml

    data = load_yaml(path)
    if not isinstance(data, dict) or not data:
        raise ShardlabError(f"{path}: an engines file maps engine ids to profiles")
    return {str(k).lower(): _check(str(k).lower(), v, str(path)) for k, v in data.items()}


@lru_cache(maxsize=1)
def builtin_engines() -> dict[str, EngineProfile]:
    return load_engines()


def get_engine(name: str | None) -> EngineProfile:
    """The profile of ``name`` (default vllm); training framework ids and unknown ids are refused."""
    name = (name or "vllm").lower()
    engines = builtin_engines()
    if name in TRAINING_FRAMEWORKS:
        raise ShardlabError(f"--framework {name} is a training framework; under --inference use a serving engine: "
                            f"{', '.join(engines)}")
    if name not in engines:
        raise ShardlabError(f"unknown serving engine '{name}'{did_you_mean(name, engines)}; use one of {', '.join(engines)}")
    return engines[name]
