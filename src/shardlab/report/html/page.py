"""The page around the sections: escaping, number formatting, tables, the generic renderer for any JSON
value, the stylesheet and the small script (rank details, colour switch, Mermaid start-up).

Nothing here computes a number: values come formatted from the document (bytes shown as GiB = 2**30,
seconds with ``units.fmt_time``), and the script only looks values up.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field

from shardlab.units import fmt_bytes, fmt_time

MAX_SHOWN_JSON = 150_000
"""Documents longer than this (characters) are embedded for scripts but not printed on the page."""
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac", "#86bcb6", "#d4a6c8")
"""Categorical colours (Tableau 10 plus two), cycled for stages, TP ranks and DP replicas."""


def esc(x) -> str:
    """HTML-escape any value's text."""
    return html.escape(str(x), quote=True)


def gib(n) -> str:
    """Bytes as GiB (2**30) with two decimals."""
    return f"{n / 2**30:,.2f} GiB"


def num(v) -> str:
    """A readable number: integers with separators, floats to 4 significant digits."""
    if isinstance(v, bool) or v is None:
        return "—" if v is None else ("yes" if v else "no")
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e15 else f"{v:.3e}"
    return str(v)


def fmt_key(key: str, v) -> str:
    """Format ``v`` by its key's unit suffix (_bytes → GiB, _per_s → a rate, _s → time, share-like keys → %)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if key in ("grad_reduce_bytes", "main_grad_bytes"):       # bytes per element; 0 = the gradient's own dtype
            return f"{v:g} B per element" if v else "the gradient dtype's"
        if key.endswith("_bytes") or key in ("weights", "gradients", "optimizer", "activations", "other", "total"):
            return gib(v) if abs(v) >= 2**30 else fmt_bytes(v) if abs(v) >= 2**10 else f"{v:,} B"
        if key.endswith("_per_s") or key.endswith("_per_second"):        # a rate, not a duration
            return f"{v:,.4g}/s" if v < 1e4 else f"{v:,.0f}/s"
        if key.endswith("_s_per_token") and v >= 0:
            return f"{fmt_time(v)}/token"
        if key.endswith("_s") and v >= 0:
            return fmt_time(v)
        if key in ("mfu", "hfu", "bubble_fraction", "error", "spread", "share") or key.endswith("_fraction"):
            return f"{100 * v:.2f}%"
    return num(v)


def table(headers: list[str], rows: list[list], cls: str = "", raw_cols: tuple[int, ...] = ()) -> str:
    """An HTML table; cells are escaped except the columns in ``raw_cols`` (already HTML)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c if i in raw_cols else esc(c)}</td>" for i, c in enumerate(r)) + "</tr>"
                   for r in rows)
    return f'<div class="scroll"><table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def kv_table(pairs: list[tuple[str, object]]) -> str:
    """Two-column key/value table; keys are escaped here, values are HTML (escape text with ``esc``)."""
    return table(["", ""], [[k, v] for k, v in pairs], cls="kv", raw_cols=(1,))


def generic(value, key: str = "", depth: int = 0) -> str:
    """Any JSON value as HTML: dicts as key/value tables, lists of dicts as tables, scalars formatted by key."""
    if isinstance(value, dict):
        if not value:
            return "<em>empty</em>"
        rows = [[esc(k), generic(v, k, depth + 1)] for k, v in value.items()]
        return table(["", ""], rows, cls="kv", raw_cols=(0, 1))
    if isinstance(value, list):
        if not value:
            return "<em>none</em>"
        if all(isinstance(x, dict) for x in value) and depth < 4:
            cols = list(dict.fromkeys(k for x in value for k in x))
            rows = [[generic(x.get(c, ""), c, depth + 1) for c in cols] for x in value[:200]]
            more = f"<p class='note'>{len(value) - 200} more rows in the JSON document</p>" if len(value) > 200 else ""
            return table(cols, rows, raw_cols=tuple(range(len(cols)))) + more
        if len(value) > 24:
            return esc(", ".join(num(x) for x in value[:24]) + f", … ({len(value)} values)")
        return esc(", ".join(fmt_key(key, x) if not isinstance(x, (dict, list)) else json.dumps(x) for x in value))
    return esc(fmt_key(key, value))


@dataclass
class Page:
    """An HTML page being assembled: sections in order, data blocks for the script, the Mermaid flag."""

    title: str
    subtitle: str = ""
    sections: list[tuple[str, str, str]] = field(default_factory=list)
    """(id, heading, body HTML)."""
    data: dict = field(default_factory=dict)
    """JSON blocks for the script, by element id."""
    mermaid: bool = False
    """Inline the Mermaid library (the page holds a ``pre.mermaid`` block)."""

    def add(self, sid: str, heading: str, body: str) -> None:
        self.sections.append((sid, heading, body))

    def answer(self, pairs: list[tuple[str, str]], note: str = "") -> None:
        """The page's answer, first on the page (within the first screen): its key figures as cards."""
        body = ("<div class='cards'>" + "".join(f"<div class='card'><div class='l'>{esc(k)}</div>"
                                                f"<div class='v'>{esc(v)}</div></div>" for k, v in pairs) + "</div>"
                + (f"<p class='note'>{esc(note)}</p>" if note else ""))
        self.sections.insert(0, ("answer", "The answer", body))

    def render(self, doc: dict, command: str) -> str:
        from shardlab import __version__
        from shardlab.report.html.layout_sections import colour_css

        full = json.dumps(doc, indent=1, default=str)
        shown = (f"<details><summary>show the JSON</summary><pre class='json'>{esc(full)}</pre></details>"
                 if len(full) <= MAX_SHOWN_JSON else
                 f"<p class='note'>It is {len(full) / 1e3:,.0f} kB: too long to show here; it is embedded in this "
                 f"file's <code>script#shardlab-doc</code> element.</p>")

        nav = "".join(f'<a href="#{sid}">{esc(h)}</a>' for sid, h, _ in self.sections)
        body = "".join(f'<section id="{sid}"><h2>{esc(h)}</h2>{b}</section>' for sid, h, b in self.sections)
        blocks = "".join(f'<script type="application/json" id="{k}">{_json_script(v)}</script>' for k, v in self.data.items())
        mm = ""
        if self.mermaid:
            from shardlab.report.html.mermaid_js import mermaid_script

            mm = mermaid_script()
        return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>" + (
                f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
                f"<meta name='generator' content='shardlab {esc(__version__)}'><title>{esc(self.title)}</title>"
                f"<style>{CSS}{colour_css()}</style></head><body><header><h1>{esc(self.title)}</h1>"
                f"<p class='sub'>{esc(self.subtitle)}</p><p class='cmd'><code>{esc(command)}</code></p><nav>{nav}</nav></header>"
                f"<main>{body}<section id='document'><h2>The document</h2><p>Every number on this page comes from "
                f"the JSON document below, the one <code>--json</code> prints (shardlab {esc(__version__)}); the page "
                f"computes none of them.</p>{shown}</section></main>"
                f"<script type='application/json' id='shardlab-doc'>{_json_script(doc)}</script>{blocks}"
                f"<script>{JS}</script>{mm}</body></html>").replace("\ue000", ""))   # render.table's row marks


def _json_script(v) -> str:
    """JSON safe inside a <script> element: every '<', '>' and '&' escaped (\\u003c...), so no '</script>' or
    '<!--' in a user's text can end the element or open an HTML comment; JSON.parse gives back the same text."""
    return (json.dumps(v, separators=(",", ":"), default=str)
            .replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


CSS = """
:root{--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--bg:#fff;--soft:#f6f8fa;--accent:#0969da}
*{box-sizing:border-box}body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg)}
header{padding:18px 28px 8px;border-bottom:1px solid var(--line);background:var(--soft)}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:0 0 10px;padding-top:6px}h3{font-size:15px;margin:14px 0 6px}
.sub{margin:0;color:var(--muted)}.cmd{margin:6px 0}.cmd code{background:#eaeef2;padding:2px 6px;border-radius:4px}
nav{display:flex;flex-wrap:wrap;gap:4px 14px;margin-top:8px}nav a{color:var(--accent);text-decoration:none}
main{padding:8px 28px 40px;max-width:1500px}section{padding:14px 0;border-bottom:1px solid var(--line)}
table{border-collapse:collapse;margin:4px 0 8px;font-size:13px}th,td{border:1px solid var(--line);padding:3px 7px;text-align:left;vertical-align:top}
th{background:var(--soft);font-weight:600}td.r,th.r{text-align:right}.scroll{overflow-x:auto}
table.kv td:first-child{color:var(--muted);white-space:nowrap}table.kv>thead{display:none}
.note{color:var(--muted);font-size:13px;margin:4px 0}.big{font-size:20px;font-weight:600}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:6px 0 12px}.card{border:1px solid var(--line);border-radius:6px;padding:8px 12px;min-width:150px}
.card .l{color:var(--muted);font-size:12px}.card .v{font-size:18px;font-weight:600}
svg{max-width:100%;height:auto;font-family:inherit}.chart{overflow-x:auto}.chart svg{min-width:760px}svg text{font-size:12px;fill:var(--fg)}
svg text.halo{paint-order:stroke;stroke:var(--bg,#fff);stroke-width:3px;stroke-linejoin:round}
.risk{color:#8a4b00}.ok{color:#1a7f37}.bad{color:#cf222e;font-weight:600}
.rankmap{display:flex;gap:16px;align-items:flex-start;flex-wrap:wrap;max-width:100%;overflow-x:auto}
table.comm td:last-child{min-width:30ch}
.nodes{display:flex;flex-direction:column;gap:4px}.nodes.compact{flex-direction:row;flex-wrap:wrap;max-width:900px}
.node{display:flex;align-items:center;gap:3px}.node .nl{width:54px;color:var(--muted);font-size:12px}
.nodes.compact .node{gap:1px;border:1px solid var(--line);padding:2px}.nodes.compact .nl{width:auto;min-width:18px;text-align:right;font-size:9px;margin-right:2px}
.rank{width:84px;height:46px;border-radius:4px;font-size:11px;line-height:1.2;padding:3px 4px;cursor:pointer;border:1px solid rgba(0,0,0,.15);
 color:#111;overflow:hidden;outline:none}
.nodes.compact .rank{width:13px;height:13px;padding:0;font-size:0;border-radius:2px}
.rank:hover,.rank:focus,.rank.sel{box-shadow:0 0 0 2px #111}
#rank-panel{position:sticky;top:8px;max-height:calc(100vh - 16px);overflow-y:auto;flex:1 1 320px;min-width:300px;max-width:620px;border:1px solid var(--line);border-radius:6px;padding:10px;background:var(--soft)}
.legend[hidden]{display:none}.legend{display:flex;flex-wrap:wrap;gap:4px 12px;font-size:12px;margin:4px 0}.sw{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:4px;vertical-align:-1px}
pre{white-space:pre-wrap}pre.json{max-height:420px;overflow:auto;background:var(--soft);padding:8px;font-size:12px}
pre.mermaid{background:var(--soft);padding:8px;font-size:12px}pre.mermaid[data-processed]{background:none}
.cols{display:flex;flex-wrap:wrap;gap:24px}.cols>div{flex:1 1 420px;min-width:0}
"""

JS = r"""
(function(){
  var info = document.getElementById('rank-info');
  if (info) {
    info = JSON.parse(info.textContent);
    var rm = JSON.parse(document.getElementById('shardlab-doc').textContent).detail.rank_map;
    var panel = document.getElementById('rank-panel'), sel = null;
    function show(cell){
      var r = +cell.dataset.rank, row = rm.ranks[r], c = {rank: r};
      rm.columns.forEach(function(k, i){ c[k] = row[i]; });
      c.stage = c.pp;
      var st = info.stages[c.stage], h = '<h3>rank ' + r + '</h3>';
      h += '<p>node ' + c.node + ', GPU ' + c.gpu + ' &middot; pipeline stage ' + c.stage + ' &middot; TP rank ' + c.tp +
           ' &middot; DP replica ' + c.dp + (info.cp ? ' &middot; CP rank ' + c.cp : '') +
           (info.ep ? ' &middot; EP rank ' + c.ep : '') + '</p>';
      h += st.holds + st.memory;
      var g = '';
      info.axes.forEach(function(a){ var idx = c[a.key + '_group'];
        g += '<tr><td>' + a.label + '</td><td>' + rm.groups[a.key][idx] + '</td><td>' + a.comm + '</td></tr>'; });
      if (g) h += '<table><thead><tr><th>group</th><th>members</th><th>collectives (per step)</th></tr></thead><tbody>' + g + '</tbody></table>';
      panel.innerHTML = h;
    }
    document.querySelectorAll('.rank').forEach(function(cell){
      cell.addEventListener('mouseenter', function(){ show(cell); });
      cell.addEventListener('focus', function(){ show(cell); });
      cell.addEventListener('click', function(){ if (sel) sel.classList.remove('sel'); sel = cell; cell.classList.add('sel'); show(cell); });
    });
    document.querySelectorAll('input[name=colour]').forEach(function(r){
      r.addEventListener('change', function(){ var m = document.getElementById('nodes');
        m.classList.remove('by-pp','by-tp','by-dp','by-ep'); m.classList.add('by-' + r.value);
        document.querySelectorAll('.legend').forEach(function(l){ l.hidden = l.dataset.by !== r.value; }); });
    });
  }
})();
"""
