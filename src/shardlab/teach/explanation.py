"""What an explanation is (a derivation with the learner's numbers, a plain paragraph, sources, code) and its
two faces: the human text and the JSON document."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Explanation:
    """One concept, derived with the learner's numbers."""

    topic: str
    """Topic id (``shardlab explain --list``)."""
    title: str
    """Heading."""
    question: str
    """The question the derivation answers, with the numbers in it."""
    inputs: dict
    """The numbers used (after defaults), by parameter name."""
    derivation: list[str]
    """The steps: each a formula with the numbers substituted and its value."""
    plain: str
    """The same in plain words: a paragraph a learner can say out loud."""
    numbers: dict = field(default_factory=dict)
    """The results, machine-readable (bytes, seconds, fractions)."""
    table: tuple[list[str], list[list]] | None = None
    """Optional (headers, rows) comparing the alternatives."""
    sources: list[str] = field(default_factory=list)
    """Ids of the papers and documents behind the formulas (``teach.sources.PAPERS``)."""
    code: list[str] = field(default_factory=list)
    """Ids of the code locations (``teach.codemap.CODE``): Megatron-LM / PyTorch and shardlab's own."""
    commands: list[str] = field(default_factory=list)
    """shardlab commands that show more (each one runs as written)."""
    notes: list[str] = field(default_factory=list)
    """Assumptions the numbers rest on."""

    def to_dict(self) -> dict:
        from shardlab.teach.codemap import code_refs
        from shardlab.teach.sources import citations

        return {"topic": self.topic, "title": self.title, "question": self.question, "inputs": self.inputs,
                "derivation": self.derivation, "plain": self.plain, "numbers": self.numbers,
                "table": {"headers": self.table[0], "rows": self.table[1]} if self.table else None,
                "sources": citations(self.sources), "code": code_refs(self.code), "commands": self.commands,
                "notes": self.notes}


def render(ex: Explanation, width: int = 110) -> str:
    """The human text: question, numbered derivation, table, plain words, code map, sources, commands."""
    from shardlab.render.table import table
    from shardlab.teach.codemap import code_refs
    from shardlab.teach.sources import citations

    wrap = lambda s, ind="  ": textwrap.fill(s, width, initial_indent=ind, subsequent_indent=ind + "   ",  # noqa: E731
                                             break_on_hyphens=False)
    inputs = ", ".join(f"{k}={v}" for k, v in ex.inputs.items())
    out = [f"{ex.title}  [shardlab explain {ex.topic}]", wrap(ex.question, ""),
           f"with: {inputs}" if inputs else "", "", "derivation:"]
    out += [wrap(f"{i}. {line}") for i, line in enumerate(ex.derivation, 1)]
    if ex.table:
        out += ["", table(ex.table[0], ex.table[1])]
    out += ["", "in plain words:", textwrap.fill(ex.plain, width, initial_indent="  ", subsequent_indent="  ")]
    refs = code_refs(ex.code)
    if refs:
        out += ["", "where it lives in code (upstream file: class / function → shardlab):"]
        out += [wrap(f"- {r['concept']}: {r['project']} {r['path']}: {r['symbol']} → {r['shardlab']}") for r in refs]
    if ex.sources:
        out += ["", "sources:"] + [wrap(f"- {c['citation']}: {c['used_for']}") for c in citations(ex.sources)]
    if ex.notes:
        out += ["", "notes:"] + [wrap(f"- {n}") for n in ex.notes]
    if ex.commands:
        out += ["", "see it with:"] + [f"  shardlab {c}" for c in ex.commands]
    return "\n".join(line for i, line in enumerate(out) if line or (i and out[i - 1]))
