"""Glue for the run commands (an Observation per run, the straggler prediction) and the aggregate's text."""

from __future__ import annotations


def observation_for(opts, nproc: int, world_size: int, kind: str, torchrun_args=()):
    """An Observation for one launch on this node (None when ``opts`` is None)."""
    if opts is None:
        return None
    from shardlab.runtime.observe.launcher import Observation
    from shardlab.runtime.train import _nnodes

    args = list(torchrun_args)
    job = args[args.index("--rdzv-id") + 1] if "--rdzv-id" in args else None
    return Observation(opts, nproc, world_size, kind=kind, job_id=job, nnodes=_nnodes(args))


def train_prediction(est, opts, source: str) -> dict | None:
    """``estimate.straggler`` applied to the run's training estimate when a slow rank is injected."""
    if opts is None or opts.slow_rank is None or est is None:
        return None
    from shardlab.estimate.straggler import straggler_effect

    eff = straggler_effect(est.breakdown, est.step_time_s, opts.slow_rank)
    return {**eff.to_dict(), "source": f"shardlab.estimate.straggler on {source}"}


SLOWEST_FROM = {"--slow-rank": "slowed with --slow-rank", "measured": "the longest compute, measured"}
"""How the slowest rank was found (``summary.slowest_rank``'s ``from``), in words."""


def slowest_phrase(rank: int, source: str) -> str:
    """The one wording of the slowest rank in every report (run train, run infer, the observability summary):
    'slowest rank 1 (slowed with --slow-rank)' or 'slowest rank 0 (the longest compute, measured)'."""
    return f"slowest rank {rank} ({SLOWEST_FROM.get(source, source)})"


def slowest_line(slowest: dict | None, unit: str = "step") -> str | None:
    """``run train``/``run infer``'s line on the slowest rank (``summary.slowest_rank`` plus the others' wait)."""
    if not slowest:
        return None
    line = f"{slowest_phrase(slowest['rank'], slowest['from'])}: compute {_t(slowest['compute_s'])} per {unit}"
    if slowest.get("compute_ratio") is not None:
        line += f", {slowest['compute_ratio']:.2f}× the other ranks' median {_t(slowest['others_compute_s'])}"
    if slowest.get("others_wait_s") is not None:
        line += (f"; the other ranks wait {_t(slowest['others_wait_s'])} per {unit} on average, it waits "
                 f"{_t(slowest['own_wait_s'])}")
    return line


def _t(v) -> str:
    from shardlab.units import fmt_time

    return "-" if v is None else fmt_time(v)


def render_observability(doc: dict, unit: str = "step") -> str:
    """Per-rank percentiles and waits, the straggler line, predicted vs measured, where the series went."""
    from shardlab.render.table import table

    if not doc.get("ranks"):
        return doc.get("note", "no step records")
    rows = [[r["rank"], r["steps"], _t(r["p50_step_s"]), _t(r["p90_step_s"]), _t(r["p99_step_s"]),
             _t(r["median_compute_s"]), _t(r["mean_blocked_s"]), _t(r["mean_waited_s"]),
             _t(r["mean_injected_s"]) if r["mean_injected_s"] else "-"] for r in doc["ranks"]]
    skipped = doc.get("skipped_steps", 0)
    out = [table(["rank", f"{unit}s", "p50", "p90", "p99", "compute", "in collectives", "waited for others",
                  "injected"], rows,
                 title=f"per-rank {unit} time (p50/p90/p99: the rank's own {unit}, "
                       + ("the wait at the step-end barrier not included; " if unit == "step" else
                          "waits inside its collectives included; ")
                       + (f"first {skipped} {unit}(s) instrumented, left out" if skipped else
                          f"every {unit} kept, instrumented ones included: too few to leave them out")
                       + f"; compute = {unit} - "
                       f"time blocked in collectives; waited = boundary wait + collective time beyond the "
                       f"least-waiting rank's; per {unit})")]
    job = doc["job"]
    out.append(f"job {unit} time (the slowest rank sets the pace): p50 {_t(job['p50_period_s'])}, "
               f"p90 {_t(job['p90_period_s'])}, p99 {_t(job['p99_period_s'])}")
    st = doc.get("straggler")
    inj = (doc.get("injected") or {}).get("slow_rank")
    if st:
        share = st["others_wait_s"] / st["period_s"] if st["period_s"] else 0.0
        head = slowest_phrase(st["rank"], st.get("rank_from", "measured")) + (
            ": a straggler" if st["is_straggler"] else
            ": no straggler (a straggler is over 10% slower than the others and drags the job by 5% or more)")
        out.append(f"{head}. It set the pace on {st['paced_steps_fraction']:.0%} of the {unit}s; its compute is "
                   f"{st['compute_ratio']:.2f}× the other ranks' median (p99: {st['p99_compute_ratio']:.2f}×)"
                   + (f", injected {inj['factor']:g}× on rank {inj['rank']} (without the injection "
                      f"{st['natural_compute_ratio']:.2f}×)"
                      + (f" on {inj['fraction']:.0%} of the {unit}s" if inj["fraction"] < 1 else "") if inj else "")
                   + f". It drags the job by {st['drag'] * 100:+.0f}% at the median ({_t(st['period_s'])} per {unit} "
                     f"instead of {_t(st['base_step_s'])}) and {st['p99_drag'] * 100:+.0f}% at p99; the other ranks "
                     f"wait {_t(st['others_wait_s'])} per {unit} ({share:.0%} of it), rank {st['rank']} itself "
                     f"{_t(st['own_wait_s'])}")
    pv = doc.get("predicted_vs_measured")
    if pv:
        pred = doc["predicted"]
        scaled = ", ".join(p.removesuffix("_s") for p in pred["scaled_parts"]) or "compute"
        out.append(f"predicted ({pred['source']}; the {scaled} share of the {unit} scales by {pred['factor']:g}, "
                   f"communication does not): drag {pv['predicted_drag'] * 100:+.0f}% at the median, "
                   f"{pv['predicted_p99_drag'] * 100:+.0f}% at p99; measured {pv['measured_drag'] * 100:+.0f}% and "
                   f"{pv['measured_p99_drag'] * 100:+.0f}%")
    link = (doc.get("injected") or {}).get("slow_link")
    if link:
        r = next((x for x in doc["ranks"] if x["rank"] == link["rank"]), None)
        if r:
            out.append(f"slow link: {link['delay_s'] * 1e3:g} ms added to each of rank {link['rank']}'s "
                       f"{r['collective_calls_per_step']:.0f} collectives per {unit} = "
                       f"{_t(link['delay_s'] * r['collective_calls_per_step'])} predicted; measured in collectives: "
                       + ", ".join(f"rank {x['rank']} {_t(x['mean_blocked_s'])}" for x in doc["ranks"]))
    m = doc.get("metrics") or {}
    where = [f"per-{unit} series: {doc['steps_jsonl']}" if doc.get("steps_jsonl") else
             f"per-{unit} series: not kept (the run folder is temporary; --steps-jsonl FILE keeps it)"]
    if doc.get("tensorboard"):
        where.append(f"TensorBoard: {doc['tensorboard']['logdir']}")
    if m.get("enabled"):
        ok = sum(1 for v in (m.get("scrapes_ok") or {}).values() if v)
        where.append(f"Prometheus endpoints {m['host']}:{','.join(map(str, m['ports']))} (job_id {m['job_id']}; "
                     f"{ok} of {len(m.get('endpoints') or [])} scraped live)")
    out.append("; ".join(where))
    return "\n".join(out)


def infer_prediction(spec, tp: int, prompt_len: int, req) -> dict | None:
    """The decode-step roofline on this machine's CPU cores (fp32, batch 1) with the slow TP rank applied."""
    opts = req.observe
    if opts is None or opts.slow_rank is None:
        return None
    # the TP decode roofline (comm/inference.py), which prices fp32 on a CPU core; the serving estimator's
    # precisions are the GPU engines' (bf16, fp8, int8, int4)
    from shardlab.catalog import get_catalog
    from shardlab.comm.inference import decode_step
    from shardlab.estimate.straggler import inference_straggler

    cat = get_catalog()
    acc, ln = cat.accelerator("cpu-core"), cat.link("loopback")
    step = decode_step(spec, tp=tp, batch=1, context_len=prompt_len + req.max_new_tokens // 2, accelerator=acc,
                       link=ln, elem_bytes=4, dtype="fp32")
    eff = inference_straggler(step.step_time_s, step.comm_time_s, opts.slow_rank)
    return {**eff.to_dict(), "source": f"shardlab.estimate.straggler on the decode roofline ({tp} × cpu-core, loopback)"}
