"""The rank program of ``shardlab run train`` (started by torchrun; one process per rank).

Each rank: joins the process group, builds its share of the strategy, runs ``--steps`` steps on its slice
of the deterministic global batches and writes ``rank{r}.json`` into ``$SHARDLAB_RUN_DIR``:
step times, collectives (count/bytes by op and phase for one step, time per step), model-state bytes
measured from storages after the first optimizer step, peak memory by category (torch's MemTracker) and
saved activations (on step 0), and losses. Instruments slow a step, so they are kept off the timed steps:
step 0 measures memory and counts collectives, step 1 times the collectives, steps 2+ give the step time
(with fewer steps, the step time includes instrumentation and says so).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import time

from shardlab.runtime.worker import RankRun


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m shardlab.runtime.train_worker")
    p.add_argument("--model", default="tiny")
    p.add_argument("--load", action="store_true", help="--model is a checkpoint folder: start from its weights")
    p.add_argument("--vocab-divisible-by", type=int, default=1)
    p.add_argument("--strategy", default="ddp")
    p.add_argument("--tp", type=int, default=None)
    p.add_argument("--pp", type=int, default=None)
    p.add_argument("--ep", type=int, default=None)
    p.add_argument("--vpp", type=int, default=1)
    p.add_argument("--schedule", default="1f1b")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--optimizer", default="adamw")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None)
    p.add_argument("--dump-grads", action="store_true")
    p.add_argument("--no-mem-tracker", action="store_true")
    return p.parse_args(argv)


def resolve_spec(name: str):
    """A catalog model (the runtime presets tiny, small, tiny-gpt2 are catalog entries), a config.json or YAML."""
    from shardlab.catalog import get_catalog

    return get_catalog().model(name)


def model_source(model: str, load: bool, tp: int, divisible_by: int = 1):
    """(spec with the vocabulary padded for TP, Numerics, loader or None): a preset's, or a checkpoint folder's
    (``load``: every rank fills its own shards from it after the strategy has cut the model)."""
    from shardlab.runtime.numerics import Numerics
    from shardlab.runtime.vocab import pad_spec

    source = None
    if load:
        from shardlab.runtime.checkpoint.config import CheckpointSource

        source = CheckpointSource(model)
    spec0 = source.spec if source is not None else resolve_spec(model)
    spec, cut = pad_spec(spec0, tp, divisible_by)
    numerics = source.numerics(cut) if source is not None else Numerics(vocab_size=cut)
    if source is None:
        return spec, numerics, None
    from shardlab.runtime.checkpoint.load import load_into

    def load(modules):
        load.reports.append(load_into(modules, source.open(), source.family, spec0))
    load.reports = []      # what this rank read (LoadReport)
    return spec, numerics, load


def main(argv: list[str] | None = None) -> None:
    from shardlab.runtime.worker import rank_main

    rank_main(parse_args(argv), run)


def run(args, rr) -> dict:
    import torch
    import torch.distributed as dist

    from shardlab.runtime.data import SyntheticData
    from shardlab.runtime.dist import destroy, init_from_env
    from shardlab.runtime.metrics import CollectiveRecorder, PeakMemory, SavedActivations, model_state_bytes
    from shardlab.runtime.observe.rank import RankObserver
    from shardlab.runtime.parallel.build import forward_backward, full_grads, optimizer_step, setup_rank
    from shardlab.runtime.parallel.strategy import parse_strategy

    ctx = init_from_env(device_type=args.device)
    st = parse_strategy(args.strategy, ctx.world_size, tp=args.tp, pp=args.pp, vpp=args.vpp, schedule=args.schedule,
                        ep=args.ep)
    spec, numerics, load = model_source(args.model, args.load, st.tp, args.vocab_divisible_by)
    local = args.global_batch // st.dp
    m = local // args.micro_batch
    data = SyntheticData(numerics.vocab_size or spec.vocab_size, args.seq_len, args.global_batch, seed=1234 + args.seed)
    obs = RankObserver.from_env(ctx, strategy=st.name, kind="train", model=spec.name, planned=args.steps,
                                tokens_per_step=args.global_batch * args.seq_len)
    rec = CollectiveRecorder()
    rec.phase = "setup"
    rr.beat("build model")
    with rec:
        setup = setup_rank(spec, st, microbatches=m, optimizer=args.optimizer, lr=args.lr, seed=args.seed,
                           device_type=ctx.device_type, recorder=rec, numerics=numerics, load=load)
    setup_collectives = rec.summary()
    rec.reset()
    setup.counter.reset()
    setup.dispatch.reset()
    dp_group = setup.mesh["dp"].get_group()
    obs.bind(setup.mesh, setup.modules, dp_group)  # per-step collectives, metrics endpoint, slowness injection
    # step 0: memory (MemTracker + saved activations) and collective counts; step 1: time in collectives
    # (the recorder is a Python dispatch mode: it slows every op); steps 2+: clean step times
    coll_step = 1 if args.steps > 1 else 0
    losses, times, states, peak, coll_counts, coll_times, megatron_step0, megatron_sites = [], [], None, {}, {}, {}, {}, {}
    dispatch0: dict = {}
    grads = None
    for k in range(args.steps):
        with obs.data():
            x, y = data.shard(k, setup.coords["dp"], st.dp)
        obs.sync()  # steps start together; the barrier (timed: the wait for the slowest rank) is outside the step
        rr.beat(f"step {k} forward/backward")
        # MemTracker's module hooks cannot follow pipelining's autograd.grad: no tracker with pp
        tracker = PeakMemory(setup.modules, setup.optimizer, fsdp=st.data == "fsdp") \
            if k == 0 and st.pp == 1 and not args.no_mem_tracker else None
        saved = SavedActivations(setup.params) if k == 0 else contextlib.nullcontext()
        recording = rec if k in (0, coll_step) else contextlib.nullcontext()
        t0 = time.perf_counter()
        with recording:
            if tracker:
                tracker.__enter__()
            with saved:
                loss = forward_backward(setup, x, y, m, recorder=rec)
            if k == 0 and args.dump_grads:
                rec.enabled = False
                grads = full_grads(setup, spec)
                rec.enabled = True
            rr.beat(f"step {k} optimizer")
            optimizer_step(setup, recorder=rec)
            if tracker:
                tracker.__exit__(None, None, None)
        if ctx.device_type == "cuda":
            torch.cuda.synchronize()
        obs.slow_down(k, time.perf_counter() - t0)
        times.append(time.perf_counter() - t0)
        if k == 0:
            states = model_state_bytes(setup.params, setup.optimizer)
            peak = {"by_category": tracker.peak_by_category(), "at_peak": tracker.at_peak()} if tracker else {}
            peak["saved_activations"] = saved.peak_bytes
            obs.memory(states, {c.lower(): v for c, v in peak.get("by_category", {}).items()})
            coll_counts, megatron_step0, megatron_sites = rec.summary(), dict(setup.counter.counts), setup.counter.by_site()
            dispatch0 = setup.dispatch.summary()
            # a pipeline's first step also exchanges shapes and votes once: setup traffic, not per-step traffic
            for op, phases in list(coll_counts.items()):
                if "setup" in phases:
                    setup_collectives.setdefault(op, {})["first step"] = phases.pop("setup")
                    if not phases:
                        del coll_counts[op]
            if args.dump_grads and setup.coords["dp"] == 0 and setup.coords["tp"] == 0 and rr.run_dir:
                torch.save(grads, rr.run_dir / f"rank{ctx.rank}.grads.pt")
        if k == coll_step:
            coll_times = rec.summary()
        rec.reset()
        setup.optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss) if loss is not None else float("nan"))
        obs.step_done(k, times[-1], losses[-1])
    obs.finish()
    rr.beat("report")
    # the global-batch loss: mean of the data-parallel slices' losses (one all-reduce, after all steps)
    lt = torch.tensor(losses, dtype=torch.float64)
    if st.dp > 1:
        dist.all_reduce(lt, group=dp_group)
        lt /= st.dp
    clean = times[2:] or times[1:] or times
    instrumented = len(times) < 3
    coll = {op: {ph: {**v, "time_s": coll_times.get(op, {}).get(ph, {}).get("time_s")} for ph, v in d.items()}
            for op, d in coll_counts.items()}
    step_s = statistics.median(clean)
    doc = {
        "strategy": st.name, "world_size": ctx.world_size, "backend": ctx.backend, "device": ctx.device_type,
        "coords": setup.coords, "chunks": setup.pipeline.chunk_ids if setup.pipeline else [0],
        "computes_loss": setup.computes_loss, "losses": lt.tolist() if setup.computes_loss else None,
        "step_time_s": step_s, "step_times_s": times, "timed_steps": len(clean),
        "step_time_instrumented": instrumented,
        "tokens_per_s": args.global_batch * args.seq_len / step_s,
        "collectives": coll, "setup_collectives": setup_collectives,
        "megatron_counter": {f"{op}/{ph}": n for (op, ph), n in megatron_step0.items()},
        "megatron_sites": megatron_sites,
        "expert_dispatch": dispatch0,
        "model_states_bytes": states, "peak_bytes": peak,
        "params_local": sum(p.numel() for p in setup.params),
        "checkpoint_bytes_read": sum(r.bytes_read for r in load.reports) if load is not None else None,
    }
    doc["node"] = {"group_rank": int(os.environ.get("GROUP_RANK", "0")), "host": socket.gethostname()}
    gather_to_rank0(doc, grads if args.dump_grads and setup.coords["dp"] == 0 and setup.coords["tp"] == 0 else None,
                    ctx, rr)
    rr.beat("shutdown")
    destroy()
    return doc


def gather_to_rank0(doc: dict, grads, ctx, rr) -> None:
    """Several nodes, one job: global rank 0 gathers every rank's document (and its step-0 gradients, when parity is
    checked) over the process group and writes them beside its own (``rank{r}.json``, ``rank{r}.grads.pt``), so the
    driver on rank 0's node reports the whole job; one node: nothing to do (every rank writes to the same folder)."""
    import torch
    import torch.distributed as dist

    if int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size)) >= ctx.world_size:
        return
    rr.beat("gather the job's report")
    got = [None] * ctx.world_size if ctx.rank == 0 else None
    dist.gather_object({"doc": doc, "grads": grads}, got, dst=0)
    if ctx.rank != 0 or rr.run_dir is None:
        return
    here = doc["node"]["group_rank"]
    for r, item in enumerate(got):
        if r == 0 or item is None or item["doc"]["node"]["group_rank"] == here:
            continue                                   # this node's ranks write their own files
        RankRun(r, str(rr.run_dir)).result(item["doc"])
        if item["grads"] is not None:
            torch.save(item["grads"], rr.run_dir / f"rank{r}.grads.pt")


if __name__ == "__main__":
    main()
