"""Fit the serving engines' kernel numbers to the published measurements, then rewrite what depends on them.

Refits the nine fitted fields of each engine (vllm, tensorrt-llm, sglang) on every target row of
src/shardlab/validation/inference_runs.yaml, as `shardlab validate --inference` does (two-stage empirical Bayes,
src/shardlab/validation/inference.py), repeating until the values stop moving (each pass starts from the last);
writes them into src/shardlab/catalog/data/engines.yaml with the command and the date in their sources; then
rewrites docs/inference.md's generated tables from a fresh `validate --inference` (in sample and
leave-one-source-out). tests/test_serve_cli.py fails when engines.yaml or the page lag behind a refit.

    python benchmarks/fit_engines.py          # about a minute on one core
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from shardlab.catalog import get_catalog  # noqa: E402
from shardlab.serving.engines import ENGINES_FILE, FITTED, builtin_engines  # noqa: E402
from shardlab.validation.inference import load_inference_runs, validate  # noqa: E402

COMMAND = "python benchmarks/fit_engines.py"
LABEL = {"vllm": "vLLM", "tensorrt-llm": "TensorRT-LLM", "sglang": "SGLang"}


def _fmt(key: str, v: float) -> str:
    return f"{v:.0f}" if key == "request_overhead_us" else f"{v:.4g}"


def write_values(text: str, values: dict, date: str) -> str:
    """engines.yaml's text with each engine's FITTED values and their sources replaced."""
    out, engine = [], None
    for line in text.splitlines():
        top = re.match(r"^([a-z0-9-]+):\s*$", line)
        if top:
            engine = top.group(1)
        m = re.match(r"^  ([a-z0-9_]+): (.*)$", line)
        if engine in values and m and m.group(1) in FITTED:
            line = f"  {m.group(1)}: {_fmt(m.group(1), values[engine][m.group(1)])}"
        m = re.match(r"^    ([a-z0-9_]+): \"fitted.*\"$", line)
        if engine in values and m and m.group(1) in FITTED:
            line = (f"    {m.group(1)}: \"fitted ({COMMAND}, {date}) to the {LABEL.get(engine, engine)} rows of "
                    f"inference_runs.yaml\"")
        out.append(line)
    return "\n".join(out) + "\n"


def main() -> int:
    date = datetime.date.today().isoformat()
    runs = load_inference_runs()
    for attempt in range(4):
        d = validate(get_catalog(), runs, loso=False)
        now = {e: {k: getattr(p, k) for k in FITTED} for e, p in builtin_engines().items()}
        moved = max(abs(d["refit"][e][k] / now[e][k] - 1) for e in d["refit"] for k in FITTED)
        print(f"pass {attempt + 1}: largest move {100 * moved:.2f}%")
        ENGINES_FILE.write_text(write_values(ENGINES_FILE.read_text(), d["refit"], date))
        builtin_engines.cache_clear()
        if moved < 0.005:
            break
    for e, vals in sorted(d["refit"].items()):
        print(f"  {e:13s} " + ", ".join(f"{k} {_fmt(k, v)}" for k, v in vals.items()))
    from shardlab.cli import main as cli
    from shardlab.validation.inference_markdown import blocks
    from shardlab.validation.markdown import render_into

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = cli(["validate", "--inference", "--json"])
    if code != 0:
        print("validate --inference failed", file=sys.stderr)
        return 1
    page = ROOT / "docs" / "inference.md"
    page.write_text(render_into(page.read_text(), blocks(json.loads(buf.getvalue()))))
    with contextlib.redirect_stdout(io.StringIO()) as text:
        cli(["validate", "--inference"])
    print(text.getvalue().split("\n\nper source")[0])
    print(f"wrote {ENGINES_FILE.relative_to(ROOT)} and the generated tables of {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
