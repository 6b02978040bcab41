"""Published serving measurements, shardlab's predictions of them, and the engine fit (``validate --inference``).

The rows live in ``inference_runs.yaml`` (a ``sources`` block per publication: citation, engine, tag, stated
settings; ``runs`` inheriting them). Each run becomes a ServeCase (``serving.case``) and is predicted by the
steady-state model (``serving.steady``). Errors are (predicted − measured) / measured per metric.

The fit (rates per GPU generation, host costs per engine version) is in ``validation.inference_fit``; the targets,
the summaries and the leave-one-source-out folds (``validate``) in ``validation.inference_loso``. Families for the
targets: engine version × GPU generation.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import numpy as np

from shardlab.errors import ShardlabError
from shardlab.serving.engines import FITTED, EngineProfile, get_engine
from shardlab.serving.rates import RATE_FIELDS
from shardlab.serving.step import Kernels

RUNS_FILE = Path(__file__).parent / "inference_runs.yaml"
SETTINGS = ("gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "scheduler_steps", "chunked_prefill",
            "cuda_graph_max_batch", "sliding_window_cache")
"""Engine settings a source or run may state (they replace the engine's defaults)."""
METRICS = {"output_tokens_per_s": "throughput", "requests_per_s": "throughput", "ttft_s": "ttft", "tpot_s": "tpot",
           "e2e_s": "tpot", "input_tokens_per_s": "throughput"}
"""Measured metric -> the target it counts for (e2e of a static batch is per-token latency × tokens)."""
_RUN_KEYS = {"id", "source", "model", "gpu", "tp", "pp", "weights", "kv_cache", "activations", "group_size", "isl", "osl",
             "mode", "requests", "qps", "concurrency", "batch", "target", "dataset", "build", "settings", "assumed",
             "ttft_stat", "tpot_stat", "e2e_stat", "prefix_hit_rate", "speculative_tokens", "draft",
             "acceptance_length", "ep", "dp_attention", "redundant_experts", "two_batch_overlap", "phase"} | set(METRICS)
PHASES = {None: 0, "prefill": 1, "decode": 2}
"""A run measured on one phase alone (disaggregated serving measured pool by pool, as DeepSeek and SGLang publish):
'prefill' counts the input tokens/s of prefill-only steps of ``batch`` prompts, 'decode' the output tokens/s of
decode-only cycles of ``batch`` sequences at their mean context (the prompt and half the output), a speculative
cycle's draft steps and verification included."""
_SOURCE_KEYS = {"engine", "tag", "citation", "settings", "assumed"}
TARGETS = ("latency", "throughput", "load", "info")


@dataclass(frozen=True)
class InferenceRun:
    """One published measurement with everything it was measured under."""

    id: str
    """source/gpu/model/tp/lengths/mode, unique."""
    source: str
    """Key of the source block."""
    engine: str
    """Serving engine id."""
    config: dict
    """The run's fields (model, gpu, tp, lengths, mode, ...), source settings merged in."""
    measured: dict
    """metric -> value (seconds or per second)."""
    stats: dict
    """metric -> 'mean' or 'median'."""
    settings: dict
    """Engine settings stated by the source or the run."""
    target: str
    """latency, throughput or load."""
    tag: str
    """exact or plot."""
    citation: str
    """Where the number was published."""
    assumed: str
    """What the source does not state and the row assumes."""


def load_inference_runs(path: Path = RUNS_FILE) -> list[InferenceRun]:
    """Every run of the file, strictly checked."""
    from shardlab.catalog import load_yaml

    data = load_yaml(path)
    if not isinstance(data, dict) or set(data) != {"sources", "runs"}:
        raise ShardlabError(f"{path}: expected the sections 'sources' and 'runs'")
    out = []
    for r in data["runs"]:
        unknown = set(r) - _RUN_KEYS
        src = data["sources"].get(r.get("source"))
        if unknown or src is None or set(src) - _SOURCE_KEYS:
            raise ShardlabError(f"{path}: run {r.get('id')}: unknown fields {sorted(unknown)} or source {r.get('source')!r}")
        settings = {**(src.get("settings") or {}), **(r.get("settings") or {})}
        if set(settings) - set(SETTINGS) or r.get("target") not in TARGETS:
            raise ShardlabError(f"{path}: run {r['id']}: settings must be among {SETTINGS}, target among {TARGETS}")
        measured = {m: float(r[m]) for m in METRICS if m in r}
        stats = {m: r.get(m[:-2] + "_stat", "mean") if METRICS[m] != "throughput" else "aggregate" for m in measured}
        out.append(InferenceRun(r["id"], r["source"], src["engine"], dict(r), measured, stats, settings, r["target"],
                                src["tag"], src["citation"], " ".join(x for x in (src.get("assumed"), r.get("assumed")) if x)))
    return out


def run_engine(run: InferenceRun, engine: EngineProfile | None = None) -> EngineProfile:
    """The run's engine profile with the settings its source states."""
    return (engine or get_engine(run.engine)).with_settings(**run.settings)


def run_case(run: InferenceRun, catalog, engine: EngineProfile | None = None):
    """The ServeCase of a run: its model on one TP×PP replica of its GPU, precision, engine and lengths."""
    from shardlab.serving.case import prepare
    from shardlab.serving.precision import make_precision
    from shardlab.specs.hardware import Cluster

    c = run.config
    acc = catalog.accelerator(c["gpu"])
    dp = c.get("ep", 1) // c["tp"] if c.get("dp_attention") else 1
    cluster = Cluster(acc, c["tp"] * c.get("pp", 1) * dp, acc.system["gpus_per_node"], catalog.link(acc.system["intra_link"]),
                      catalog.link(acc.system["inter_link"]))
    prec = make_precision(c.get("weights", "bf16"), c.get("group_size"), c.get("kv_cache", "bf16"), c.get("activations"),
                          acc.peak_tflops)
    eng = run_engine(run, engine)
    spec = catalog.model(c["model"])
    from shardlab.serving.speculative import draft_spec, make_speculation

    speculation = make_speculation(c.get("speculative_tokens"), c.get("draft"), length=c.get("acceptance_length"))
    return prepare(spec, cluster, eng, tp=c["tp"], pp=c.get("pp", 1), precision=prec,
                   prompt_len=c["isl"], output_len=c["osl"], scheduler_steps=eng.scheduler_steps,
                   prefix_hit_rate=float(c.get("prefix_hit_rate", 0.0)), speculation=speculation,
                   draft_spec=draft_spec(spec, speculation.draft, catalog) if speculation else None,
                   ep=c.get("ep", 1), dp_attention=bool(c.get("dp_attention", False)),
                   redundant_experts=int(c.get("redundant_experts", 0)),
                   two_batch_overlap=bool(c.get("two_batch_overlap", False)))


def run_mode(run: InferenceRun, capacity: int) -> tuple[int, float]:
    """(steady.MODES index, n): offline runs whose requests all fit at once are one static batch."""
    c = run.config
    if c["mode"] == "batch":
        return 0, float(c["batch"])
    if c["mode"] == "offline":
        return (0, float(c["requests"])) if c["requests"] <= capacity else (1, float(c["requests"]))
    if c["mode"] == "concurrency":
        return 1, float(c["concurrency"])
    return 2, float(c["qps"])


@dataclass
class Prepared:
    """Runs turned into arrays once, so fits re-evaluate only the engine parameters."""

    runs: list[InferenceRun]
    """The runs, in order."""
    arrays: object
    """Their ServeCases as ``steady.Arrays``."""
    mode: np.ndarray
    """``steady.MODES`` index per run."""
    n: np.ndarray
    """Batch, clients or arrival rate per run."""
    steps: np.ndarray
    """Scheduler steps per run (the step overheads are spread over them)."""
    phase: np.ndarray
    """``PHASES`` index per run (0: the whole request)."""
    cases: list = field(repr=False, default_factory=list)
    """The ServeCases."""
    generations: list = field(default_factory=list)
    """GPU generation per run (whose rates it uses)."""
    moe: list = field(default_factory=list)
    """Per run: it serves a mixture-of-experts model (``moe_run``, from the run's catalog): predicted, never fitted."""
    pinned: dict = field(default_factory=dict)
    """generation -> {rate field: value} the fit does not move: the 16-bit GEMM share of a generation whose matmul
    curve the training fit measured (its max_fraction, catalog/data/fitted.yaml), one curve for training and serving."""
    waves: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Per run: the full waves of an offline run that runs in waves (``offline_waves``), else 0."""
    tail: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Per run: the requests of its last, partial wave (0: none, or no waves)."""


def offline_waves(run: InferenceRun, case) -> tuple[int, int]:
    """(full waves, requests of the last partial wave) of an offline run that runs in waves, else (0, 0).

    An engine that admits a request only when the KV blocks of its whole output are free (``kv_admission``
    'reserve': TensorRT-LLM's GUARANTEED_NO_EVICT capacity scheduler) given N requests of one length each, all
    queued at once (trtllm-bench's offline mode with ``token-norm-dist`` at stdev 0), admits as many as its blocks
    hold (the replica's capacity C), and admits more only as those finish: they were admitted together and have the
    same length, so they finish together, and the next C start. The run is ⌊N/C⌋ full waves and one of N mod C
    requests, each a batch prefilled then decoded to the end (the steady state's ``batch`` mode at that size): the
    last wave runs its decode steps nearly as long with fewer sequences. (An engine that admits on demand, vLLM's
    and SGLang's, lets the next requests in as blocks free during decode and does not run in waves.) The prefills
    of a wave spread over its first steps (the token budget admits a few prompts a step), a small share of a decode
    of hundreds of steps: taken as one batch."""
    c = run.config
    if (c.get("mode") != "offline" or case.engine.kv_admission != "reserve" or case.capacity < 1
            or c["requests"] <= case.capacity):
        return 0, 0
    return divmod(int(c["requests"]), int(case.capacity))


def prepare_runs(runs: list[InferenceRun], catalog) -> Prepared:
    from shardlab.serving.steady import arrays

    cases = [run_case(r, catalog) for r in runs]
    modes = [run_mode(r, c.capacity) for r, c in zip(runs, cases)]
    gens = [generation_of(r, catalog) for r in runs]
    waves = np.array([offline_waves(r, c) for r, c in zip(runs, cases)], dtype=float).reshape(-1, 2)
    return Prepared(runs, arrays(cases), np.array([m for m, _ in modes]), np.array([n for _, n in modes], dtype=float),
                    np.array([c.scheduler_steps for c in cases], dtype=float),
                    np.array([PHASES[r.config.get("phase")] for r in runs]), cases, gens,
                    moe=[moe_run(r, catalog) for r in runs],
                    pinned={g: pinned_rates(c.cluster.accelerator) for g, c in zip(gens, cases)
                            if pinned_rates(c.cluster.accelerator)},
                    waves=waves[:, 0], tail=waves[:, 1])


def pinned_rates(acc) -> dict:
    """Serving rates ``acc``'s generation takes from elsewhere instead of the serving fit: the large-shape 16-bit
    GEMM share is the training fit's matmul max_fraction where the training runs measured the generation (its
    curve's source says 'fitted'), so prefill GEMMs and training GEMMs run on one curve."""
    curve = acc.efficiency
    if curve is None or not str(curve.source).startswith("fitted"):
        return {}
    return {"gemm16_efficiency": float(curve.max_fraction)}


FIELDS = RATE_FIELDS + FITTED
"""Every fitted field: the generation's six rates, then the engine's five overheads."""
SHARES = set(RATE_FIELDS)
"""Fields that are shares in (0, 1] (fitted in logit space; the rest in log space)."""
_KERNEL_OF = {"weight_bandwidth_efficiency": "weight_bandwidth_efficiency", "kv_bandwidth_efficiency": "kv_bandwidth_efficiency",
              "gemm16_efficiency": "gemm_efficiency", "gemm8_efficiency": "gemm8_efficiency",
              "gemm4_efficiency": "gemm4_efficiency", "attention_efficiency": "attention_efficiency"}


def expert_parallel(run: InferenceRun) -> bool:
    """The run serves a MoE model with expert parallelism (``serving.moe``)."""
    return int(run.config.get("ep", 1)) > 1


def moe_run(run: InferenceRun, catalog) -> bool:
    """The run serves a mixture-of-experts model of ``catalog``, with expert parallelism or without: predicted, never
    fitted, as the training fit treats MoE runs (``validation.fit.fitted_runs``): small experts' grouped GEMMs, the
    routing and the dispatch carry no fitted value, so the generation's rates come from the dense rows."""
    return expert_parallel(run) or catalog.model(str(run.config["model"])).moe is not None


def fitted(prep: Prepared, idx: np.ndarray) -> np.ndarray:
    """Of ``idx``, the runs the fit sees: the latency and throughput target rows (informational and moderate-load
    rows are scored, never fitted), less the mixture-of-experts ones (``moe_run``), whose mechanisms (grouped GEMMs,
    routing, all-to-all over the links, the cited imbalance) carry no fitted value, so their rows are predicted from
    the dense rows' rates. A generation or
    engine only informational rows cover is therefore unseen in a fold (``unseen_from_others``)."""
    return np.array([i for i in idx if not prep.moe[i]
                     and prep.runs[i].target in ("latency", "throughput")], dtype=int)


def family_of(run: InferenceRun, generation: str, moe: bool = False) -> str:
    """Family of a run for the targets: engine version × GPU generation; MoE runs (``moe``: ``moe_run``) form their
    own, with expert parallelism (MoE-EP) or without (MoE)."""
    kind = " MoE-EP" if expert_parallel(run) else " MoE" if moe else ""
    return f"{run.engine}{kind} × {generation}"


def generation_of(run: InferenceRun, catalog) -> str:
    """The GPU generation a run's rates come from."""
    return catalog.accelerator(run.config["gpu"]).generation or "default"


@dataclass(frozen=True)
class Params:
    """Fitted values: rates per GPU generation and overheads per engine."""

    rates: dict
    """generation -> RATE_FIELDS -> share."""
    engines: dict
    """engine id -> FITTED -> value (µs)."""

    def per_run(self, prep: Prepared, idx: np.ndarray) -> dict:
        """field -> array over ``idx`` of each run's value (its generation's rate, its engine's overhead)."""
        out = {}
        for f in RATE_FIELDS:
            out[f] = np.array([self.rates[prep.generations[i]][f] for i in idx], dtype=float)
        for f in FITTED:
            out[f] = np.array([self.engines[prep.runs[i].engine][f] for i in idx], dtype=float)
        return out


def _kernels(prep: Prepared, idx: np.ndarray, values: dict) -> tuple[Kernels, np.ndarray]:
    """Kernels of runs ``idx`` with ``values`` (field -> array over idx); the fixed per-case fields (GEMM
    half-size, GQA grouping, CUDA-graph sizes) stay the prepared cases'."""
    from shardlab.serving.steady import take

    base = take(prep.arrays.kernels, idx)
    steps = prep.steps[idx]
    kw = {f.name: getattr(base, f.name) for f in fields(Kernels)}
    kw.update({_KERNEL_OF[f]: values[f] for f in RATE_FIELDS})
    kw.update(step_overhead_s=values["step_overhead_us"] * 1e-6 / steps, seq_overhead_s=values["seq_overhead_us"] * 1e-6 / steps,
              layer_overhead_s=values["layer_overhead_us"] * 1e-6, first_token_overhead_s=values["first_token_overhead_us"] * 1e-6,
              eager_layer_overhead_s=values["eager_layer_overhead_us"] * 1e-6)
    return Kernels(**kw), values["request_overhead_us"] * 1e-6


def predict(prep: Prepared, values: dict | Params | None = None, index: np.ndarray | None = None) -> dict:
    """Predicted metrics (arrays over runs, or over ``index``), with the catalog's values, a ``Params``, or
    ``values`` (field -> array with one value per entry of ``index``)."""
    from shardlab.serving.steady import fluid, take

    idx = np.arange(len(prep.runs)) if index is None else index
    a = take(prep.arrays, idx)
    if values is not None:
        if isinstance(values, Params):
            values = values.per_run(prep, idx)
        k, req = _kernels(prep, idx, values)
        a = replace(a, kernels=k, request_overhead_s=req)
    out = fluid(a, prep.mode[idx], prep.n[idx])
    _waves(prep, idx, a, out)
    phase = prep.phase[idx]
    out["input_tokens_per_s"] = np.zeros(len(idx))
    if np.any(phase > 0):                        # one phase alone: the step of the batch (``PHASES``)
        from shardlab.serving.step import step_time

        B = prep.n[idx]
        from shardlab.serving.cycle import cycle_time

        prefill = step_time(a.whole, a.kernels, 0.0, 0.0, B * a.S, B * a.S * a.L, B)
        # a decode cycle (``cycle.cycle_time``: pipelined over the stages' micro-batches): the verification step
        # and the draft's k steps with speculation, each sequence gaining the acceptance length; without, one step
        decode = cycle_time(a, B, B * a.ctx, seqs=B)
        out["input_tokens_per_s"] = np.where(phase == 1, B * a.S / prefill, 0.0)
        out["output_tokens_per_s"] = np.where(phase == 2, B * a.spec_accept / decode, out["output_tokens_per_s"])
    return out


def _waves(prep: Prepared, idx: np.ndarray, a, out: dict) -> None:
    """Replace the steady state of the offline runs that run in waves (``offline_waves``) by their waves: full ones
    of the replica's capacity C and a last one of the rest, each a static batch; throughput = N·O / the waves' time."""
    from shardlab.serving.steady import fluid, take

    full = prep.waves[idx] if len(prep.waves) else np.zeros(len(idx))
    pos = np.flatnonzero(full > 0)
    if not len(pos):
        return
    sub = take(a, pos)
    cap, tail, k = sub.capacity, prep.tail[idx][pos], full[pos]
    zero = np.zeros(len(pos), dtype=int)
    one = fluid(sub, zero, cap)
    last = fluid(sub, zero, np.maximum(tail, 1.0))
    t = k * cap / one["requests_per_s"] + np.where(tail > 0, tail / last["requests_per_s"], 0.0)
    n = k * cap + tail
    for key in out:
        if key.endswith("_per_s"):
            out[key] = np.array(out[key], dtype=float)
    out["requests_per_s"][pos] = n / t
    out["output_tokens_per_s"][pos] = n * sub.O / t


def _pairs(prep: Prepared, idx: np.ndarray, targets=("latency", "throughput")) -> list[tuple[int, int, str]]:
    """(position in idx, run index, metric) of the measurements that count for ``targets``."""
    out = []
    for pos, i in enumerate(idx):
        r = prep.runs[i]
        if r.target not in targets:
            continue
        for m in r.measured:
            if r.target in ("load", "info") or (METRICS[m] == "throughput") == (r.target == "throughput"):
                out.append((pos, int(i), m))
    return out


def errors(prep: Prepared, preds: dict, idx: np.ndarray, targets=TARGETS) -> list[dict]:
    """One entry per (run, metric): predicted, measured, error (inf predictions give error None)."""
    out = []
    for pos, i, m in _pairs(prep, idx, targets):
        p, meas = float(preds[m][pos]), prep.runs[i].measured[m]
        out.append({"run": prep.runs[i].id, "source": prep.runs[i].source, "engine": prep.runs[i].engine,
                    "generation": prep.generations[i], "family": family_of(prep.runs[i], prep.generations[i], prep.moe[i]),
                    "target": prep.runs[i].target, "metric": m, "group": METRICS[m], "stat": prep.runs[i].stats[m],
                    "measured": meas, "predicted": p if np.isfinite(p) else None,
                    "error": (p - meas) / meas if np.isfinite(p) else None})
    return out
