"""Plain-text tables for the human output (no dependency, fast to import)."""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar


OUTPUT_WIDTH: ContextVar[int | None] = ContextVar("shardlab_output_width", default=None)
"""Columns the human output must fit, set by the command line for one command (the terminal's width, 100 when not a
terminal, COLUMNS when set); None: no limit (``--wide``, ``--json``, library use)."""
MIN_COLUMN = 12
"""A text column is never wrapped narrower than this."""


def terminal_width() -> int | None:
    """The width to fit: COLUMNS, else the terminal's, else 100 (not a terminal); at least 60. None (no limit) when
    SHARDLAB_WIDE is set, as --wide."""
    import os
    import shutil

    if os.environ.get("SHARDLAB_WIDE", "").strip() not in ("", "0"):
        return None
    return max(60, shutil.get_terminal_size((100, 24)).columns)


def _fits(widths: list[int], limit: int) -> bool:
    return sum(widths) + 2 * (len(widths) - 1) <= limit


def _fit(widths: list[int], wrappable: list[bool], limit: int, floors: list[int]) -> list[int]:
    """Narrow the widest wrappable columns (none below its floor) until the row, two spaces between columns, fits."""
    widths = list(widths)
    while not _fits(widths, limit):
        over = sum(widths) + 2 * (len(widths) - 1) - limit
        cands = [i for i, w in enumerate(widths) if wrappable[i] and w > floors[i]]
        if not cands:
            break
        i = max(cands, key=lambda k: widths[k] - floors[k])
        widths[i] -= max(1, min(over, widths[i] - floors[i]))
    return widths


def _wrap_cell(text: str, width: int) -> list[str]:
    import textwrap

    if len(text) <= width:
        return [text]
    return textwrap.wrap(text, width, break_on_hyphens=False) or [""]


KEEP = "\ue000"
"""Marks a table row that is wider than the limit even after fitting (many number columns): ``fit_text`` leaves such
a row whole rather than re-wrapping it as prose, and removes the mark."""


def _layout(headers, cells, widths: list[int], align: str, limit: int) -> tuple[list[int], list[int], list[int]]:
    """(columns kept in the row, their widths, columns moved under the row) for a width limit.

    Text columns wrap inside their cells, never below MIN_COLUMN or their longest word; when that is not enough
    (many number columns), the widest text columns (never the first) leave the row and print under it as
    'header: text' lines. Words are never broken: a table still too wide keeps its rows whole."""
    n = len(headers)
    words = [max((len(w) for r in [list(headers), *cells] if i < len(r) for w in r[i].split()), default=0)
             for i in range(n)]
    keep, under = list(range(n)), []
    while True:
        w = _fit([widths[i] for i in keep], [align[i] == "l" for i in keep], limit,
                 [max(MIN_COLUMN, words[i]) for i in keep])
        movable = [i for i in keep if align[i] == "l" and i > 0]
        if _fits(w, limit) or not movable or len(keep) <= 2:
            break
        out = max(movable, key=lambda i: widths[i])
        keep.remove(out)
        under.append(out)
    if not _fits(w, limit):    # prose columns may still narrow (their words stay whole)
        w = _fit(w, [align[i] == "l" for i in keep], limit, [max(6, words[i]) for i in keep])
    return keep, w, sorted(under)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], title: str | None = None,
          align: str | None = None, wrap: int | None = None) -> str:
    """Render rows as an aligned table. ``align``: one char per column, 'l' or 'r' (default: numbers right).
    ``wrap``: break the last column's text into lines of at most this many characters (long explanations).
    Under a width limit (``OUTPUT_WIDTH``) the table fits it (``_layout``); numbers are never wrapped."""
    import textwrap

    cells = [[("" if c is None else str(c)) for c in row] for row in rows]
    n = len(headers)
    limit = OUTPUT_WIDTH.get()
    if wrap and limit:
        # pre-wrapped lines narrowed again would come out ragged: wrap the last column once, at what the width allows
        fixed = [max([len(headers[i])] + [len(r[i]) for r in cells if i < len(r)]) for i in range(n - 1)]
        wrap = min(wrap, max(MIN_COLUMN, limit - sum(fixed) - 2 * (n - 1)))
    if wrap:
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
    keep, under = list(range(n)), []
    if limit and not _fits(widths, limit):
        # headers of several words may wrap over two lines: a column is as wide as its cells or its longest header word
        widths = [max([len(w) for w in headers[i].split()] + [len(r[i]) for r in cells if i < len(r)] + [1])
                  for i in range(n)]
    if limit and not _fits(widths, limit):
        keep, kept_w, under = _layout(headers, cells, widths, align, limit)
        widths = [0] * n
        for i, w in zip(keep, kept_w):
            widths[i] = w

    def fmt(row, below: bool = True):
        """One logical row: its kept cells wrapped to their widths, then the moved columns under it."""
        parts = [_wrap_cell(row[i] if i < len(row) else "", widths[i]) for i in keep]
        out = []
        for k in range(max(len(p) for p in parts)):
            line = []
            for j, i in enumerate(keep):
                c = parts[j][k] if k < len(parts[j]) else ""
                line.append(c.rjust(widths[i]) if align[i] == "r" else c.ljust(widths[i]))
            out.append("  ".join(line).rstrip())
        for i in under if below else ():
            text = row[i] if i < len(row) else ""
            if text:
                out += textwrap.wrap(f"{headers[i]}: {text}", limit, initial_indent="    ", subsequent_indent="      ",
                                     break_on_hyphens=False)
        return "\n".join(out)
    lines = []
    if title:
        lines.append(fit_text(title))
    lines.append(fmt(list(headers), below=False))
    lines.append("  ".join("-" * widths[i] for i in keep))
    lines.extend(fmt(r) for r in cells)
    if limit:                 # rows still over the limit stay whole: marked for ``fit_text``
        lines = ["\n".join(KEEP + ln if len(ln) > limit else ln for ln in block.split("\n")) for block in lines]
    if under:
        lines.append(fit_text(f"(under each row: {', '.join(headers[i] for i in under)}; --wide keeps one line per row)"))
    return "\n".join(lines)


def fit_text(text: str, limit: int | None = None) -> str:
    """Lines longer than the width limit wrapped at spaces, continuations indented two more than the line (a
    'key  value' line, two spaces or more after the key: under its value)."""
    import re
    import textwrap

    limit = limit or OUTPUT_WIDTH.get()
    if not limit:
        return "\n".join(line[len(KEEP):] if line.startswith(KEEP) else line for line in text.split("\n"))
    out = []
    for line in text.split("\n"):
        if line.startswith(KEEP):                    # a table row ``table`` could not narrow: whole
            out.append(line[len(KEEP):])
            continue
        if len(line) <= limit:                       # (table rows fit already: ``table`` narrowed them)
            out.append(line)
            continue
        gaps = re.findall(r"\S( {2,})(?=\S)", line)
        if gaps:                                     # 'key  value': the value wraps under itself
            head = re.match(r"(.*?\S {2,})(?=\S)", line).group(1)
            if len(head) < limit // 2:
                out.extend(textwrap.wrap(line[len(head):], limit, initial_indent=head,
                                         subsequent_indent=" " * len(head), break_long_words=False,
                                         break_on_hyphens=False) or [line])
                continue
        indent = line[:len(line) - len(line.lstrip(" "))]
        out.extend(textwrap.wrap(line, limit, initial_indent="", subsequent_indent=indent + "  ",
                                 break_long_words=False, break_on_hyphens=False, drop_whitespace=True) or [line])
    return "\n".join(out)


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
