"""`shardlab plan`'s pins: --fix AXIS=VALUE and the layout flags (--tp 2, --zero 3, ...) as axes the search holds."""

from __future__ import annotations

from shardlab.limits import MAX_GPUS
from shardlab.memory.training import RECOMPUTE_CODES

PLAN_RECOMPUTE = {k: v for k, v in RECOMPUTE_CODES.items() if k != "op"}
"""Recomputation settings the planner searches, by their codes (per-op checkpointing is estimate-only)."""


def parse_fix(items: list[str]) -> dict:
    from shardlab.errors import ShardlabError
    from shardlab.estimate.step import SCHEDULE_CODES

    out = {}
    for it in items:
        key, _, val = it.partition("=")
        key = key.strip().replace("-", "_")
        if key == "micro_batch":
            key = "mb"
        if key in ("rc", "recompute"):
            key, val = "rc", str(PLAN_RECOMPUTE.get(val, val))
        if key in ("schedule", "sched"):
            if val not in SCHEDULE_CODES:
                raise ShardlabError(f"--fix {it}: schedule is one of {', '.join(SCHEDULE_CODES)}")
            key, val = "sched", str(SCHEDULE_CODES[val])
        if key in ("hybrid", "hsdp"):
            key = "hs"
        if key == "hs" and val.strip() not in ("0", "1"):
            raise ShardlabError(f"--fix {it}: hs is 0 (no hybrid sharding) or 1 (shard inside a node, replicate across "
                                f"nodes; the replica count follows from the layout)")
        if key not in ("tp", "pp", "cp", "ep", "zero", "mb", "vpp", "rc", "sp", "sched", "hs") or not (val.strip().isascii() and val.strip().isdigit()):
            raise ShardlabError(f"--fix {it}: use AXIS=VALUE with AXIS in tp, pp, cp, ep, zero, micro_batch, vpp "
                                f"(integers), sp, hs (0 or 1), recompute (none/selective/full) or schedule "
                                f"({'/'.join(SCHEDULE_CODES)})")
        v = int(val)
        allowed = _FIX_RANGES.get(key)
        if allowed is not None and v not in allowed:
            raise ShardlabError(f"--fix {it}: {key} is one of {', '.join(map(str, allowed))}" + _FIX_WHY.get(key, ""))
        if key in ("tp", "pp", "cp", "ep", "mb") and not 1 <= v <= MAX_GPUS:
            raise ShardlabError(f"--fix {it}: {key} is a whole number from 1 to {MAX_GPUS:,}")
        if key in out and out[key] != v:
            raise ShardlabError(f"--fix {it} contradicts an earlier --fix of {key}; pin each axis once")
        out[key] = v
    return out


_FIX_RANGES = {"zero": (0, 1, 2, 3), "sp": (0, 1), "rc": tuple(sorted(PLAN_RECOMPUTE.values())), "vpp": (1, 2, 4, 8)}
"""Values a pinned axis can take: those the search enumerates (planner.space)."""
_FIX_WHY = {"rc": " (none, selective, full; or their codes)",
            "vpp": " (the virtual stages the search tries: interleaving needs vpp 2, 4 or 8; 1 is no interleaving)"}


def layout_flags_as_fixes(args, fixed: dict) -> dict:
    """Layout flags written on `plan`'s command line (--tp 2, --zero 3, and --tp 1 or --zero 0 too) pin their axis,
    as --fix does; a flag and a --fix that disagree are refused. Flags the search has no axis for are refused. Under
    --from the flags hold the file's layout, which plan estimates beside an unpinned search. (Args built in code,
    without the parser's record of what was written, pin the flags that differ from their defaults.)"""
    from shardlab.cli.common import given_flags
    from shardlab.errors import ShardlabError
    from shardlab.estimate.step import SCHEDULE_CODES

    if getattr(args, "from_file", None):        # plan --from: the file's layout is estimated beside the free search
        return fixed
    given = {"tp": (args.tp, 1), "pp": (args.pp, 1), "cp": (args.cp, 1), "ep": (args.ep, 1), "zero": (args.zero, 0),
             "mb": (args.micro_batch, 1), "vpp": (args.vpp, 1),
             "rc": (PLAN_RECOMPUTE.get(args.recompute, -1), 0), "sp": (int(bool(args.sequence_parallel)), 0),
             "sched": (SCHEDULE_CODES.get(args.schedule, -1), SCHEDULE_CODES.get("1f1b"))}
    if args.recompute == "op":
        raise ShardlabError("--recompute op is not among the recomputation settings plan searches (none, selective, "
                            "full); estimate it with `shardlab estimate`")
    unpinnable = [f for f, bad in (("--dp", args.dp is not None), ("--stage-layers", args.stage_layers is not None),
                                   ("--microbatches", args.microbatches is not None)) if bad]
    if unpinnable:
        raise ShardlabError(f"{', '.join(unpinnable)}: plan derives these from --gpus and --global-batch; drop them, or "
                            f"estimate one layout with `shardlab estimate`")
    written = given_flags(args)
    why = {"wrap": ("--wrap", "plan prices one block per FSDP unit"),
           "recompute_fraction": ("--recompute-fraction", "plan searches recompute none, selective or full"),
           "dp_replicate": ("--dp-replicate", "plan searches hybrid sharding itself (--fix hs=1 pins it on)")}
    defaults = {"wrap": 1, "recompute_fraction": 1.0, "dp_replicate": 1}
    unsearched = [why[d] for d in why if (d in written if written is not None else getattr(args, d, defaults[d]) != defaults[d])]
    if unsearched:
        raise ShardlabError("; ".join(f"{flag}: {reason}" for flag, reason in unsearched)
                            + "; drop it, or estimate this setting with `shardlab estimate`")
    dest = {"mb": "micro_batch", "rc": "recompute", "sp": "sequence_parallel", "sched": "schedule"}
    out = dict(fixed)
    etp = getattr(args, "etp", None)
    if etp == 0:                                  # 0: as tp, pinned
        out["et"] = 0
    elif etp is not None:        # the search tries the experts split like the attention (et 0) or whole (et 1)
        if etp != 1 and not ("tp" in (written or ()) and etp == args.tp):
            raise ShardlabError(f"--etp {etp}: plan searches the experts split like the attention or whole (--etp 1); "
                                "pin --etp 1, or estimate another expert TP with `shardlab estimate`")
        out["et"] = 1 if etp == 1 and not ("tp" in (written or ()) and args.tp == 1) else 0
    for axis, (value, default) in given.items():
        if (dest.get(axis, axis) not in written) if written is not None else value == default:
            continue
        if axis in out and out[axis] != value:
            raise ShardlabError(f"the layout flag for {axis} and --fix {axis}={out[axis]} disagree; give one of them")
        allowed = _FIX_RANGES.get(axis)
        if allowed is not None and value not in allowed:      # as --fix: only values the search enumerates
            flag = "--" + dest.get(axis, axis).replace("_", "-")
            raise ShardlabError(f"{flag} {value}: plan searches {axis} in {', '.join(map(str, allowed))}"
                                + _FIX_WHY.get(axis, ""))
        out[axis] = value
    return out
