"""The rank side of observability: per-step records, the Prometheus endpoint, slowness injection.

The launcher passes one JSON document in ``SHARDLAB_OBSERVE`` (see ``launcher.ObserveOptions.rank_env``).
A rank program (train_worker, infer_worker) then calls, per step::

    obs = RankObserver.from_env(ctx, strategy=..., kind="train", model=..., planned=steps, tokens_per_step=...)
    obs.bind(setup.mesh, setup.modules)        # label groups, route DDP through the tap, install it
    for k in range(steps):
        with obs.data():  ... fetch batch ...
        obs.sync()                             # timed step-boundary barrier: the wait for the slowest rank
        t0 = ...; work; obs.slow_down(k, elapsed); step_s = ...
        obs.step_done(k, step_s, loss)
    obs.finish()                               # last boundary wait, gather every rank's steps, stop serving

Each finished step is a record (``STEP_FIELDS``) appended to ``rank{r}.steps.jsonl`` in the run directory
and fed to the exporter; ``finish`` gathers all ranks' records (one ``all_gather_object``) and local rank 0
writes ``job.steps.json`` for its node's launcher, so every node can summarise the whole job.

Slow-rank injection: after its own work of a slowed step, rank R sleeps (factor − 1) × (step time so far −
time blocked in collectives), so its *compute* takes factor × longer, as ``estimate.straggler`` models it.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import time
from contextlib import contextmanager
from pathlib import Path

STEP_FIELDS = ("step", "rank", "step_s", "wait_s", "data_s", "compute_s", "blocked_s", "coll_s", "coll_calls",
               "coll_bytes", "injected_s", "loss", "time")
"""One step of one rank: its step time, the boundary wait after it, batch fetch, own compute (step − blocked),
time blocked in collectives, collective seconds/calls/bytes, injected sleep, loss, and the wall clock."""


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class RankObserver:
    """Observability for one rank; every method is cheap (no dispatch mode, no device sync)."""

    def __init__(self, cfg: dict, ctx, *, strategy: str, kind: str, model: str, planned: int, tokens_per_step: int,
                 run_dir: str | None = None):
        from shardlab.estimate.straggler import SlowLink, SlowRank
        from shardlab.runtime.observe.tap import CollectiveTap

        self.cfg, self.ctx, self.kind = cfg, ctx, kind
        self.rank = ctx.rank
        self.tokens_per_step = tokens_per_step
        sr, sl = cfg.get("slow_rank"), cfg.get("slow_link")
        self.slow = SlowRank(*sr) if sr and sr[0] == self.rank else None
        self.tap = CollectiveTap(self.rank, SlowLink(*sl) if sl else None)
        d = run_dir or os.environ.get("SHARDLAB_RUN_DIR")
        self.run_dir = Path(d) if d else None
        self.records: list[dict] = []
        self._pending: dict | None = None
        self._data_s = 0.0
        self._compute_injected_s = self._injected_total_s = 0.0
        self._totals = {"wait": 0.0, "compute": 0.0, "data": 0.0}
        self.exporter = None
        self.labels = {"job_id": cfg.get("job_id", "shardlab"), "node": os.environ.get("GROUP_RANK", "0"),
                       "rank": str(self.rank), "strategy": strategy}
        if cfg.get("metrics_ports"):
            from shardlab.runtime.observe.exporter import RankExporter

            gpu = ctx.local_rank if ctx.device_type == "cuda" else None
            self.exporter = RankExporter(self.labels, gpu_index=gpu)
            self.exporter.metric("shardlab_run_info", kind=kind, model=model, backend=ctx.backend,
                                 device=ctx.device_type, world_size=ctx.world_size).set(1)
            self.exporter.metric("shardlab_steps_planned").set(planned)
            port = self.exporter.start(int(cfg["metrics_ports"][ctx.local_rank]), cfg.get("metrics_host", "127.0.0.1"))
            self._publish_endpoint(port)
        self._jsonl = open(self.run_dir / f"rank{self.rank}.steps.jsonl", "w") if self.run_dir else None

    @classmethod
    def from_env(cls, ctx, **kw) -> RankObserver:
        return cls(json.loads(os.environ.get("SHARDLAB_OBSERVE") or "{}"), ctx, **kw)

    def _publish_endpoint(self, port: int) -> None:
        """Every rank's host:port, gathered so each node's launcher can scrape the whole job."""
        import torch.distributed as dist

        host = self.cfg.get("metrics_host", "127.0.0.1")
        me = {"rank": self.rank, "node": self.labels["node"], "port": port,
              "host": socket.gethostname() if host in ("0.0.0.0", "::") else host}
        eps = [None] * self.ctx.world_size
        dist.all_gather_object(eps, me)
        if self.ctx.local_rank == 0 and self.run_dir:
            _write_json(self.run_dir / "endpoints.json", eps)

    # ---- binding -----------------------------------------------------------------------------------
    def bind(self, mesh=None, modules=(), ddp_group=None) -> None:
        """Name process groups by mesh dimension, route DDP buckets through the tap, install the tap."""
        from shardlab.runtime.observe.tap import use_python_ddp_hook

        self.tap.name_groups(mesh)
        if modules:
            use_python_ddp_hook(modules, ddp_group)
        self.tap.install()
        self.tap.mark()

    # ---- per step ----------------------------------------------------------------------------------
    @contextmanager
    def data(self):
        """Time the batch fetch of the coming step."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._data_s = time.perf_counter() - t0

    def sync(self) -> float:
        """Timed barrier at the step boundary (not counted as a collective); returns the wait."""
        import torch.distributed as dist

        t0 = time.perf_counter()
        with self.tap.paused():
            dist.barrier()
        wait = time.perf_counter() - t0
        if self._pending is not None:
            self._emit(wait)
        self.tap.mark()
        return wait

    def slow_down(self, step: int, elapsed_s: float) -> float:
        """Injected slowness: on the slow rank's slowed steps, sleep (factor − 1) × own compute so far."""
        if self.slow is None or not self.slow.slowed(step):
            return 0.0
        own = max(elapsed_s - self.tap.since_mark()["blocked_s"], 0.0)
        extra = (self.slow.factor - 1.0) * own
        time.sleep(extra)
        self._compute_injected_s += extra
        self._injected_total_s += extra
        return extra

    def step_done(self, step: int, step_s: float, loss: float | None = None, wait_s: float | None = None) -> None:
        """Record a finished step; ``wait_s`` given (inference) emits it now, else the next :meth:`sync` does."""
        d = self.tap.since_mark()
        self._pending = {"step": step, "rank": self.rank, "step_s": step_s, "data_s": self._data_s,
                         "compute_s": max(step_s - d["blocked_s"], 0.0), "blocked_s": d["blocked_s"],
                         "coll_s": d["seconds"], "coll_calls": d["calls"], "coll_bytes": d["bytes"],
                         "injected_s": d["injected_s"] + self._compute_injected_s,
                         "loss": loss if loss is not None and loss == loss else None}
        self._data_s = self._compute_injected_s = 0.0
        if wait_s is not None:
            self._emit(wait_s)
            self.tap.mark()

    def token(self, k: int, t0: float) -> None:
        """Inference hook (``infer_worker.generate``'s ``on_token``): token k started at ``t0`` has finished."""
        self.slow_down(k, time.perf_counter() - t0)
        self.step_done(k, time.perf_counter() - t0, wait_s=0.0)

    def _emit(self, wait_s: float) -> None:
        rec = {**self._pending, "wait_s": wait_s, "time": time.time()}
        self._pending = None
        self.records.append(rec)
        if self._jsonl:
            self._jsonl.write(json.dumps(rec) + "\n")
            self._jsonl.flush()
        if self.exporter:
            self._export(rec)

    def _export(self, rec: dict) -> None:
        e, t = self.exporter, self._totals
        e.metric("shardlab_step_seconds").observe(rec["step_s"])
        e.metric("shardlab_steps").inc()
        period = rec["step_s"] + rec["wait_s"] + rec["data_s"]
        if period > 0:
            e.metric("shardlab_tokens_per_second").set(self.tokens_per_step / period)
        if rec["loss"] is not None:
            e.metric("shardlab_loss").set(rec["loss"])
        for key, name in (("wait", "shardlab_step_wait_seconds"), ("compute", "shardlab_compute_seconds"),
                          ("data", "shardlab_dataloader_wait_seconds")):
            t[key] += rec[f"{key}_s"]
            e.set_total(name, t[key])
        for row in self.tap.totals():
            for field, name in (("calls", "shardlab_collective_calls"), ("bytes", "shardlab_collective_bytes"),
                                ("seconds", "shardlab_collective_seconds"),
                                ("blocked_s", "shardlab_collective_blocked_seconds")):
                e.set_total(name, row[field], op=row["op"], group=row["group"])
        e.set_total("shardlab_injected_delay_seconds", self.tap.injected_s, kind="link")
        e.set_total("shardlab_injected_delay_seconds", self._injected_total_s, kind="compute")
        self.memory()

    def memory(self, states: dict | None = None, peak: dict | None = None) -> None:
        """Current and peak memory by category (states: model-state bytes; peak: MemTracker's by category)."""
        if not self.exporter:
            return
        cur = {"process_rss": _rss_bytes(), **(states or {})}
        top = {"process_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, **(peak or {})}
        if self.ctx.device_type == "cuda":
            import torch

            cur.update(cuda_allocated=torch.cuda.memory_allocated(), cuda_reserved=torch.cuda.memory_reserved())
            top["cuda_allocated"] = torch.cuda.max_memory_allocated()
        for cat, v in cur.items():
            self.exporter.metric("shardlab_memory_bytes", category=cat).set(v)
        for cat, v in top.items():
            self.exporter.metric("shardlab_memory_peak_bytes", category=cat).set(v)

    # ---- end ---------------------------------------------------------------------------------------
    def finish(self, barrier: bool = True) -> list[dict]:
        """Last boundary wait, every rank's records to local rank 0 (``job.steps.json``), endpoint closed."""
        import torch.distributed as dist

        if barrier:
            self.sync()
        elif self._pending is not None:
            self._emit(0.0)
        everyone = [None] * self.ctx.world_size
        with self.tap.paused():
            dist.all_gather_object(everyone, self.records)
        if self.ctx.local_rank == 0 and self.run_dir:
            _write_json(self.run_dir / "job.steps.json", [r for recs in everyone for r in recs])
        self.close()
        return self.records

    def close(self) -> None:
        """Stop serving and restore torch.distributed (safe to call twice)."""
        self.tap.uninstall()
        if self.exporter:
            self.exporter.stop()
        if self._jsonl:
            self._jsonl.close()
            self._jsonl = None


def _write_json(path: Path, doc) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)
