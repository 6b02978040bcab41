"""What an export writes is what the plan or the flags said: serving settings, node counts, recomputation, precision
and hybrid sharding reach the file or are named as not expressed; a layout the framework's own code would refuse is
refused here first (one line, exit 2)."""

import json
import tomllib

import pytest
import yaml

from conftest import cli_main


def export(*args):
    code, out, err = cli_main("export", *args, "--json")
    assert code == 0, err
    return json.loads(out)


def text(*args) -> str:
    code, out, err = cli_main("export", *args)
    assert code == 0, err
    return out


def refused(*args) -> str:
    code, out, err = cli_main("export", *args)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (code, err)
    return err


def unsupported(doc: dict) -> dict:
    return {u["setting"]: u for u in doc["unsupported"]}


def test_vllm_export_carries_the_serving_flags():
    t = text("--to", "vllm", "llama-3.1-70b", "--inference", "--tp", "8", "--batch", "32",
             "--gpu-memory-utilization", "0.5", "--max-num-seqs", "8", "--weights", "fp16")
    assert "--gpu-memory-utilization 0.5" in t and "--max-num-seqs 8" in t and "--dtype float16" in t


def test_vllm_export_from_a_plan_keeps_its_precision_and_memory_share(tmp_path):
    code, out, err = cli_main("plan", "llama-3.1-8b", "--inference", "--gpus", "2", "--kv-cache-dtype", "fp8",
                              "--weights", "fp8", "--gpu-memory-utilization", "0.8", "--json")
    assert code == 0, err
    assert json.loads(out)["serving"]["gpu_memory_utilization"] == 0.8
    plan = tmp_path / "plan.json"
    plan.write_text(out)
    t = text("--to", "vllm", "--plan", str(plan))
    assert "--kv-cache-dtype fp8" in t and "--quantization fp8" in t and "--gpu-memory-utilization 0.8" in t


@pytest.mark.parametrize("target", ["slurm", "skypilot"])
def test_multi_node_serving_runs_one_engine_per_node(tmp_path, target):
    t = text("--to", target, "llama-3.1-70b", "--inference", "--tp", "8", "--gpus", "16", "--batch", "32")
    lines = [line.strip() for line in t.splitlines()]
    run = [line for line in lines if "vllm serve" in line and not line.startswith("#")]
    assert len(run) == 1 and run[0].endswith("\\")            # the command line itself, continued with its flags
    assert "--data-parallel-size" not in t                     # one replica per 8-GPU node, not 2 per node
    assert "put a load balancer in front" in t
    f = tmp_path / ("job.sbatch" if target == "slurm" else "task.yaml")
    f.write_text(t)
    code, out, err = cli_main("estimate", "--from", str(f), "--json")
    assert code == 0, err


def test_gpus_that_do_not_fill_nodes_are_refused():
    assert "do not fill whole nodes of 8" in refused("--to", "deepspeed", "llama-3.1-8b", "--gpus", "12", "--tp", "4",
                                                     "--zero", "1", "--global-batch", "48")
    # a vllm serve file launches no per-node processes: 3 replicas of TP 4 on 12 GPUs is written
    assert "--data-parallel-size 3" in text("--to", "vllm", "llama-3.1-8b", "--inference", "--gpus", "12", "--tp", "4")
    # a launcher running one engine per node needs the replicas to spread evenly over the nodes
    assert "do not spread evenly" in refused("--to", "slurm", "llama-3.1-8b", "--inference", "--gpus", "24", "--tp", "2",
                                             "--pp", "3", "--batch", "32")


def test_torchtitan_recomputation_modes():
    toml = lambda *a: tomllib.loads(text("--to", "torchtitan", "llama-3.1-8b", "--gpus", "8", "--zero", "3", *a))  # noqa: E731
    assert toml("--recompute", "op")["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    half = toml("--recompute", "full", "--recompute-fraction", "0.5")["activation_checkpoint"]
    assert half == {"mode": "selective", "selective_ac_option": "2"}        # every 2nd block: half of them
    doc = export("--to", "torchtitan", "llama-3.1-8b", "--gpus", "8", "--zero", "3", "--recompute", "selective")
    assert "per-op" in unsupported(doc)["recompute"]["why"]


def test_torchtitan_1f1b_needs_as_many_microbatches_as_stages():
    assert "at least as many micro-batches as stages" in refused(
        "--to", "torchtitan", "llama-3.1-8b", "--gpus", "8", "--pp", "4", "--dp", "2", "--zero", "2",
        "--global-batch", "4")


def test_megatron_writes_a_recompute_fraction_as_blocks_of_layers():
    t = text("--to", "megatron", "llama-3.1-8b", "--gpus", "8", "--zero", "1", "--recompute", "full",
             "--recompute-fraction", "0.5")
    assert "--recompute-method block" in t and "--recompute-num-layers 16" in t     # 16 of 32 layers
    doc = export("--to", "megatron", "llama-3.1-8b", "--gpus", "8", "--zero", "1", "--recompute", "op")
    assert "recompute" in unsupported(doc)


def test_deepspeed_precision_sections():
    cfg = json.loads(text("--to", "deepspeed", "llama-3.1-8b", "--gpus", "8", "--zero", "2", "--precision",
                          "fp16-mixed", "--grad-reduce-fp32"))
    assert cfg["fp16"]["enabled"] and cfg["communication_data_type"] == "fp32"
    doc = export("--to", "deepspeed", "llama-3.1-8b", "--gpus", "8", "--zero", "2", "--precision", "fp8-mixed")
    assert "precision" in unsupported(doc)


def test_accelerate_fp8_hsdp_and_refusal():
    doc = export("--to", "accelerate", "llama-3.1-8b", "--gpus", "8", "--zero", "2", "--precision", "fp8-mixed")
    assert "precision" in unsupported(doc)
    cfg = yaml.safe_load(text("--to", "accelerate", "llama-3.1-8b", "--gpus", "16", "--zero", "3", "--dp-replicate", "2"))
    pc = cfg["parallelism_config"]
    assert (pc["parallelism_config_dp_replicate_size"], pc["parallelism_config_dp_shard_size"]) == (2, 8)
    assert "FSDP only" in refused("--to", "accelerate", "llama-3.1-8b", "--gpus", "8", "--tp", "2", "--zero", "0")


def test_torchtitan_hybrid_sharding_and_wrap():
    t = text("--to", "torchtitan", "llama-3.1-8b", "--gpus", "16", "--zero", "3", "--dp-replicate", "2", "--wrap",
             "4-blocks")
    par = tomllib.loads(t)["parallelism"]
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (2, 8)
    assert "could not express wrap=4-blocks" in t


def test_plan_export_never_replaces_a_file_it_named_itself(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "llama-3.1-8b.toml").write_text("mine")
    code, out, err = cli_main("plan", "llama-3.1-8b", "--gpus", "8", "--export", "torchtitan")
    assert code == 2 and "exists" in err and (tmp_path / "llama-3.1-8b.toml").read_text() == "mine"
    code, out, err = cli_main("plan", "llama-3.1-8b", "--gpus", "8", "--out", "x.toml")
    assert code == 2 and "add --export TARGET" in err and not (tmp_path / "x.toml").exists()
