"""Serving-engine profiles (vLLM, TensorRT-LLM, SGLang, each version its own id): the mechanisms an engine has,
as data.

``catalog/data/engines.yaml`` holds one entry per engine version. Scheduler, memory, CUDA-graph and kernel-choice
settings are the version's defaults, each with the file of its source they come from; the host overheads are
fitted to published measurements (``shardlab.validation.inference``; ``python benchmarks/fit_engines.py``
writes them here, and ``shardlab validate --inference`` says when a refit would move them) and say so in
their source. Kernel rates are not the engine's: they are the GPU generation's (``serving.rates``). The loader is strict: every field is required, carries a source, and is range-checked;
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


GQA_KERNELS = ("always", "never", "16-bit-kv")
"""Whether the engine's decode attention kernel reads each KV head once for its whole group of query heads
(always: FlashAttention's/FlashInfer's/XQA's grouped decode; never: a kernel per query head, each reading its KV
head again; 16-bit-kv: grouped for a 16-bit cache, per head for an fp8 cache that falls back to a paged kernel)."""


@dataclass(frozen=True)
class EngineProfile:
    """One serving engine version's mechanisms (every field has a source in ``sources``); the kernel rates are
    the GPU generation's (``serving.rates``), shared by every engine."""

    id: str
    """Catalog id (vllm, vllm-0.6, sglang, sglang-0.3, tensorrt-llm, tensorrt-llm-0.17)."""
    name: str
    """Readable name."""
    version: str
    """Engine version the defaults are taken from."""
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
    decode_groups_query_heads: str
    """Whether decode attention reads a KV head once per query group (see GQA_KERNELS)."""
    cuda_graph_max_batch: int
    """Largest decode batch replayed as a captured CUDA graph (0: none); such steps pay no per-layer launches."""
    prefix_caching: bool
    """Prompt prefixes already in the KV cache are not recomputed (automatic prefix caching / RadixAttention)."""
    attention_dp_tp: bool
    """Data-parallel attention ranks may each span a TP group (attention TP > 1 beside wide expert parallelism); False:
    every attention rank is one GPU, or the version has no data-parallel attention."""
    step_overhead_us: float
    """Per step: scheduling, sampling, graph launch and synchronisation the GPU waits for, µs."""
    seq_overhead_us: float
    """Per sequence in a step: host-side bookkeeping (block tables, detokenisation, output processing), µs."""
    layer_overhead_us: float
    """Per block per step: the floor of its small kernels (norms, RoPE, activation: a few µs each however little
    they do) and the gaps between them, µs; paid inside CUDA graphs too."""
    eager_layer_overhead_us: float
    """Per block per step outside CUDA graphs: the host's kernel launches the GPU waits for, µs."""
    request_overhead_us: float
    """Per request before its first token: API server, tokenisation, admission, µs (online serving)."""
    first_token_overhead_us: float
    """Per static batch before its first token: input preparation, first sampling and output, µs."""
    small_gpu_below_gib: float
    """GPUs with less memory (or listed in small_gpu_ids) get the small-GPU defaults below (0: one default for all)."""
    small_gpu_ids: tuple
    """Catalog GPU ids that take the small-GPU defaults whatever their memory."""
    small_gpu_max_num_seqs: int
    """max_num_seqs on a small GPU."""
    small_gpu_max_num_batched_tokens: int
    """The step's token budget on a small GPU."""
    sources: dict
    """Field name -> where its value comes from."""
    given: frozenset = frozenset()
    """Settings given explicitly (``with_settings``): a GPU's defaults never replace them."""

    def kernels(self, rates, kv_cache: str = "bf16", scheduler_steps: int | None = None) -> Kernels:
        """The generation's ``rates`` (``serving.rates.ServingRates``) and this engine's overheads in the step model's
        units (multi-step scheduling spreads the host part of the step overhead over its steps)."""
        n = scheduler_steps or self.scheduler_steps
        grouped = self.decode_groups_query_heads == "always" or (self.decode_groups_query_heads == "16-bit-kv"
                                                                 and kv_cache in ("bf16", "fp16"))
        return Kernels(rates.weight_bandwidth_efficiency, rates.kv_bandwidth_efficiency, rates.gemm16_efficiency,
                       rates.gemm8_efficiency, rates.gemm4_efficiency, rates.attention_efficiency,
                       self.step_overhead_us * 1e-6 / n, self.seq_overhead_us * 1e-6 / n, self.layer_overhead_us * 1e-6,
                       0.0 if grouped else 1.0, float(self.cuda_graph_max_batch), self.first_token_overhead_us * 1e-6,
                       self.eager_layer_overhead_us * 1e-6)

    def with_settings(self, **kw) -> EngineProfile:
        """A copy with settings replaced (None values ignored), for flags such as --gpu-memory-utilization;
        turning chunked prefill on also selects the engine's chunked scheduling."""
        kw = {k: v for k, v in kw.items() if v is not None}
        if kw.get("chunked_prefill") and not self.chunked_prefill:
            kw.setdefault("scheduling", self.chunked_scheduling)
        return replace(self, given=self.given | frozenset(kw), **kw)

    def for_gpu(self, accelerator) -> EngineProfile:
        """The profile on ``accelerator``: an engine whose defaults depend on the GPU (vLLM V1: 1024 sequences and
        an 8192-token budget on GPUs of 70 GiB or more other than A100, 256 and 2048 on the rest) takes the small-GPU
        values there, except for settings given explicitly."""
        small = self.small_gpu_below_gib > 0 and (accelerator.memory_gib < self.small_gpu_below_gib
                                                  or accelerator.id in self.small_gpu_ids)
        if not small:
            return self
        kw = {k: v for k, v in (("max_num_seqs", self.small_gpu_max_num_seqs),
                                ("max_num_batched_tokens", self.small_gpu_max_num_batched_tokens)) if k not in self.given}
        return replace(self, **kw)


FITTED = ("step_overhead_us", "seq_overhead_us", "layer_overhead_us", "eager_layer_overhead_us", "request_overhead_us",
          "first_token_overhead_us")
"""Engine fields fitted to published measurements (``shardlab.validation.inference``); the rates are the
generation's (``serving.rates.RATE_FIELDS``)."""
_FRACTIONS = ("gpu_memory_utilization",)
_FIELDS = {f.name for f in fields(EngineProfile)} - {"id", "given"}
_TEXT = ("name", "version")
_BOOLS = ("chunked_prefill", "sliding_window_cache", "prefix_caching", "attention_dp_tp")
_CHOICES = (("kv_memory_rule", KV_RULES), ("kv_admission", ADMISSION), ("scheduling", SCHEDULING),
            ("chunked_scheduling", SCHEDULING), ("decode_groups_query_heads", GQA_KERNELS))


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
    for key, choices in _CHOICES:
        if d[key] not in choices:
            raise ShardlabError(f"{where}: engine '{name}' {key} must be one of {', '.join(choices)}, got {d[key]!r}")
    for key in _TEXT:
        if not isinstance(d[key], str) or not d[key]:
            raise ShardlabError(f"{where}: engine '{name}' {key} must be text")
    for key in _FIELDS - {"sources", "small_gpu_ids", *_TEXT, *_BOOLS, *(k for k, _ in _CHOICES)}:
        v = d[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (key in _FRACTIONS and not 0 < v <= 1):
            raise ShardlabError(f"{where}: engine '{name}' field '{key}' must be a "
                                f"{'share in (0, 1]' if key in _FRACTIONS else 'number ≥ 0'}, got {v!r}")
    for key in _BOOLS:
        if not isinstance(d[key], bool):
            raise ShardlabError(f"{where}: engine '{name}' {key} must be true or false")
    ids = d["small_gpu_ids"]
    if not isinstance(ids, list) or not all(isinstance(x, str) for x in ids):
        raise ShardlabError(f"{where}: engine '{name}' small_gpu_ids must be a list of GPU ids")
    ints = ("kv_block_size", "max_num_seqs", "max_num_batched_tokens", "scheduler_steps", "cuda_graph_max_batch",
            "small_gpu_max_num_seqs", "small_gpu_max_num_batched_tokens")
    vals = {k: (int(d[k]) if k in ints else tuple(ids) if k == "small_gpu_ids" else d[k]) for k in _FIELDS}
    if any(vals[k] < 1 for k in ints if k != "cuda_graph_max_batch"):
        raise ShardlabError(f"{where}: engine '{name}' kv_block_size, max_num_seqs, max_num_batched_tokens, "
                            f"scheduler_steps and the small-GPU values must be at least 1")
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
    """The profile of ``name`` (default vllm: today's V1 engine); training framework ids and unknown ids are refused."""
    name = (name or "vllm").lower()
    engines = builtin_engines()
    if name in TRAINING_FRAMEWORKS:
        raise ShardlabError(f"{name} is a training framework; under --inference --engine names a serving engine: "
                            f"{', '.join(engines)}")
    if name not in engines:
        raise ShardlabError(f"unknown serving engine '{name}'{did_you_mean(name, engines)}; use one of {', '.join(engines)}")
    return engines[name]
