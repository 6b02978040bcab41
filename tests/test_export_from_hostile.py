"""`estimate/memory/plan --from FILE` on hostile framework files: one line naming the file and its field (never a
shardlab flag the user did not give, never Python's own words), exit code 2, and an answer in well under a second
(a degree read from a file is bounded before any work proportional to it)."""

from __future__ import annotations

import json
import time

import pytest
from conftest import cli_main

FAST_S = 1.5
"""In-process calls answer in about 10 ms; the bound leaves room for a slow machine, not for work per stage."""

TT = '[model]\nname = "llama3"\nflavor = "8B"\n[parallelism]\n'
INTERNALS = ("Traceback", "ZeroDivisionError", "ValueError", "AttributeError", "TypeError", "set_int_max_str_digits",
             "object has no attribute", "dp_from_world")


@pytest.fixture(scope="module", autouse=True)
def warm():
    cli_main("estimate", "llama-3.1-8b", "--json")        # imports done before any timing


def refused(tmp_path, name: str, text: str, *fragments: str, cmd=("estimate", "llama-3.1-8b"), absent=()) -> str:
    path = tmp_path / name
    path.write_text(text)
    t0 = time.perf_counter()
    code, out, err = cli_main(*cmd, "--from", str(path))
    took = time.perf_counter() - t0
    assert code == 2, (code, out[-300:], err)
    assert len(err.strip().splitlines()) == 1, err
    assert took < FAST_S, f"{name}: {took:.2f} s"
    assert name in err, err                                  # names the file
    for f in fragments:
        assert f in err, err
    for bad in (*INTERNALS, *absent):
        assert bad not in err, err
    return err


def imported(tmp_path, name: str, text: str, *cmd: str) -> dict:
    path = tmp_path / name
    path.write_text(text)
    code, out, err = cli_main(*cmd, "--from", str(path), "--json")
    assert code == 0, err
    return json.loads(out)


# ---- 1. huge degrees: bounded before any per-stage work ------------------------------------------------------
@pytest.mark.parametrize("name, text, fragments", [
    ("pp_huge.toml", TT + "pipeline_parallel_degree = 100000000\nmodule_fqns_per_model_part = [[\"layers.0\"]]\n",
     ("parallelism.pipeline_parallel_degree", "100,000,000")),
    ("pp_20k.toml", '[model]\nname = "mine"\nflavor = "x"\n[parallelism]\npipeline_parallel_degree = 20000\n'
                    'module_fqns_per_model_part = [["layers.0"]]\n', ("parallelism.pipeline_parallel_degree", "10,000")),
    ("mega_huge.sh", "pretrain_gpt.py --pipeline-model-parallel-size 200000002 --num-layers 400000002 "
                     "--decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 1\n", ("--num-layers",)),
    ("mega_pp.sh", "pretrain_gpt.py --pipeline-model-parallel-size 200000002 --num-layers 400 "
                   "--decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 1\n",
     ("--pipeline-model-parallel-size", "--num-layers is 400")),
    ("mega_layout.sh", "pretrain_gpt.py --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout '(t|)*400000'\n",
     ("--pipeline-model-parallel-layout",)),
    ("ds_pp.json", json.dumps({"pipeline": {"stages": 10**9}}), ("pipeline.stages",)),
    ("tt_world.toml", TT + "tensor_parallel_degree = 1048576\ncontext_parallel_degree = 1048576\n", ("1,048,576",)),
])
def test_huge_degrees_are_refused_fast(tmp_path, name, text, fragments):
    refused(tmp_path, name, text, *fragments, cmd=("estimate",))


def test_uneven_megatron_stages_stay_linear(tmp_path):
    """The largest accepted pipeline (10,000 stages of an unknown model) is read in linear time."""
    path = tmp_path / "deep.sh"
    path.write_text("pretrain_gpt.py --pipeline-model-parallel-size 9999 --num-layers 10000 "
                    "--decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 2\n")
    from shardlab.catalog import get_catalog
    from shardlab.export import read_text

    t0 = time.perf_counter()
    imp = read_text(path.read_text(), get_catalog())
    assert time.perf_counter() - t0 < 0.5
    assert imp.fields["pp"] == 9999 and imp.fields["stage_layers"][:2] == (1, 1) and imp.fields["stage_layers"][-1] == 2


def test_even_split_matches_split_layers():
    from shardlab.export.text import even_split
    from shardlab.layout import split_layers

    for layers in range(0, 70):
        for stages in range(1, 20):
            assert even_split(layers, stages) == split_layers(layers, stages)


# ---- 2. errors name the file's field, not a flag the user never gave -----------------------------------------
@pytest.mark.parametrize("name, text, fragments, absent", [
    ("ds7.json", '{"zero_optimization": {"stage": 7}}', ("zero_optimization.stage", "0, 1, 2 or 3", "got 7"), ("--zero",)),
    ("ds_huge.json", '{"zero_optimization": {"stage": 1e308}}', ("zero_optimization.stage", "0, 1, 2 or 3"),
     ("digit", "--zero")),
    ("pp64.toml", TT + "pipeline_parallel_degree = 64\n", ("parallelism.pipeline_parallel_degree", "32 layers"),
     ("--pp", "--vpp")),
    ("rep.toml", TT + "data_parallel_replicate_degree = -5\n", ("parallelism.data_parallel_replicate_degree", "-5"), ()),
    ("ds_pp64.json", json.dumps({"pipeline": {"stages": 64}}), ("pipeline.stages 64", "32 layers"), ("--pp",)),
    ("tp3.sh", "vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 3\n", ("--tensor-parallel-size 3", "KV heads"),
     ("--tp ",)),
    ("acc.yaml", "distributed_type: FSDP\nnum_processes: 8\nparallelism_config: {parallelism_config_tp_size: 3}\n",
     ("num_processes", "parallelism_config.parallelism_config_tp_size"), ("--gpus",)),
    ("ep.json", json.dumps({"expert_parallel": {"enabled": True, "autoep_size": 2}}),
     ("expert_parallel.autoep_size 2", "dense"), ("--ep",)),
])
def test_errors_name_the_field_in_the_file(tmp_path, name, text, fragments, absent):
    cmd = ("estimate", "--inference") if name.endswith(".sh") else ("estimate", "llama-3.1-8b")
    refused(tmp_path, name, text, *fragments, cmd=cmd, absent=absent)


def test_memory_and_plan_name_the_field_too(tmp_path):
    refused(tmp_path, "ds7.json", '{"zero_optimization": {"stage": 7}}', "zero_optimization.stage",
            cmd=("memory", "llama-3.1-8b"), absent=("--zero",))
    refused(tmp_path, "pp64.toml", TT + "pipeline_parallel_degree = 64\n", "parallelism.pipeline_parallel_degree",
            cmd=("plan", "--gpus", "64"), absent=("--pp",))


def test_a_launcher_names_its_embedded_file(tmp_path):
    text = ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gpus-per-node=8\ncat > job.toml <<'SHARDLAB_EOF'\n" + TT
            + "pipeline_parallel_degree = 64\nSHARDLAB_EOF\nsrun torchrun -m torchtitan.train\n")
    refused(tmp_path, "job.sbatch", text, "(its torchtitan part)", "parallelism.pipeline_parallel_degree")


# ---- 3. no Python internals ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, text, fragments", [
    ("gas0.json", json.dumps({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1,
                              "gradient_accumulation_steps": 0}), ("gradient_accumulation_steps", "got 0")),
    ("digits.json", '{"train_batch_size": ' + "9" * 5000 + "}", ("thousands of digits",)),
    ("digits.toml", TT + "tensor_parallel_degree = " + "9" * 5000 + "\n", ("thousands of digits",)),
    ("digits.yaml", "distributed_type: FSDP\nnum_processes: " + "9" * 5000 + "\n", ("thousands of digits",)),
    ("digits.sh", "pretrain_gpt.py --num-layers " + "9" * 5000 + "\n", ("--num-layers",)),
    ("nan.toml", TT + "tensor_parallel_degree = nan\n", ("parallelism.tensor_parallel_degree", "got nan")),
    ("acc_list.yaml", "distributed_type: FSDP\nfsdp_config: [1, 2]\n", ("fsdp_config", "got a list")),
    ("acc_par.yaml", "distributed_type: FSDP\nparallelism_config: [1]\n", ("parallelism_config",)),
    ("sky_list.yaml", "run: |\n  pretrain_gpt.py --num-layers 32\nresources: [1]\n", ("resources", "got a list")),
    ("sky_count.yaml", "run: |\n  pretrain_gpt.py --num-layers 32\nresources: {accelerators: 'H100:nan'}\n",
     ("resources.accelerators",)),
    ("ds_bf16.json", json.dumps({"bf16": True}), ("bf16", "wrong type")),
    ("ds_mult.json", json.dumps({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 3,
                                 "gradient_accumulation_steps": 1}), ("train_batch_size", "multiple of 3")),
    ("tt_parts.toml", TT + "pipeline_parallel_degree = 2\nmodule_fqns_per_model_part = [[1], [2]]\n",
     ("module_fqns_per_model_part",)),
    ("tt_mode.toml", TT + "[activation_checkpoint]\nmode = [1]\n", ("activation_checkpoint.mode",)),
])
def test_no_python_internals(tmp_path, name, text, fragments):
    refused(tmp_path, name, text, *fragments)


# ---- 4. booleans -----------------------------------------------------------------------------------------------
def test_accelerate_booleans(tmp_path):
    acc = "distributed_type: FSDP\nnum_processes: 8\nfsdp_config: {{fsdp_activation_checkpointing: {}}}\n"
    for value, recompute in (('"false"', "none"), ("false", "none"), ('"TRUE"', "full"), ("true", "full")):
        d = imported(tmp_path, "acc.yaml", acc.format(value), "estimate", "llama-3.1-8b")
        assert d["layout"]["recompute"] == recompute, value
    for value in ('"yes"', "1", "0", '"off"'):
        refused(tmp_path, "acc.yaml", acc.format(value), "fsdp_config.fsdp_activation_checkpointing", "true or false")


def test_skypilot_use_spot(tmp_path):
    sky = "run: |\n  pretrain_gpt.py --num-layers 32\nresources: {{use_spot: {}, accelerators: 'H100:8'}}\n"
    for value, spot in (('"false"', False), ("false", False), ('"True"', True), ("true", True)):
        assert imported(tmp_path, "sky.yaml", sky.format(value), "estimate", "llama-3.1-8b")["imported"]["fields"]["spot"] is spot
    for value in ('"no"', "1"):
        refused(tmp_path, "sky.yaml", sky.format(value), "resources.use_spot", "true or false")


# ---- 5. vllm --gpu-memory-utilization -----------------------------------------------------------------------
def test_vllm_gpu_memory_utilization_is_applied_and_bounded(tmp_path):
    d = imported(tmp_path, "v.sh", "vllm serve meta-llama/Llama-3.1-8B --gpu-memory-utilization 0.5\n",
                 "estimate", "--inference")
    code, out, err = cli_main("estimate", "llama-3.1-8b", "--inference", "--gpu-memory-utilization", "0.5", "--json")
    assert code == 0, err
    flag = json.loads(out)
    assert d["kv_blocks"] == flag["kv_blocks"]
    default = json.loads(cli_main("estimate", "llama-3.1-8b", "--inference", "--json")[1])
    assert d["kv_blocks"]["num_blocks"] != default["kv_blocks"]["num_blocks"]
    for value in ("5", "0", "nan", "-0.5", "abc"):
        refused(tmp_path, "v.sh", f"vllm serve meta-llama/Llama-3.1-8B --gpu-memory-utilization {value}\n",
                "--gpu-memory-utilization", "(0, 1]", cmd=("estimate", "--inference"))
    path = tmp_path / "v.sh"
    path.write_text("vllm serve meta-llama/Llama-3.1-8B --gpu-memory-utilization 0.5\n")
    code, _, err = cli_main("estimate", "--inference", "--from", str(path), "--gpu-memory-utilization", "0.8")
    assert code == 2 and "conflicts" in err and len(err.strip().splitlines()) == 1, err


def test_vllm_export_carries_fp8_weights_and_kv_cache_and_says_what_it_cannot(tmp_path):
    """--weights fp8 → --quantization fp8, --kv-cache-dtype fp8 → the same; reading the file back gives the same
    precision and KV blocks. int4 needs a pre-quantized checkpoint: listed as not expressed, blocks for bf16."""
    out = tmp_path / "s8.sh"
    args = ("llama-3.1-70b", "--inference", "--tp", "4")
    code, _, err = cli_main("export", "--to", "vllm", *args, "--weights", "fp8", "--kv-cache-dtype", "fp8", "--out", str(out))
    assert code == 0, err
    text = out.read_text()
    assert "--quantization fp8" in text and "--kv-cache-dtype fp8" in text
    back = json.loads(cli_main("estimate", "--from", str(out), "--json")[1])
    direct = json.loads(cli_main("estimate", *args, "--weights", "fp8", "--kv-cache-dtype", "fp8", "--json")[1])
    assert back["precision"] == direct["precision"] and back["precision"]["weights"] == "fp8"
    assert back["kv_blocks"]["num_blocks"] == direct["kv_blocks"]["num_blocks"]
    assert f"predicted KV-cache blocks per GPU: {direct['kv_blocks']['num_blocks']} " in text
    out4 = tmp_path / "s4.sh"
    code, stdout, err = cli_main("export", "--to", "vllm", *args, "--weights", "int4", "--out", str(out4))
    assert code == 0, err
    bf16 = json.loads(cli_main("estimate", *args, "--json")[1])["kv_blocks"]["num_blocks"]
    text4 = out4.read_text()
    assert "could not express weights=int4" in text4 and "--quantization " not in text4.split("vllm serve", 1)[1]
    assert f"predicted KV-cache blocks per GPU: {bf16} " in text4


@pytest.mark.parametrize("nodes, fragment", [("9" * 5000, "#SBATCH --nodes must be a whole number from 1 to 1,048,576"),
                                             ("0", "#SBATCH --nodes must be a whole number from 1")])
def test_a_slurm_node_count_is_bounded_by_name(tmp_path, nodes, fragment):
    text = (f"#!/bin/bash\n#SBATCH --nodes={nodes}\n#SBATCH --gpus-per-node=8\ncat > job.toml <<'SHARDLAB_EOF'\n" + TT
            + "tensor_parallel_degree = 2\nSHARDLAB_EOF\nsrun torchrun -m torchtitan.train\n")
    refused(tmp_path, "job.sbatch", text, fragment)
