"""The launcher side: what the ranks are told, the live view while they run, the aggregate afterwards.

``shardlab.runtime.launch.launch(..., observer=Observation(...))`` calls :meth:`Observation.prepare`
(environment for the ranks; metrics ports checked free) before starting torchrun, :meth:`start` right
after and :meth:`stop` when torchrun has exited. The run command then calls :meth:`finish` for the
aggregate: every rank's step records (``job.steps.json``, gathered by the ranks at the end, so a node
sees the whole job), percentiles, the straggler, a JSONL series and optional TensorBoard scalars.
"""

from __future__ import annotations

import json
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from shardlab.errors import ShardlabError


@dataclass(frozen=True)
class ObserveOptions:
    """The observability flags of ``shardlab run train|infer`` and ``bench collectives``."""

    metrics: bool = True
    """Serve Prometheus metrics from every rank (``--no-metrics`` turns it off)."""
    metrics_port: int | None = None
    """Base port: local rank i serves on base + i; None lets each rank bind a free port (the run prints them)."""
    metrics_host: str | None = None
    """Address to bind; default 127.0.0.1 on one node, 0.0.0.0 with several (peers scrape each other)."""
    live: bool = False
    """Draw the live per-rank table on stderr (the CLI sets it when stderr is a terminal and not --json)."""
    slow_rank: object = None
    """``estimate.straggler.SlowRank`` to inject, or None."""
    slow_link: object = None
    """``estimate.straggler.SlowLink`` to inject, or None."""
    steps_jsonl: str | None = None
    """Where to write the per-step series (default: steps.jsonl in the run directory)."""
    tensorboard: str | None = None
    """Directory for TensorBoard scalars (one run per rank), or None."""
    interval_s: float = 1.0
    """Seconds between scrapes of the live view."""


def bind_error(host: str, port: int) -> str | None:
    """Why ``port`` cannot be bound on ``host`` (an IPv4 or IPv6 address or name: the family its address has), or
    None when it can (port 0: whether the host can be listened on at all)."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(addr)
    except (OSError, UnicodeError) as e:
        return getattr(e, "strerror", None) or str(e)
    return None


def port_free(host: str, port: int) -> bool:
    """Whether ``port`` can be bound on ``host`` (``bind_error``)."""
    return bind_error(host, port) is None


def choose_ports(host: str, nproc: int, base: int | None) -> list[int]:
    """One port per local rank: base + i (each checked free), or 0 for each when ``base`` is None: the rank binds a
    port the OS picks at that moment and publishes it (``endpoints.json``). A port picked here and bound seconds later
    by the rank could be taken in between, by the job's own gloo connections among others."""
    if base is None:
        return [0] * nproc
    if base + nproc - 1 > 65535:
        raise ShardlabError(f"--metrics-port {base} + {nproc} ranks runs past port 65535; choose a lower base")
    for i in range(nproc):
        if not port_free(host, base + i):
            raise ShardlabError(f"metrics port {base + i} (local rank {i}) is in use on {host}; pass another "
                                f"--metrics-port (ranks use {base}..{base + nproc - 1}) or --no-metrics")
    return [base + i for i in range(nproc)]


class Observation:
    """One run's observability on this node."""

    def __init__(self, opts: ObserveOptions, nproc: int, world_size: int, *, kind: str, job_id: str | None = None,
                 nnodes: int = 1, stream=None):
        from shardlab.estimate.straggler import check_rank

        check_rank(opts.slow_rank, world_size, "--slow-rank")
        check_rank(opts.slow_link, world_size, "--slow-link")
        if opts.metrics:
            from shardlab.runtime.observe.exporter import require_prometheus_client

            require_prometheus_client()
        self.opts, self.nproc, self.world_size, self.kind, self.nnodes = opts, nproc, world_size, kind, nnodes
        self.job_id = job_id
        self.host = opts.metrics_host or ("0.0.0.0" if nnodes > 1 else "127.0.0.1")
        self.stream = stream if stream is not None else sys.stderr
        self.ports: list[int] = []
        self.view = None
        self.run_dir: Path | None = None

    def prepare(self, run_dir: Path) -> dict:
        """Environment entries for torchrun's ranks (checks the metrics ports first)."""
        self.run_dir = Path(run_dir)
        self.job_id = self.job_id or self.run_dir.name
        cfg = {"job_id": self.job_id}
        if self.opts.metrics:
            self.ports = choose_ports(self.host, self.nproc, self.opts.metrics_port)
            cfg.update(metrics_ports=self.ports, metrics_host=self.host)
        if self.opts.slow_rank is not None:
            s = self.opts.slow_rank
            cfg["slow_rank"] = [s.rank, s.factor, s.fraction]
        if self.opts.slow_link is not None:
            cfg["slow_link"] = [self.opts.slow_link.rank, self.opts.slow_link.delay_s]
        return {"SHARDLAB_OBSERVE": json.dumps(cfg)}

    def start(self) -> None:
        """Start scraping (and drawing, with ``live``) in a thread."""
        if not self.opts.metrics:
            return
        from shardlab.runtime.observe.live import LiveView

        local = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        self.view = LiveView([(local, p) for p in self.ports if p], self.run_dir,
                             stream=self.stream if self.opts.live else None, interval_s=self.opts.interval_s,
                             title=f"shardlab {self.kind} · job {self.job_id}")
        self.view.start()

    def stop(self) -> None:
        if self.view is not None:
            self.view.stop()

    def bound_ports(self) -> list[int]:
        """The ports the ranks serve on: the chosen ones, or (OS-picked) those the ranks published in endpoints.json."""
        if all(self.ports):
            return list(self.ports)
        try:
            eps = json.loads((self.run_dir / "endpoints.json").read_text())
            return [int(e["port"]) for e in eps if isinstance(e, dict)]
        except (OSError, ValueError, TypeError, KeyError):
            return []

    def records(self) -> list[dict]:
        """Every rank's step records (:func:`step_records`)."""
        return step_records(self.run_dir)

    def finish(self, *, skip_steps: int, predicted: dict | None = None) -> dict:
        """The aggregate document; writes the JSONL series and TensorBoard scalars."""
        from shardlab.runtime.observe.summary import compare_prediction, summarise

        recs = sorted(self.records(), key=lambda r: (r["step"], r["rank"]))
        injected = self.opts.slow_rank.rank if self.opts.slow_rank is not None else None
        doc = summarise(recs, skip_steps=skip_steps, kind=self.kind, injected=injected)
        path = Path(self.opts.steps_jsonl) if self.opts.steps_jsonl else self.run_dir / "steps.jsonl"
        from shardlab.safeout import replace_text

        replace_text(path, "".join(json.dumps(r) + "\n" for r in recs), "--steps-jsonl")
        from shardlab.runtime.launch import removed_at_exit

        # in a temporary run folder the series goes with the folder when the command exits: report no path then
        doc["steps_jsonl"] = None if not self.opts.steps_jsonl and removed_at_exit(self.run_dir) else str(path)
        if self.opts.tensorboard:
            from shardlab.runtime.observe.tensorboard import write_scalars

            doc["tensorboard"] = write_scalars(recs, self.opts.tensorboard)
        doc["injected"] = {"slow_rank": _asdict(self.opts.slow_rank), "slow_link": _asdict(self.opts.slow_link)}
        if predicted is not None:
            doc["predicted"] = predicted
            doc["predicted_vs_measured"] = compare_prediction(doc, predicted)
        doc["metrics"] = {"enabled": self.opts.metrics, "job_id": self.job_id, "host": self.host, "ports": self.bound_ports(),
                          **(self.view.report() if self.view else {})}
        return doc


def step_records(run_dir) -> list[dict]:
    """Every rank's step records (``rank.STEP_FIELDS``): the gathered ``job.steps.json`` (every node's, written when
    the ranks finish), else this node's ``rank*.steps.jsonl`` (written step by step: what an interrupted job left).
    A line cut short or a record without the fields is skipped; no folder, no records."""
    from shardlab.runtime.observe.rank import STEP_FIELDS

    if run_dir is None:
        return []
    rd = Path(run_dir)
    try:
        recs = json.loads((rd / "job.steps.json").read_text())
    except (OSError, ValueError):
        recs = []
        for p in sorted(rd.glob("rank*.steps.jsonl")):
            try:
                lines = p.read_text().splitlines()
            except OSError:
                continue
            for line in lines:
                try:
                    recs.append(json.loads(line))
                except ValueError:
                    continue
    if not isinstance(recs, list):
        return []
    return [r for r in recs if isinstance(r, dict) and all(k in r for k in STEP_FIELDS)]


def _asdict(x) -> dict | None:
    import dataclasses

    return dataclasses.asdict(x) if x is not None else None
