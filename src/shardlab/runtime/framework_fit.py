"""A framework profile from the user's own training runs: ``shardlab calibrate --from-run RUN.json ...``.

Each ``shardlab run train --json`` document holds a model, a layout, a workload and the measured median step time.
The step-time model is linear in the framework's two host terms (``specs/framework.py``): T = T0 + n_pass · host_layer
+ host_step, where T0 is the estimate with both at zero and n_pass the block passes (forward, backward, recomputed
forward) per step on the slowest rank. Both coefficients are read off the estimate itself (finite differences), so
the fit prices exactly what ``shardlab estimate`` will add. A non-negative least-squares fit of the relative errors
over the runs gives the two values; with one run, or runs that cannot tell them apart, only the per-block term is
fitted. The profile is a catalog YAML with a ``frameworks:`` entry (the base framework's mechanisms, the fitted host
times, the command and date) and ``profile: {framework: ID}``, so ``--profile FILE`` makes it the default.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import asdict, dataclass, replace

from shardlab.errors import ShardlabError
from shardlab.limits import MAX_FIT_BLOCKS, MAX_FIT_RUNS

_PROBE_S = 1e-3

MAX_LAYER_HOST_S = 60.0
"""The largest host time per block pass a framework entry holds (``catalog.entries.framework_from_dict``)."""
MAX_STEP_OVERHEAD_S = 3600.0
"""The largest host time per step a framework entry holds (``catalog.entries.framework_from_dict``)."""


@dataclass(frozen=True)
class HostFit:
    """The fitted host times and how well they explain the runs."""

    layer_host_s: float
    """Host time per block and pass the GPU waits for, seconds."""
    step_overhead_s: float
    """Host time per optimizer step, seconds."""
    rel_rms_before: float
    """RMS of (measured − predicted) / measured with the base framework's host times."""
    rel_rms_after: float
    """The same with the fitted host times."""
    runs: int
    """Runs fitted."""
    step_fitted: bool
    """Whether the per-step term was fitted (False: held at 0, the runs could not separate it)."""


def fit_host_times(rows: list[tuple[float, float, float, float]]) -> tuple[float, float, bool]:
    """(layer_host_s, step_overhead_s, step_fitted) minimising Σ((T0 + a·n_pass + b − T) / T)², a, b ≥ 0.

    ``rows``: (T0, n_pass, n_step, T) per run: the estimate with no host time, its coefficients and the measurement."""
    import numpy as np

    if not rows:
        raise ShardlabError("no measured runs to fit: pass `shardlab run train --json` output with --from-run")
    a = np.array([[n / t, s / t] for t0, n, s, t in rows])
    y = np.array([(t - t0) / t for t0, n, s, t in rows])
    both = len(rows) >= 2 and np.linalg.matrix_rank(a, tol=1e-9 * max(1.0, float(np.abs(a).max()))) == 2
    if both:
        sol, *_ = np.linalg.lstsq(a, y, rcond=None)
        if (sol >= 0).all():
            return float(sol[0]), float(sol[1]), True
    # one term (or a negative component): the per-block host time alone, clamped at zero
    col = a[:, 0]
    layer = float(max(0.0, col @ y / (col @ col))) if col @ col > 0 else 0.0
    return layer, 0.0, False




_DEGREES = ("dp", "tp", "pp", "cp", "ep", "vpp", "dp_replicate")
"""Layout fields that are parallel degrees: whole numbers from 1 to ``limits.MAX_GPUS``."""

_DOC_FIX = "fix the document or rerun the job with --json"


def _shown(v) -> str:
    """A value as the user wrote it in JSON (null, true, "x"), cut to 40 characters."""
    import json

    try:
        text = json.dumps(v)
    except (TypeError, ValueError):
        text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _whole(v, what: str, lo: int, hi: int) -> int:
    """A whole number in [lo, hi] (not a boolean, not a float), else one line naming ``what``."""
    if isinstance(v, bool) or not isinstance(v, int):
        kind = "a positive whole number" if lo == 1 else f"a whole number from {lo} to {hi:,}"
        raise ShardlabError(f"{what} must be {kind}, got {_shown(v)}; {_DOC_FIX}")
    if not lo <= v <= hi:
        raise ShardlabError(f"{what} must be a whole number from {lo} to {hi:,}, got {_shown(v)}; {_DOC_FIX}")
    return v


def _check_layout(raw, where: str):
    """The document's ``layout`` as a Layout: every field's type and range checked, unknown fields refused."""
    from dataclasses import fields

    from shardlab import limits as L
    from shardlab.layout import RECOMPUTE, SCHEDULES, Layout
    from shardlab.numbers import check_number

    known = [f.name for f in fields(Layout)]
    if not isinstance(raw, dict):
        raise ShardlabError(f"{where}: layout must be an object ({', '.join(known[:4])}, ...), got {_shown(raw)}; "
                            f"{_DOC_FIX}")
    unknown = [str(k) for k in raw if k not in known]
    if unknown:
        raise ShardlabError(f"{where}: layout has unknown field(s) {', '.join(unknown)[:80]}; allowed: "
                            f"{', '.join(known)}; {_DOC_FIX}")
    kw = {}
    for key, v in raw.items():
        what = f"{where}: layout.{key}"
        if key in _DEGREES:
            kw[key] = _whole(v, what, 1, L.MAX_GPUS)
        elif key == "micro_batch":
            kw[key] = _whole(v, what, 1, L.MAX_BATCH)
        elif key == "zero":
            kw[key] = _whole(v, what, 0, 3)
        elif key == "wrap":
            kw[key] = _whole(v, what, 0, L.MAX_LAYERS)
        elif key == "recompute_fraction":
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ShardlabError(f"{what} must be a number in (0, 1], got {_shown(v)}; {_DOC_FIX}")
            kw[key] = check_number(v, what, maximum=1.0, smallest=L.MIN_SHARE)
        elif key == "sequence_parallel":
            if not isinstance(v, bool):
                raise ShardlabError(f"{what} must be true or false, got {_shown(v)}; {_DOC_FIX}")
            kw[key] = v
        elif key in ("recompute", "schedule"):
            names = RECOMPUTE if key == "recompute" else SCHEDULES
            if not isinstance(v, str) or v not in names:
                raise ShardlabError(f"{what} must be one of {', '.join(names)}, got {_shown(v)}; {_DOC_FIX}")
            kw[key] = v
        elif key == "stage_layers":
            if v is None:
                kw[key] = None
                continue
            if not isinstance(v, list) or not 1 <= len(v) <= L.MAX_PIPELINE_STAGES:
                raise ShardlabError(f"{what} must be null or a list of positive whole numbers (layers per pipeline "
                                    f"stage, at most {L.MAX_PIPELINE_STAGES:,} stages), got {_shown(v)}; {_DOC_FIX}")
            kw[key] = tuple(_whole(n, f"{what}[{i}]", 1, L.MAX_LAYERS) for i, n in enumerate(v))
    return Layout(**kw)


_WORKLOAD_FLAGS = {"--seq-len": "workload.seq_len", "--global-batch": "workload.global_batch",
                   "--precision": "workload.precision", "--optimizer": "workload.optimizer"}


def _doc_terms(message: str) -> str:
    """An estimate's error in the document's words: ``--tp`` -> ``layout.tp``, ``--global-batch`` ->
    ``workload.global_batch`` (the user wrote a file, not flags)."""
    import re

    def field(m):
        flag = m.group(0)
        if flag in _WORKLOAD_FLAGS:
            return _WORKLOAD_FLAGS[flag]
        key = flag[2:].replace("-", "_")
        return f"layout.{key}" if key in _DEGREES + ("micro_batch", "zero", "wrap", "recompute", "recompute_fraction",
                                                    "sequence_parallel", "schedule", "stage_layers") else flag
    return re.sub(r"--[a-z][a-z0-9-]*", field, message)


def _in_doc(where: str, e: ShardlabError) -> ShardlabError:
    """``e`` from checking or estimating one run, naming the document and its fields."""
    text = str(e)
    return ShardlabError(text if text.startswith(where) else f"{where}: {_doc_terms(text)}")


def _resolve_model(ref, where: str, cache: dict | None = None):
    """The ModelSpec of a document's ``model_ref``. A ``hf:`` reference is read from the local Hugging Face cache only:
    a data file does not make shardlab reach the network (the Hub retries for about 25 s before failing)."""
    import os

    from shardlab.runtime.train_worker import resolve_spec

    if not isinstance(ref, str) or not ref.strip() or len(ref) > 4096:
        raise ShardlabError(f"{where}: model_ref cannot be read (must be a model name such as tiny, hf:ORG/NAME or a "
                            f"config path, got {_shown(ref)}); rerun the job with --json")
    if cache is not None and ref in cache:
        return cache[ref]
    from shardlab.catalog.hub import is_hub_ref

    hub = is_hub_ref(ref)
    old = os.environ.get("HF_HUB_OFFLINE")
    if hub:
        os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        spec = resolve_spec(ref)
    except ShardlabError as e:
        if hub and "not in the Hugging Face cache" in str(e):
            raise ShardlabError(f"{where}: model_ref {ref} is not in the local Hugging Face cache; run documents are "
                                f"resolved from the cache only (no network access): fetch it once with "
                                f"`shardlab models {ref}`") from None
        raise _in_doc(where, ShardlabError(f"model_ref {ref}: {e}")) from None
    except (AttributeError, TypeError, ValueError, KeyError, IndexError, OverflowError) as e:
        raise ShardlabError(f"{where}: model_ref cannot be read ({type(e).__name__}: {str(e)[:80]}); rerun the job "
                            f"with --json") from None
    finally:
        if hub:
            if old is None:
                os.environ.pop("HF_HUB_OFFLINE", None)
            else:
                os.environ["HF_HUB_OFFLINE"] = old
    if cache is not None:
        cache[ref] = spec
    return spec


def _run_inputs(doc: dict, where: str, specs: dict | None = None):
    """(spec, layout, workload kwargs, measured step s, device) of one `run train --json` document, every field used
    checked (type and range) with the document and field named."""
    from shardlab.layout_checks import validate
    from shardlab.memory.precision import OPTIMIZERS, PRECISIONS

    if not isinstance(doc, dict) or any(k not in doc for k in ("model_ref", "layout", "workload", "step_time")):
        raise ShardlabError(f"{where} is not `shardlab run train --json` output of this version (needs model_ref, layout, "
                            "workload and step_time); rerun the job with --json")
    ref, wl, st = doc["model_ref"], doc["workload"], doc["step_time"]
    if not isinstance(st, dict) or "measured_median_s" not in st:
        raise ShardlabError(f"{where}: step_time must be an object with measured_median_s; rerun the job with --json")
    ranks = doc.get("ranks")
    first = ranks[0] if isinstance(ranks, list) and ranks else None
    device = first.get("device") if isinstance(first, dict) else None
    device = device if isinstance(device, str) and device else "cpu"
    from shardlab import limits as L
    from shardlab.numbers import check_number

    measured = check_number(st["measured_median_s"], f"{where}: step_time.measured_median_s", maximum=L.MAX_SECONDS,
                            reason="31 years", smallest=L.MIN_SECONDS)
    if not isinstance(wl, dict):
        raise ShardlabError(f"{where}: workload must be an object (seq_len, global_batch, ...); rerun the job with --json")
    for key, top in (("seq_len", L.MAX_SEQ_LEN), ("global_batch", L.MAX_BATCH)):
        check_number(wl.get(key), f"{where}: workload.{key}", integer=True, maximum=top)
    for key, names in (("precision", PRECISIONS), ("optimizer", OPTIMIZERS)):
        if key in wl and (not isinstance(wl[key], str) or wl[key] not in names):
            raise ShardlabError(f"{where}: workload.{key} must be one of {', '.join(names)}, got {_shown(wl[key])}; "
                                f"{_DOC_FIX}")
    lay = _check_layout(doc["layout"], where)
    spec = _resolve_model(ref, where, specs)
    try:
        validate(lay, spec, None, wl["seq_len"])
    except ShardlabError as e:
        raise _in_doc(where, e) from None
    return spec, lay, wl, measured, device


def check_run_count(count: int, where: str) -> None:
    """Refuse more than MAX_FIT_RUNS runs (before any estimate)."""
    if count > MAX_FIT_RUNS:
        raise ShardlabError(f"{where}: {count:,} runs, above the limit of {MAX_FIT_RUNS} a fit reads (each costs four "
                            f"estimates); pass a representative subset, a few runs per configuration")


def calibrate_framework(docs: list[tuple[str, dict]], catalog, *, base: str, gpu: str | None = None,
                        link: str | None = None, suffix: str = "calibrated", command: str = "") -> tuple[dict, HostFit]:
    """Fit the host times of framework ``base`` to the runs; returns (catalog document, HostFit)."""
    import re

    from shardlab.estimate import estimate_training
    from shardlab.specs.hardware import Cluster

    fw = catalog.framework(base)
    prof = catalog.profile or {}
    # the runs measure the host time of the stages they ran: the calibrated profile applies it at every stage
    zero_fw = replace(fw, layer_host_s=0.0, step_overhead_s=0.0, layer_host_min_zero=0)
    files = list(dict.fromkeys(re.sub(r"(: runs)?\[\d+\]$", "", where) for where, _ in docs))
    named = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "") or "--from-run"
    check_run_count(len(docs), named)
    specs: dict = {}
    runs, blocks = [], {}
    for where, doc in docs:    # every document checked (and the work counted) before any estimate
        spec, lay, wl, measured, device = _run_inputs(doc, where, specs)
        acc = catalog.accelerator(gpu or prof.get("gpu") or ("cpu-core" if device == "cpu" else "h100-sxm"))
        ln = catalog.link(link or prof.get("intra_link") or ("loopback" if device == "cpu" else "nvlink4"))
        kw = dict(seq_len=wl["seq_len"], global_batch=wl["global_batch"], precision=wl.get("precision", "fp32"),
                  optimizer=wl.get("optimizer", "adamw"), dp_overlap=prof.get("comm_overlap", True) is not False)
        key = (doc["model_ref"], lay, acc.id, ln.id, tuple(sorted(kw.items())))
        blocks[key] = spec.num_layers
        runs.append((where, key, spec, lay, acc, ln, kw, measured))
    if sum(blocks.values()) > MAX_FIT_BLOCKS:
        raise ShardlabError(f"{named}: {len(blocks)} distinct run(s) of models with {sum(blocks.values()):,} transformer "
                            f"blocks in all, above the limit of {MAX_FIT_BLOCKS:,} a fit prices (each estimate walks every "
                            f"block); fit fewer runs, or runs of a smaller model")
    rows, before = [], []
    seen: dict = {}   # identical runs (the same job measured again) share their estimates
    for where, key, spec, lay, acc, ln, kw, measured in runs:
        if key not in seen:
            n = lay.world_size
            cluster = Cluster(accelerator=acc, num_gpus=n, gpus_per_node=n, intra_link=ln, inter_link=ln)
            try:
                seen[key] = {name: estimate_training(spec, lay, cluster, framework=f, **kw).step_time_s
                             for name, f in (("zero", zero_fw), ("layer", replace(zero_fw, layer_host_s=_PROBE_S)),
                                             ("step", replace(zero_fw, step_overhead_s=_PROBE_S)), ("base", fw))}
            except ShardlabError as e:
                raise _in_doc(where, e) from None
        t = seen[key]
        rows.append((t["zero"], (t["layer"] - t["zero"]) / _PROBE_S, (t["step"] - t["zero"]) / _PROBE_S, measured))
        before.append((measured - t["base"]) / measured)
    layer_s, step_s, both = fit_host_times(rows)
    for value, field, top in ((layer_s, "host time per block pass", MAX_LAYER_HOST_S),
                              (step_s, "host time per step", MAX_STEP_OVERHEAD_S)):
        if value > top:
            raise ShardlabError(f"{named}: the measured step times (step_time.measured_median_s up to "
                                f"{max(r[3] for r in rows):.4g} s, against {min(r[0] for r in rows):.3g} s predicted "
                                f"without host time) fit a {field} of {value:.4g} s, above the limit of {top:g} s a "
                                f"framework profile holds; check the measured times, or rerun the jobs with --json")
    after = [(t - (t0 + layer_s * n + step_s * s)) / t for t0, n, s, t in rows]
    rms = lambda e: (sum(x * x for x in e) / len(e)) ** 0.5
    fit = HostFit(layer_s, step_s, rms(before), rms(after), len(rows), both)
    fid = f"{fw.id}-{suffix}"
    date = _dt.date.today().isoformat()
    entry = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(fw).items() if k != "id"}
    entry.update(name=f"{fw.name} (calibrated)", layer_host_s=float(f"{layer_s:.4g}"), step_overhead_s=float(f"{step_s:.4g}"),
                 layer_host_min_zero=0,
                 source=(f"host times fitted by `{command or 'shardlab calibrate --from-run'}` on {date} to {len(rows)} "
                         f"measured run(s) (relative RMS error {fit.rel_rms_before:.1%} -> {fit.rel_rms_after:.1%}); other "
                         f"mechanisms from {fw.id}: {fw.source}"),
                 notes=f"layer_host_s per block and pass, at every ZeRO stage (measured on these runs); step_overhead_s {'fitted' if both else 'held at 0 (the runs could not separate it)'}")
    # the profile section names the framework only: loaded after a hardware profile, its keys merge into that one's
    doc = {"frameworks": {fid: entry},
           "profile": {"framework": fid, "source": f"host times fitted by shardlab calibrate --from-run ({len(rows)} runs)",
                       "measured_at": date}}
    return doc, fit
