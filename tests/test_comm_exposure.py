"""One collective inventory, priced once: `comm plan` and `estimate` give the same seconds per group for every
layout, framework and model kind, and the README's main plan reads the same through the job file."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from shardlab.catalog import get_catalog
from shardlab.comm.exposure import GROUPS, exposure, group_of
from shardlab.comm.inventory import layout_collectives
from shardlab.estimate import estimate_training
from shardlab.layout import Layout
from shardlab.specs.hardware import Cluster

CAT = get_catalog()


def _cluster(gpus: int, gpu: str = "h100-sxm") -> Cluster:
    acc = CAT.accelerator(gpu)
    return Cluster(accelerator=acc, num_gpus=gpus, gpus_per_node=8, intra_link=CAT.link(acc.system["intra_link"]),
                   inter_link=CAT.link(acc.system["inter_link"]))


CASES = [  # (model, GPUs, framework, global batch, sequence length, layout)
    ("llama-3.1-70b", 64, "megatron-lm", 1024, 4096, dict(dp=2, tp=2, pp=4, cp=4, zero=1, sequence_parallel=True)),
    ("llama-3.1-70b", 64, "megatron-lm", 1024, 4096, dict(dp=4, tp=8, pp=2, zero=0, recompute="full")),
    ("llama-3.1-70b", 64, "megatron-lm", 1024, 4096,
     dict(dp=2, tp=4, pp=8, vpp=2, schedule="interleaved", zero=1, sequence_parallel=True)),
    ("llama-3.1-8b", 16, "pytorch-fsdp", 64, 4096, dict(dp=16, zero=3, recompute="full")),
    ("llama-3.1-8b", 16, "deepspeed", 64, 4096, dict(dp=16, zero=3, recompute="full")),
    ("llama-3.1-8b", 16, "deepspeed", 64, 4096, dict(dp=16, zero=2)),
    ("llama-3.1-8b", 16, "torchtitan", 64, 4096, dict(dp=16, zero=3, dp_replicate=2)),
    ("llama-3.1-8b", 16, "torchtitan", 64, 4096, dict(dp=16, zero=3, wrap=0)),
    ("llama-3.1-8b", 32, "torchtitan", 64, 4096, dict(dp=16, pp=2, zero=3, wrap=0)),
    ("llama-3.1-8b", 16, "torchtitan", 64, 4096, dict(dp=16, zero=3, wrap=4)),
    ("llama-3.1-8b", 16, "megatron-lm", 64, 4096, dict(dp=8, cp=2, zero=1, recompute="full")),
    ("llama-3.1-8b", 32, "megatron-lm", 64, 4096, dict(dp=2, tp=4, pp=4, zero=1, dp_replicate=2)),
    ("mixtral-8x7b", 32, "megatron-lm", 256, 4096, dict(dp=8, tp=2, pp=2, ep=8, zero=1, sequence_parallel=True)),
    ("mixtral-8x7b", 32, "megatron-lm", 256, 4096, dict(dp=16, tp=2, ep=4, zero=1, recompute="full")),
    ("mixtral-8x7b", 32, "torchtitan", 64, 4096, dict(dp=32, ep=8, zero=3)),
    ("mixtral-8x7b", 32, "pytorch-fsdp", 64, 4096, dict(dp=16, pp=2, ep=4, zero=3, wrap=0, dp_replicate=2)),
    ("deepseek-v3", 256, "megatron-lm", 1024, 4096, dict(dp=16, pp=16, ep=16, zero=1)),
    ("gpt2-xl", 16, "megatron-lm", 64, 1024, dict(dp=4, pp=4, zero=1, recompute="selective")),   # tied embeddings
    ("gpt2-xl", 20, "megatron-lm", 64, 1024, dict(dp=2, pp=2, tp=5, zero=0)),
    ("gpt2-xl", 16, "torchtitan", 64, 1024, dict(dp=8, pp=2, zero=3)),
]


@pytest.mark.parametrize("model,gpus,fw,gb,seq,kw", CASES, ids=[f"{c[0]}-{c[2]}-{i}" for i, c in enumerate(CASES)])
def test_inventory_totals_equal_the_step_model(model, gpus, fw, gb, seq, kw):
    spec, lay, cl = CAT.model(model), Layout(**kw), _cluster(gpus)
    est = estimate_training(spec, lay, cl, seq_len=seq, global_batch=gb, framework=CAT.framework(fw))
    items = layout_collectives(spec, lay, cl, seq_len=seq, microbatches=est.microbatches,
                               precision=est.workload.precision, framework=est.workload)
    groups = exposure(items, est.breakdown, lay.zero)
    seen = {g.component for g in groups}
    for key, total in est.comm_total_s.items():          # a group the step model prices has inventory rows, and back
        assert (key in seen) == (total > 0), (key, total)
    for g in groups:
        assert g.total_s == pytest.approx(est.comm_total_s[g.component], rel=1e-9, abs=1e-12), g
        assert g.exposed_s == est.breakdown[g.component]
        assert 0 <= g.exposed_s <= g.total_s * (1 + 1e-9) + 1e-12, g
        if g.group in ("TP", "EP", "PP"):                 # the critical path: the step waits for every call
            assert g.exposed_s == pytest.approx(g.total_s, rel=1e-9), g


def test_every_inventory_axis_has_a_group():
    assert group_of("HSDP", 3) == "FSDP" and group_of("HSDP", 1) == "DP" and group_of("SP", 0) == "TP"
    assert {k for _, k, _ in GROUPS} <= set(estimate_training.__globals__["BREAKDOWN_KEYS"])
    with pytest.raises(ValueError):
        group_of("XX", 0)


def _run(*args, cwd):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-m", "shardlab", *args], capture_output=True, text=True, cwd=cwd, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_readme_main_plan_reads_the_same_in_comm_plan_and_estimate(tmp_path):
    """The issue's check: `plan --save job.toml`, then `comm plan job.toml --json`'s exposed seconds per group are the
    estimate's communication components, and `estimate job.toml` gives the winner's step time."""
    plan = json.loads(_run("plan", "--save", "job.toml", "--json", cwd=tmp_path))
    comm = json.loads(_run("comm", "plan", "job.toml", "--json", cwd=tmp_path))
    est = json.loads(_run("estimate", "job.toml", "--json", cwd=tmp_path))
    assert est["step_time_s"] == plan["plans"][0]["step_time_s"] == comm["step_time_s"]
    assert comm["layout"] == {k: v for k, v in est["layout"].items() if k != "microbatches"}
    assert comm["global_batch"] == est["workload"]["global_batch"]
    for group, key, _ in GROUPS:
        if group in comm["summary"]["exposed_by_group_s"]:
            assert comm["summary"]["exposed_by_group_s"][group] == est["breakdown"][key], group
            assert comm["summary"]["total_by_group_s"][group] == pytest.approx(est["comm_total_s"][key], rel=1e-9)
        else:
            assert est["breakdown"][key] == 0, group
    assert {e["group"] for e in est["communication_exposure"]} == set(comm["summary"]["exposed_by_group_s"])
    assert comm["summary"]["exposed_s"] == pytest.approx(sum(est["breakdown"][k] for _, k, _ in GROUPS), rel=1e-12)
