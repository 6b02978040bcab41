"""Observability of real runs: every rank's metrics live, aggregated by the launcher, stragglers named.

Rank side (inside torchrun's processes):
- ``tap``: counts and times every collective cheaply (wraps torch.distributed's Python entry points);
  injects a slow link.
- ``rank``: per-step records (``rank{r}.steps.jsonl``), the Prometheus endpoint, slow-rank injection.
- ``exporter`` / ``gpu``: the prometheus_client registry and HTTP server; NVML GPU counters.
- ``names``: every exported metric (name, type, help, labels) as data.

Launcher side:
- ``launcher``: options, the ranks' environment, ports, the live view while torchrun runs, the aggregate.
- ``scrape`` / ``live``: HTTP scrapes parsed with prometheus_client's parser; the refreshing per-rank table.
- ``summary`` / ``report``: percentiles, the straggler and its drag, predicted vs measured; their text.
- ``tensorboard``: scalars via tensorboardX (and a reader to check them).
- ``logs``: reads torchrun / NCCL start-up output (``shardlab logs``).
"""
