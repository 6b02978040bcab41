"""Small writers and readers shared by the targets: TOML out (stdlib ``tomllib`` reads it back), comment blocks,
shell command lines (``shlex``), and argument lists to flag dictionaries."""

from __future__ import annotations

import json
import shlex

from shardlab.errors import ShardlabError


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def toml_dump(sections: dict[str, dict], comments: list[str] = ()) -> str:
    """``{section: {key: value}}`` as TOML (tables of scalars and arrays only), comment lines first."""
    out = [f"# {c}" for c in comments]
    for name, body in sections.items():
        if out:
            out.append("")
        out.append(f"[{name}]")
        out += [f"{k} = {_toml_value(v)}" for k, v in body.items() if v is not None]
    return "\n".join(out) + "\n"


def comment_block(lines, marker: str = "#") -> str:
    return "".join(f"{marker} {ln}\n" for ln in lines)


def split_command(text: str) -> list[str]:
    """Shell words of a command or script: line continuations joined, comments dropped."""
    try:
        return shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as e:
        raise ShardlabError(f"cannot read the command line: {e}; check its quotes") from None


def flags_dict(words: list[str]) -> dict[str, object]:
    """``--name value`` / ``--name=value`` / bare ``--switch`` → {name: value or True}; the last occurrence wins."""
    out: dict[str, object] = {}
    i = 0
    while i < len(words):
        w = words[i]
        if w.startswith("--"):
            name, eq, val = w[2:].partition("=")
            if eq:
                out[name] = val
            elif i + 1 < len(words) and not words[i + 1].startswith("--"):
                out[name] = words[i + 1]
                i += 1
            else:
                out[name] = True
        i += 1
    return out


def as_int(flags: dict, name: str, where: str) -> int | None:
    if name not in flags:
        return None
    try:
        return int(str(flags[name]))
    except ValueError:
        raise ShardlabError(f"{where}: --{name} must be a whole number, got '{flags[name]}'") from None
