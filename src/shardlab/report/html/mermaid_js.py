"""The Mermaid library inlined into a page: the npm package's ``dist/mermaid.min.js``, stored gzipped in
``vendor/`` and embedded as base64; the page decompresses it with the browser's ``DecompressionStream`` and
renders every ``pre.mermaid`` block. Without JavaScript the block shows the diagram's source text."""

from __future__ import annotations

import base64
from functools import lru_cache
from pathlib import Path

MERMAID_VERSION = "11.17.2"
"""npm ``mermaid`` version inlined (vendor/README.md says how to refresh it)."""
VENDOR = Path(__file__).parent / "vendor" / f"mermaid-{MERMAID_VERSION}.min.js.gz"


@lru_cache(maxsize=1)
def mermaid_gzip() -> bytes:
    """The gzipped library."""
    return VENDOR.read_bytes()


def mermaid_info() -> dict:
    """Version and sizes of the inlined library (shown on the page and in docs/report.md)."""
    import gzip

    raw = len(gzip.decompress(mermaid_gzip()))
    return {"package": "mermaid (npm)", "version": MERMAID_VERSION, "bytes": raw, "gzip_bytes": len(mermaid_gzip()),
            "inlined_bytes": 4 * ((len(mermaid_gzip()) + 2) // 3)}


LOADER = r"""
(async function(){
  var blocks = document.querySelectorAll('pre.mermaid');
  if (!blocks.length) return;
  try {
    var b64 = document.getElementById('mermaid-lib').textContent.trim();
    var bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    var text = await new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'))).text();
    var s = document.createElement('script'); s.textContent = text; document.head.appendChild(s);
    window.mermaid.initialize({startOnLoad: false, securityLevel: 'strict', theme: 'neutral', flowchart: {useMaxWidth: true}});
    await window.mermaid.run({nodes: blocks});
    document.documentElement.dataset.mermaid = 'rendered';
  } catch (e) {
    document.documentElement.dataset.mermaid = 'failed';
    console.error('mermaid: ' + (e && e.message ? e.message : e));
  }
})();
"""


def mermaid_script() -> str:
    """The library (base64 of the gzip) and the loader, for the end of <body>."""
    b64 = base64.b64encode(mermaid_gzip()).decode("ascii")
    return f'<script type="text/plain" id="mermaid-lib">{b64}</script><script>{LOADER}</script>'


def mermaid_block(source: str) -> str:
    """A ``pre.mermaid`` element holding ``source`` (escaped: the browser hands Mermaid the original text)."""
    import html

    return f'<pre class="mermaid">{html.escape(source)}</pre>'
