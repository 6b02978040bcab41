"""shardlab shard-check: build a model on the meta device, shard it with PyTorch's own FSDP2/TP at the target
world size on a fake process group, and compare every rank's shards with the memory model byte for byte."""

from __future__ import annotations

import argparse

from shardlab.cli.bench_cmds import _STOPPED
from shardlab.cli.common import BOUNDED, add_output_args, old_spelling
from shardlab.cli.runtime_cmds import reports_interrupt
from shardlab.errors import ShardlabError

MAX_CHECKED_RANKS = 256
"""Ranks `shard-check --ranks` may execute (each is a fresh interpreter building the model on the meta device)."""

EXAMPLES_SHARD = """examples:
  shardlab shard-check llama-3.1-70b --gpus 64 --fsdp 64
  shardlab shard-check llama-3.1-70b --gpus 64 --dp 8 --tp 8
  shardlab shard-check llama-2-7b --fsdp 60 --ranks all --json
"""


def register(sub) -> None:
    sc = sub.add_parser("shard-check", help="PyTorch's real per-rank shards at target scale vs the memory model",
                        description="Build MODEL on the meta device, apply FSDP2/TP with PyTorch's fake process group "
                                    "at --gpus ranks, and compare every rank's parameter shards with the memory "
                                    "model byte for byte (exit 1 on any difference).",
                        epilog=EXAMPLES_SHARD, formatter_class=argparse.RawDescriptionHelpFormatter)
    sc.add_argument("model", metavar="MODEL", help="catalog id, config.json path, or runtime preset (tiny, small)")
    sc.add_argument("--gpus", dest="world_size", type=BOUNDED["gpus"], default=None, help="ranks (default: dp x tp)")
    old_spelling(sc, "--world-size", "--gpus", "world_size", type=BOUNDED["gpus"])
    sc.add_argument("--fsdp", type=BOUNDED["gpus"], default=None, metavar="N", help="FSDP2 over N ranks (= --dp N --zero 3)")
    sc.add_argument("--dp", type=BOUNDED["gpus"], default=None, help="data-parallel degree (default: world size / tp)")
    sc.add_argument("--tp", type=BOUNDED["gpus"], default=1, help="tensor-parallel degree (DTensor, Megatron plan)")
    sc.add_argument("--zero", type=int, choices=(0, 3), default=None,
                    help="3: FSDP2 shards over dp (default); 0: dp replicas")
    sc.add_argument("--dtype", choices=("bf16", "fp32", "fp16"), default="bf16", help="parameter dtype (default bf16)")
    sc.add_argument("--ranks", default="auto", help="ranks to execute: auto (one per shard class, default), all, "
                                                   "or a comma list (rank 0 always runs)")
    sc.add_argument("--timeout", type=BOUNDED["timeout"], default=600, help="seconds per rank process (default 600)")
    add_output_args(sc)
    sc.set_defaults(func=cmd_shard_check)


@reports_interrupt("shard-check", note=_STOPPED)
def cmd_shard_check(args):
    from shardlab.cli import emit
    from shardlab.layout import Layout
    from shardlab.layout_checks import validate
    from shardlab.runtime import require_torch
    from shardlab.runtime.shard_check import render, resolve_spec, shard_check

    dp, tp, zero = args.dp, args.tp, 3 if args.zero is None else args.zero
    if args.fsdp is not None:
        if args.dp is not None and args.dp != args.fsdp:
            raise ShardlabError(f"--fsdp {args.fsdp} and --dp {args.dp} disagree; give one of them")
        if zero != 3:
            raise ShardlabError(f"--fsdp {args.fsdp} shards (zero 3) but --zero {zero} replicates; use --dp "
                                f"{args.fsdp} --zero {zero} for replicas, or drop --zero")
        dp = args.fsdp
    world = args.world_size or (dp or 1) * tp
    if dp is None:
        if world % tp:
            raise ShardlabError(f"--gpus {world} is not divisible by --tp {tp}; choose a tp that divides it")
        dp = world // tp
    if dp * tp != world:
        raise ShardlabError(f"dp x tp = {dp} x {tp} = {dp * tp} but --world-size is {world}; make them agree")
    ranks = args.ranks
    if ranks not in ("auto", "all"):
        try:
            ranks = sorted({int(x) for x in ranks.split(",")})
        except ValueError:
            raise ShardlabError(f"--ranks '{args.ranks}': use auto, all or a comma list such as 0,63") from None
        if ranks[0] < 0 or ranks[-1] >= world:
            raise ShardlabError(f"--ranks {args.ranks}: ranks run from 0 to {world - 1}")
    if (len(ranks) if isinstance(ranks, list) else world if ranks == "all" else 0) > MAX_CHECKED_RANKS:
        raise ShardlabError(f"shard-check runs one process per rank checked: at most {MAX_CHECKED_RANKS} "
                            f"(about a second each); use --ranks auto (one rank per shard class) or a shorter list")
    require_torch()
    spec = resolve_spec(args.model, args.catalog)
    layout = validate(Layout(dp=dp, tp=tp, zero=zero), spec, num_gpus=world)
    from shardlab.runtime.gpt import unbuilt

    if unbuilt(spec):
        raise ShardlabError(f"{spec.name} {unbuilt(spec)}")
    doc = shard_check(args.model, args.catalog, layout, args.dtype, ranks, args.timeout)
    from shardlab.cli.progress import clear

    clear()
    emit(args, doc, render(doc))
    return 0 if doc["exact"] else 1
