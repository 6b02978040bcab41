"""The experts' own tensor parallelism (``Layout.etp``, Megatron-core's --expert-tensor-parallel-size): the expert grid
carved from a stage's TP × DP ranks, its validation, memory, compute and communication, the flag, the Megatron
export and its reader, and the published rows it lets in."""

import json

import numpy as np
import pytest

from conftest import cli_main
from shardlab.catalog import get_catalog
from shardlab.comm.pricing import ep_per_moe_block_s
from shardlab.errors import ShardlabError
from shardlab.estimate import estimate_training
from shardlab.estimate.step import evaluate
from shardlab.layout import Layout, expert_grid, layouts_to_arrays
from shardlab.layout_checks import validate
from shardlab.rank_grid import group_ranks, rank_coords
from shardlab.specs.hardware import Cluster

CAT = get_catalog()
H100 = CAT.accelerator("h100-sxm")
Q235 = CAT.model("qwen3-235b-a22b")
Q30 = CAT.model("qwen3-30b-a3b")
# the Megatron-MoE-ModelZoo's Qwen3-235B row: 256 H100, TP 2 × PP 8 × EP 32, ETP 1, DP 16
ZOO = Layout(dp=16, tp=2, pp=8, vpp=4, schedule="interleaved", ep=32, etp=1, zero=1, sequence_parallel=True,
             recompute="selective", recompute_modules=("layernorm", "moe_act"))


def _cluster(n):
    return Cluster(H100, n, 8, CAT.link("nvlink4"), CAT.link("ib-ndr"))


def test_expert_grid_is_megatrons():
    # ETP 1 below TP 2: EP members one rank apart, the 32 of a stage's 32 ranks, no expert data parallelism
    assert expert_grid(2, 1, 16, 32, 1) == {"etp": 1, "ep_stride": 1, "edp": 1, "edp_stride": 32}
    # the default (experts split like the attention): EP borrows data-parallel coordinates, tp·cp apart
    assert expert_grid(2, 2, 16, 8, 0) == {"etp": 2, "ep_stride": 4, "edp": 4, "edp_stride": 32}
    assert expert_grid(4, 1, 8, 8, 1) == {"etp": 1, "ep_stride": 1, "edp": 4, "edp_stride": 8}
    # arrays alike (the planner's and the step model's form)
    g = expert_grid(np.array([2, 2]), np.array([1, 1]), np.array([16, 16]), np.array([32, 8]), np.array([1, 0]))
    assert g["ep_stride"].tolist() == [1, 2] and g["edp"].tolist() == [1, 2]
    assert ZOO.expert_tp == 1 and ZOO.expert_dp == 1 and Layout(tp=2, dp=8, ep=4).expert_dp == 2


def test_validation_of_etp():
    validate(ZOO, Q235, 256, 4096)                       # EP 32 > DP 16: allowed with ETP 1
    with pytest.raises(ShardlabError, match="must divide"):
        validate(ZOO.with_(etp=0), Q235, 256)          # the same EP with experts split like the attention
    with pytest.raises(ShardlabError, match=r"layout\.etp must divide layout\.tp 2"):
        validate(ZOO.with_(etp=3), Q235)
    with pytest.raises(ShardlabError, match=r"× layout\.etp 1 must divide a stage's tp·cp·dp = 32"):
        validate(ZOO.with_(ep=64), Q235)
    with pytest.raises(ShardlabError, match="dense"):
        validate(Layout(tp=2, dp=4, etp=1), CAT.model("llama-3.1-8b"))
    with pytest.raises(ShardlabError, match="hybrid sharding"):
        validate(Layout(tp=2, dp=8, ep=4, etp=1, zero=3, dp_replicate=2), Q30)
    # the expert width need only divide by etp, not by tp
    validate(Layout(tp=2, dp=2, ep=2, etp=1), Q30)


def test_rank_grid_follows_the_expert_grid():
    lay = Layout(tp=2, dp=8, ep=8, etp=1)
    assert group_ranks(lay, "ep", 0) == list(range(8)) and group_ranks(lay, "ep", 9) == list(range(8, 16))
    assert [rank_coords(r, lay)["ep"] for r in (0, 1, 7, 8, 15)] == [0, 1, 7, 0, 7]
    # the default: EP members tp apart (data-parallel neighbours)
    assert group_ranks(Layout(tp=2, dp=8, ep=4), "ep", 0) == [0, 2, 4, 6]


def test_memory_and_compute_follow_etp():
    kw = dict(seq_len=4096, global_batch=2048, precision="bf16-mixed")
    cl = _cluster(256)
    one = estimate_training(Q235, ZOO, cl, **kw)
    # the same layout with EP 16 (inside dp) and the experts split by TP 2 against ETP 1: whole experts on a rank, twice
    # the parameters per expert, half the experts per rank (EP 16 vs 32 too): the expert parameters per rank are equal
    by_tp = estimate_training(Q235, ZOO.with_(ep=16, etp=0), cl, **kw)
    e1 = one.memory.worst.expert_params
    e2 = by_tp.memory.worst.expert_params
    assert e1 == e2 * 2 * 16 // 32
    # the model FLOPs do not move; the exact memory equals the search's vectorised memory
    assert one.model_tflops_per_gpu * one.step_time_s == pytest.approx(by_tp.model_tflops_per_gpu * by_tp.step_time_s)
    arrays = layouts_to_arrays([ZOO])
    got = evaluate(Q235, cl, one.workload, arrays, recompute_modules=ZOO.recompute_modules)
    assert float(got["memory_bytes"][0]) == pytest.approx(one.memory.worst.total, rel=1e-6)
    assert float(got["step_time_s"][0]) == pytest.approx(one.step_time_s, rel=1e-9)


def test_etp_equal_to_tp_is_the_default():
    kw = dict(seq_len=4096, global_batch=512, precision="bf16-mixed")
    lay = Layout(tp=2, dp=8, ep=4, zero=1, sequence_parallel=True)
    a = estimate_training(Q30, lay, _cluster(16), **kw)
    b = estimate_training(Q30, lay.with_(etp=2), _cluster(16), **kw)
    assert a.step_time_s == b.step_time_s and a.memory.worst.total == b.memory.worst.total


def test_dispatch_without_expert_tp_gathers_nothing():
    cl = _cluster(256)
    common = dict(tp=2, cp=1, ep=32, tokens=4096.0, hidden=4096, top_k=8, elem_bytes=2, recompute_code=1,
                  num_experts=128)
    folded = float(ep_per_moe_block_s(cl, etp=1, **common))
    # the same sends with ETP 2 add the gather and scatter over the TP pair, and spread EP members two ranks apart
    by_tp = float(ep_per_moe_block_s(cl, etp=2, **common))
    assert folded < by_tp
    # EP 8 with ETP 1 is 8 consecutive ranks, one node; with ETP 2 its members sit 2 apart over 16 ranks, two nodes:
    # the all-to-all alone (no gather) is cheaper inside the node
    from shardlab.comm.pricing import ep_all_to_all_s

    kw = dict(tp=2, cp=1, ep=8, size=4096 * 8 * 4096 * 2 / 2, top_k=8)
    assert float(ep_all_to_all_s(cl, **kw, stride=1)) < 0.5 * float(ep_all_to_all_s(cl, **kw))


def test_cli_flag_export_and_read_back(tmp_path):
    args = ["qwen3-235b-a22b", "--gpu", "h100-sxm", "--gpus", "256", "--tp", "2", "--etp", "1", "--pp", "8", "--vpp",
            "4", "--schedule", "interleaved", "--ep", "32", "--zero", "1", "--global-batch", "2048", "--seq-len", "4096",
            "--recompute", "selective", "--recompute-modules", "layernorm,moe_act", "--sequence-parallel"]
    code, out, err = cli_main("estimate", *args)
    assert code == 0, err
    assert "ep 32 (experts over etp 1)" in out and "expert-TP" not in out
    code, out, _ = cli_main("estimate", *args, "--json")
    doc = json.loads(out)
    assert doc["layout"]["etp"] == 1
    # without ETP 1 the layout is refused in one line, naming the fix
    code, _, err = cli_main("estimate", *args[:8], *args[10:])
    assert code == 2 and "must divide" in err and len(err.strip().splitlines()) == 1
    # plan searches the experts split like the attention or whole; another expert TP is refused in one line
    code, _, err = cli_main("plan", "qwen3-235b-a22b", "--gpus", "256", "--tp", "4", "--etp", "2")
    assert code == 2 and "--etp 2" in err and len(err.strip().splitlines()) == 1
    # a framework without the experts' own TP: estimate prices the what-if and says so (export refuses, plan skips)
    code, out, err = cli_main("estimate", "qwen3-235b-a22b", "--gpus", "256", "--tp", "2", "--etp", "1", "--pp", "8",
                              "--ep", "32", "--zero", "1", "--global-batch", "2048", "--seq-len", "4096",
                              "--sequence-parallel", "--framework", "deepspeed")
    assert code == 0, err
    assert "deepspeed splits the experts like the attention" in " ".join(out.split())
    # the Megatron-LM launch file writes the flag, and reads back to the same layout
    path = tmp_path / "train.sh"
    code, _, err = cli_main("export", *args, "--to", "megatron", "--out", str(path))
    assert code == 0, err
    text = path.read_text()
    assert "--expert-tensor-parallel-size 1" in text
    code, out, err = cli_main("estimate", "--from", str(path), "--gpu", "h100-sxm", "--json")
    assert code == 0, err
    back = json.loads(out)
    assert back["layout"]["etp"] == 1 and back["layout"]["ep"] == 32
    assert back["step_time_s"] == pytest.approx(doc["step_time_s"], rel=1e-9)


def test_published_rows_with_etp_are_validated():
    from shardlab.validation import compare, load_runs

    runs = [r for r in load_runs() if r.config.get("etp") == 1]
    ids = {r.id for r in runs}
    assert {"mzoo-q235b-h100-deepep", "mcore-moe-q235b-h100-25.11", "mcore-moe-q235b-gb200-25.09"} <= ids
    for c in compare(runs):
        # each is an expert group wider than its data-parallel group, which only ETP 1 runs
        lay = c.estimate.layout
        assert lay.ep > lay.dp or c.run.source == "megatron-moe-modelzoo"
        assert np.isfinite(c.error)


def test_plan_searches_whole_experts_beside_tensor_parallel_attention():
    """Megatron-Core's MoE recipes run ETP 1 beside TP 2 (the ModelZoo's and the Bridge tables' Qwen3-235B layouts);
    the search tries it and, for Qwen3-235B on 256 H100, ranks such a layout first."""
    base = ["qwen3-235b-a22b", "--gpus", "256", "--gpu", "h100-sxm", "--seq-len", "4096", "--global-batch", "2048",
            "--json"]
    code, out, err = cli_main("plan", *base)
    assert code == 0, err
    plans = json.loads(out)["plans"]
    best = plans[0]["layout"]
    assert best["etp"] == 1 and best["tp"] > 1 and best["ep"] * best["etp"] <= best["tp"] * best["dp"]
    # every plan the search returns is one `estimate` reproduces, expert TP included
    lay = plans[0]["layout"]
    code, out, err = cli_main("estimate", "qwen3-235b-a22b", "--gpus", "256", "--gpu", "h100-sxm", "--seq-len", "4096",
                              "--global-batch", "2048", "--tp", str(lay["tp"]), "--pp", str(lay["pp"]), "--cp", str(lay["cp"]), "--ep",
                              str(lay["ep"]), "--etp", str(lay["etp"]), "--zero", str(lay["zero"]), "--vpp",
                              str(lay["vpp"]), "--micro-batch", str(lay["micro_batch"]), "--recompute", lay["recompute"],
                              *(["--schedule", lay["schedule"]] if lay["pp"] > 1 else []),
                              *(["--sequence-parallel"] if lay["sequence_parallel"] else []), "--json")
    assert code == 0, err
    assert json.loads(out)["step_time_s"] == pytest.approx(plans[0]["step_time_s"], rel=1e-9)
    # pinned: --etp 1 keeps only whole-expert layouts; --etp equal to a pinned --tp keeps the split ones
    code, out, err = cli_main("plan", *base, "--etp", "1", "--tp", "4")
    assert code == 0, err
    assert {p["layout"]["etp"] for p in json.loads(out)["plans"]} == {1}
    code, out, err = cli_main("plan", *base, "--etp", "4", "--tp", "4")
    assert code == 0, err
    assert {p["layout"]["etp"] for p in json.loads(out)["plans"]} == {0}
    code, out, err = cli_main("plan", *base, "--etp", "0")       # 0: split like the attention, pinned
    assert code == 0, err
    assert {p["layout"]["etp"] for p in json.loads(out)["plans"]} == {0}
    # whole experts only beside TP > 1 and EP > 1, and where the framework runs them (review)
    assert all(p["layout"]["tp"] > 1 and p["layout"]["ep"] > 1 for p in plans if p["layout"]["etp"] == 1)
    for extra, words in ((["--framework", "deepspeed"], "deepspeed splits the experts like the attention"),
                         (["--fix", "tp=1"], "beside tensor and expert parallelism")):
        code, _, err = cli_main("plan", *base, "--etp", "1", *extra)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1
    # the plan table names the expert TP, so the line can be typed back into estimate
    code, out, err = cli_main("plan", *base[:-1])
    assert code == 0 and " etp1 " in out


@pytest.mark.parametrize("zero,pp,recipe", [(0, 1, "fp8"), (1, 2, "fp8-params"), (3, 1, "bf16"), (2, 2, "bf16"),
                                            (3, 1, "qlora"), (0, 1, "lora")])
def test_exact_and_vectorised_memory_agree_with_whole_experts(zero, pp, recipe):
    """The exact per-tensor report and the search's arrays price an expert-TP-1 layout alike: FP8 weight caches and
    primary weights, ZeRO-3 gathered units and buckets, LoRA/QLoRA bases and dequantisation buffers (review)."""
    from shardlab.estimate.workload import workload_memory
    from shardlab.memory.fp8 import Fp8Recipe
    from shardlab.memory.lora import LoraSpec
    from shardlab.memory.recipe import Recipe

    precision = "fp8-mixed" if recipe.startswith("fp8") else "bf16-mixed"
    rec = Recipe(fp8=Fp8Recipe(primary_weights=recipe == "fp8-params"),
                 lora=LoraSpec(rank=16, quantize_base="nf4" if recipe == "qlora" else "none")
                 if recipe.endswith("lora") else None)
    lay = Layout(tp=4, dp=16 // (4 * pp), pp=pp, ep=4, etp=1, zero=zero, sequence_parallel=True)
    if pp == 1 and zero == 3:
        lay = lay.with_(dp=4)
    est = estimate_training(Q30, lay, _cluster(lay.world_size), seq_len=4096, global_batch=64, precision=precision,
                            recipe=rec, framework=CAT.framework("torchtitan" if recipe.endswith("lora") else "megatron-lm"))
    exact = workload_memory(lay, Q30, H100, est.workload, est.microbatches).worst.total
    got = evaluate(Q30, est.cluster, est.workload, layouts_to_arrays([lay]))
    assert float(got["memory_bytes"][0]) == pytest.approx(exact, rel=1e-9)
    # and the experts' FP8 copies follow their own split: whole experts hold 4x the split ones' bytes
    if recipe == "fp8":
        split = workload_memory(lay.with_(etp=0), Q30, H100, est.workload, est.microbatches).worst.other
        whole = workload_memory(lay, Q30, H100, est.workload, est.microbatches).worst.other
        assert whole["fp8_weight_cache"] > 2 * split["fp8_weight_cache"]


def test_files_carry_etp_and_say_what_they_cannot(tmp_path):
    base = ["qwen3-30b-a3b", "--gpus", "16", "--tp", "4", "--ep", "4", "--etp", "1", "--zero", "3",
            "--sequence-parallel", "--global-batch", "64", "--seq-len", "4096"]
    code, out, err = cli_main("estimate", *base, "--json")
    assert code == 0, err
    want = json.loads(out)["step_time_s"]
    # torchtitan writes expert_tensor_parallel_degree 1 and reads it back (DeepSeek-V3: a model it ships)
    tt = ["deepseek-v3", *base[1:], "--framework", "torchtitan"]
    code, out, err = cli_main("estimate", *tt, "--json")
    assert code == 0, err
    want_tt = json.loads(out)["step_time_s"]
    path = tmp_path / "job.toml"
    code, _, err = cli_main("export", *tt, "--to", "torchtitan", "--out", str(path))
    assert code == 0, err
    assert "expert_tensor_parallel_degree = 1" in path.read_text()
    code, out, err = cli_main("estimate", "--from", str(path), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["layout"]["etp"] == 1 and doc["step_time_s"] == pytest.approx(want_tt, rel=1e-9)
    # torchtitan applies expert TP only with EP, and runs 1 or tp only
    code, _, err = cli_main("export", *[a if i != 6 else "1" for i, a in enumerate(tt)], "--to", "torchtitan",
                            "--out", str(tmp_path / "noep.toml"))
    assert code == 2 and "only with expert parallelism" in err
    code, _, err = cli_main("export", *[a if i != 8 else "2" for i, a in enumerate(tt)], "--to", "torchtitan",
                            "--out", str(tmp_path / "bad.toml"))
    assert code == 2 and "expert_tensor_parallel_degree" in err
    # the Megatron line keeps the step time
    code, out, err = cli_main("export", *base, "--to", "megatron", "--out", str(tmp_path / "run.sh"))
    assert code == 0, err
    code, out, err = cli_main("estimate", "--from", str(tmp_path / "run.sh"), "--json")
    assert code == 0, err
    assert json.loads(out)["step_time_s"] == pytest.approx(want, rel=1e-9)
    # DeepSpeed has no expert TP of its own: it says so
    code, out, err = cli_main("export", *base, "--to", "deepspeed", "--out", str(tmp_path / "ds.json"), "--json")
    assert code == 0, err
    assert "etp" in {u["setting"] for u in json.loads(out)["unsupported"]}
    # --inference has no use for it
    code, _, err = cli_main("plan", "qwen3-30b-a3b", "--inference", "--etp", "1")
    assert code == 2 and "--etp" in err
    # QLoRA on a MoE model (a traceback before)
    code, out, err = cli_main("estimate", *base, "--lora-rank", "16", "--quantize-base", "nf4")
    assert code == 0, err


def test_the_block_diagram_draws_whole_experts():
    """The HTML page's TP diagram (shard.diagram.block_mermaid): with expert TP 1 the experts are whole on every rank
    and the MoE block gathers no sequence (review); the default draws them split like the attention, as before."""
    from shardlab.shard.diagram import block_mermaid

    whole = block_mermaid(Q235, 2, seq_len=4096, sequence_parallel=True, ep=32, etp=1)
    assert "whole (expert TP 1)" in whole and "4096 → 1536" in whole and "no gather of the sequence" in whole
    split = block_mermaid(Q235, 2, seq_len=4096, sequence_parallel=True, ep=8)
    assert "whole" not in split and "4096 → 768" in split
    assert split == block_mermaid(Q235, 2, seq_len=4096, sequence_parallel=True, ep=8, etp=2)


def test_planner_page_quotes_the_search_it_makes():
    """docs/planner.md quotes how many DeepSeek-V3 layouts on 512 GPUs the search scores with whole experts in it and
    without (``--etp 0``): the counts the command gives now."""
    import re
    from pathlib import Path

    text = " ".join((Path(__file__).resolve().parents[1] / "docs" / "planner.md").read_text(encoding="utf-8").split())
    counts = []
    for pin in ([], ["--etp", "0"]):
        code, out, err = cli_main("plan", "deepseek-v3", "--gpus", "512", *pin, "--json")
        assert code == 0, err
        counts.append(json.loads(out)["evaluated"])
    assert counts[0] > 1.8 * counts[1]
    assert re.search(rf"scores {counts[0]:,} layouts instead of {counts[1]:,}", text), counts
