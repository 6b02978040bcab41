"""docs/inference.md's generated tables: the engines' fitted values and ``validate --inference``'s errors.

``python benchmarks/fit_engines.py`` refits the engines and rewrites the blocks between ``<!-- begin NAME -->`` and
``<!-- end NAME -->``; ``tests/test_serve_cli.py`` checks that the committed page equals a fresh rendering of
``shardlab validate --inference --json``.
"""

from __future__ import annotations

from shardlab.serving.engines import FITTED
from shardlab.serving.rates import RATE_FIELDS
from shardlab.validation.markdown import _pct

ENGINE_ORDER = ("vllm", "sglang", "tensorrt-llm", "vllm-0.6", "sglang-0.3", "tensorrt-llm-0.17")
GROUPS = {"tpot": "per-token latency", "ttft": "first-token latency", "throughput": "throughput"}
_HEAD = {"weight_bandwidth_efficiency": ("η weights", "{:.3f}", 1), "kv_bandwidth_efficiency": ("η KV", "{:.3f}", 1),
         "gemm16_efficiency": ("η GEMM 16", "{:.3f}", 1), "gemm8_efficiency": ("η GEMM 8", "{:.3f}", 1),
         "gemm4_efficiency": ("η GEMM 4", "{:.3f}", 1), "first_token_overhead_us": ("first token ms", "{:.2f}", 1e-3),
         "attention_efficiency": ("η attention", "{:.3f}", 1), "step_overhead_us": ("step µs", "{:.1f}", 1),
         "seq_overhead_us": ("seq µs", "{:.2f}", 1), "layer_overhead_us": ("layer µs", "{:.1f}", 1),
         "eager_layer_overhead_us": ("eager layer µs", "{:.1f}", 1),
         "request_overhead_us": ("request ms", "{:.1f}", 1e-3)}


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def engines_md(values: dict, counts: dict) -> str:
    """The fitted overheads per engine version (``values``: engine -> FITTED field -> value), with the measured
    values of the engine behind them."""
    lines = [_row(["engine", "measured values", *(_HEAD[k][0] for k in FITTED)]), _row(["---"] * (len(FITTED) + 2))]
    for e in [e for e in ENGINE_ORDER if e in values] + sorted(set(values) - set(ENGINE_ORDER)):
        lines.append(_row([e, counts.get(e, 0), *(_HEAD[k][1].format(values[e][k] * _HEAD[k][2]) for k in FITTED)]))
    return "\n".join(lines)


def rates_md(values: dict, counts: dict) -> str:
    """The fitted rates per GPU generation, with the measured values behind each."""
    lines = [_row(["generation", "measured values", *(_HEAD[k][0] for k in RATE_FIELDS)]), _row(["---"] * (len(RATE_FIELDS) + 2))]
    for g in sorted(values):
        lines.append(_row([g, counts.get(g, 0), *(_HEAD[k][1].format(values[g][k]) for k in RATE_FIELDS)]))
    return "\n".join(lines)


def families_md(ins: dict, loso: dict, goals: dict, family_min: int) -> str:
    """One row per family (engine version × GPU generation): in-sample / leave-one-source-out mean |error|
    (measurements) per target group; a LOSO mean over its goal in a family of at least family_min is marked."""
    lines = [_row(["family", "per-token (in / LOSO)", "first-token (in / LOSO)", "throughput (in / LOSO)", "LOSO max"]),
             _row(["---"] * 5)]
    for f in sorted(ins["by_family"]):
        cells, worst = [], 0.0
        for g in GROUPS:
            a, b = ins["by_family"][f].get(g), loso["by_family"][f].get(g)
            if not a:
                cells.append("–")
                continue
            miss = " ✗" if b["n"] >= family_min and b["mean_abs_error"] > goals[g] else ""
            cells.append(f"{_pct(a['mean_abs_error'])} / {_pct(b['mean_abs_error'])}{miss} ({a['n']})")
            worst = max(worst, b["max_abs_error"])
        lines.append(_row([f, *cells, _pct(worst)]))
    return "\n".join(lines)


def targets_md(ins: dict, loso: dict, goals: dict) -> str:
    """One row per target group: measurements, in-sample and leave-one-source-out mean |error|, goal."""
    lines = [_row(["target", "measurements", "in sample", "leave-one-source-out", "goal"]), _row(["---"] * 5)]
    for g, name in GROUPS.items():
        if g in ins["by_group"]:
            a, b = ins["by_group"][g], loso["by_group"][g]
            lines.append(_row([name, a["n"], _pct(a["mean_abs_error"]), _pct(b["mean_abs_error"]),
                               f"{100 * goals[g]:.0f}%"]))
    for g, name in GROUPS.items():             # mixture-of-experts rows: predicted, never fitted (moe_run)
        if g in ins.get("moe", {}):
            a, b = ins["moe"][g], loso["moe"][g]
            lines.append(_row([f"{name}, mixture of experts (not fitted)", a["n"], _pct(a["mean_abs_error"]),
                               _pct(b["mean_abs_error"]), f"{100 * goals[g]:.0f}%"]))
    return "\n".join(lines)


def by_engine_md(ins: dict, loso: dict) -> str:
    """One row per engine: in-sample / leave-one-source-out mean |error| (measurements) per target group."""
    lines = [_row(["engine", "per-token (in / LOSO)", "first-token (in / LOSO)", "throughput (in / LOSO)"]),
             _row(["---"] * 4)]
    order = [e for e in ENGINE_ORDER if e in ins["by_engine"]] + sorted(set(ins["by_engine"]) - set(ENGINE_ORDER))
    for e in order:
        cells = []
        for g in GROUPS:
            a, b = ins["by_engine"][e].get(g), loso["by_engine"][e].get(g)
            cells.append(f"{_pct(a['mean_abs_error'])} / {_pct(b['mean_abs_error'])} ({a['n']})" if a else "–")
        lines.append(_row([e, *cells]))
    return "\n".join(lines)


def blocks(doc: dict) -> dict[str, str]:
    """The generated blocks from ``validate --inference --json``'s document."""
    s = doc["summary"]
    return {"engine-values": engines_md(doc["engines"], doc["rows_per_engine"]),
            "rate-values": rates_md(doc["rates"], doc["rows_per_generation"]),
            "inference-families": families_md(s["in_sample"], s["leave_one_source_out"], s["goals"], s["verdict"]["family_min"]),
            "inference-targets": targets_md(s["in_sample"], s["leave_one_source_out"], s["goals"]),
            "inference-engines": by_engine_md(s["in_sample"], s["leave_one_source_out"])}
