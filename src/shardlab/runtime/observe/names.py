"""The metrics every rank exports, as data: one place for names, types, help and labels.

The exporter (``exporter.py``), the docs (docs/observability.md), the Grafana dashboard and the
Prometheus scrape config in examples/ all use these names; tests hold each against this table and against
what a live endpoint serves. Names follow the Prometheus conventions (base units: seconds, bytes, watts,
hertz, celsius; ``_total`` on counters: https://prometheus.io/docs/practices/naming/).
"""

from __future__ import annotations

from dataclasses import dataclass

COMMON_LABELS = ("job_id", "node", "rank", "strategy")
"""On every series. ``job_id`` (not ``job``, which a Prometheus server sets to the scrape job's name)."""

STEP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0)
"""Histogram buckets of the step time (1 ms .. 1 min; a 1-2-5 ladder like prometheus_client's defaults)."""


@dataclass(frozen=True)
class MetricDef:
    """One exported metric family."""

    name: str
    """Family name as given to prometheus_client (counters gain ``_total`` when exported)."""
    kind: str
    """'counter', 'gauge' or 'histogram'."""
    help: str
    """The HELP text."""
    labels: tuple[str, ...] = ()
    """Labels beyond COMMON_LABELS."""
    gpu: bool = False
    """Only on CUDA ranks (read through NVML)."""

    @property
    def series(self) -> tuple[str, ...]:
        """Sample names a scrape shows (what PromQL queries)."""
        if self.kind == "counter":
            return (f"{self.name}_total",)
        if self.kind == "histogram":
            return tuple(f"{self.name}_{s}" for s in ("bucket", "sum", "count"))
        return (self.name,)


METRICS: tuple[MetricDef, ...] = (
    MetricDef("shardlab_run_info", "gauge", "Always 1; labels describe the run", ("kind", "model", "backend", "device",
                                                                                "world_size")),
    MetricDef("shardlab_step_seconds", "histogram",
              "Wall time of one step on this rank (training: forward, backward, optimizer; inference: one decoded "
              "token), injected slowness included, waiting at the step boundary excluded"),
    MetricDef("shardlab_steps", "counter", "Steps (training) or decoded tokens (inference) finished"),
    MetricDef("shardlab_steps_planned", "gauge", "Steps (or tokens) this run will take"),
    MetricDef("shardlab_tokens_per_second", "gauge",
              "Tokens the job processes per second at the pace of this rank's last step (boundary wait included)"),
    MetricDef("shardlab_loss", "gauge", "Last training loss this rank computed (its data-parallel slice)"),
    MetricDef("shardlab_step_wait_seconds", "counter",
              "Time spent at the step boundary waiting for the slowest rank to finish its step"),
    MetricDef("shardlab_compute_seconds", "counter",
              "Step time not spent blocked in collectives (own work, injected slowness included)"),
    MetricDef("shardlab_dataloader_wait_seconds", "counter", "Time spent fetching the next batch"),
    MetricDef("shardlab_collective_calls", "counter", "Collective calls issued", ("op", "group")),
    MetricDef("shardlab_collective_bytes", "counter",
              "Bytes moved by collectives (nccl-tests' S: the largest buffer of the call)", ("op", "group")),
    MetricDef("shardlab_collective_seconds", "counter",
              "Time from a collective's issue until its work completed (overlap with compute included)",
              ("op", "group")),
    MetricDef("shardlab_collective_blocked_seconds", "counter",
              "Time this rank's thread was blocked in a collective call or its wait(): waiting for peers shows here",
              ("op", "group")),
    MetricDef("shardlab_injected_delay_seconds", "counter",
              "Sleep injected for teaching (--slow-rank: compute, --slow-link: link)", ("kind",)),
    MetricDef("shardlab_memory_bytes", "gauge",
              "Memory held now, by category (weights, gradients, optimizer from tensor storages; process_rss; "
              "cuda_allocated, cuda_reserved)", ("category",)),
    MetricDef("shardlab_memory_peak_bytes", "gauge",
              "Peak memory by category (torch MemTracker categories of step 0; process_rss; cuda_allocated)",
              ("category",)),
    MetricDef("shardlab_gpu_utilization_ratio", "gauge", "NVML: fraction of time a kernel ran (0-1)", ("gpu",), True),
    MetricDef("shardlab_gpu_memory_used_bytes", "gauge", "NVML: device memory in use", ("gpu",), True),
    MetricDef("shardlab_gpu_memory_total_bytes", "gauge", "NVML: device memory size", ("gpu",), True),
    MetricDef("shardlab_gpu_power_watts", "gauge", "NVML: power draw", ("gpu",), True),
    MetricDef("shardlab_gpu_sm_clock_hertz", "gauge", "NVML: SM clock", ("gpu",), True),
    MetricDef("shardlab_gpu_temperature_celsius", "gauge", "NVML: GPU temperature", ("gpu",), True),
)
"""Every family a rank exports."""

BY_NAME = {m.name: m for m in METRICS}


def series_names(gpu: bool = True) -> set[str]:
    """Every sample name a rank can serve (with ``gpu=False``: those a CPU rank serves)."""
    return {s for m in METRICS if gpu or not m.gpu for s in m.series}
