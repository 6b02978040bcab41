"""shardlab logs: read a distributed job's start-up output (torchrun, c10d, DDP, NCCL) and check the layout it shows."""

from __future__ import annotations

import argparse
import sys

EXAMPLES = """examples:
  LOGLEVEL=INFO TORCH_CPP_LOG_LEVEL=INFO TORCH_DISTRIBUTED_DEBUG=INFO NCCL_DEBUG=INFO torchrun ... 2> start.log
  shardlab logs start.log
  shardlab logs node0.log node1.log --json
  journalctl -u trainer | shardlab logs -
"""


def register(sub) -> None:
    p = sub.add_parser("logs", help="read torchrun/NCCL start-up logs: world size, ranks, hosts, NCCL transports",
                       description="Read a distributed job's start-up output and report what it shows: torchrun's "
                                   "launch configuration and rendezvous, c10d's store, DDP's replica, NCCL's version, "
                                   "network and how each ring hop is connected; then check the layout is consistent.",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", metavar="FILE", help="log files ('-' reads standard input); several are joined")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    p.set_defaults(func=cmd_logs)


def _read(path: str) -> str:
    from shardlab.limits import MAX_LOG_BYTES
    from shardlab.safeio import read_bytes

    if path == "-":
        return sys.stdin.read(MAX_LOG_BYTES)
    return read_bytes(path, "log file", max_bytes=MAX_LOG_BYTES).decode("utf-8", "replace")


def cmd_logs(args):
    from shardlab.errors import ShardlabError
    from shardlab.runtime.observe.logs import checks, parse_startup, render_startup

    text = "\n".join(_read(f) for f in args.files)
    facts = parse_startup(text)
    if not (facts["torchrun"] or facts["rendezvous"] or facts["ddp"] or facts["nccl"]["ranks"] or facts["nccl"]["version"]
            or facts["store_ports"]):
        raise ShardlabError("no torchrun, c10d, DDP or NCCL start-up lines found; capture them with LOGLEVEL=INFO "
                            "TORCH_CPP_LOG_LEVEL=INFO TORCH_DISTRIBUTED_DEBUG=INFO NCCL_DEBUG=INFO")
    doc = {"files": list(args.files), **facts, "checks": checks(facts)}
    doc["ddp"] = {str(k): v for k, v in doc["ddp"].items()}
    doc["nccl"] = {**doc["nccl"], "ranks": {str(k): v for k, v in doc["nccl"]["ranks"].items()}}
    return doc, render_startup(facts, doc["checks"])
