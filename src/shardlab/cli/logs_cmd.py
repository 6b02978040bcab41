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


def _read(path: str, budget: int) -> tuple[str, int]:
    """(text, bytes read) of one log file, or of standard input for '-', reading at most ``budget`` bytes."""
    from shardlab.safeio import read_bytes

    if path == "-":
        raw = sys.stdin.buffer.read(budget) if hasattr(sys.stdin, "buffer") else sys.stdin.read(budget).encode()
    else:
        raw = read_bytes(path, "log file", max_bytes=budget)
    return raw.decode("utf-8", "replace"), len(raw)


def _read_all(files: list[str]) -> str:
    """The files joined, at most ``MAX_LOG_BYTES`` in all; runs of blank lines are cut to one (a log padded with
    millions of empty lines would otherwise cost a Python loop turn each)."""
    import re

    from shardlab.errors import ShardlabError
    from shardlab.limits import MAX_LOG_BYTES, MAX_LOG_LINES

    parts, left = [], MAX_LOG_BYTES
    too_much = (f"the log files hold more than {MAX_LOG_BYTES // 2**20} MiB in all; give the start-up part of each "
                f"(e.g. head -n 5000 FILE > start.log)")
    for f in files:
        if left <= 0:
            raise ShardlabError(too_much)
        try:
            text, n = _read(f, left)
        except ShardlabError as e:
            if left < MAX_LOG_BYTES and "-byte limit" in str(e):
                raise ShardlabError(too_much) from None
            raise
        parts.append(text)
        left -= n
    text = re.sub(r"\n[ \t\r\f\v\n]*\n", "\n\n", "\n".join(parts))
    if text.count("\n") - text.count("\n\n") > MAX_LOG_LINES:    # lines less the blank ones (single now)
        raise ShardlabError(f"the log files hold more than {MAX_LOG_LINES:,} lines; give the start-up part of each "
                            f"(e.g. head -n 5000 FILE > start.log)")
    return text


def cmd_logs(args):
    from shardlab.errors import ShardlabError
    from shardlab.runtime.observe.logs import checks, parse_startup, render_startup

    text = _read_all(args.files)
    facts = parse_startup(text)
    if not (facts["torchrun"] or facts["rendezvous"] or facts["ddp"] or facts["nccl"]["ranks"] or facts["nccl"]["version"]
            or facts["store_ports"]):
        raise ShardlabError("no torchrun, c10d, DDP or NCCL start-up lines found; capture them with LOGLEVEL=INFO "
                            "TORCH_CPP_LOG_LEVEL=INFO TORCH_DISTRIBUTED_DEBUG=INFO NCCL_DEBUG=INFO")
    doc = {"files": list(args.files), **facts, "checks": checks(facts)}
    doc["ddp"] = {str(k): v for k, v in doc["ddp"].items()}
    doc["nccl"] = {**doc["nccl"], "ranks": {str(k): v for k, v in doc["nccl"]["ranks"].items()}}
    return doc, render_startup(facts, doc["checks"])
