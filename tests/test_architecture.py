"""The packages form the layers docs/architecture.md draws: every import (module-level and function-level, parsed
from the source) points to a lower layer, so there is no import cycle between packages."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "shardlab"


def unit_of(path: Path) -> str:
    rel = path.relative_to(SRC).parts
    return rel[0] if len(rel) > 1 else rel[0]            # a package name, or 'errors.py' for a top-level module


def target(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "shardlab" or len(parts) < 2:
        return None
    return parts[1] if (SRC / parts[1]).is_dir() else parts[1] + ".py"


def import_graph() -> dict[str, dict[str, list[str]]]:
    """{unit: {imported unit: ['file:line', ...]}} over every import statement of the package."""
    graph: dict[str, dict[str, list[str]]] = {}
    for f in sorted(SRC.rglob("*.py")):
        u = unit_of(f)
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            mods = ([node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else
                    [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for m in mods:
                t = target(m)
                if t and t != u:
                    graph.setdefault(u, {}).setdefault(t, []).append(f"{f.relative_to(SRC)}:{node.lineno}")
    return graph


def layers() -> dict[str, int]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("```", 2)[1]
    out: dict[str, int] = {}
    for line in block.splitlines():
        m = re.match(r"layer\s+(\d+)\s+(.*)", line)
        if m:
            for word in m.group(2).split():
                if (SRC / word).is_dir() or (word.endswith(".py") and (SRC / word).is_file()):
                    out[word] = int(m.group(1))
                else:
                    break                                  # the description starts
    return out


def test_every_unit_has_a_layer():
    units = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    units |= {p.name for p in SRC.glob("*.py") if p.name != "__init__.py"}
    missing = sorted(units - set(layers()))
    assert not missing, f"docs/architecture.md gives no layer to {missing}"


def test_imports_point_down_the_layers():
    lay = layers()
    bad = [f"{u} (layer {lay[u]}) imports {t} (layer {lay[t]}) at {sites[0]}"
           for u, deps in import_graph().items() if u in lay
           for t, sites in deps.items() if t in lay and lay[t] >= lay[u]]
    assert not bad, "imports that point up or sideways (a cycle in the making):\n" + "\n".join(bad)


def test_no_cycle_between_packages():
    """Tarjan's strongly connected components over the whole graph (the layer table aside)."""
    g = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in g.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))
    for v in list(g):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles between packages: {cycles}"
