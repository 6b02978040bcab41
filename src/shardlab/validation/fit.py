"""Fit the few shared efficiencies of the step-time model to published runs, and cross-validate the fit.

What is fitted (nothing per run): for each GPU generation with runs, the matmul curve's ceiling (max_fraction)
and the HBM streaming share; shared by all generations, the matmul curve's shape (half_size) and the share of a
compute window overlapped communication hides under; for frameworks whose host work can stall the GPU, the host
time per block pass, and for DeepSpeed's pipeline engine the host time per micro-batch pass. Everything else in a prediction comes from sources.

Objective: weighted least squares on log(predicted / measured), each run weighted 1/sqrt(runs in its family)
so that one large publisher does not decide a generation alone, plus a Gaussian prior on every parameter (the
value its source suggests, PRIOR_SIGMA wide) weighed against RUN_SIGMA: a maximum-a-posteriori fit. Solver: Levenberg-Marquardt on bounded
parameters (a logistic map keeps each inside its range), with finite differences computed in one vectorised
``estimate.step.evaluate`` call per run (all perturbed parameter sets at once).

``cross_validate`` refits without each source in turn and predicts that source (leave-one-source-out): the
figure the README quotes. The solver itself (Levenberg-Marquardt over all problems in lockstep, the folds' restart)
is ``validation.fit_solve``; this module says what is fitted, how a run is predicted and the switches.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

import numpy as np

from shardlab.validation.fit_solve import Objective, Problem, solve_restarted, to_theta

GENERATION_FIELDS = {"max_fraction": (0.35, 0.95, 0.72), "memory": (0.3, 0.98, 0.85)}
"""(low, high, default prior) of each generation's fitted efficiencies. The attention-kernel shares are not fitted:
they come from the kernels' own papers (catalog/data/efficiencies.yaml)."""
GENERATION_PRIORS: dict = {}
SHARED_FIELDS = {"half_size": (10.0, 800.0, 100.0), "overlap": (0.3, 1.0, 0.7)}
"""(low, high, prior) of numbers every generation shares: the matmul curve's shape (tile quantisation and occupancy
of cuBLAS kernels depend on the GEMM's dimensions in tiles, similar across NVIDIA generations); only runs with
narrow GEMMs (TP shards, small models) inform it, and most of those are on Ampere. Likewise the share of a compute
window overlapped communication hides under (SM and memory contention, stream ordering): only runs whose
collectives rival their compute inform it."""
FRAMEWORK_FIELDS = {"layer_host_s": (0.0, 0.02, 0.0)}
"""(low, high, prior) of each framework's fitted mechanisms."""
HOST_STALL_FRAMEWORKS = ("deepspeed", "pytorch-fsdp", "torchtitan", "kempnerforge")
"""Frameworks whose host work per block can stall the GPU, so their layer_host_s is fitted (others keep 0): FSDP1's
rate limiter makes the host wait for the all-gather two units back before issuing the next (Zhao et al. 2023 §3.4,
limit_all_gathers); DeepSpeed's ZeRO-3 parameter coordinator and activation checkpointing run per-module Python
with stream synchronisations (deepspeed/runtime/zero/partitioned_param_coordinator.py, activation_checkpointing/);
FSDP2 (torchtitan, KempnerForge) runs per-parameter DTensor hooks and the all-gather copy-in/copy-out on the host
for every unit (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py)."""
PIPELINE_ENGINE_FIELDS = {"pipeline_host_s": (0.0, 0.2, 0.0)}
"""(low, high, prior) of a pipeline engine's fitted mechanisms."""
PIPELINE_ENGINE_FRAMEWORKS = ("deepspeed",)
"""Frameworks whose pipeline engine issues the schedule from the host, one instruction at a time, so their
pipeline_host_s (per micro-batch, pass and stage) is fitted: DeepSpeed's PipelineEngine interprets TrainSchedule's
instructions in Python (deepspeed/runtime/pipe/engine.py, _exec_schedule: LoadMicroBatch, ForwardPass,
SendActivation, RecvActivation, BackwardPass, SendGrad, RecvGrad) with blocking point-to-point transfers
(deepspeed/runtime/pipe/p2p.py); Megatron-Core's schedules issue the same work asynchronously (no such term)."""
SWITCHES = {"zero3_comm_per_gpu_nic": ("deepspeed", False)}
"""Discrete mechanisms the fit chooses, field -> (framework, prior): each fit (the full one and every
leave-one-source-out fold) is solved once per value and keeps the value whose objective is lower; where no run the
fit sees tells the values apart (equal objectives), the prior stands. ``zero3_comm_per_gpu_nic``: whether DeepSpeed
ZeRO-3's gathers and reduce-scatters leave through each rank's own NIC (``rates.hardware.group_link``) instead of the
node's NICs together, as NCCL's rings use them (one channel per NIC: NVIDIA NCCL documentation, 'NCCL_CROSS_NIC'
and 'NCCL_MIN_NCHANNELS'), the prior. Only DeepSpeed ZeRO-3 runs across nodes inform it."""
PRIOR_SIGMA = {"pipeline_host_s": 0.02, "max_fraction": 0.1, "half_size": 50.0, "memory": 0.1, "overlap": 0.1,
               "layer_host_s": 0.003}
"""How far each parameter plausibly sits from its prior (one standard deviation): large GEMMs reach 0.7-0.85 of
peak with cuBLAS (NVIDIA Matrix Multiplication Background guide, 'GPU performance background'); overlapped collectives slow concurrent compute
kernels by a fifth to a third (Rashidi et al. 2021 §3; Pati et al. 2024 §2.3), hence an overlap prior of 0.7;
host stalls per block are milliseconds at most."""
RUN_SIGMA = 0.05
"""Typical log error of one run (published throughputs, our physics): the scale priors are weighed against (a
parameter one PRIOR_SIGMA from its prior costs as much as one run 5% off: a Gaussian prior, MAP estimate)."""


@dataclass(frozen=True)
class Param:
    """One fitted number."""

    scope: str
    """'generation', 'framework' or 'shared' (every generation)."""
    key: str
    """Generation (ampere, hopper) or framework id."""
    field: str
    """A key of GENERATION_FIELDS or FRAMEWORK_FIELDS."""
    lo: float
    hi: float
    prior: float

    @property
    def name(self) -> str:
        return f"{self.key}.{self.field}"


@dataclass
class FittedParams:
    """Fitted values by parameter name, and how they apply to a catalog."""

    values: dict[str, float]
    """'hopper.max_fraction' -> 0.61, 'deepspeed.layer_host_s' -> 0.005, ..."""
    runs: int = 0
    """Runs the fit used."""
    rms_log_error: float = 0.0
    """Root-mean-square log error of the fit on those runs."""
    held_out: str | None = None
    """The source left out (cross-validation), or None for the fit on every run."""
    extra: dict = field(default_factory=dict)

    def apply(self, catalog):
        """A copy of ``catalog`` whose generations and frameworks carry these values."""
        from copy import copy

        from shardlab.specs.hardware import MatmulEfficiency

        cat = copy(catalog)
        gens = {k: dict(v) for k, v in catalog.generations.items()}
        fws = dict(catalog.frameworks)
        for name, v in self.values.items():
            key, fld = name.rsplit(".", 1)
            if fld in GENERATION_FIELDS or fld in SHARED_FIELDS:
                for g in ([gens[key]] if key != "shared" else gens.values()):
                    m = g["matmul"]
                    if fld in ("max_fraction", "half_size"):
                        g["matmul"] = MatmulEfficiency(v if fld == "max_fraction" else m.max_fraction,
                                                       v if fld == "half_size" else m.half_size, m.source)
                    else:
                        g[fld] = v
            else:
                fws[key] = replace(fws[key], **{fld: bool(v) if fld in SWITCHES else v})
        cat.generations, cat.frameworks = gens, fws
        cat.accelerators = {k: _regeneration(cat, a) for k, a in catalog.accelerators.items()}
        return cat


def _regeneration(cat, acc):
    """Re-resolve an accelerator's efficiencies from (possibly refitted) generation entries."""
    if acc.generation not in cat.generations or not acc.efficiency_source.startswith(f"{acc.generation} generation"):
        return acc
    return cat.resolve_efficiencies(replace(acc, efficiency=None, attention_efficiency=None, memory_efficiency=None,
                                            overlap_efficiency=None, efficiency_source=""))


# ---- preparing runs for fast, vectorised evaluation ------------------------------------------------
@dataclass
class _Prepared:
    run: object
    spec: object
    cluster: object
    wl: object
    cands: dict
    stage_layers: object
    recompute_modules: object
    generation: str
    framework: str


def _prepare(run, catalog) -> _Prepared:
    from shardlab.estimate.workload import workload_for
    from shardlab.layout import layouts_to_arrays
    from shardlab.validation import predict_inputs

    spec, lay, cluster, kw = predict_inputs(run, catalog)
    fw = catalog.framework(run.framework)
    wl = workload_for(fw, **kw)
    cands = {k: v[0] for k, v in layouts_to_arrays([lay]).items()}
    return _Prepared(run, spec, cluster, wl, cands, lay.stage_layers, lay.recompute_modules,
                     cluster.accelerator.generation, run.framework)


def _predict_batch(p: _Prepared, params: list[Param], thetas: np.ndarray) -> np.ndarray:
    """Predicted metric of one run for K parameter sets (thetas: K × P)."""
    from shardlab.estimate.step import evaluate
    from shardlab.rates.hardware import matmul_curve, memory_efficiency, overlap_efficiency
    from shardlab.specs.hardware import MatmulEfficiency

    K = thetas.shape[0]
    acc = p.cluster.accelerator
    curve, _ = matmul_curve(acc)                 # a generation without fitted entries takes the defaults (rates.hardware)
    cur = {"max_fraction": curve.max_fraction, "half_size": curve.half_size,
           "memory": memory_efficiency(acc), "overlap": overlap_efficiency(acc),
           "layer_host_s": p.wl.layer_host_s, "pipeline_host_s": p.wl.pipeline_host_s}
    vals = {k: np.full(K, float(v)) for k, v in cur.items()}
    for j, prm in enumerate(params):
        if prm.scope == "shared" or (prm.scope == "generation" and prm.key == p.generation) \
                or (prm.scope == "framework" and prm.key == p.framework):
            vals[prm.field] = thetas[:, j]
    acc_k = replace(acc, efficiency=MatmulEfficiency(vals["max_fraction"], vals["half_size"]),
                    memory_efficiency=vals["memory"], overlap_efficiency=vals["overlap"])
    wl_k = replace(p.wl, layer_host_s=vals["layer_host_s"], pipeline_host_s=vals["pipeline_host_s"])
    cands = {k: np.full(K, v) for k, v in p.cands.items()}
    out = evaluate(p.spec, replace(p.cluster, accelerator=acc_k), wl_k, cands, stage_layers=p.stage_layers, memory=False,
                   recompute_modules=p.recompute_modules)
    run = p.run
    if run.metric == "tokens_per_s_per_gpu":
        return out["tokens_per_s"] / p.cluster.num_gpus
    return out["hardware_tflops_per_gpu"] if run.convention == "hardware" else out["model_tflops_per_gpu"]


def default_params(runs, catalog) -> list[Param]:
    """The parameters the runs can inform: every generation and framework with an in-target run."""
    gens = sorted({catalog.accelerator(r.gpu).generation for r in runs})
    fws = sorted({r.framework for r in runs})
    out = [Param("shared", "shared", fld, lo, hi, prior) for fld, (lo, hi, prior) in SHARED_FIELDS.items()]
    for g in gens:
        if g not in catalog.generations:
            continue
        for fld, (lo, hi, prior) in GENERATION_FIELDS.items():
            out.append(Param("generation", g, fld, lo, hi, prior))
    for f in fws:
        if f not in HOST_STALL_FRAMEWORKS:
            continue
        for fld, (lo, hi, prior) in FRAMEWORK_FIELDS.items():
            out.append(Param("framework", f, fld, lo, hi, prior))
        if f in PIPELINE_ENGINE_FRAMEWORKS:
            out += [Param("framework", f, fld, lo, hi, prior) for fld, (lo, hi, prior) in PIPELINE_ENGINE_FIELDS.items()]
    return out


def family_weights(runs, catalog) -> np.ndarray:
    from shardlab.validation import family_of

    fam = [family_of(r, catalog) for r in runs]
    counts = defaultdict(int)
    for f in fam:
        counts[f] += 1
    return np.array([1 / np.sqrt(counts[f]) for f in fam])


def _result(pb: Problem, prepared: list, runs: list) -> FittedParams:
    theta = to_theta(pb.params, pb.u)
    preds = np.array([_predict_batch(prepared[int(r)], pb.params, theta[None, :])[0] for r in pb.members])
    meas = np.array([runs[int(r)].measured for r in pb.members])
    rms = float(np.sqrt(np.mean(np.log(preds / meas) ** 2)))
    return FittedParams({**{p.name: float(t) for p, t in zip(pb.params, theta)}, **pb.switches}, len(pb.members), rms,
                        pb.held_out)


def fitted_runs(runs, catalog) -> list:
    """The runs a fit sees: in target, on a GPU generation with fitted efficiencies (catalog/data/efficiencies.yaml),
    of a dense model. A generation without an entry (Blackwell) is predicted from the default curve and never fitted:
    its runs would otherwise move the shared values (half size, overlap) that the fitted generations' runs set.
    Mixture-of-experts runs are predicted, never fitted, for the same reason: their grouped GEMMs, dispatch and host
    work are mechanisms of their own, not what the dense runs' efficiencies measure."""
    def dense(r):
        m = r.config.get("model")
        return not (isinstance(m, str) and catalog.model(m).moe is not None)

    return [r for r in runs if not r.informational and catalog.accelerator(r.gpu).generation in catalog.generations
            and dense(r)]


def _with_switch(catalog, fld: str, value: bool):
    """A copy of ``catalog`` whose framework ``SWITCHES[fld][0]`` has ``fld`` = ``value``."""
    from copy import copy

    cat = copy(catalog)
    fw = SWITCHES[fld][0]
    cat.frameworks = {**catalog.frameworks, fw: replace(catalog.frameworks[fw], **{fld: bool(value)})}
    return cat


def switch_sensitive(prep_a: list, prep_b: list, params: list) -> np.ndarray:
    """Per run: whether its prediction (at the parameters' priors) differs between two prepared sets, one per value
    of a switch. A problem none of whose runs is sensitive cannot tell the values apart."""
    theta = np.array([[p.prior for p in params]])
    out = []
    for a, b in zip(prep_a, prep_b):
        pa, pb = float(_predict_batch(a, params, theta)[0]), float(_predict_batch(b, params, theta)[0])
        out.append(abs(pa - pb) > 1e-9 * max(abs(pa), abs(pb), 1e-30))
    return np.array(out, dtype=bool)


def _objective(runs, catalog) -> Objective:
    return Objective(np.array([r.measured for r in runs]), np.sqrt(family_weights(runs, catalog)), _predict_batch,
                     PRIOR_SIGMA, RUN_SIGMA)


def _solve_switched(make_problems, runs, catalog, iterations: int, progress=None) -> list:
    """Solve ``make_problems()`` once per value of the switch and keep, for each problem, the solution with the lower
    objective; a problem none of whose runs the switch moves (``switch_sensitive``) keeps the prior's solution
    without comparing (its two objectives are equal, up to where the solver stopped). Returns the problems, each
    with ``switches`` = {'framework.field': 0.0 or 1.0}."""
    assert len(SWITCHES) == 1, "one switch: several would need their combinations solved"
    (fld, (fw, prior)), = SWITCHES.items()
    per_value = 2 if len(make_problems()) > 1 else 1          # folds are solved twice (fit_solve.solve_restarted)
    if not any(r.framework == fw for r in runs):
        prepared = [_prepare(r, catalog) for r in runs]
        best = solve_restarted(make_problems, prepared, _objective(runs, catalog), iterations, progress, 0, per_value)
        for pb in best:
            pb.switches, pb.prepared = {}, prepared
        return best
    solved = []
    for k, value in enumerate((prior, not prior)):
        cat = _with_switch(catalog, fld, value)
        prepared = [_prepare(r, cat) for r in runs]
        problems = solve_restarted(make_problems, prepared, _objective(runs, cat), iterations, progress, k * per_value,
                                   2 * per_value)
        for pb in problems:
            pb.switches = {f"{fw}.{fld}": float(value)}
            pb.prepared = prepared
        solved.append(problems)
    sensitive = switch_sensitive(solved[0][0].prepared, solved[1][0].prepared,
                                 list({p.name: p for pb in solved[0] for p in pb.params}.values()))
    return [alt if sensitive[pb.members].any() and alt.cost < pb.cost else pb for pb, alt in zip(*solved)]


def fit(runs, catalog, params: list[Param] | None = None, iterations: int = 40, progress=None) -> FittedParams:
    """Fit ``params`` (default: every parameter the runs inform) to the in-target ``runs``, from the priors."""
    runs = fitted_runs(runs, catalog)
    every = params or default_params(runs, catalog)
    [pb] = _solve_switched(lambda: [Problem(np.arange(len(runs)), every, None)], runs, catalog, iterations, progress)
    return _result(pb, pb.prepared, runs)


def cross_validate(runs, catalog, iterations: int = 40, progress=None) -> tuple[FittedParams, dict[str, FittedParams]]:
    """The fit on every in-target run, and leave-one-source-out: {source: the fit without that source's runs}, all
    solved together. Parameters no remaining run informs take their priors, never the full fit's values."""
    runs = fitted_runs(runs, catalog)
    every = default_params(runs, catalog)
    sources = sorted({r.source for r in runs})

    def make_problems():
        problems = [Problem(np.arange(len(runs)), every, None)]
        for src in sources:
            members = np.array([i for i, r in enumerate(runs) if r.source != src])
            problems.append(Problem(members, default_params([runs[i] for i in members], catalog), src))
        return problems

    problems = _solve_switched(make_problems, runs, catalog, iterations, progress)
    full = _result(problems[0], problems[0].prepared, runs)
    folds = {}
    for pb in problems[1:]:
        f = _result(pb, pb.prepared, runs)
        f.values = {**{p.name: p.prior for p in every}, **f.values}
        folds[pb.held_out] = f
    return full, folds
