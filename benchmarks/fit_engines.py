"""Fit the serving rates (per GPU generation) and the engines' overheads to the published measurements, then
rewrite what depends on them.

Refits the six rates of every GPU generation and the five overheads of every engine version jointly on every
target row of src/shardlab/validation/inference_runs.yaml, as `shardlab validate --inference` does (two-stage
empirical Bayes, src/shardlab/validation/inference_fit.py), repeating until the values stop moving (each pass starts
from the last); writes src/shardlab/catalog/data/serving_rates.yaml (with each generation's count of measured
values and a default entry, the fitted generations' mean) and the overheads into
src/shardlab/catalog/data/engines.yaml, with the command and the date in their sources; refits every
leave-one-source-out fold on those values and commits them to src/shardlab/validation/inference_crossval.json
(`validate --inference` reuses them while the data files are unchanged); then
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
import numpy as np  # noqa: E402

from shardlab.serving.engines import ENGINES_FILE, FITTED, builtin_engines  # noqa: E402
from shardlab.serving.rates import RATE_FIELDS, RATES_FILE, builtin_rates  # noqa: E402
from shardlab.validation.inference import load_inference_runs  # noqa: E402
from shardlab.validation.inference_loso import validate  # noqa: E402
from shardlab.validation.inference_fit import _v, _x  # noqa: E402

COMMAND = "python benchmarks/fit_engines.py"
LABEL = {"vllm": "vLLM V1", "tensorrt-llm": "TensorRT-LLM 1.x", "sglang": "SGLang 0.5", "vllm-0.6": "vLLM 0.6",
         "tensorrt-llm-0.17": "TensorRT-LLM 0.x", "sglang-0.3": "SGLang 0.3"}


def _fmt(key: str, v: float) -> str:
    return f"{v:.0f}" if key in ("request_overhead_us", "first_token_overhead_us") else f"{v:.4g}"


def pinned_by_generation() -> dict:
    """generation -> the rates it takes from the training fit (``validation.inference.pinned_rates``)."""
    from shardlab.validation.inference import pinned_rates

    cat = get_catalog()
    out: dict = {}
    for acc_id in cat.accelerators:
        acc = cat.accelerator(acc_id)
        if acc.generation and pinned_rates(acc):
            out.setdefault(acc.generation, pinned_rates(acc))
    return out


def rates_text(rates: dict, counts: dict, date: str) -> str:
    """serving_rates.yaml's text: one line per fitted generation and the default (their mean in logit space)."""
    pinned = pinned_by_generation()
    head = [line for line in RATES_FILE.read_text().splitlines() if line.startswith("#")]
    mean = {f: float(_v(f, np.mean([_x(f, r[f]) for r in rates.values()]))) for f in RATE_FIELDS}
    out = list(head)
    for gen, vals in [*sorted(rates.items()), ("default", mean)]:
        cells = ", ".join(f"{f}: {vals[f]:.4g}" for f in RATE_FIELDS)
        src = (f"fitted ({COMMAND}, {date}) to every engine's {counts.get(gen, 0)} measured values on {gen}" if gen != "default"
               else f"the fitted generations' mean in logit space ({COMMAND}, {date}): no published serving row")
        if pinned.get(gen):
            src += (f"; {', '.join(sorted(pinned[gen]))} is the training fit's matmul max_fraction "
                    f"(catalog/data/fitted.yaml), not fitted to serving rows")
        out.append(f"{gen}: {{{cells}, rows: {counts.get(gen, 0) if gen != 'default' else 0}, source: \"{src}\"}}")
    return "\n".join(out) + "\n"


def write_values(text: str, values: dict, date: str) -> str:
    """engines.yaml's text with each engine's FITTED values and their sources replaced."""
    out, engine = [], None
    for line in text.splitlines():
        top = re.match(r"^([a-z0-9.-]+):\s*$", line)
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
    import os

    if os.environ.get("SHARDLAB_CATALOG"):
        print("unset SHARDLAB_CATALOG: the fit writes the built-in catalog's values and folds", file=sys.stderr)
        return 2
    date = datetime.date.today().isoformat()
    runs = load_inference_runs()
    for attempt in range(4):
        d = validate(get_catalog(), runs, loso=False)
        refit = d["refit"]
        now_e = {e: {k: getattr(p, k) for k in FITTED} for e, p in builtin_engines().items()}
        now_r = {g: {k: getattr(r, k) for k in RATE_FIELDS} for g, r in builtin_rates().items()}
        moved = max([abs(refit["engines"][e][k] / now_e[e][k] - 1) for e in refit["engines"] for k in FITTED] +
                    [abs(refit["rates"][g][k] / now_r.get(g, now_r["default"])[k] - 1) for g in refit["rates"] for k in RATE_FIELDS])
        print(f"pass {attempt + 1}: largest move {100 * moved:.2f}%")
        ENGINES_FILE.write_text(write_values(ENGINES_FILE.read_text(), refit["engines"], date))
        RATES_FILE.write_text(rates_text(refit["rates"], d["rows_per_generation"], date))
        builtin_engines.cache_clear()
        builtin_rates.cache_clear()
        if moved < 0.005:
            break
    for g, vals in sorted(refit["rates"].items()):
        print(f"  {g:13s} " + ", ".join(f"{k} {v:.3f}" for k, v in vals.items()))
    for e, vals in sorted(refit["engines"].items()):
        print(f"  {e:18s} " + ", ".join(f"{k} {_fmt(k, v)}" for k, v in vals.items()))
    # the leave-one-source-out folds on the values just written, committed for `validate --inference` to reuse
    from shardlab.validation.inference_folds import FOLDS_FILE, write

    d = validate(get_catalog(), runs)
    write(d["fold_values"], d["free_values"], d["refit"], runs, date, COMMAND)
    print(f"wrote {FOLDS_FILE.relative_to(ROOT)} ({len(d['fold_values'])} folds)")
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
