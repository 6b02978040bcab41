"""The topics ``shardlab explain`` knows, their parameters, and the curriculum items each answers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from shardlab.errors import ShardlabError, did_you_mean
from shardlab.teach.explanation import Explanation
from shardlab.teach.params import Param, parse_values


@dataclass(frozen=True)
class Topic:
    """One concept the chapters teach."""

    id: str
    """Name on the command line (lowercase, hyphenated)."""
    title: str
    """Heading."""
    summary: str
    """One line for ``--list``."""
    items: tuple[int, ...]
    """Curriculum items (items.md) the topic answers."""
    params: tuple[Param, ...]
    """The numbers it takes (``key=value``)."""
    build: Callable[[dict], Explanation]
    """Derive the explanation from the parsed values."""
    presets: dict = field(default_factory=dict)
    """Values fixed by an alias (e.g. zero-2 sets stage=2)."""


_TOPIC_MODULES = ("memory", "finetune", "comm", "tensor", "pipeline", "inference", "disaggregation", "precision", "design", "budgets")


def topics() -> dict[str, Topic]:
    """Every topic by id, in teaching order (aliases included, marked by their presets)."""
    import importlib

    out: dict[str, Topic] = {}
    for name in _TOPIC_MODULES:
        mod = importlib.import_module(f"shardlab.teach.topics.{name}")
        for t in mod.TOPICS:
            if t.id in out:
                raise ShardlabError(f"internal: topic '{t.id}' defined twice")
            out[t.id] = t
    return out


def get_topic(name: str) -> Topic:
    """The topic called ``name``; a one-line error naming close matches otherwise."""
    all_ = topics()
    key = name.strip().lower().replace("_", "-")
    if key not in all_:
        raise ShardlabError(f"unknown topic '{name}'{did_you_mean(key, all_)}; `shardlab explain --list` shows all "
                            f"{len(all_)} topics")
    return all_[key]


def explain(name: str, words: list[str] | None = None, **values) -> Explanation:
    """Build topic ``name`` from ``key=value`` words (and/or keyword values): the one entry point."""
    t = get_topic(name)
    vals = parse_values(t.params, list(words or []), t.id)
    bad = [k for k in values if k not in vals]
    if bad:
        raise ShardlabError(f"'{bad[0]}' is not a number {t.id} takes")
    vals.update(values)
    vals.update(t.presets)
    _check_model_values(vals)
    return t.build(vals)


def _check_model_values(vals: dict) -> None:
    """The rules every topic's model obeys, checked once: T divides the heads (Megatron's whole-heads split), a
    sequence fits the model's positions."""
    if not isinstance(vals.get("model"), str):
        return
    from shardlab.catalog import get_catalog
    from shardlab.layout import Layout
    from shardlab.layout_checks import validate

    spec = get_catalog().model(vals["model"])
    if isinstance(vals.get("tp"), int) and vals["tp"] >= 1:
        try:
            validate(Layout(tp=vals["tp"]), spec)
        except ShardlabError as e:
            raise ShardlabError(str(e).replace(f"--tp {vals['tp']}", f"tp={vals['tp']}", 1)) from None
    for key in ("seq", "prompt"):
        n = vals.get(key)
        if isinstance(n, int) and spec.max_seq_len and n > spec.max_seq_len:
            raise ShardlabError(f"{key}={n:,} exceeds {spec.name}'s {spec.max_seq_len:,} positions; use at most "
                                f"{spec.max_seq_len:,} (or another model=)")
