"""Flag schemas copied from the documentation of targets whose own parser needs a GPU stack (``data/flags.yaml``:
Megatron-LM's pretrain_gpt.py arguments, vLLM's ``vllm serve`` engine arguments), and the check of a line against
them: every flag known, every value of its type and among its choices."""

from __future__ import annotations

import functools
import os

from shardlab.errors import ShardlabError
from shardlab.safeio import yaml_load


@functools.lru_cache(maxsize=1)
def schemas() -> dict:
    with open(os.path.join(os.path.dirname(__file__), "data", "flags.yaml")) as f:
        return yaml_load(f.read())


def version(target: str) -> str:
    return schemas()[target]["version"]


def check_flags(target: str, flags: dict) -> list[str]:
    """Problems of ``flags`` ({name: value or True}) against the target's schema; empty when the line is valid."""
    spec = schemas()[target]["flags"]
    bad = []
    for name, val in flags.items():
        s = spec.get(name)
        if s is None:
            bad.append(f"--{name} is not a {version(target)} flag")
            continue
        kind = s["type"]
        if kind == "switch":
            if val is not True:
                bad.append(f"--{name} takes no value (got {val!r})")
            continue
        if val is True:
            bad.append(f"--{name} needs a value")
            continue
        if kind == "list":      # nargs='*' of names
            vals = val if isinstance(val, (tuple, list)) else (val,)
            bad += [f"--{name} {v} is not one of {s['choices']}" for v in vals if v not in s.get("choices", (v,))]
            continue
        try:
            v = {"int": int, "float": float, "str": str}[kind](str(val))
        except ValueError:
            bad.append(f"--{name} needs a {kind}, got {val!r}")
            continue
        if "choices" in s and v not in s["choices"]:
            bad.append(f"--{name} {val} is not one of {s['choices']}")
    return bad


def unread_flags(target: str, flags: dict, read: set) -> list[str]:
    """The ``ignored`` entries for a launch line's flags its reader does not use (``read``: the ones it reads or
    names itself): each said, and a name the engine's flag schema does not know said to be no flag of it (a typo
    read silently as the engine's default changed the estimate without a word)."""
    out = []
    for name in sorted(set(flags) - set(read)):
        known = name in schemas()[target]["flags"]
        out.append(f"--{name[:60]} ({'not read: the engine default is priced' if known else f'not a {version(target)} flag'})")
    return out


def require_valid(target: str, flags: dict) -> None:
    bad = check_flags(target, flags)
    if bad:
        raise ShardlabError(f"{target} line: {bad[0]}")
