"""Settings an exported training file reads back as they were written (`shardlab export --to shardlab --from FILE`),
or that the export names as not expressed: the optimizer, the recompute fraction, hybrid sharding's replicas, GPUs per
node, and what a DeepSpeed or Accelerate config leaves to the training script (sequence length, dropout, optimizer)."""

import json
import tomllib

import pytest

from conftest import cli_main

MODEL = ("llama-3.1-8b",)


def exported(target: str, path, *args) -> dict:
    """Write ``target``'s file to ``path``; the export's JSON document (with its 'unsupported' list)."""
    code, out, err = cli_main("export", "--to", target, *MODEL, *args, "--out", str(path), "--json")
    assert code == 0, err
    return json.loads(out)


def lost(doc: dict) -> set:
    return {u["setting"] for u in doc["unsupported"]}


def read_back(path, model: bool = False) -> dict:
    """The shardlab job file the exported file reads back as: {section: {key: value}}."""
    code, out, err = cli_main("export", "--to", "shardlab", *(MODEL if model else ()), "--from", str(path), "--json")
    assert code == 0, err
    return tomllib.loads(json.loads(out)["text"])


# 1. Megatron-LM --optimizer
def test_megatron_optimizer_sgd_reads_back(tmp_path):
    p = tmp_path / "m.sh"
    exported("megatron", p, "--gpus", "16", "--global-batch", "256", "--optimizer", "sgd")
    assert "--optimizer sgd" in p.read_text()
    assert read_back(p)["workload"]["optimizer"] == "sgd"


def test_megatron_optimizer_adam_reads_back_as_adamw_and_a_bad_one_is_one_line(tmp_path):
    p = tmp_path / "m.sh"
    exported("megatron", p, "--gpus", "16", "--global-batch", "256")
    assert read_back(p)["workload"]["optimizer"] == "adamw"
    p.write_text(p.read_text().replace("--optimizer adam", "--optimizer lamb"))
    code, out, err = cli_main("estimate", "--from", str(p))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "--optimizer" in err, err


# 2. --recompute-fraction
@pytest.mark.parametrize("layout, frac", [((), "0.5"), (("--pp", "2", "--vpp", "2", "--schedule", "interleaved"), "0.25")])
def test_megatron_block_recompute_reads_back_as_its_fraction(tmp_path, layout, frac):
    p = tmp_path / "m.sh"
    doc = exported("megatron", p, "--gpus", "16", "--zero", "1", "--global-batch", "256", *layout, "--recompute", "full",
                   "--recompute-fraction", frac)
    assert "--recompute-method block" in p.read_text() and "recompute_fraction" not in lost(doc)
    lay = read_back(p)["layout"]
    assert (lay["recompute"], lay["recompute_fraction"]) == ("full", float(frac))


def test_torchtitan_every_nth_block_reads_back_as_its_fraction(tmp_path):
    p = tmp_path / "t.toml"
    doc = exported("torchtitan", p, "--gpus", "16", "--zero", "3", "--recompute", "full", "--recompute-fraction", "0.5",
                   "--global-batch", "256")
    assert tomllib.loads(p.read_text())["activation_checkpoint"]["selective_ac_option"] == "2"
    assert "recompute_fraction" not in lost(doc)
    lay = read_back(p)["layout"]
    assert (lay["recompute"], lay["recompute_fraction"]) == ("full", 0.5)


# 3. HSDP replicas
@pytest.mark.parametrize("target, model", [("torchtitan", False), ("accelerate", True)])
def test_hsdp_replicas_read_back(tmp_path, target, model):
    p = tmp_path / f"{target}.file"
    doc = exported(target, p, "--gpus", "16", "--zero", "3", "--dp-replicate", "2", "--global-batch", "256")
    assert "dp_replicate" not in lost(doc)
    lay = read_back(p, model)["layout"]
    assert (lay["dp"], lay["zero"], lay["dp_replicate"]) == (16, 3, 2)


# 4. what a DeepSpeed or Accelerate config cannot carry is named; what DeepSpeed's can, it carries
def test_deepspeed_carries_the_optimizer_and_names_seq_len_and_dropout(tmp_path):
    p = tmp_path / "ds.json"
    doc = exported("deepspeed", p, "--gpus", "16", "--zero", "1", "--global-batch", "256", "--seq-len", "8192",
                   "--dropout", "--optimizer", "sgd")
    cfg = json.loads(p.read_text())
    assert cfg["optimizer"]["type"] == "SGD" and cfg["zero_allow_untested_optimizer"] is True
    assert {"seq_len", "dropout"} <= lost(doc) and "optimizer" not in lost(doc)
    assert read_back(p, model=True)["workload"]["optimizer"] == "sgd"


def test_deepspeed_names_8bit_adam_and_recompute_modules(tmp_path):
    doc = exported("deepspeed", tmp_path / "ds.json", "--gpus", "16", "--zero", "3", "--global-batch", "256",
                   "--optimizer", "adam-8bit", "--recompute", "selective", "--recompute-modules", "core_attn,mlp")
    assert {"optimizer", "recompute_modules"} <= lost(doc)


def test_accelerate_names_dropout_optimizer_and_recompute_modules(tmp_path):
    doc = exported("accelerate", tmp_path / "a.yaml", "--gpus", "16", "--zero", "3", "--global-batch", "256",
                   "--dropout", "--optimizer", "sgd", "--recompute", "selective", "--recompute-modules", "core_attn,mlp")
    assert {"dropout", "optimizer", "recompute_modules"} <= lost(doc)


def test_torchtitan_names_recompute_modules(tmp_path):
    doc = exported("torchtitan", tmp_path / "t.toml", "--gpus", "16", "--zero", "3", "--global-batch", "256",
                   "--recompute", "selective", "--recompute-modules", "core_attn,mlp")
    assert "recompute_modules" in lost(doc)


# 5. GPUs per node
def test_megatron_reads_gpus_per_node_from_torchrun(tmp_path):
    p = tmp_path / "m12.sh"
    doc = exported("megatron", p, "--gpus", "12", "--gpus-per-node", "4", "--zero", "1", "--global-batch", "240")
    assert "gpus_per_node" not in lost(doc)
    assert read_back(p)["cluster"]["gpus_per_node"] == 4
    code, out, err = cli_main("export", "--to", "megatron", "--from", str(p), "--json")   # 12 GPUs on nodes of 4
    assert code == 0, err
    code, out, err = cli_main("estimate", "--from", str(p), "--json")
    assert code == 0, err
    assert json.loads(out)["cluster"]["gpus_per_node"] == 4


def test_accelerate_reads_gpus_per_node_from_its_machines(tmp_path):
    p = tmp_path / "a.yaml"
    doc = exported("accelerate", p, "--gpus", "12", "--gpus-per-node", "4", "--zero", "3", "--global-batch", "240")
    assert "gpus_per_node" not in lost(doc)
    assert read_back(p, model=True)["cluster"]["gpus_per_node"] == 4


@pytest.mark.parametrize("target", ["torchtitan", "deepspeed", "megatron", "accelerate"])
def test_gpus_per_node_a_file_cannot_carry_is_named_only_off_the_default(tmp_path, target):
    """One node of 4 (and torchtitan's or DeepSpeed's file, whatever the nodes) does not say the node size."""
    off = exported(target, tmp_path / "a", "--gpus", "4", "--gpus-per-node", "4", "--zero", "3", "--global-batch", "256")
    assert "gpus_per_node" in lost(off)
    default = exported(target, tmp_path / "b", "--gpus", "4", "--zero", "3", "--global-batch", "256")
    assert "gpus_per_node" not in lost(default)
