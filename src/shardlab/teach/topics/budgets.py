"""Spending under a ceiling: set-up time in the reservation, and a lab budget inside a course total (item 5).

The derivation drives the real ledger (``shardlab.ledger``, an SQLite file in a temporary folder) through the
same reservations `shardlab guard` makes, so every decision shown is the ledger's own.
"""

from __future__ import annotations

from shardlab.teach.explanation import Explanation
from shardlab.teach.params import Param
from shardlab.teach.topics._common import catalog, gpu
from shardlab.teach.registry import Topic


def budgets(v: dict) -> Explanation:
    """A $3 lab inside a $5 total: three guarded runs, each reserved (set-up included) or refused by a ceiling."""
    import tempfile
    from pathlib import Path

    from shardlab.cost.estimate import fmt_usd
    from shardlab.ledger import Ledger, Refusal, RunRequest

    v = {**v, "gpu": catalog().accelerator(v["gpu"]).id}   # a catalog GPU (unknown ids get the catalog's one line)
    rate = v["gpus"] * v["price"]
    total, lab, setup = v["total"], v["lab"], v["setup"]
    # run 1 fits the lab; run 2 would pass the lab's ceiling; run 3 fits a second lab but passes the total
    first = v["hours"]
    second = max(0.1, (lab - rate * (first + setup)) / rate - setup + 0.5)
    third = max(0.1, (total - rate * (first + setup)) / rate - setup + 0.1)
    attempts = [("lab", first), ("lab", second), ("lab-2", third)]
    rows, derivation, outcome = [], [], []
    with tempfile.TemporaryDirectory(prefix="shardlab-explain-") as d, Ledger(Path(d) / "ledger.sqlite") as led:
        led.set_budget("total", total)
        led.set_budget("lab", lab, parent="total")
        led.set_budget("lab-2", lab, parent="total")
        for i, (budget, hours) in enumerate(attempts, 1):
            req = RunRequest(budget=budget, command=f"python lab{i}.py", shell=False, gpus=v["gpus"], gpu=v["gpu"],
                             price_per_gpu_hour=v["price"], price_source="explain", hours=hours, grace_s=0.0,
                             setup_hours=setup)
            try:
                run, _ = led.reserve(req)
                led.finish(run.id, status="finished", exit_code=0, wall_s=hours * 3600, actual_usd=req.estimate_usd)
                decision, binding = "reserved, ran, charged", "-"
            except Refusal as r:
                decision, binding = f"refused (exit 3): {fmt_usd(r.spent_usd + r.reserved_usd)} already used of " \
                                    f"{fmt_usd(r.ceiling_usd)}", r.binding
            outcome.append(binding)
            b = {x.name: x for x in led.budgets()}
            rows.append([i, budget, f"{setup:g} h + {hours:.3g} h", fmt_usd(req.estimate_usd), decision, binding,
                         fmt_usd(b[budget].spent_usd), fmt_usd(b["total"].spent_usd)])
            derivation.append(f"run {i} in '{budget}': {v['gpus']} × ${v['price']:g}/h × ({setup:g} h set-up + "
                              f"{hours:.3g} h) = {fmt_usd(req.estimate_usd)} → {decision}")
    derivation.insert(0, f"budgets: 'total' {fmt_usd(total)}; 'lab' and 'lab-2' {fmt_usd(lab)} each, both part of "
                         f"'total' (a reservation must fit every ceiling above it)")
    plain = (f"Set-up time is paid time too: each run reserves {v['gpus']} GPUs × ${v['price']:g}/h × (set-up + paid "
             f"hours) before it starts. The lab's own ${lab:g} ceiling refuses run 2, and the ${total:g} total refuses run "
             f"3 even though it fits its own lab: a budget inside another is bound by both ceilings, so the course "
             f"never spends more than ${total:g}.")
    return Explanation(
        "budgets", "Budgets: set-up time and a lab inside a total",
        f"{v['gpus']} × {v['gpu']} at ${v['price']:g}/GPU-hour with {setup:g} h of set-up per run: which runs fit a "
        f"${lab:g} lab inside a ${total:g} total?", dict(v), derivation, plain,
        {"binding": outcome, "rate_usd_per_hour": rate},
        table=(["run", "budget", "set-up + hours", "estimate", "decision", "refused by", "budget spent", "total spent"], rows),
        commands=[f"cost --gpus {v['gpus']} --price {v['price']:g} --hours {first:g} --setup-hours {setup:g} --budget {lab:g}",
                  f"guard --budget-name lab --gpus {v['gpus']} --gpu {v['gpu']} --price {v['price']:g} --hours {first:g} "
                  f"--setup-hours {setup:g} -- python lab.py"],
        notes=["the ledger here is a temporary file; `shardlab guard` and `shardlab ledger` use yours (docs/cost.md)",
               f"on your ledger, create the budgets first: `shardlab ledger --budget-name total --set-ceiling {total:g}`, "
               f"then `shardlab ledger --budget-name lab --set-ceiling {lab:g} --parent total`",
               "a run is charged its measured time (here: the full paid hours), never more than its reservation"])


TOPICS = [
    Topic("budgets", "Budgets", "set-up time in every reservation, and a lab budget inside a course total", (5,),
          (Param("gpus", "int", 2, "GPUs rented"), gpu("rtx-4090"),
           Param("price", "float", 0.35, "USD per GPU-hour", minimum=0.0001),
           Param("hours", "float", 2.5, "paid hours of the first run", minimum=0.0001),
           Param("setup", "float", 0.5, "set-up hours per run", minimum=0),
           Param("lab", "float", 3.0, "the lab's ceiling, USD", minimum=0.01),
           Param("total", "float", 5.0, "the course total's ceiling, USD", minimum=0.01)), budgets),
]
