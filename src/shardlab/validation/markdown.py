"""The validation tables of docs/validation.md, generated from `shardlab validate` so the page cannot drift.

``python benchmarks/validation_docs.py`` rewrites the blocks between ``<!-- begin NAME -->`` and ``<!-- end NAME -->``
in docs/validation.md; ``tests/test_validation.py`` checks that the committed page equals a fresh rendering.
"""

from __future__ import annotations

import re

from shardlab.validation.report import TARGET_MAX, TARGET_MEAN, TARGET_MIN_RUNS, family_accuracy


def _pct(x: float | None, sign: bool = False) -> str:
    if x is None:
        return "-"
    return f"{100 * x:+.1f}%" if sign else f"{100 * x:.1f}%"


def families_md(ins: list, loso: list) -> str:
    rows = ["| family | runs | sources | in-sample mean | in-sample max | **leave-one-source-out mean** | **LOSO max** | target |",
            "|---|---:|---:|---:|---:|---:|---:|---|"]
    for f in family_accuracy(ins, loso):
        verdict = ("meets" if f.meets_target else "**misses**") if f.target_applies else f"n/a (< {TARGET_MIN_RUNS} runs)"
        rows.append(f"| {f.family} | {f.runs} | {f.sources} | {_pct(f.in_sample_mean)} | {_pct(f.in_sample_max)} | "
                    f"**{_pct(f.loso_mean)}** | **{_pct(f.loso_max)}** | {verdict} |")
    rows.append("")
    rows.append(f"Target: leave-one-source-out mean |error| ≤ {TARGET_MEAN:.0%} in every family with at least "
                f"{TARGET_MIN_RUNS} runs, and no run beyond {TARGET_MAX:.0%}.")
    return "\n".join(rows)


def runs_md(ins: list, loso: list) -> str:
    lo = {c.run.id: c for c in loso}
    rows = ["| run | family | GPUs | metric | measured | predicted | error | out of sample | source |",
            "|---|---|---:|---|---:|---:|---:|---:|---|"]
    for c in ins:
        r = c.run
        unit = "tok/s/GPU" if r.metric == "tokens_per_s_per_gpu" else f"TFLOP/s ({r.convention})"
        oos = "info" if r.informational else _pct(lo[r.id].error, sign=True)
        rows.append(f"| {r.id} | {c.family} | {r.config['gpus']} × {r.gpu} | {unit} | {r.measured:,.4g} | "
                    f"{c.predicted:,.4g} | {_pct(c.error, sign=True)} | {oos} | {r.source} |")
    return "\n".join(rows)


def blocks(ins: list, loso: list) -> dict[str, str]:
    return {"families": families_md(ins, loso), "runs": runs_md(ins, loso)}


def render_into(text: str, new: dict[str, str]) -> str:
    """``text`` with each ``<!-- begin NAME -->...<!-- end NAME -->`` block replaced by ``new[NAME]``."""
    for name, body in new.items():
        pat = re.compile(rf"(<!-- begin {name} -->\n).*?(<!-- end {name} -->)", re.S)
        if not pat.search(text):
            raise ValueError(f"no '<!-- begin {name} -->' block in the page")
        text = pat.sub(lambda m: m.group(1) + body.rstrip("\n") + "\n" + m.group(2), text)
    return text
