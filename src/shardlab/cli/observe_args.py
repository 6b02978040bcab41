"""Observability flags shared by `shardlab run train|infer` and `shardlab bench collectives` (docs/observability.md)."""

from __future__ import annotations

import argparse
import sys

from shardlab.cli.common import BOUNDED


def add_observe_args(p: argparse.ArgumentParser, injection: bool = True) -> None:
    g = p.add_argument_group("observability (docs/observability.md)")
    g.add_argument("--metrics-port", type=BOUNDED["port"], default=None, metavar="N",
                   help="each rank serves Prometheus metrics on N + its local rank (default: free ports, printed)")
    g.add_argument("--metrics-host", default=None, metavar="ADDR",
                   help="address the endpoints bind (default 127.0.0.1; 0.0.0.0 with --nnodes > 1)")
    g.add_argument("--no-metrics", action="store_true", help="no per-rank endpoints and no live table")
    g.add_argument("--no-live", action="store_true", help="no live per-rank table on the terminal (stderr)")
    g.add_argument("--steps-jsonl", default=None, metavar="FILE",
                   help="keep every rank's per-step records in FILE (default: steps.jsonl in the run directory, which is "
                        "temporary unless SHARDLAB_KEEP_RUN_DIR=1)")
    g.add_argument("--tensorboard", default=None, metavar="DIR", help="also write TensorBoard scalars (one run per rank)")
    if injection:
        g.add_argument("--slow-rank", default=None, metavar="R:FACTOR[:FRACTION]",
                       help="teaching: rank R computes FACTOR x slower (on FRACTION of the steps, default all)")
        g.add_argument("--slow-link", default=None, metavar="R:SECONDS",
                       help="teaching: every collective of rank R takes SECONDS longer")


def observe_options(args):
    """ObserveOptions from the flags (bad --slow-rank/--slow-link text: one-line error, exit 2)."""
    from shardlab.estimate.straggler import parse_slow_link, parse_slow_rank
    from shardlab.runtime.observe.launcher import ObserveOptions

    sr, sl = getattr(args, "slow_rank", None), getattr(args, "slow_link", None)
    if args.steps_jsonl:
        from shardlab.safeout import check_output_path

        check_output_path(args.steps_jsonl, "--steps-jsonl")
    return ObserveOptions(
        metrics=not args.no_metrics, metrics_port=args.metrics_port, metrics_host=args.metrics_host,
        live=not (args.no_live or args.no_metrics or getattr(args, "json", False)) and sys.stderr.isatty(),
        slow_rank=parse_slow_rank(sr) if sr else None, slow_link=parse_slow_link(sl) if sl else None,
        steps_jsonl=args.steps_jsonl, tensorboard=args.tensorboard)
