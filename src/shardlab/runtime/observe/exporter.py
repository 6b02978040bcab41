"""A rank's Prometheus endpoint (``prometheus_client``): the families of ``names.METRICS``, served over HTTP.

One registry per rank (never the library's global one), one HTTP server thread on ``host:port`` (port =
base + local rank), stopped with :meth:`RankExporter.stop` so no port stays open after the run. Counters
are fed from the rank's cumulative totals (``set_total``), so what a scrape shows always equals what the
rank's JSON reports.
"""

from __future__ import annotations

from shardlab.errors import ShardlabError
from shardlab.runtime.observe.names import COMMON_LABELS, METRICS, STEP_BUCKETS_S


def require_prometheus_client():
    try:
        import prometheus_client
    except ImportError:
        raise ShardlabError("per-rank metrics need prometheus-client: pip install 'shardlab[observe]' "
                            "(or pass --no-metrics)") from None
    return prometheus_client


class RankExporter:
    """The metric families of one rank with their common label values bound."""

    def __init__(self, labels: dict[str, str], gpu_index: int | None = None):
        pc = require_prometheus_client()
        pc.disable_created_metrics()  # no *_created series: they double every counter for nothing
        self.registry = pc.CollectorRegistry(auto_describe=True)
        self.base = {k: str(labels[k]) for k in COMMON_LABELS}
        self.families = {}
        kinds = {"counter": pc.Counter, "gauge": pc.Gauge, "histogram": pc.Histogram}
        for m in METRICS:
            if m.gpu:
                continue
            kw = {"buckets": STEP_BUCKETS_S} if m.kind == "histogram" else {}
            self.families[m.name] = kinds[m.kind](m.name, m.help, COMMON_LABELS + m.labels, registry=self.registry, **kw)
        self._totals: dict = {}
        if gpu_index is not None:
            from shardlab.runtime.observe.gpu import NvmlCollector

            collector = NvmlCollector(gpu_index, self.base)
            if collector.available:
                self.registry.register(collector)
        self.server = None
        self.thread = None

    def metric(self, name: str, **extra):
        """The child series of family ``name`` for this rank (``extra``: its own labels)."""
        return self.families[name].labels(**self.base, **{k: str(v) for k, v in extra.items()})

    def set_total(self, name: str, total: float, **extra) -> None:
        """Advance counter ``name`` to the cumulative ``total`` (counters only go up)."""
        key = (name, tuple(sorted(extra.items())))
        prev = self._totals.get(key, 0.0)
        if total > prev:
            self.metric(name, **extra).inc(total - prev)
            self._totals[key] = total
        elif key not in self._totals:
            self.metric(name, **extra)  # expose the series at 0
            self._totals[key] = prev

    def start(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve /metrics on host:port (0: a port the OS picks now) in a daemon thread; returns the port bound. A
        port in use is a one-line error."""
        pc = require_prometheus_client()
        try:
            self.server, self.thread = pc.start_http_server(port, addr=host, registry=self.registry)
        except OSError as e:
            raise ShardlabError(f"cannot serve metrics on {host}:{port} ({e.strerror}); pass another --metrics-port "
                                f"or --no-metrics") from None
        return int(self.server.server_address[1])

    def stop(self) -> None:
        """Close the listening socket and end the server thread."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            if self.thread is not None:
                self.thread.join(timeout=5)
            self.server = self.thread = None

    def exposition(self) -> str:
        """What a scrape would return now (Prometheus text format 0.0.4)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()
