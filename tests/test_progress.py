"""Progress: bars and a live status on a terminal, quiet under --json and when not a terminal; the analytic core
takes a callback and imports no progress, plotting or browser library."""

import os
import subprocess
import sys

from conftest import run_cli
from shardlab.catalog import get_catalog
from shardlab.estimate.workload import Workload
from shardlab.planner.search import plan_training
from shardlab.specs.hardware import Cluster

CORE = ("shardlab.planner.search", "shardlab.planner.explain", "shardlab.planner.risk", "shardlab.planner.detail",
        "shardlab.estimate", "shardlab.memory", "shardlab.comm.inventory", "shardlab.pipeline.simulate", "shardlab.shard")


def test_analytic_core_imports_no_progress_plotting_or_browser_library():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in CORE)
            + "bad = [m for m in ('tqdm', 'rich', 'playwright', 'matplotlib', 'plotly', 'torch') if m in sys.modules]\n"
            "assert not bad, bad\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_plan_search_reports_progress_through_a_callback():
    cat = get_catalog()
    acc = cat.accelerators["h100-sxm"]
    cl = Cluster(acc, 16, 8, cat.link("nvlink4"), cat.link("ib-ndr"))
    calls = []
    plan_training(cat.models["llama-3.1-8b"], cl, Workload(seq_len=2048, global_batch=64), objective="cost",
                  progress=lambda done, total, label: calls.append((done, total, label)))
    worlds = [c for c in calls if c[2].startswith("scoring")]
    assert [c[0] for c in calls] == sorted(c[0] for c in calls) and calls[-1][0] < calls[-1][1]
    assert {c[2] for c in worlds} >= {"scoring layouts of 1 GPUs", "scoring layouts of 16 GPUs"}


def test_bar_on_a_terminal_and_silence_under_json_or_a_pipe():
    args = ("plan", "llama-3.1-70b", "--gpus", "64", "--objective", "cost")
    env = {**os.environ, "SHARDLAB_PROGRESS": "1"}
    drawn = subprocess.run([sys.executable, "-m", "shardlab", *args], capture_output=True, text=True, env=env, timeout=120)
    assert drawn.returncode == 0 and "scoring layouts of" in drawn.stderr and "%|" in drawn.stderr
    quiet_json = subprocess.run([sys.executable, "-m", "shardlab", *args, "--json"], capture_output=True, text=True,
                                env=env, timeout=120)
    assert quiet_json.returncode == 0 and quiet_json.stderr == ""
    piped = run_cli(*args)                                   # stderr is a pipe: no progress
    assert piped.returncode == 0 and piped.stderr == ""
