"""Scrape a rank's endpoint the way a Prometheus server does: HTTP GET /metrics, parse the text format.

Parsing uses ``prometheus_client.parser.text_string_to_metric_families`` (the reference parser of the
text exposition format), so what the launcher reads is exactly what a server would ingest.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass, field


@dataclass
class Scrape:
    """One scrape of one endpoint."""

    url: str
    """http://host:port/metrics"""
    ok: bool
    """True when the endpoint answered with parseable text."""
    samples: list[tuple[str, dict, float]] = field(default_factory=list)
    """(sample name, labels, value) for every sample served."""
    error: str = ""
    """Why the scrape failed (connection refused while a rank starts, or gone after it ended)."""

    def value(self, name: str, **labels) -> float | None:
        """Sum of the samples named ``name`` whose labels include ``labels`` (None when there is none)."""
        vals = [v for n, lab, v in self.samples if n == name and all(lab.get(k) == str(x) for k, x in labels.items())]
        return sum(vals) if vals else None

    def label(self, key: str) -> str | None:
        """A common label's value (rank, node, job_id, strategy) as served."""
        return next((lab[key] for _, lab, _ in self.samples if key in lab), None)


def parse(text: str) -> list[tuple[str, dict, float]]:
    """Every sample of a Prometheus text exposition (raises ValueError on malformed text)."""
    from prometheus_client.parser import text_string_to_metric_families

    return [(s.name, dict(s.labels), float(s.value)) for fam in text_string_to_metric_families(text) for s in fam.samples]


def scrape(host: str, port: int, timeout_s: float = 1.0) -> Scrape:
    """GET http://host:port/metrics and parse it; never raises."""
    url = f"http://{host}:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            text = resp.read().decode("utf-8")
        return Scrape(url, True, parse(text))
    except (urllib.error.URLError, OSError, ValueError) as e:
        return Scrape(url, False, error=str(getattr(e, "reason", e)))
