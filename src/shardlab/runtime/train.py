"""``shardlab run train``: launch a strategy with torchrun, gather the ranks' measurements, set them beside
the predictions, and (``--check-parity``) hold step 0 against a single-process step."""

from __future__ import annotations

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
    ep: int | None = None
    """Expert-parallel degree (ddp+ep; default: the data-parallel degree)."""
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
    """Compare step 0 with a single-process step (and, with a checkpoint, with transformers' loss)."""
    vocab_divisible_by: int = 1
    """Megatron-LM's --make-vocab-size-divisible-by: the vocabulary is padded to a multiple of this × tp."""
    device: str | None = None
    """cpu or cuda (default: cuda when available)."""
    predict_gpu: str | None = None
    profile: str | None = None
    """Hardware profile from `shardlab calibrate` for the step-time prediction (its gpu, link and overlap)."""
    """Accelerator id for the step-time prediction (default cpu-core on CPU)."""
    probe: bool = True
    """On a CPU without ``profile``/``predict_gpu``: predict from this machine's probe (``runtime.probe``, cached)."""
    reprobe: bool = False
    """Measure the probe again even when it is cached."""
    status: object = None
    """``status(text)``: where a long phase (the probe) stands, or None."""
    torchrun_args: tuple[str, ...] = ()
    """Extra torchrun flags (multi-node rendezvous)."""
    observe: object = None
    """``runtime.observe.launcher.ObserveOptions`` (metrics endpoints, live table, slowness injection), or None."""


def checkpoint_source(model: str):
    """The checkpoint ``model`` names, checked against its config (first mismatch named), or None for a preset."""
    from shardlab.runtime.checkpoint.config import CheckpointSource, is_checkpoint

    if not is_checkpoint(model):
        return None
    source = CheckpointSource(model)
    source.check()
    return source


def prepare(req: TrainRequest):
    """Validate without torch: (spec, strategy, micro_batch). Raises one-line ShardlabErrors. A checkpoint's spec has
    its own vocabulary (the runtime pads it for TP); the checkpoint is checked against its config here."""
    from shardlab.runtime.parallel.strategy import parse_strategy
    from shardlab.runtime.train_worker import resolve_spec

    source = checkpoint_source(req.model)
    spec = source.spec if source is not None else resolve_spec(req.model)
    from shardlab.runtime import check_host_memory

    check_host_memory(spec, 16, "training", req.device)
    st = parse_strategy(req.strategy, req.nproc * _nnodes(req.torchrun_args), tp=req.tp, pp=req.pp, vpp=req.vpp,
                        schedule=req.schedule, ep=req.ep)
    if req.global_batch % st.dp:
        raise ShardlabError(f"--global-batch {req.global_batch} is not divisible by the {st.dp} data-parallel ranks")
    local = req.global_batch // st.dp
    mb = req.micro_batch or (1 if st.pp > 1 else local)
    if local % mb:
        raise ShardlabError(f"each data-parallel rank gets {local} sequences, not divisible by --micro-batch {mb}")
    from shardlab.estimate.training import positions_notes

    positions_notes(spec, req.seq_len)          # a learned position table has no rows past its length
    if spec.sliding_window and req.seq_len > spec.sliding_window:
        raise ShardlabError(f"--seq-len {req.seq_len} exceeds {spec.name}'s sliding window ({spec.sliding_window}); the "
                            f"runtime attends to every token, which such a model does not: use --seq-len "
                            f"{spec.sliding_window} or less")
    if st.tp > 1 and spec.num_kv_heads % st.tp:
        raise ShardlabError(f"training with --tp {st.tp} needs it to divide {spec.name}'s {spec.num_kv_heads} KV heads "
                            f"(duplicated KV heads are for inference only)")
    if st.tp > 1 and spec.ffn_hidden_size % st.tp:
        raise ShardlabError(f"--tp {st.tp} must divide {spec.name}'s FFN width {spec.ffn_hidden_size} (column-parallel "
                            f"rows split evenly); use a TP degree that divides it")
    if st.tp > 1 and spec.num_heads % st.tp:
        raise ShardlabError(f"--tp {st.tp} must divide {spec.name}'s {spec.num_heads} attention heads")
    if spec.moe is not None and (st.pp > 1 or (st.tp > 1 and (st.tp_kind != "dtensor" or st.ep > 1 or st.sequence_parallel))):
        raise ShardlabError("mixture-of-experts models train with ddp, fsdp, ddp+ep or the DTensor tp plan (experts split "
                            "by width) in the runtime; not with tp-megatron, sp, pp or ep combined with tp")
    if "ep" in st.name.split("+") and spec.moe is None:
        raise ShardlabError(f"--strategy {st.name} splits routed experts, and {spec.name} has none; use a "
                            "mixture-of-experts model (e.g. --model tiny-moe)")
    if "ep" in st.name.split("+") and st.ep < 2:
        raise ShardlabError(f"--strategy {st.name} needs at least 2 expert-parallel ranks to split the experts (it has "
                            f"{st.ep}); use --nproc-per-node 2 or more and --ep 2 or more")
    if st.ep > 1 and spec.moe.num_experts % st.ep:
        raise ShardlabError(f"--ep {st.ep} must divide {spec.name}'s {spec.moe.num_experts} experts")
    if spec.tied_embeddings and st.tp_kind == "dtensor" and st.pp > 1:
        raise ShardlabError("tied embeddings with DTensor tp and pp are not supported; use tp-megatron+pp or untie")
    if st.sequence_parallel:                      # the ranks would refuse (or abort) after the launch
        if spec.tied_embeddings or spec.position == "learned":
            raise ShardlabError("sequence parallel is implemented for RoPE models with an untied head (e.g. --model tiny); "
                                "use plain tp for GPT-2-style models")
        if req.seq_len % st.tp:
            raise ShardlabError(f"sequence parallel splits the sequence over tp: --seq-len {req.seq_len} is not divisible "
                                f"by tp {st.tp}; use --seq-len {req.seq_len - req.seq_len % st.tp or st.tp}")
    if req.profile or req.predict_gpu:      # read now: a bad file or id is an error before the job, not after it
        from shardlab.catalog import get_catalog

        cat = get_catalog([], profile=req.profile)
        if req.predict_gpu:
            cat.accelerator(req.predict_gpu)
    return spec, st, mb


def _nnodes(torchrun_args) -> int:
    from shardlab.runtime.rendezvous import rendezvous_of

    return rendezvous_of(list(torchrun_args))[0]


def worker_args(req: TrainRequest, mb: int, source=None) -> list[str]:
    model = ["--model", str(source.folder), "--load"] if source is not None else ["--model", req.model]
    a = [*model, "--vocab-divisible-by", str(req.vocab_divisible_by), "--strategy", req.strategy, "--steps", str(req.steps), "--global-batch",
         str(req.global_batch), "--micro-batch", str(mb), "--seq-len", str(req.seq_len), "--schedule", req.schedule,
         "--vpp", str(req.vpp), "--optimizer", req.optimizer, "--seed", str(req.seed)]
    for flag, v in (("--tp", req.tp), ("--pp", req.pp), ("--ep", req.ep), ("--device", req.device)):
        if v is not None:
            a += [flag, str(v)]
    return a + (["--dump-grads"] if req.check_parity else [])


TRANSFORMERS_LOSS_TOL = 1e-5
"""|run loss - transformers' loss| accepted at step 0 (fp32 on both sides: rounding differs by ~1e-7)."""


def transformers_loss(source, data, run_loss) -> dict:
    """transformers' mean token cross-entropy on step 0's global batch, beside the run's."""
    from shardlab.runtime.checkpoint.reference import hf_loss

    x, y = data.batch(0)
    ref = hf_loss(source.folder, x, y)
    err = abs(run_loss - ref) if run_loss is not None else None
    return {"loss": ref, "run_loss": run_loss, "abs_err": err, "tolerance": TRANSFORMERS_LOSS_TOL,
            "ok": err is not None and err <= TRANSFORMERS_LOSS_TOL,
            "source": "transformers AutoModelForCausalLM.from_pretrained(checkpoint, fp32), logits -> cross-entropy"}


def _report_elsewhere(req: TrainRequest, st, ranks: list[dict], res, obs) -> dict:
    """A node without global rank 0: its ranks' documents went to rank 0 (``train_worker.gather_to_rank0``), whose
    node reports the whole job; this one says so, and what ran here."""
    node = next((d.get("node") for d in ranks if d.get("node")), {}) or {}
    doc = {"strategy": st.name, "world_size": st.world_size, "model_ref": req.model, "report_elsewhere": True,
           "node": node, "ranks_here": [d["rank"] for d in ranks],
           "report": ("printed by the node that ran global rank 0 (c10d numbers nodes in the order they join): every "
                      "rank, memory and step time beside the predictions" + (", parity" if req.check_parity else "")),
           "launch": {"duration_s": res.duration_s, "run_dir": str(res.run_dir), "summary": res.summary,
                      "warnings": res.warnings}}
    if obs is not None:
        doc["observability"] = obs.finish(skip_steps=skip_steps(req.steps), predicted=None)
    return doc


def _probing(req: TrainRequest) -> bool:
    from shardlab.runtime.probe import enabled

    return enabled(req.probe) and _nnodes(req.torchrun_args) == 1   # one host cannot probe the links between hosts


def _probe(req: TrainRequest, st, mb: int):
    """This machine's probe for the job's strategy and ranks (``runtime.probe``): cached, or measured now."""
    from shardlab.runtime.probe import ensure_probe

    import torch

    return ensure_probe(strategy=st.name, nproc=req.nproc, tp=req.tp, pp=req.pp, schedule=req.schedule,
                        vpp=req.vpp, layout=st.layout(mb).to_dict(), torch_version=torch.__version__, device="cpu",
                        refresh=req.reprobe, timeout_s=req.timeout_s, status=req.status)


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
    from shardlab.runtime.checkpoint.load import reads_doc

    spec0, st, mb = prepare(req)
    source = checkpoint_source(req.model)
    from shardlab.runtime.vocab import pad_spec, padding_report

    spec, _ = pad_spec(spec0, st.tp, req.vocab_divisible_by)   # the model the ranks build (and the memory model counts)
    obs = observation_for(req.observe, req.nproc, st.world_size, "train", req.torchrun_args)
    res = launch("shardlab.runtime.train_worker", req.nproc, worker_args(req, mb, source), timeout_s=req.timeout_s,
                 torchrun_args=list(req.torchrun_args), observer=obs)
    state["run_dir"] = res.run_dir
    if not res.ok:
        raise RunFailed(res.summary)
    ranks = res.rank_results()
    if _nnodes(req.torchrun_args) > 1 and not any(d.get("rank") == 0 for d in ranks):
        return _report_elsewhere(req, st, ranks, res, obs)   # rank 0's node prints the job
    from shardlab.runtime.observe.launcher import step_records
    from shardlab.runtime.observe.summary import TIME_SPLIT_DEFINITIONS, rank_time_split
    from shardlab.runtime.step_time import STEP_TIME_DEFINITIONS, apply_time_split, injected_rank, measured_step_time
    from shardlab.runtime.train_report import megatron_breakdown

    split = rank_time_split(step_records(res.run_dir), skip_steps(req.steps))
    tokens = req.global_batch * req.seq_len
    apply_time_split(ranks, split, tokens)
    step_time, slowest = measured_step_time(ranks, split, injected_rank(req.observe))
    shape = RunShape(req.seq_len, req.global_batch, mb, req.optimizer)
    report = predicted_memory(spec, st, shape)
    rows = memory_rows(report, ranks, spec)
    dev = ranks[0]["device"] if ranks else "cpu"
    gpu = None   # a profile names its own accelerator
    probe = None
    if req.profile:
        est, pred_src = predicted_estimate(spec, st, shape, req.predict_gpu, None, profile=req.profile)
    elif dev == "cpu" and req.predict_gpu is None and _probing(req):
        probe = _probe(req, st, mb)
        est, pred_src = predicted_estimate(spec, st, shape, None, None, profile=str(probe.path))
        pred_src += (f": this machine's probe ({'measured now' if probe.fresh else 'cached'}, {probe.measured_at}; "
                     "--reprobe measures again, --no-probe uses the catalog's generic core)")
    else:
        gpu = req.predict_gpu or ("cpu-core" if dev == "cpu" else "h100-sxm")
        est, pred_src = predicted_estimate(spec, st, shape, gpu, "loopback" if dev == "cpu" else "nvlink4")
    pred_s = est.step_time_s if est is not None else None
    med = step_time["measured_median_s"]
    loss_rank = next((d for d in ranks if d.get("losses")), None)
    doc = {
        "strategy": st.name, "world_size": st.world_size, "model": spec0.name, "model_ref": req.model,
        "vocab": padding_report(spec0.vocab_size, st.tp, req.vocab_divisible_by),
        "checkpoint": None if source is None else reads_doc(source, ranks),
        "layout": st.layout(mb).to_dict(), "microbatches": shape.microbatches(st),
        "workload": {"seq_len": req.seq_len, "global_batch": req.global_batch, "micro_batch": mb, "steps": req.steps,
                     "optimizer": req.optimizer, "precision": "fp32"},
        "losses": loss_rank["losses"] if loss_rank else None,
        "loss_rank": loss_rank["rank"] if loss_rank else None,
        "ranks": [{k: d.get(k) for k in ("rank", "coords", "chunks", "step_time_s", "time_split", "step_times_s",
                                         "tokens_per_s", "peak_bytes", "collectives", "setup_collectives", "megatron_counter",
                                         "megatron_sites", "expert_dispatch", "model_states_bytes", "params_local", "backend", "device", "node")}
                  for d in ranks],
        "predicted": [{"rank": r["rank"], "stage": r["stage"], **r["predicted"]} for r in rows],
        "measured": [{"rank": r["rank"], "stage": r["stage"], **r["measured"]} for r in rows],
        "memory_comparison": rows,
        "memory_states_exact": all(r["states_exact"] for r in rows),
        "memory_notes": memory_notes(rows, st),
        "step_time": {**step_time, "predicted_s": pred_s, "predicted_from": pred_src,
                      "error": (pred_s - med) / med if pred_s and med else None,   # (predicted − measured) / measured, as validate
                      "predicted_catalog_gpu": gpu,
                      "probe": None if probe is None else {
                          "path": str(probe.path), "fresh": probe.fresh, "measured_at": probe.measured_at,
                          "layer_host_s": probe.layer_host_s, "key": probe.key},
                      "timed_steps": min(d.get("timed_steps", 0) for d in ranks),
                      "instrumented": any(d.get("step_time_instrumented") for d in ranks)},
        "slowest": slowest,
        "time_split_definitions": {**TIME_SPLIT_DEFINITIONS, **STEP_TIME_DEFINITIONS} if split else None,
        "tokens_per_s": tokens / step_time["job_step_s"],
        "launch": {"duration_s": res.duration_s, "run_dir": str(res.run_dir), "summary": res.summary,
                   "warnings": res.warnings},
    }
    doc["megatron_breakdown"] = megatron_breakdown(doc)
    from shardlab.runtime.compare import expert_dispatch

    doc["expert_dispatch"] = expert_dispatch(spec, st, shape, ranks)
    if req.check_parity:
        from shardlab.runtime.compare import parity
        from shardlab.runtime.data import SyntheticData

        data = SyntheticData(spec0.vocab_size, req.seq_len, req.global_batch, seed=1234 + req.seed)
        from shardlab.runtime.train_worker import model_source

        # the reference is built the ranks' way: padded vocabulary, the checkpoint's numerics and weights
        _, numerics, load = model_source(str(source.folder) if source else req.model, source is not None, st.tp,
                                         req.vocab_divisible_by)
        doc["parity"] = parity(spec, data, res.run_dir, ranks, seed=req.seed, numerics=numerics, load=load)
        if source is not None:
            doc["parity"]["transformers"] = transformers_loss(source, data, doc["parity"]["run_loss"])
            doc["parity"]["ok"] = doc["parity"]["ok"] and doc["parity"]["transformers"]["ok"]
    if obs is not None:  # steps 0 and 1 carry the memory tracker and the dispatch recorder: left out
        doc["observability"] = obs.finish(skip_steps=skip_steps(req.steps),
                                          predicted=train_prediction(est, req.observe, pred_src))
    return doc
