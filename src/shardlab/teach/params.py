"""The learner's numbers: ``key=value`` words after the topic, typed and checked against the topic's parameters."""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.errors import ShardlabError, did_you_mean


@dataclass(frozen=True)
class Param:
    """One number (or name) a topic takes."""

    name: str
    """Key on the command line (``name=value``)."""
    kind: str
    """int, float, count (7B, 7.5e9), size (256MiB), str, bool."""
    default: object
    """Value when not given."""
    help: str
    """What it is, with its unit."""
    choices: tuple = ()
    """Allowed values for str parameters (empty: any)."""
    minimum: float | None = 1
    """Smallest allowed number (None: no bound)."""
    maximum: float | None = None
    """Largest allowed number where the topic's work grows with it (None: the parser's own bound)."""


def _convert(p: Param, text: str):
    from shardlab.units import parse_count, parse_size

    what = f"{p.name}={text}"
    try:
        if p.kind in ("int", "float"):
            from shardlab.limits import MAX_FLOAT, MAX_INT
            from shardlab.numbers import SMALLEST, parse_number

            lo = p.minimum if p.minimum is not None else -MAX_FLOAT
            v = parse_number(text, p.name, integer=p.kind == "int", minimum=lo, allow_min=True,
                             maximum=MAX_INT if p.kind == "int" else MAX_FLOAT, smallest=min(SMALLEST, max(lo, 0.0)))
        elif p.kind == "count":
            v = parse_count(text, p.name)
        elif p.kind == "size":
            v = parse_size(text, p.name)
        elif p.kind == "bool":
            if text.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError
            v = text.lower() in ("1", "true", "yes", "on")
        else:
            v = text
    except ValueError:
        raise ShardlabError(f"{what}: not a {'whole number' if p.kind == 'int' else p.kind}; {p.name} is {p.help}") from None
    if p.choices and v not in p.choices:
        raise ShardlabError(f"{what}: choose one of {', '.join(map(str, p.choices))}")
    if p.kind in ("int", "float", "count", "size") and p.minimum is not None and v < p.minimum:
        raise ShardlabError(f"{what}: must be at least {p.minimum:g} ({p.help})")
    if p.maximum is not None and v > p.maximum:
        raise ShardlabError(f"{what}: at most {p.maximum:g} here ({p.help})")
    return v


def parse_values(params: tuple[Param, ...], words: list[str], topic: str) -> dict:
    """{name: value} for every parameter: the defaults overridden by ``key=value`` words."""
    known = {p.name: p for p in params}
    out = {p.name: p.default for p in params}
    for w in words:
        key, eq, val = w.partition("=")
        key = key.strip().lstrip("-").replace("-", "_")
        if not eq or not val.strip():
            raise ShardlabError(f"'{w}': give numbers as key=value, e.g. "
                                + (f"{params[0].name}={params[0].default}" if params else "(this topic takes none)")
                                + f"; `shardlab explain --list` shows {topic}'s keys")
        if key not in known:
            keys = ", ".join(known) or "none"
            raise ShardlabError(f"'{key}' is not a number {topic} takes{did_you_mean(key, known)}; its keys: {keys}")
        out[key] = _convert(known[key], val.strip())
    return out


def describe(params: tuple[Param, ...]) -> str:
    """'key=default key=default ...' for --list (help texts are in --json)."""
    def show(v, kind):
        if kind == "size" and v and v % 2**20 == 0:
            return f"{v // 2**30}GiB" if v % 2**30 == 0 else f"{v // 2**20}MiB"
        if isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) >= 1e6:
            return f"{v:.4g}".replace("e+0", "e").replace("e+", "e")
        return str(v)
    return " ".join(f"{p.name}={show(p.default, p.kind)}" for p in params)
