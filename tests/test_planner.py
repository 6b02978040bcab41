"""Planner: obvious answers in clear cases, invariants, rejection accounting, JSON contract."""

import json

import numpy as np
import pytest

from conftest import cli_main
from shardlab.catalog import get_catalog
from shardlab.estimate.workload import Workload
from shardlab.planner.search import NOT_FIT, plan_training
from shardlab.planner.space import enumerate_space
from shardlab.specs.hardware import Cluster

CAT = get_catalog()


def cl(gpu="h100-sxm", n=8):
    acc = CAT.accelerators[gpu]
    return Cluster(acc, n, 8, CAT.link(acc.system["intra_link"]), CAT.link(acc.system["inter_link"]))


def test_small_model_on_8_gpus_is_pure_data_parallel():
    res = plan_training(CAT.models["gpt2-xl"], cl(), Workload(seq_len=1024, global_batch=512))
    lay = res.plans[0]["layout"]
    assert (lay["dp"], lay["tp"], lay["pp"], lay["cp"]) == (8, 1, 1, 1)


def test_70b_on_8x80gb_needs_sharding():
    """AdamW mixed precision needs 16 bytes/param = 1.13 TB for 70B: more than 8 × 80 GB, so nothing fits,
    and pure data parallelism is rejected for memory."""
    res = plan_training(CAT.models["llama-3.1-70b"], cl(), Workload(seq_len=4096, global_batch=64))
    assert res.plans == [] and res.rejected[NOT_FIT] > 0
    # with 8 bytes/param (pure bf16) on 141 GB GPUs it fits only when sharded
    res = plan_training(CAT.models["llama-3.1-70b"], cl("h200"), Workload(seq_len=4096, global_batch=64, precision="bf16"))
    best = res.plans[0]["layout"]
    assert best["zero"] == 3 or best["tp"] * best["pp"] > 1


def test_ranked_plans_fit_and_are_sorted():
    spec = CAT.models["llama-3.1-8b"]
    res = plan_training(spec, cl(n=16), Workload(seq_len=4096, global_batch=128), top=5)
    steps = [p["step_time_s"] for p in res.plans]
    assert len(steps) == 5
    cap = CAT.accelerators["h100-sxm"].memory_bytes
    for p in res.plans:
        assert p["fits"] and p["memory_bytes"] <= cap
    # simplicity preference allows a later plan to be at most 0.3% per axis faster
    assert all(s2 >= s1 * (1 - 0.03) for s1, s2 in zip(steps, steps[1:]))
    assert np.all(res.scores["memory_bytes"][np.isfinite(res.scores["key"])] <= cap)


def test_rejections_are_counted_and_add_up():
    spec = CAT.models["llama-3.1-8b"]
    c, rej, total = enumerate_space(spec, 24, 8, 4096, 96)
    assert total == len(c["dp"]) + sum(rej.values())
    assert rej["tp×pp×cp does not divide the GPU count"] > 0
    # a vocab-free check: every surviving candidate multiplies to the GPU count and divides the batch
    assert np.all(c["dp"] * c["tp"] * c["pp"] * c["cp"] == 24)
    assert np.all(96 % (c["mb"] * c["dp"]) == 0)


def test_megatron_searches_moe_under_tp_only_with_sequence_parallelism():
    """Megatron-Core's MoELayer refuses tensor parallelism without sequence parallelism in training (megatron-core
    0.16.1, moe_layer.py): its profile says so and the search keeps only SP layouts there; a profile without the
    rule keeps both, and a dense model is unaffected."""
    mix, meg = CAT.models["mixtral-8x7b"], CAT.framework("megatron-lm")
    c, rej, _ = enumerate_space(mix, 32, 8, 4096, 256, framework=meg)
    assert rej["the framework trains MoE layers under tp only with sequence parallelism"] > 0
    assert np.all(c["sp"][c["tp"] > 1] == 1)
    c, rej, _ = enumerate_space(mix, 32, 8, 4096, 256)
    assert np.any(c["sp"][c["tp"] > 1] == 0) and not rej["the framework trains MoE layers under tp only with sequence parallelism"]
    c, rej, _ = enumerate_space(CAT.models["llama-3.1-8b"], 32, 8, 4096, 256, framework=meg)
    assert np.any(c["sp"][c["tp"] > 1] == 0)
    from shardlab.layout import Layout

    assert meg.refusal(Layout(dp=16, tp=2, ep=4), mix).endswith(
        "add layout.sequence_parallel")


def test_vectorized_memory_agrees_with_exact_report():
    spec = CAT.models["llama-3.1-70b"]
    res = plan_training(spec, cl(n=64), Workload(seq_len=4096, global_batch=256), top=3, exact_check=3)
    for p in res.plans:
        assert abs(p["memory_bytes_approx"] - p["memory_bytes"]) / p["memory_bytes"] < 0.01


def test_more_gpus_never_lower_best_throughput():
    spec = CAT.models["llama-3.1-8b"]
    prev = 0
    for n in (8, 16, 32):
        res = plan_training(spec, cl(n=n), Workload(seq_len=4096, global_batch=256), top=1, exact_check=0)
        tps = res.plans[0]["tokens_per_s"]
        assert tps >= prev
        prev = tps


def test_cost_objective_may_use_fewer_gpus():
    res = plan_training(CAT.models["gpt2"], cl(n=16), Workload(seq_len=1024, global_batch=64), objective="cost", top=3)
    assert res.plans[0]["gpus"] <= 16
    per_token = [p["gpus"] * p["step_time_s"] for p in res.plans]
    assert per_token[0] <= min(per_token) * 1.03


def test_the_worksheet_explains_alternatives_by_what_was_ranked():
    from shardlab.planner.explain import axis_reasons

    res = plan_training(CAT.models["gpt2"], cl(n=16), Workload(seq_len=1024, global_batch=64), objective="cost", top=3)
    reasons = [a["reason"] for a in axis_reasons(res) if a["reason"].startswith("the best with")]
    assert reasons and all("GPU-time per token" in r or "cheaper" in r for r in reasons), reasons
    assert not any("faster but more complex" in r or "step time (" in r for r in reasons)
    res = plan_training(CAT.models["gpt2"], cl(n=16), Workload(seq_len=1024, global_batch=64), objective="memory", top=3)
    reasons = [a["reason"] for a in axis_reasons(res) if a["reason"].startswith("the best with")]
    assert reasons and all(("GiB" in r or "ties on memory" in r) and "faster" not in r for r in reasons), reasons


def test_plan_cli_json_contract_and_worksheet():
    code, out, err = cli_main("plan", "llama-3.1-8b", "--gpus", "16", "--global-batch", "64", "--top", "3", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["evaluated"] > 0 and isinstance(d["rejected"], dict) and d["search_s"] > 0
    assert len(d["plans"]) == 3 and {"layout", "step_time_s", "tokens_per_s", "mfu"} <= set(d["plans"][0])
    axes = {a["key"] for a in d["worksheet"]}
    assert {"tp", "pp", "dp", "zero"} <= axes
    assert d["communication"] and {"axis", "op", "link_id", "overlap"} <= set(d["communication"][0])


def test_plan_default_runs_and_is_human_readable():
    code, out, err = cli_main("plan")
    assert code == 0, err
    assert "llama-3.1-70b on 64 × h100-sxm" in out and "design worksheet" in out and "runner-up" in out


@pytest.mark.parametrize("args,msg", [
    (["plan", "llama-3.1-8b", "--fix", "tq=2"], "--fix"),
    (["plan", "llama-3.1-8b", "--objective", "latency"], "--inference"),
    (["plan", "llama-3.1-8b", "--gpus", "8", "--nodes", "2"], "--nodes"),
    (["plan", "--params", "7e9"], "shapes"),
])
def test_plan_bad_input(args, msg):
    code, _, err = cli_main(*args)
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1


def test_fixed_axes_are_respected():
    res = plan_training(CAT.models["llama-3.1-8b"], cl(n=16), Workload(seq_len=4096, global_batch=64), fixed={"tp": 4, "zero": 1})
    for p in res.plans:
        assert p["layout"]["tp"] == 4 and p["layout"]["zero"] == 1


def test_vectorized_memory_agrees_with_exact_report_for_moe():
    """The planner's memory is the exact per-tensor report's, on a MoE model with expert parallelism."""
    spec = CAT.models["mixtral-8x7b"]
    res = plan_training(spec, cl(n=32), Workload(seq_len=4096, global_batch=128), top=3, exact_check=3,
                        fixed={"ep": 8})
    assert res.plans
    for p in res.plans:
        assert p["memory_bytes_approx"] == pytest.approx(p["memory_bytes"], rel=1e-9), p["layout"]


def _recipe(name):
    from shardlab.memory.fp8 import Fp8Recipe
    from shardlab.memory.lora import LoraSpec
    from shardlab.memory.offload import Offload
    from shardlab.memory.recipe import Recipe

    return {"full": ("bf16-mixed", Recipe()), "fp8": ("fp8-mixed", Recipe()),
            "fp8-ag": ("fp8-mixed", Recipe(fp8=Fp8Recipe(all_gather=True))),
            "lora": ("bf16-mixed", Recipe(lora=LoraSpec(16))),
            "qlora": ("bf16-mixed", Recipe(lora=LoraSpec(64, quantize_base="nf4"))),
            "offload": ("bf16-mixed", Recipe(offload=Offload("optimizer"), host_link_bytes_per_s=50e9))}[name]


@pytest.mark.parametrize("model,gpus,fw,gb,seq,recipe", [
    ("llama-3.1-70b", 64, "megatron-lm", 1024, 4096, "full"),
    ("mixtral-8x7b", 32, "torchtitan", 64, 4096, "full"),
    ("qwen3-30b-a3b", 32, "megatron-lm", 128, 4096, "fp8"),
    ("deepseek-v3", 256, "megatron-lm", 1024, 4096, "full"),
    ("llama-3.1-8b", 16, "deepspeed", 64, 4096, "fp8-ag"),
    ("llama-3.1-8b", 16, "pytorch-fsdp", 64, 4096, "lora"),
    ("llama-3.1-8b", 16, "pytorch-fsdp", 64, 4096, "qlora"),
    ("llama-3.1-8b", 16, "deepspeed", 64, 4096, "offload"),
    ("gpt2-xl", 16, "torchtitan", 64, 1024, "full"),                   # tied embeddings over pipeline stages
    ("qwen3-30b-a3b", 16, "torchtitan", 64, 4096, "qlora"),            # MoE under QLoRA, experts whole or split
])
def test_search_memory_is_the_exact_report(model, gpus, fw, gb, seq, recipe):
    """One memory model: for candidates drawn across the whole search space (every ZeRO stage, pipeline split,
    recomputation, TP/CP/EP degree), the search's vectorised bytes equal the exact per-tensor report's worst rank."""
    from shardlab.estimate.workload import workload_for, workload_memory
    from shardlab.planner.search import layout_of

    precision, rec = _recipe(recipe)
    wl = workload_for(CAT.framework(fw), seq_len=seq, global_batch=gb, precision=precision, recipe=rec)
    spec = CAT.models[model]
    res = plan_training(spec, cl(n=gpus), wl, top=1, exact_check=0)
    c, mem = res.cands, res.scores["memory_bytes"]
    pool = np.flatnonzero(c["zero"] >= (1 if rec.offload.optimizer else 0))   # offload needs a partitioned optimizer
    idx = np.random.default_rng(0).choice(pool, size=min(25, len(pool)), replace=False)
    for i in idx:
        lay = layout_of(c, int(i))
        exact = workload_memory(lay, spec, cl(n=gpus).accelerator, wl, gb // (lay.micro_batch * lay.dp)).worst.total
        assert mem[i] == pytest.approx(exact, rel=1e-9), lay.to_dict()


def test_max_memory_fraction_keeps_headroom():
    """--max-memory-fraction 0.85: every plan, and every layout the search still counts as fitting, needs at most 85%
    of the GPU; the layouts it removes are counted under their own reason, apart from those that do not fit at all."""
    from shardlab.planner.search import over_limit_reason

    spec, wl = CAT.models["llama-3.1-70b"], Workload(seq_len=4096, global_batch=1024)
    cap = CAT.accelerators["h100-sxm"].memory_bytes
    full = plan_training(spec, cl(n=64), wl, top=3, memory_fraction=1.0)
    assert full.plans[0]["memory_bytes"] > 0.85 * cap        # the unconstrained winner uses more than 85%
    res = plan_training(spec, cl(n=64), wl, top=3, memory_fraction=0.85)
    assert res.plans and all(p["memory_bytes"] <= 0.85 * cap for p in res.plans)
    assert np.all(res.scores["memory_bytes"][np.isfinite(res.scores["key"])] <= 0.85 * cap)
    assert res.rejected[over_limit_reason(0.85)] > 0 and res.rejected[NOT_FIT] == full.rejected[NOT_FIT]
    assert res.plans[0]["step_time_s"] >= full.plans[0]["step_time_s"]


def test_default_plan_keeps_the_stated_margin():
    """The issue's check: without --max-memory-fraction the default plan's winner leaves at least 5% of the GPU free
    (the unconstrained winner leaves under 1%), the limit and its source are printed, and 1 turns the margin off."""
    from shardlab.memory.overheads import MEMORY_MARGIN

    assert MEMORY_MARGIN >= 0.03
    code, out, _ = cli_main("plan", "--top", "1", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["memory_fraction"] == pytest.approx(1 - MEMORY_MARGIN)
    assert doc["plans"][0]["memory_bytes"] <= (1 - MEMORY_MARGIN) * doc["capacity_bytes"]
    code, out, _ = cli_main("plan", "--top", "1")
    assert "memory limit: 95% of 79.6 GiB = 75.7 GiB per GPU (default: 5% kept free for allocator fragmentation" in out
    assert "--max-memory-fraction 1 turns it off" in out
    code, out, _ = cli_main("plan", "--top", "1", "--json", "--max-memory-fraction", "1")
    off = json.loads(out)
    assert off["plans"][0]["memory_bytes"] > (1 - MEMORY_MARGIN) * off["capacity_bytes"]
    assert not any("memory" in r and "uses more than" in r for r in off["rejected"])
    code, out, _ = cli_main("memory", "--json", *_layout_flags(off["plans"][0]["layout"]))
    mem = json.loads(out)
    assert mem["margin"]["kept"] is False and "a real run may run out of memory" in mem["margin"]["note"]


def _layout_flags(lay: dict) -> list[str]:
    """The default plan's layout as memory flags (llama-3.1-70b on 64 H100, the plan's defaults)."""
    flags = ["llama-3.1-70b", "--gpus", "64", "--gpu", "h100-sxm", "--global-batch", "1024"]
    for k in ("tp", "pp", "cp", "zero", "micro_batch"):
        flags += [f"--{k.replace('_', '-')}", str(lay[k])]
    return flags + (["--sequence-parallel"] if lay.get("sequence_parallel") else [])


def test_max_memory_fraction_cli():
    code, out, _ = cli_main("plan", "--max-memory-fraction", "0.85", "--top", "1", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["memory_fraction"] == 0.85
    assert doc["plans"][0]["memory_bytes"] <= 0.85 * doc["capacity_bytes"]
    assert any("--max-memory-fraction 0.85" in r for r in doc["rejected"])
    code, out, _ = cli_main("plan", "--max-memory-fraction", "0.85", "--top", "1")
    assert code == 0 and "memory limit: 85% of 79.6 GiB = 67.7 GiB per GPU" in out
    for bad in ("0", "1.5", "nan", "-0.1"):
        code, _, err = cli_main("plan", "--max-memory-fraction", bad)
        assert code == 2 and "--max-memory-fraction" in err
    code, _, err = cli_main("plan", "--inference", "--serve", "--concurrency", "8", "--max-memory-fraction", "0.9")
    assert code == 2 and "--gpu-memory-utilization" in err


def testorder_note_only_when_a_simpler_layout_jumped_a_faster_one():
    from shardlab.planner.report import order_note

    plans = [{"step_time_s": 1.0, "memory_bytes": 5, "gpus": 8}, {"step_time_s": 1.2, "memory_bytes": 4, "gpus": 8}]
    assert order_note({"objective": "throughput", "plans": plans}) == []
    note = order_note({"objective": "memory", "plans": plans})
    assert len(note) == 1 and "near-tie goes to the simpler layout" in note[0] and "0.3%" in note[0]
    swapped = [plans[1], plans[0]]
    assert order_note({"objective": "throughput", "plans": swapped})
