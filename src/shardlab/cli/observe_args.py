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
                   help="address the endpoints bind (default 127.0.0.1; 0.0.0.0 with --nodes > 1)")
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
    if args.tensorboard:
        _check_tensorboard_dir(args.tensorboard)
    if args.metrics_host and not args.no_metrics:
        _check_metrics_host(args.metrics_host)
    return ObserveOptions(
        metrics=not args.no_metrics, metrics_port=args.metrics_port, metrics_host=args.metrics_host,
        live=not (args.no_live or args.no_metrics or getattr(args, "json", False)) and sys.stderr.isatty(),
        slow_rank=parse_slow_rank(sr) if sr else None, slow_link=parse_slow_link(sl) if sl else None,
        steps_jsonl=args.steps_jsonl, tensorboard=args.tensorboard)


def _check_tensorboard_dir(path: str) -> None:
    """--tensorboard names a folder (existing or new): a file, a FIFO or a device there is an error before the job
    runs, not when its scalars are written at the end."""
    import os
    import stat

    from shardlab.errors import ShardlabError
    from shardlab.safeio import check_name

    p = check_name(path, "--tensorboard")
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise ShardlabError(f"--tensorboard {p}: {e.strerror or e}; give a folder to write into") from None
    if not stat.S_ISDIR(mode):
        raise ShardlabError(f"--tensorboard {p} exists and is not a folder; give a folder (existing or new)")


def _check_metrics_host(host: str) -> None:
    """--metrics-host must be an address of this machine the ranks can listen on (tried here, before the job: each
    rank would otherwise fail at its start)."""
    import re

    from shardlab.errors import ShardlabError
    from shardlab.runtime.observe.launcher import bind_error

    fix = "give an address of this machine (127.0.0.1, 0.0.0.0, ::) or leave the flag out"
    if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,253}", host):
        raise ShardlabError(f"--metrics-host {host[:60]!r} is not a host name or IP address; {fix}")
    why = bind_error(host, 0)
    if why:
        raise ShardlabError(f"--metrics-host {host}: cannot listen there ({why}); {fix}")
