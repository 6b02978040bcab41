"""The ledger as text: tables for the terminal and a markdown report to commit beside an experiment."""

from __future__ import annotations

from collections.abc import Sequence

from shardlab.cost.estimate import fmt_rate, fmt_usd
from shardlab.ledger.model import BudgetSummary, RunRecord
from shardlab.render.table import table


def _money(x: float | None) -> str:
    return "-" if x is None else fmt_usd(x)


def _wall(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:.1f} s" if s < 120 else (f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.2f} h")


def _ratio(r: RunRecord) -> str:
    if r.actual_usd is None or r.status == "unfinished" or not r.estimate_usd:
        return "-"
    return f"{100 * r.actual_usd / r.estimate_usd:.0f}%"


def _short(text: str, n: int = 40) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _time(iso: str | None) -> str:
    return "-" if not iso else iso.replace("T", " ").replace("+00:00", "")


def _budget_rows(budgets: Sequence[BudgetSummary]) -> list[list[str]]:
    return [[b.name, b.parent or "-", fmt_usd(b.ceiling_usd), fmt_usd(b.spent_usd), fmt_usd(b.reserved_usd),
             fmt_usd(b.remaining_usd), str(b.runs), str(b.unfinished)] for b in budgets]


_BUDGET_HEAD = ["budget", "part of", "ceiling", "spent", "reserved", "remaining", "runs", "unfinished"]


def _setup(r: RunRecord) -> str:
    return f"{r.setup_hours:g} h" if r.setup_hours else "-"


def text_report(path: str, budgets: Sequence[BudgetSummary], runs: Sequence[RunRecord], recovered: Sequence[int]) -> str:
    """Budgets, then every run with estimate vs actual; unfinished runs are marked with '!'."""
    if not budgets:
        return f"ledger {path}: no budgets yet (`shardlab guard --budget-name NAME --ceiling USD ... -- CMD` starts one)"
    lines = [table(_BUDGET_HEAD, _budget_rows(budgets), title=f"ledger {path} (USD; spent = measured, reserved = running; "
                                                               f"a budget's totals include the budgets part of it)")]
    if runs:
        rows = [[r.id, r.budget, ("! " if r.status == "unfinished" else "") + r.status, _time(r.started_at),
                 _setup(r), _wall(r.wall_s), fmt_usd(r.estimate_usd), _money(r.actual_usd), _ratio(r),
                 "-" if r.exit_code is None else r.exit_code, _short(r.command)] for r in runs]
        lines += ["", table(["run", "budget", "status", "started (UTC)", "set-up", "wall", "estimate", "actual",
                             "act/est", "exit", "command"], rows)]
    flagged = [r for r in runs if r.status == "unfinished"]
    if flagged:
        lines += ["", f"! {len(flagged)} unfinished run(s): the guard died before recording the end; "
                      f"each is charged its full reservation (the most it could have cost)."]
    if recovered:
        lines.append(f"(this call found run(s) {', '.join(map(str, recovered))} unfinished and charged them)")
    return "\n".join(lines)


def _code(text: str) -> str:
    """``text`` as a CommonMark code span: fenced by a backtick run longer than any inside it, padded with a
    space when it starts or ends with a backtick (a command may hold backticks: `date` in a shell line)."""
    text = text.replace("\n", " ")
    longest, run = 0, 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _cell(v: object) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def _md_table(head: Sequence[str], rows: Sequence[Sequence[object]], right: set[int]) -> list[str]:
    out = ["| " + " | ".join(head) + " |",
           "|" + "|".join("---:" if i in right else "---" for i in range(len(head))) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def markdown_report(path: str, budgets: Sequence[BudgetSummary], runs: Sequence[RunRecord], generated_at: str) -> str:
    """A self-contained markdown report: budgets, runs (estimate vs actual), flagged runs, price sources."""
    md = ["# GPU spend ledger", "",
          f"Generated {_time(generated_at)} UTC by `shardlab ledger` from {_code(path)}. Amounts in USD. "
          "Estimate = GPUs × price × (set-up + paid hours); actual = GPUs × price × (set-up + measured wall time), "
          "never more than the reservation; a run still running holds its reservation (estimate plus the SIGTERM "
          "grace period). A budget's totals include the budgets that are part of it.", "",
          "## Budgets", ""]
    md += _md_table(_BUDGET_HEAD, _budget_rows(budgets), right={2, 3, 4, 5, 6, 7}) if budgets else ["No budgets yet."]
    md += ["", "## Runs", ""]
    if runs:
        rows = [[r.id, r.budget, _code(r.command), r.gpus, r.gpu, fmt_rate(r.price_per_gpu_hour), f"{r.setup_hours:g}",
                 f"{r.hours:g}", fmt_usd(r.estimate_usd), _money(r.actual_usd), _ratio(r),
                 ("**unfinished**" if r.status == "unfinished" else r.status), _time(r.started_at), _time(r.ended_at),
                 "-" if r.exit_code is None else r.exit_code] for r in runs]
        md += _md_table(["#", "budget", "command", "GPUs", "GPU", "$/GPU-h", "set-up h", "paid h", "estimate", "actual",
                         "actual/estimate", "status", "started (UTC)", "ended (UTC)", "exit"], rows,
                        right={0, 3, 5, 6, 7, 8, 9, 10, 14})
    else:
        md.append("No runs yet.")
    notes = [r for r in runs if r.note]
    if notes:
        md += ["", "## Notes", ""]
        md += [f"- run {r.id} ({r.status}): {r.note}" for r in notes]
    if runs:
        md += ["", "## Price sources", ""]
        seen: dict[str, list[int]] = {}
        for r in runs:
            seen.setdefault(r.price_source, []).append(r.id)
        md += [f"- runs {', '.join(map(str, ids))}: {src}" for src, ids in seen.items()]
    return "\n".join(md) + "\n"
