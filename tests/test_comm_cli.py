"""CLI of comm, shard and pipeline: JSON contracts, pictures, one-line errors with exit code 2."""

import json
import subprocess
import sys

import pytest

from conftest import cli_main


def jdoc(*args):
    code, out, err = cli_main(*args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_comm_op_json_contract():
    d = jdoc("comm", "all-reduce", "--size", "256MiB", "--gpus", "8", "--link", "nvlink4")
    for k in ("time_s", "algbw_gbps", "busbw_gbps", "regime", "crossover_bytes"):
        assert k in d
    assert d["size_bytes"] == 256 * 2**20 and d["regime"] == "bandwidth"
    assert d["busbw_gbps"] == pytest.approx(d["algbw_gbps"] * 1.75)
    d = jdoc("comm", "all-reduce", "--size", "8KB", "--gpus", "2", "--link", "ethernet-10g")
    assert d["size_bytes"] == 8000 and d["regime"] == "latency"
    d = jdoc("comm", "all-gather", "--size", "1GiB", "--gpus", "64", "--nodes", "8", "--link", "ib-ndr")
    assert d["algorithm"].startswith("hierarchical") and len(d["phases"]) == 2


def test_comm_human_output_shows_the_formula():
    code, out, _ = cli_main("comm", "reduce-scatter", "--size", "64MiB", "--gpus", "4", "--link", "pcie5", "--algorithm", "ring")
    assert code == 0
    assert "(n−1)·α + (n−1)/n·S/β" in out and "busbw" in out and "nccl-tests" in out and "bandwidth-bound" in out


def test_sweep_table_and_pictures(tmp_path):
    d = jdoc("comm", "all-reduce", "--sweep", "--gpus", "8", "--link", "nvlink4,ib-ndr")
    assert [s["link"] for s in d["sweep"]] == ["nvlink4", "ib-ndr"]
    rows = d["sweep"][0]
    assert rows["sizes_bytes"][0] == 1 and rows["sizes_bytes"][-1] == 2**30 and len(rows["time_s"]) == 31
    assert rows["regime"][0] == "latency" and rows["regime"][-1] == "bandwidth"
    for suffix in ("png", "svg"):
        f = tmp_path / f"sweep.{suffix}"
        code, out, err = cli_main("comm", "all-to-all", "--sweep", "--gpus", "8", "--link", "nvlink4,ethernet-100g",
                                  "--plot", str(f))
        assert code == 0, err
        assert f.exists() and str(f) in out
        data = f.read_bytes()
        assert data.startswith(b"\x89PNG") if suffix == "png" else b"<svg" in data[:2000]


def test_comm_plan_json():
    d = jdoc("comm", "plan", "llama-3.1-70b", "--gpus", "64", "--tp", "8", "--pp", "2", "--zero", "1", "--microbatches", "8")
    axes = {i["axis"] for i in d["items"]}
    assert {"TP", "PP", "ZeRO"} <= axes
    tp = [i for i in d["items"] if i["axis"] == "TP" and i["phase"] == "forward"][0]
    assert tp["link_id"] == "nvlink4" and tp["calls_per_step"] == 2 * 40 * 8   # 80 layers / 2 stages
    assert d["summary"]["critical_s"] > 0
    code, out, _ = cli_main("comm", "plan", "llama-2-7b", "--gpus", "16", "--tp", "16", "--gpus-per-node", "8")
    assert code == 0 and "crosses nodes" in out


def test_comm_inference_json_contract_and_lesson():
    d = jdoc("comm", "inference", "llama-2-7b", "--tp", "2", "--link", "ethernet-10g", "--batch", "1", "--prompt-len", "2048")
    for ph in ("decode", "prefill"):
        for k in ("step_time_s", "comm_time_s", "comm_fraction"):
            assert k in d[ph]
    assert d["decode"]["comm_fraction"] > 0.4
    assert d["decode"]["comm_regime"] == "latency" and d["prefill"]["comm_regime"] == "bandwidth"
    assert {x["link"] for x in d["links"]} == {"ethernet-10g", "nvlink4", "pcie5"}
    code, out, _ = cli_main("comm", "inference", "llama-2-7b", "--tp", "2", "--link", "ethernet-10g")
    assert "keep TP inside a node" in out and "latency-bound" in out


def test_shard_cli_and_mermaid(tmp_path):
    d = jdoc("shard", "llama-3.1-8b", "--tp", "4")
    assert d["max_tp"] == 32 and any(r["name"] == "layers.0.attention.wq.weight" for r in d["rows"])
    code, out, _ = cli_main("shard", "llama-3.1-8b", "--tp", "4", "--mermaid")
    assert code == 0 and out.startswith("---") and "flowchart TD" in out
    f = tmp_path / "block.md"
    code, out, _ = cli_main("shard", "mixtral-8x7b", "--tp", "8", "--sequence-parallel", "--mermaid", str(f))
    assert code == 0 and f.read_text().startswith("```mermaid") and str(f) in out


def test_pipeline_json_contract():
    d = jdoc("pipeline", "--schedule", "1f1b", "--stages", "4", "--microbatches", "8")
    for k in ("bubble_fraction", "step_time_s", "microbatches", "peak_in_flight"):
        assert k in d
    assert d["bubble_fraction"] == pytest.approx(3 / 11, abs=1e-12) and d["peak_in_flight"] == [4, 3, 2, 1]
    assert len(d["events"]) == 2 * 4 * 8
    d = jdoc("pipeline", "--max-bubble", "0.10", "--stages", "8")
    assert d["microbatches"] == 63
    d = jdoc("pipeline", "--stages", "4", "--microbatches", "8", "--slow-stage", "2", "--slowdown", "1.5")
    assert d["straggler"]["stage"] == 2 and d["straggler"]["slowdown_of_step"] > 1


def test_pipeline_text_grid_and_plot(tmp_path):
    f = tmp_path / "tl.png"
    code, out, err = cli_main("pipeline", "--schedule", "zb-h1", "--stages", "4", "--microbatches", "8", "--plot", str(f))
    assert code == 0, err
    assert f.read_bytes().startswith(b"\x89PNG")
    assert "stage 3 |...FBFBFBFB" in out and "split in half" in out


BAD = [
    (["comm", "all-reduce", "--size", "1MiB", "--gpus", "8", "--link", "nvlnk4"], "did you mean nvlink4"),
    (["comm", "all-reduce", "--size", "1MiB", "--gpus", "0"], "positive"),
    (["comm", "all-reduce", "--size", "1MiB", "--gpus", "1"], "2 or more"),
    (["comm", "all-reduce", "--size", "12XB", "--gpus", "8"], "unknown unit"),
    (["comm", "all-reduce", "--size", "lots", "--gpus", "8"], "cannot parse"),
    (["comm", "all-reduce", "--gpus", "8"], "--size is required"),
    (["comm", "all-reduce", "--size", "1MiB", "--gpus", "16", "--nodes", "2", "--link", "nvlink4"], "inside a node"),
    (["comm", "all-reduce", "--size", "1MiB", "--gpus", "12", "--nodes", "5", "--link", "ib-ndr"], "multiple of 5"),
    (["comm", "all-reduce", "--sweep", "--gpus", "8", "--plot", "x.jpg"], ".png or .svg"),
    (["comm", "plan", "llama-2-7b", "--gpus", "8", "--tp", "3"], "not divisible"),
    (["pipeline", "--schedule", "interleaved", "--stages", "8", "--microbatches", "4"], "≥ --stages"),
    (["pipeline", "--schedule", "1f1b", "--stages", "4", "--vpp", "2"], "interleaved schedule only"),
    (["pipeline", "--stages", "4", "--slow-stage", "7"], "outside the pipeline"),
    (["pipeline", "--stages", "4", "--max-bubble", "0.1", "--microbatches", "8"], "not both"),
    (["shard", "gpt2", "--tp", "5"], "valid T"),
    (["shard", "llama-2-7b", "--tp", "4", "--mermaid", "/nonexistent/dir/x.mmd"], "does not exist"),
]


@pytest.mark.parametrize("args,msg", BAD)
def test_bad_input_one_line_exit_2(args, msg):
    code, out, err = cli_main(*args)
    assert code == 2
    assert msg in err and err.count("\n") == 1 and "Traceback" not in err


def test_comm_cli_imports_stay_light():
    code = ("import sys, shardlab.cli.comm_cmds as m; import argparse; p = argparse.ArgumentParser(); "
            "s = p.add_subparsers(); m.register(s); "
            "print(sorted(x for x in ('numpy', 'matplotlib', 'yaml') if x in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_a_hierarchical_sweep_names_both_links_and_its_own_asymptote():
    import json

    from conftest import cli_main

    code, out, err = cli_main("comm", "all-reduce", "--sweep", "--gpus", "64", "--nodes", "8", "--link", "ib-ndr", "--json")
    s = json.loads(out)["sweep"][0]
    assert code == 0 and s["label"] == "ib-ndr between nodes + nvlink4 inside"
    assert s["beta_gbps"] == s["busbw_gbps"][-1] > 47 and "hierarchical" in s["beta_from"]
    code, out, err = cli_main("comm", "all-reduce", "--sweep", "--gpus", "2", "--nodes", "2", "--link", "ib-ndr", "--json")
    s = json.loads(out)["sweep"][0]
    assert s["label"] == "ib-ndr" and s["beta_from"] == "the link's line rate × efficiency"     # one rank per node


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_comm_plan_and_estimate_price_the_same_ep_calls_under_recomputation(recompute):
    import json

    from conftest import cli_main

    args = ["mixtral-8x7b", "--gpus", "32", "--tp", "2", "--ep", "4", "--pp", "2", "--sequence-parallel",
            "--microbatches", "4", "--recompute", recompute, "--json"]
    code, out, err = cli_main("comm", "plan", *args)
    assert code == 0, err
    ep = sum(i["time_per_step_s"] for i in json.loads(out)["items"] if i["axis"] == "EP")
    code, out, err = cli_main("estimate", *args)
    assert code == 0, err
    assert ep == pytest.approx(json.loads(out)["breakdown"]["ep_comm_s"], rel=1e-6)   # the re-run forward's too


def test_tp_groups_straddling_nodes_are_priced_alike_by_plan_and_estimate():
    import json

    from conftest import cli_main

    args = ["llama-3.1-8b", "--gpus", "24", "--tp", "4", "--gpus-per-node", "6", "--microbatches", "1", "--json"]
    code, out, err = cli_main("comm", "plan", *args)
    items = [i for i in json.loads(out)["items"] if i["axis"] == "TP"]
    assert code == 0 and all(i["nodes_spanned"] == 2 for i in items)        # ranks 4-7 sit on nodes 0 and 1
    code, out, err = cli_main("estimate", *args)
    assert json.loads(out)["breakdown"]["tp_comm_s"] == pytest.approx(sum(i["time_per_step_s"] for i in items), rel=1e-3)
