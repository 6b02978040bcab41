"""Plain-text tables for the human output (no dependency, fast to import)."""

from __future__ import annotations

from collections.abc import Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], title: str | None = None,
          align: str | None = None, wrap: int | None = None) -> str:
    """Render rows as an aligned table. ``align``: one char per column, 'l' or 'r' (default: numbers right).
    ``wrap``: break the last column's text into lines of at most this many characters (long explanations)."""
    cells = [[("" if c is None else str(c)) for c in row] for row in rows]
    n = len(headers)
    if wrap:
        import textwrap

        wrapped = []
        for row in cells:
            last = row[n - 1] if len(row) >= n else ""
            parts = textwrap.wrap(last, wrap, break_on_hyphens=False) or [""]
            wrapped.append(row[:n - 1] + [parts[0]])
            wrapped.extend([""] * (n - 1) + [p] for p in parts[1:])
        cells = wrapped
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row[:n]):
            widths[i] = max(widths[i], len(c))
    if align is None:
        align = "".join("r" if cells and all(_numeric(r[i]) for r in cells if i < len(r) and r[i] not in ("", "-")) else "l"
                        for i in range(n))
    def fmt(row):
        parts = []
        for i in range(n):
            c = row[i] if i < len(row) else ""
            parts.append(c.rjust(widths[i]) if align[i] == "r" else c.ljust(widths[i]))
        return "  ".join(parts).rstrip()
    lines = []
    if title:
        lines.append(title)
    lines.append(fmt(list(headers)))
    lines.append("  ".join("-" * w for w in widths))
    lines.extend(fmt(r) for r in cells)
    return "\n".join(lines)


def _numeric(s: str) -> bool:
    s = s.replace(",", "").replace("%", "").replace("×", "").strip()
    for suffix in (" GiB", " MiB", " KiB", " GB", " MB", " B", " ms", " µs", " s", " h", "K", "M", "B", "T"):
        if s.endswith(suffix):
            s = s[: -len(suffix)].strip()
            break
    try:
        float(s)
        return True
    except ValueError:
        return False


def kv_lines(pairs: Sequence[tuple[str, object]], indent: str = "") -> str:
    """'key   value' lines with keys padded to the same width."""
    w = max((len(k) for k, _ in pairs), default=0)
    return "\n".join(f"{indent}{k.ljust(w)}  {v}" for k, v in pairs)
