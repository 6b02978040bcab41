"""The HTML report: one self-contained page per plan, estimate, memory answer, run, benchmark or calibration,
built from the same document ``--json`` prints (the page draws; it computes no number).

``write_report(path, kind, doc, command)`` is the one entry point; ``check_html_path`` validates a path before
long work starts. Charts are hand-written SVG (docs/report.md says why); the only script library is Mermaid,
inlined for the TP block diagram.
"""

from __future__ import annotations

from pathlib import Path

from shardlab.errors import ShardlabError

KINDS = ("plan", "estimate", "memory", "run-train", "run-infer", "bench-collectives", "calibrate")
"""Page kinds: the command whose document the page draws."""


def check_html_path(path: str) -> str:
    """``path`` if it ends in .html/.htm and its folder exists, else a ShardlabError naming the fix."""
    from shardlab.safeout import check_output_path

    p = Path(path)
    if p.suffix.lower() not in (".html", ".htm"):
        raise ShardlabError(f"--html {path}: use a file name ending in .html")
    check_output_path(p, "--html")
    return path


def build_page(kind: str, doc: dict):
    """The ``Page`` for a command's document (inference variants are recognised from the document)."""
    from shardlab.report.html import plan_page as pp
    from shardlab.report.html import run_pages as rp

    from shardlab.report.html import serve_pages as sp

    if kind == "plan":
        if "prompt_len" in doc:
            return sp.serve_plan_page(doc) if "load" in doc else rp.inference_plan_page(doc)
        return pp.plan_page(doc)
    if kind == "estimate":
        if "prompt_len" in doc:
            if "disaggregated" in doc:
                from shardlab.report.html.pools import disagg_estimate_page

                return disagg_estimate_page(doc)
            return sp.serve_estimate_page(doc) if "steady_state" in doc else rp.inference_page(doc)
        return pp.estimate_page(doc)
    builders = {"memory": rp.memory_page, "run-train": rp.run_train_page, "run-infer": rp.run_infer_page,
                "bench-collectives": rp.bench_page, "calibrate": rp.calibrate_page}
    if kind not in builders:
        raise ShardlabError(f"no HTML page for '{kind}'; pages exist for {', '.join(KINDS)}")
    return builders[kind](doc)


def render_report(kind: str, doc: dict, command: str) -> str:
    """The page's HTML text."""
    return build_page(kind, doc).render(doc, command)


def write_report(path: str, kind: str, doc: dict, command: str) -> int:
    """Write the page for ``doc`` to ``path``; returns its size in bytes."""
    text = render_report(kind, doc, command)
    data = text.encode("utf-8")
    from shardlab.safeout import save_with

    save_with(lambda f: Path(f).write_bytes(data), check_html_path(path), "HTML page")   # no partial page left
    return len(data)
