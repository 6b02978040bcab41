"""Predicted vs measured: model-state bytes (must be exact), activations and step time (errors reported),
and parity of a distributed step with a single-process step on the same global batch.

Predictions come from the analytic core (``shardlab.memory.training_memory`` with precision fp32 and the
optimizer the run used; ``shardlab.estimate.estimate_training`` for the step time, when it is there).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.memory import training_memory
from shardlab.runtime.parallel.strategy import Strategy

STATE_KEYS = ("weights", "gradients", "optimizer")


@dataclass(frozen=True)
class RunShape:
    """The workload a run used (what the predictions are evaluated on)."""

    seq_len: int
    """Tokens per sequence."""
    global_batch: int
    """Sequences per step."""
    micro_batch: int
    """Sequences per micro-batch per data-parallel rank."""
    optimizer: str
    """'adamw' or 'sgd'."""

    def microbatches(self, strategy: Strategy) -> int:
        return self.global_batch // strategy.dp // self.micro_batch


def one_host(accelerator, link, ranks: int):
    """The cluster a run's predictions use: ``ranks`` accelerators on one host joined by ``link``."""
    from shardlab.specs.hardware import Cluster

    return Cluster(accelerator=accelerator, num_gpus=ranks, gpus_per_node=ranks, intra_link=link, inter_link=link)


def predicted_memory(spec, strategy: Strategy, shape: RunShape):
    """The memory model's report for this run (fp32: CPU runs are fp32)."""
    return training_memory(strategy.layout(shape.micro_batch), model=spec, precision="fp32", optimizer=shape.optimizer,
                           seq_len=shape.seq_len, microbatches=shape.microbatches(strategy), flash_attention=True,
                           dropout=False)


def memory_rows(report, ranks: list[dict], spec=None) -> list[dict]:
    """Per rank: predicted and measured weights/gradients/optimizer (exact?) and activations (error).

    Model states are predicted for each rank itself (``memory.states.rank_state_report``: its TP chunk of an
    uneven vocabulary, its own FSDP2 shard of optimizer state); activations per pipeline stage."""
    from shardlab.memory.precision import state_bytes
    from shardlab.memory.states import rank_state_report

    rows = []
    for d in ranks:
        st = report.stages[d["coords"]["pp"]]
        pred = {"weights": st.weights, "gradients": st.gradients, "optimizer": st.optimizer, "activations": st.activations}
        if spec is not None:
            rs = rank_state_report(spec, report.layout, state_bytes(report.precision, report.optimizer), d["rank"])
            pred.update(weights=rs.weights, gradients=rs.gradients, optimizer=rs.optimizer)
        ms = d.get("model_states_bytes") or {}
        act = (d.get("peak_bytes") or {}).get("saved_activations")
        meas = {k: ms.get(k) for k in STATE_KEYS}
        meas["activations"] = act
        meas["optimizer_step_counters"] = ms.get("optimizer_step_counters")
        rows.append({
            "rank": d["rank"], "stage": d["coords"]["pp"], "predicted": pred, "measured": meas,
            "states_exact": all(meas[k] == pred[k] for k in STATE_KEYS),
            "diff": {k: (meas[k] - pred[k]) if meas[k] is not None else None for k in STATE_KEYS},
            "activations_error": (st.activations - act) / act if act else None,   # (predicted − measured) / measured
        })
    return rows


def predicted_step_time(spec, strategy: Strategy, shape: RunShape, accelerator: str | None = "cpu-core",
                        link: str | None = "loopback", profile: str | None = None) -> tuple[float | None, str]:
    """(seconds, where from) from ``shardlab.estimate.estimate_training`` on one host; (None, why) if unavailable.

    With ``profile`` (a file from ``shardlab calibrate``) its accelerator, intra-node link and communication
    overlap replace the catalog defaults, unless ``accelerator``/``link`` name others."""
    est, src = predicted_estimate(spec, strategy, shape, accelerator, link, profile)
    return (est.step_time_s if est is not None else None), src


def predicted_estimate(spec, strategy: Strategy, shape: RunShape, accelerator: str | None = "cpu-core",
                       link: str | None = "loopback", profile: str | None = None):
    """(TrainingEstimate, where from), or (None, why) when the estimate is unavailable."""
    try:
        from shardlab.estimate import estimate_training
    except ImportError:
        return None, "no step-time prediction yet (shardlab.estimate is not available)"
    try:
        from shardlab.catalog import get_catalog

        cat = get_catalog([], profile=profile)
        prof = cat.profile or {}
        acc = cat.accelerator(accelerator or prof.get("gpu") or "cpu-core")
        ln = cat.link(link or prof.get("intra_link") or "loopback")
        n = strategy.world_size
        cluster = one_host(acc, ln, n)
        fw = cat.framework(prof["framework"]) if prof.get("framework") else None   # `calibrate --from-run`
        est = estimate_training(spec, strategy.layout(shape.micro_batch), cluster, seq_len=shape.seq_len,
                                global_batch=shape.global_batch, precision="fp32", optimizer=shape.optimizer,
                                dp_overlap=prof.get("comm_overlap", True) is not False, framework=fw)
        return est, f"shardlab.estimate on {n} × {acc.id} over {ln.id}" + (f" (profile {profile})" if profile else "")
    except Exception as e:  # the estimator is another module's: report, never crash the run
        return None, f"no step-time prediction ({type(e).__name__}: {e})"


def expert_dispatch(spec, strategy: Strategy, shape: RunShape, ranks: list[dict]) -> list[dict] | None:
    """The expert dispatcher's collectives per step beside `comm plan`'s (``comm.inventory``, balanced routing), per
    (op, phase): calls on every rank (they must be the plan's) and bytes per call averaged over all ranks and calls.
    Routing makes each rank's all-to-alls uneven, but every token copy is sent once each way, so the average is the
    plan's b·s·k·h·4 exactly (fp32). None without expert parallelism."""
    if strategy.ep <= 1:
        return None
    from shardlab.catalog import get_catalog
    from shardlab.comm.inventory import layout_collectives

    cat = get_catalog()
    cluster = one_host(cat.accelerator("cpu-core"), cat.link("loopback"), strategy.world_size)
    plan: dict = {}
    for i in layout_collectives(spec, strategy.layout(shape.micro_batch), cluster, seq_len=shape.seq_len,
                                microbatches=shape.microbatches(strategy), precision="fp32"):
        if i.axis == "EP":
            p = plan.setdefault(f"{i.op.replace('-', '_')}/{i.phase}", {"calls": 0, "bytes": 0})
            p["calls"] += i.calls_per_step
            p["bytes"] += i.bytes_per_call * i.calls_per_step
    measured = [r.get("expert_dispatch") or {} for r in ranks]
    rows = []
    for key in sorted(set(plan) | {k for m in measured for k in m}):
        calls = sorted({m.get(key, {}).get("calls", 0) for m in measured})
        sent = sum(m.get(key, {}).get("sent_bytes", 0) for m in measured)
        total = sum(m.get(key, {}).get("calls", 0) for m in measured)
        pc = plan.get(key, {}).get("calls", 0)
        rows.append({"collective": key, "measured_calls": calls[0] if len(calls) == 1 else calls, "predicted_calls": pc,
                     "measured_bytes_per_call": sent / total if total else None,
                     "predicted_bytes_per_call": plan[key]["bytes"] / pc if pc else None,
                     "match": calls == [pc] and bool(total) and sent == plan[key]["bytes"] * len(measured)})
    return rows


def parity(spec, data, run_dir, ranks: list[dict], seed: int = 0, numerics=None, load=None) -> dict:
    """Loss and gradients of step 0 against a single-process step on the same global batch.

    Tolerance: float32 sums in another order (slices, shards, all-reduces) differ by rounding only;
    losses agree to ~1e-6 and gradients (entries ~1e-3) to ~1e-7 absolute. We accept 1e-5 (loss) and 1e-6
    (gradients, max absolute), two orders above the rounding seen, far below any real bug (a missing
    all-reduce or a wrong shard gives errors of the size of the gradients themselves). ``numerics`` and ``load``:
    a checkpoint's (the reference is built the same way, vocabulary padding included, and loaded from it).
    """
    import torch

    from shardlab.runtime.gpt import build_model
    from shardlab.runtime.parallel.build import loss_fn

    model = build_model(spec, seed=seed, **({"numerics": numerics} if numerics is not None else {}))
    if load is not None:   # a checkpoint run: the reference starts from the same checkpoint
        load([model])
    x, y = data.batch(0)
    loss = loss_fn(model(x), y)
    loss.backward()
    ref = {n: p.grad for n, p in model.named_parameters()}
    got: dict = {}
    for p in sorted(run_dir.glob("rank*.grads.pt")):
        got.update(torch.load(p))
    missing = sorted(set(ref) - set(got))
    errs = {n: (got[n] - ref[n]).abs().max().item() for n in ref if n in got}
    worst = max(errs, key=errs.get) if errs else None
    run_loss = next((d["losses"][0] for d in ranks if d.get("losses")), None)
    loss_err = abs(run_loss - loss.item()) if run_loss is not None else None
    grad_err = errs[worst] if worst else None
    ok = not missing and grad_err is not None and grad_err <= 1e-6 and loss_err is not None and loss_err <= 1e-5
    return {"reference_loss": loss.item(), "run_loss": run_loss, "loss_abs_err": loss_err,
            "grad_max_abs_err": grad_err, "worst_tensor": worst, "tensors_compared": len(errs),
            "missing": missing, "tolerance": {"loss": 1e-5, "grad": 1e-6}, "ok": ok}


def memory_notes(rows: list[dict], strategy: Strategy) -> list[str]:
    """One line per rank whose model states differ from the prediction, with the known cause when there is one."""
    notes = []
    for r in rows:
        if r["states_exact"]:
            continue
        diffs = ", ".join(f"{k} measured {r['measured'][k]:,} B vs predicted {r['predicted'][k]:,} B"
                          for k in STATE_KEYS if r["diff"][k])
        notes.append(f"rank {r['rank']}: {diffs}")
    return notes
