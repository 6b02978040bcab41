"""Mermaid flowchart helpers (text only; no dependency). Labels are quoted and escaped so shapes,
parentheses and arrows in them render literally."""

from __future__ import annotations

import json

_SHAPES = {"box": ('["', '"]'), "round": ('("', '")'), "hex": ('{{"', '"}}'), "circle": ('(("', '"))'),
           "stadium": ('(["', '"])'), "para": ('[/"', '"/]')}


def escape(label: str) -> str:
    """Make ``label`` safe inside a quoted Mermaid label (quotes → #quot;, newlines → <br/>)."""
    return label.replace('"', "#quot;").replace("\n", "<br/>")


def node(node_id: str, label: str, shape: str = "box") -> str:
    """One node line, e.g. ``node("qkv", "Q, K, V", "box")`` → ``qkv["Q, K, V"]``."""
    left, right = _SHAPES[shape]
    return f"{node_id}{left}{escape(label)}{right}"


def edge(a: str, b: str, label: str | None = None, dotted: bool = False) -> str:
    """An arrow a → b, optionally labelled, dotted for side paths (residuals)."""
    arrow = "-.->" if dotted else "-->"
    return f"{a} {arrow}|\"{escape(label)}\"| {b}" if label else f"{a} {arrow} {b}"


def flowchart(lines: list[str], direction: str = "TD", title: str | None = None,
              classes: dict[str, str] | None = None) -> str:
    """Assemble a flowchart: optional YAML title front matter (quoted: Mermaid 11 rejects an unquoted ': ' there),
    the direction, indented lines, classDefs."""
    out = []
    if title:  # a YAML double-quoted scalar (JSON's string syntax is one): ': ' and '#' in titles stay text
        out += ["---", f"title: {json.dumps(title, ensure_ascii=False)}", "---"]
    out.append(f"flowchart {direction}")
    out += [f"    {ln}" for ln in lines]
    for name, style in (classes or {}).items():
        out.append(f"    classDef {name} {style}")
    return "\n".join(out) + "\n"
