"""``shardlab run train``: launch a strategy with torchrun, gather the ranks' measurements, set them beside
the predictions, and (``--check-parity``) hold step 0 against a single-process step."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from shardlab.errors import ShardlabError


class RunFailed(ShardlabError):
    """A rank failed or hung; the message is launch's one-line summary."""

    exit_code = 1


@dataclass(frozen=True)
class TrainRequest:
    """What ``shardlab run train`` was asked to run."""

    strategy: str
    """Strategy text, e.g. 'fsdp+tp'."""
    nproc: int
    """Ranks per node."""
    model: str = "tiny"
    """Preset (tiny, small, tiny-gpt2), catalog id, config.json or YAML."""
    steps: int = 4
    """Optimizer steps (0: memory and collective counts, 1: collective times, 2+: step time)."""
    global_batch: int = 8
    """Sequences per step."""
    micro_batch: int | None = None
    """Sequences per micro-batch per DP rank (default: the whole slice; 1 with pp)."""
    seq_len: int = 64
    """Tokens per sequence."""
    tp: int | None = None
    """Tensor-parallel degree (default: all ranks, or 2 when combined)."""
    pp: int | None = None
    """Pipeline degree (default: all ranks, or 2 when combined)."""
    schedule: str = "1f1b"
    """gpipe, 1f1b or interleaved."""
    vpp: int = 1
    """Chunks per pipeline rank (interleaved; 2 by default there)."""
    optimizer: str = "adamw"
    """adamw or sgd."""
    seed: int = 0
    """Model seed (data seed = 1234 + seed)."""
    timeout_s: float = 300.0
    """The whole job is stopped after this long."""
    check_parity: bool = False
    """Compare step 0 with a single-process step."""
    device: str | None = None
    """cpu or cuda (default: cuda when available)."""
    predict_gpu: str | None = None
    profile: str | None = None
    """Hardware profile from `shardlab calibrate` for the step-time prediction (its gpu, link and overlap)."""
    """Accelerator id for the step-time prediction (default cpu-core on CPU)."""
    torchrun_args: tuple[str, ...] = ()
    """Extra torchrun flags (multi-node rendezvous)."""
    observe: object = None
    """``runtime.observe.launcher.ObserveOptions`` (metrics endpoints, live table, slowness injection), or None."""


def prepare(req: TrainRequest):
    """Validate without torch: (spec, strategy, micro_batch). Raises one-line ShardlabErrors."""
    from shardlab.runtime.parallel.strategy import parse_strategy
    from shardlab.runtime.train_worker import resolve_spec

    spec = resolve_spec(req.model)
    from shardlab.runtime import check_host_memory

    check_host_memory(spec, 16, "training", req.device)
    st = parse_strategy(req.strategy, req.nproc * _nnodes(req.torchrun_args), tp=req.tp, pp=req.pp, vpp=req.vpp,
                        schedule=req.schedule)
    if req.global_batch % st.dp:
        raise ShardlabError(f"--global-batch {req.global_batch} is not divisible by the {st.dp} data-parallel ranks")
    local = req.global_batch // st.dp
    mb = req.micro_batch or (1 if st.pp > 1 else local)
    if local % mb:
        raise ShardlabError(f"each data-parallel rank gets {local} sequences, not divisible by --micro-batch {mb}")
    if req.seq_len > spec.max_seq_len and spec.position == "learned":
        raise ShardlabError(f"--seq-len {req.seq_len} exceeds {spec.name}'s {spec.max_seq_len} learned positions")
    if st.tp > 1 and spec.num_kv_heads % st.tp:
        raise ShardlabError(f"training with --tp {st.tp} needs it to divide {spec.name}'s {spec.num_kv_heads} KV heads "
                            f"(duplicated KV heads are for inference only)")
    if spec.moe is not None and (st.tp > 1 or st.pp > 1):
        raise ShardlabError("mixture-of-experts models run with ddp or fsdp only in the runtime")
    if spec.tied_embeddings and st.tp_kind == "dtensor" and st.pp > 1:
        raise ShardlabError("tied embeddings with DTensor tp and pp are not supported; use tp-megatron+pp or untie")
    return spec, st, mb


def _nnodes(torchrun_args) -> int:
    args = list(torchrun_args)
    for i, a in enumerate(args):
        if a.startswith("--nnodes"):
            val = a.split("=", 1)[1] if "=" in a else args[i + 1]
            return int(val.split(":")[-1])
    return 1


def worker_args(req: TrainRequest, mb: int) -> list[str]:
    a = ["--model", req.model, "--strategy", req.strategy, "--steps", str(req.steps), "--global-batch",
         str(req.global_batch), "--micro-batch", str(mb), "--seq-len", str(req.seq_len), "--schedule", req.schedule,
         "--vpp", str(req.vpp), "--optimizer", req.optimizer, "--seed", str(req.seed)]
    for flag, v in (("--tp", req.tp), ("--pp", req.pp), ("--device", req.device)):
        if v is not None:
            a += [flag, str(v)]
    return a + (["--dump-grads"] if req.check_parity else [])


def skip_steps(steps: int) -> int:
    """Steps the ranks instrument and the timings leave out: 0 (memory tracker) and 1 (collective recorder), as
    many as leave one timed step."""
    return min(2, steps - 1)


def run_train(req: TrainRequest) -> dict:
    """Run, gather, compare; returns the JSON document. Interrupted (Ctrl-C, SIGTERM), the job is stopped and the
    interrupt goes on with what the job had done attached (``runtime.interrupted.note_interrupt``)."""
    from shardlab.runtime.interrupted import note_interrupt

    state: dict = {}
    try:
        return _run_train(req, state)
    except KeyboardInterrupt as e:
        note_interrupt(e, state.get("run_dir"), unit="step", planned=req.steps, skip_steps=skip_steps(req.steps),
                       steps_jsonl=getattr(req.observe, "steps_jsonl", None), job_done="run_dir" in state)
        raise


def _run_train(req: TrainRequest, state: dict) -> dict:
    from shardlab.runtime import require_torch
    from shardlab.runtime.compare import RunShape, memory_notes, memory_rows, predicted_estimate, predicted_memory
    from shardlab.runtime.launch import launch
    from shardlab.runtime.observe.report import observation_for, train_prediction

    require_torch(load=False)   # the ranks import torch; this process only for --check-parity, after the job
    spec, st, mb = prepare(req)
    obs = observation_for(req.observe, req.nproc, st.world_size, "train", req.torchrun_args)
    res = launch("shardlab.runtime.train_worker", req.nproc, worker_args(req, mb), timeout_s=req.timeout_s,
                 torchrun_args=list(req.torchrun_args), observer=obs)
    state["run_dir"] = res.run_dir
    if not res.ok:
        raise RunFailed(res.summary)
    ranks = res.rank_results()
    from shardlab.runtime.observe.launcher import step_records
    from shardlab.runtime.observe.summary import TIME_SPLIT_DEFINITIONS, rank_time_split

    split = rank_time_split(step_records(res.run_dir), skip_steps(req.steps))
    tokens = req.global_batch * req.seq_len
    apply_time_split(ranks, split, tokens)
    step_time, slowest = measured_step_time(ranks, split, injected_rank(req.observe))
    shape = RunShape(req.seq_len, req.global_batch, mb, req.optimizer)
    report = predicted_memory(spec, st, shape)
    rows = memory_rows(report, ranks, spec)
    dev = ranks[0]["device"] if ranks else "cpu"
    gpu = None   # a profile names its own accelerator
    if req.profile:
        est, pred_src = predicted_estimate(spec, st, shape, req.predict_gpu, None, profile=req.profile)
    else:
        gpu = req.predict_gpu or ("cpu-core" if dev == "cpu" else "h100-sxm")
        est, pred_src = predicted_estimate(spec, st, shape, gpu, "loopback" if dev == "cpu" else "nvlink4")
    pred_s = est.step_time_s if est is not None else None
    med = step_time["measured_median_s"]
    loss_rank = next((d for d in ranks if d.get("losses")), None)
    doc = {
        "strategy": st.name, "world_size": st.world_size, "model": spec.name, "model_ref": req.model,
        "layout": st.layout(mb).to_dict(), "microbatches": shape.microbatches(st),
        "workload": {"seq_len": req.seq_len, "global_batch": req.global_batch, "micro_batch": mb, "steps": req.steps,
                     "optimizer": req.optimizer, "precision": "fp32"},
        "losses": loss_rank["losses"] if loss_rank else None,
        "loss_rank": loss_rank["rank"] if loss_rank else None,
        "ranks": [{k: d.get(k) for k in ("rank", "coords", "chunks", "step_time_s", "time_split", "step_times_s",
                                         "tokens_per_s", "peak_bytes", "collectives", "megatron_counter",
                                         "megatron_sites", "model_states_bytes", "params_local", "backend", "device")}
                  for d in ranks],
        "predicted": [{"rank": r["rank"], "stage": r["stage"], **r["predicted"]} for r in rows],
        "measured": [{"rank": r["rank"], "stage": r["stage"], **r["measured"]} for r in rows],
        "memory_comparison": rows,
        "memory_states_exact": all(r["states_exact"] for r in rows),
        "memory_notes": memory_notes(rows, st),
        "step_time": {**step_time, "predicted_s": pred_s, "predicted_from": pred_src,
                      "error": (med - pred_s) / pred_s if pred_s else None,
                      "predicted_catalog_gpu": gpu,
                      "timed_steps": min(d.get("timed_steps", 0) for d in ranks),
                      "instrumented": any(d.get("step_time_instrumented") for d in ranks)},
        "slowest": slowest,
        "time_split_definitions": {**TIME_SPLIT_DEFINITIONS, **STEP_TIME_DEFINITIONS} if split else None,
        "tokens_per_s": tokens / step_time["job_step_s"],
        "launch": {"duration_s": res.duration_s, "run_dir": str(res.run_dir), "summary": res.summary},
    }
    doc["megatron_breakdown"] = megatron_breakdown(doc)
    if req.check_parity:
        from shardlab.runtime.compare import parity
        from shardlab.runtime.data import SyntheticData

        data = SyntheticData(spec.vocab_size, req.seq_len, req.global_batch, seed=1234 + req.seed)
        doc["parity"] = parity(spec, data, res.run_dir, ranks, seed=req.seed)
    if obs is not None:  # steps 0 and 1 carry the memory tracker and the dispatch recorder: left out
        doc["observability"] = obs.finish(skip_steps=skip_steps(req.steps),
                                          predicted=train_prediction(est, req.observe, pred_src))
    return doc


STEP_TIME_DEFINITIONS = {
    "step_time_s": "per rank: time_split.step_s, its whole step (compute + collectives + wait)",
    "step_times_s": "per rank: each step's own time (forward, backward, optimizer), the wait at the step-end barrier "
                    "not included; steps 0 and 1 instrumented",
    "measured_median_s": "step_time: the median over ranks of step_time_s",
    "spread": "step_time: (largest - smallest) / median of the ranks' compute_s"}
"""What the step-time numbers of ``run train --json`` are, beside ``TIME_SPLIT_DEFINITIONS``."""


def injected_rank(observe) -> int | None:
    """The rank slowed with ``--slow-rank`` (``ObserveOptions.slow_rank``), or None."""
    slow = getattr(observe, "slow_rank", None)
    return slow.rank if slow is not None else None


def apply_time_split(ranks: list[dict], split: dict[int, dict], tokens_per_step: int) -> None:
    """Give each rank document its ``time_split`` (``observe.summary.rank_time_split``) and make its
    ``step_time_s`` the whole step, waits included (compute + collectives + wait), with ``tokens_per_s`` from it.
    A rank without records keeps the median of its own steps (waits at the step end not included) and no split."""
    for d in ranks:
        sp = split.get(d["rank"])
        d["time_split"] = sp
        if sp is not None:
            d["step_time_s"] = sp["step_s"]
            d["tokens_per_s"] = tokens_per_step / sp["step_s"] if sp["step_s"] > 0 else None


def measured_step_time(ranks: list[dict], split: dict[int, dict], injected: int | None) -> tuple[dict, dict | None]:
    """(the document's ``step_time`` measurements, the slowest rank).

    Over every rank of the job when the split has them (each node reads the whole job's records), else over this
    node's ranks: the median whole step, the job's step (the longest: synchronous ranks move at the slowest's pace),
    the slowest rank by the one rule (``observe.summary.slowest_rank``: the ``--slow-rank`` one, else the longest
    compute) and the spread of compute (slowest − fastest) / median. Without a split compute is not separated from
    waiting: the ranks' own step times stand in for it."""
    from shardlab.runtime.observe.summary import slowest_of_split, slowest_rank

    if split:
        times = {k: v["step_s"] for k, v in split.items()}
        compute = {k: v["compute_s"] for k, v in split.items()}
        slowest = slowest_of_split(split, injected)
    else:
        times = compute = {d["rank"]: d["step_time_s"] for d in ranks}
        slowest = slowest_rank(compute, injected)
    med, cmed = statistics.median(times.values()), statistics.median(compute.values())
    return {"measured_median_s": med, "job_step_s": max(times.values()),
            "slowest_rank": slowest["rank"], "slowest_rank_from": slowest["from"],
            "slowest_s": times[slowest["rank"]], "slowest_compute_s": slowest["compute_s"],
            "fastest_s": min(times.values()),
            "spread": (max(compute.values()) - min(compute.values())) / cmed if cmed else None,
            "spread_of": "compute" if split else "step"}, slowest


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def _colls(c: dict) -> str:
    parts = []
    for op, phases in sorted((c or {}).items()):
        f, b = phases.get("forward", {}).get("count", 0), phases.get("backward", {}).get("count", 0)
        other = sum(v["count"] for ph, v in phases.items() if ph not in ("forward", "backward"))
        t = sum(v["time_s"] or 0 for v in phases.values())
        parts.append(f"{op} {f}/{b}{f'+{other}' if other else ''} ({t * 1e3:.1f} ms)")
    return ", ".join(parts) or "none"


def per_block_summary(sites: dict[str, dict[str, int]], microbatches: int = 1) -> dict[str, dict]:
    """Collapse ``by_site`` into one row per kind (attention, mlp, embedding, head): calls per instance per
    micro-batch for each op/phase, the number of instances, and whether every instance issued the same."""
    kinds: dict[str, list[dict[str, int]]] = {}
    for site, ops in sites.items():
        kinds.setdefault(site.rsplit(".", 1)[-1], []).append(ops)
    out = {}
    for kind, insts in kinds.items():
        keys = sorted({k for d in insts for k in d}, key=lambda k: (k.split("/")[1] != "forward", k))
        per = {k: sorted({d.get(k, 0) for d in insts}) for k in keys}
        out[kind] = {"instances": len(insts), "uniform": all(len(v) == 1 for v in per.values()),
                     "per_instance_per_microbatch": {k: v[0] / microbatches for k, v in per.items() if len(v) == 1}}
    return out


def megatron_breakdown(doc: dict) -> dict | None:
    """Rank 0's f/g counter per kind of site (attention, mlp, embedding, head), per instance per micro-batch."""
    sites = next((r.get("megatron_sites") for r in doc["ranks"] if r.get("megatron_sites")), None)
    return per_block_summary(sites, doc["microbatches"]) if sites else None


def _megatron_lines(doc: dict) -> list[str]:
    b = doc.get("megatron_breakdown")
    if not b:
        return []
    parts = []
    for kind in ("attention", "mlp", "embedding", "head"):
        if kind in b:
            k = b[kind]
            ops = ", ".join(f"{v:g} {op.replace('_', '-')} {ph}" for op_ph, v in k["per_instance_per_microbatch"].items()
                            for op, ph in [op_ph.split("/")])
            parts.append(f"per {kind}: {ops}" + (f" (each of {k['instances']})" if k["instances"] > 1 else "")
                         + ("" if k["uniform"] else " (NOT the same in every block)"))
    return ["Megatron f/g collectives per micro-batch (our operators' counter): " + "; ".join(parts)]


def step_time_notes(doc: dict) -> list[str]:
    """What the measured-vs-predicted line needs beside it: a timed step that carried instrumentation, and on a
    CPU, that the catalog's generic core is not this machine."""
    st, notes = doc["step_time"], []
    if st.get("instrumented"):
        steps = doc['workload']['steps']
        which = ("step 0, the only one (it carries the memory tracker)" if steps == 1 else
                 "step 1 (it carries the collective recorder, a dispatch mode on every operator)")
        notes.append(f"  measured on an instrumented step: steps count from 0 and the step time is the median of steps 2 "
                     f"and later; with --steps {steps} it is {which}; --steps 3 or more gives clean step times (warm-up "
                     f"and instrumented steps left out, as PyTorch's benchmark Timer warms up before it measures: "
                     f"torch/utils/benchmark/utils/timer.py)")
    cpu = all(r.get("device") == "cpu" for r in doc["ranks"])
    if cpu and st.get("predicted_catalog_gpu") == "cpu-core" and st.get("error") is not None and abs(st["error"]) > 0.5:
        notes.append("  the prediction uses the catalog's generic cpu-core, not this machine, and no host time per "
                     "operator: `shardlab calibrate --out hw.yaml` measures this machine (then --profile hw.yaml), "
                     "and `shardlab calibrate --from-run RUN.json --framework BASE` fits the host time a run spends "
                     "(docs/calibration.md)")
    return notes


def per_rank_time_table(doc: dict) -> list[str]:
    """The measured per-rank table: where each rank's step went (compute, collectives, waiting for the others;
    they add up to the step) beside its throughput, peak memory and collectives, and where the numbers come from."""
    from shardlab.report.table import table
    from shardlab.units import fmt_bytes, fmt_time

    ranks = doc["ranks"]
    split = all(r.get("time_split") for r in ranks)
    rows = []
    for r in ranks:
        sp = r.get("time_split") or {}
        times = [fmt_time(sp[k]) for k in ("compute_s", "collectives_s", "wait_s")] if split else []
        rows.append([r["rank"], "{pp},{dp},{tp}".format(**r["coords"]), *times, fmt_time(r["step_time_s"]),
                     "-" if r.get("tokens_per_s") is None else f"{r['tokens_per_s']:.0f}",
                     fmt_bytes((r.get("peak_bytes") or {}).get("by_category", {}).get("Total", 0)),
                     _colls(r["collectives"])])
    head = ["rank", "pp,dp,tp", *(["compute", "in collectives", "waiting"] if split else []), "step", "tokens/s",
            "peak", "collectives per step: fwd/bwd count (time)"]
    n = min((r["time_split"]["steps"] for r in ranks), default=0) if split else doc["step_time"].get("timed_steps")
    if split:
        title = (f"measured per rank, mean of {n} timed step(s), step = compute + in collectives + waiting (the ranks' "
                 f"per-step records)")
        notes = ["  compute: the rank's own work (batch, forward, backward, optimizer) minus time blocked in "
                 "collectives; in collectives: the time the least-waiting rank spent in them that step (the "
                 "transfer); waiting: for other ranks, at the step-end barrier and inside collectives; peak: torch "
                 "MemTracker; collectives: counted on step 0, timed on step 1 (the dispatch recorder)"]
    else:
        title = "measured per rank (step: median of the rank's timed steps, waiting at the step end not included)"
        notes = ["  peak: torch MemTracker; collectives: counted on step 0, timed on step 1 (the dispatch recorder)"]
    return [table(head, rows, title=title), *notes]


def render_train(doc: dict) -> str:
    """The human report: losses, per-rank measurements, predicted vs measured memory and step time, parity."""
    from shardlab.report.table import table
    from shardlab.units import fmt_bytes, fmt_time

    lay, wl = doc["layout"], doc["workload"]
    out = [f"shardlab run train: {doc['strategy']} on {doc['world_size']} ranks (dp {lay['dp']} × tp {lay['tp']} × "
           f"pp {lay['pp']}{', vpp ' + str(lay['vpp']) if lay['vpp'] > 1 else ''}), model {doc['model']}, "
           f"{wl['steps']} steps of {wl['global_batch']} × {wl['seq_len']} tokens, fp32 {wl['optimizer']}, "
           f"{doc['microbatches']} micro-batch(es) of {wl['micro_batch']}"]
    out += _megatron_lines(doc)
    if doc.get("losses"):
        out.append(f"loss per step (global batch, seen by rank {doc['loss_rank']}): "
                   + "  ".join(f"{v:.4f}" for v in doc["losses"]))
    out += ["", *per_rank_time_table(doc)]
    st = doc["step_time"]
    from shardlab.runtime.observe.report import slowest_line

    line = slowest_line(doc.get("slowest"), "step") if doc["world_size"] > 1 else None
    if line:
        out.append(f"{line}; spread of {st.get('spread_of', 'step')} (slowest - fastest) / median = "
                   f"{(st['spread'] or 0) * 100:.1f}%")
    mrows = []
    for r in doc["memory_comparison"]:
        p, m = r["predicted"], r["measured"]
        mrows.append([r["rank"], r["stage"]] + [f"{p[k]:,} / {m[k]:,}" for k in ("weights", "gradients", "optimizer")]
                     + ["yes" if r["states_exact"] else "NO", fmt_bytes(p["activations"]),
                        fmt_bytes(m["activations"]) if m["activations"] is not None else "-", _pct(r["activations_error"])])
    out += ["", table(["rank", "stage", "weights B pred / meas", "grads B pred / meas", "optimizer B pred / meas",
                       "exact", "act pred", "act meas", "act err"], mrows,
                      title="memory per rank: predicted (shardlab.memory, fp32) vs measured (tensor storages after step 0; "
                            "activations: peak of tensors saved for backward)")]
    out.append("model states " + ("match the memory model exactly on every rank" if doc["memory_states_exact"] else
                                  "DIFFER from the memory model:"))
    out += [f"  {n}" for n in doc.get("memory_notes", [])]
    if st["predicted_s"]:
        out.append(f"step time: measured {fmt_time(st['measured_median_s'])} (median over ranks, waits included) vs "
                   f"predicted {fmt_time(st['predicted_s'])} [{st['predicted_from']}]: error {_pct(st['error'])}")
    else:
        out.append(f"step time: measured {fmt_time(st['measured_median_s'])}; {st['predicted_from']}")
    out += step_time_notes(doc)
    if "parity" in doc:
        p = doc["parity"]
        out.append(f"parity with one process (step 0): loss {p['run_loss']:.6f} vs {p['reference_loss']:.6f} "
                   f"(|err| {p['loss_abs_err']:.1e}), gradients max |err| {p['grad_max_abs_err']:.1e} over "
                   f"{p['tensors_compared']} tensors (tolerance 1e-5 / 1e-6): {'OK' if p['ok'] else 'FAILED'}")
    if doc.get("observability"):
        from shardlab.runtime.observe.report import render_observability

        out += ["", render_observability(doc["observability"])]
    out.append(f"rank JSON: {doc['launch']['run_dir']} (removed when shardlab exits; SHARDLAB_KEEP_RUN_DIR=1 keeps it)")
    return "\n".join(out)
