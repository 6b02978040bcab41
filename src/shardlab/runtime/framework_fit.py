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

_PROBE_S = 1e-3


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


def _run_inputs(doc: dict, where: str):
    """(spec, layout, workload kwargs, measured step s, device) of one `run train --json` document."""
    from shardlab.layout import Layout
    from shardlab.runtime.train_worker import resolve_spec

    try:
        ref = doc["model_ref"]
        lay = Layout(**{k: (tuple(v) if k == "stage_layers" and v else v) for k, v in doc["layout"].items()})
        wl = doc["workload"]
        measured = doc["step_time"]["measured_median_s"]
        device = (doc.get("ranks") or [{}])[0].get("device") or "cpu"
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
        raise ShardlabError(f"{where} is not `shardlab run train --json` output of this version (needs model_ref, layout, "
                            "workload and step_time); rerun the job with --json") from None
    from shardlab import limits as L
    from shardlab.numbers import check_number

    measured = check_number(measured, f"{where}: step_time.measured_median_s", maximum=L.MAX_SECONDS, reason="31 years",
                 smallest=L.MIN_SECONDS)
    if not isinstance(wl, dict):
        raise ShardlabError(f"{where}: workload must be an object (seq_len, global_batch, ...); rerun the job with --json")
    for key, top in (("seq_len", L.MAX_SEQ_LEN), ("global_batch", L.MAX_BATCH)):
        check_number(wl.get(key), f"{where}: workload.{key}", integer=True, maximum=top)
    try:
        spec = resolve_spec(ref)
    except ShardlabError:
        raise
    except (AttributeError, TypeError, ValueError, KeyError, IndexError, OverflowError) as e:
        raise ShardlabError(f"{where}: model_ref cannot be read ({type(e).__name__}: {str(e)[:80]}); rerun the job "
                            f"with --json") from None
    return spec, lay, wl, measured, device


def calibrate_framework(docs: list[tuple[str, dict]], catalog, *, base: str, gpu: str | None = None,
                        link: str | None = None, suffix: str = "calibrated", command: str = "") -> tuple[dict, HostFit]:
    """Fit the host times of framework ``base`` to the runs; returns (catalog document, HostFit)."""
    from shardlab.estimate import estimate_training
    from shardlab.specs.hardware import Cluster

    fw = catalog.framework(base)
    prof = catalog.profile or {}
    zero_fw = replace(fw, layer_host_s=0.0, step_overhead_s=0.0)
    rows, before = [], []
    for where, doc in docs:
        spec, lay, wl, measured, device = _run_inputs(doc, where)
        acc = catalog.accelerator(gpu or prof.get("gpu") or ("cpu-core" if device == "cpu" else "h100-sxm"))
        ln = catalog.link(link or prof.get("intra_link") or ("loopback" if device == "cpu" else "nvlink4"))
        n = lay.world_size
        cluster = Cluster(accelerator=acc, num_gpus=n, gpus_per_node=n, intra_link=ln, inter_link=ln)
        kw = dict(seq_len=wl["seq_len"], global_batch=wl["global_batch"], precision=wl.get("precision", "fp32"),
                  optimizer=wl.get("optimizer", "adamw"), dp_overlap=prof.get("comm_overlap", True) is not False)
        t = {name: estimate_training(spec, lay, cluster, framework=f, **kw).step_time_s
             for name, f in (("zero", zero_fw), ("layer", replace(zero_fw, layer_host_s=_PROBE_S)),
                             ("step", replace(zero_fw, step_overhead_s=_PROBE_S)), ("base", fw))}
        rows.append((t["zero"], (t["layer"] - t["zero"]) / _PROBE_S, (t["step"] - t["zero"]) / _PROBE_S, measured))
        before.append((measured - t["base"]) / measured)
    layer_s, step_s, both = fit_host_times(rows)
    after = [(t - (t0 + layer_s * n + step_s * s)) / t for t0, n, s, t in rows]
    rms = lambda e: (sum(x * x for x in e) / len(e)) ** 0.5
    fit = HostFit(layer_s, step_s, rms(before), rms(after), len(rows), both)
    fid = f"{fw.id}-{suffix}"
    date = _dt.date.today().isoformat()
    entry = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(fw).items() if k != "id"}
    entry.update(name=f"{fw.name} (calibrated)", layer_host_s=float(f"{layer_s:.4g}"), step_overhead_s=float(f"{step_s:.4g}"),
                 source=(f"host times fitted by `{command or 'shardlab calibrate --from-run'}` on {date} to {len(rows)} "
                         f"measured run(s) (relative RMS error {fit.rel_rms_before:.1%} -> {fit.rel_rms_after:.1%}); other "
                         f"mechanisms from {fw.id}: {fw.source}"),
                 notes=f"layer_host_s per block and pass; step_overhead_s {'fitted' if both else 'held at 0 (the runs could not separate it)'}")
    # the profile section names the framework only: loaded after a hardware profile, its keys merge into that one's
    doc = {"frameworks": {fid: entry},
           "profile": {"framework": fid, "source": f"host times fitted by shardlab calibrate --from-run ({len(rows)} runs)",
                       "measured_at": date}}
    return doc, fit
