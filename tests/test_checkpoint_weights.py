"""The weights' type a published checkpoint ships (``ModelSpec.checkpoint_weights``): what `--inference` prices when
`--weights` is not given (DeepSeek-V3's block FP8, GPT-OSS's MXFP4 experts), read from a config.json's
``quantization_config`` too; training ignores it."""

import json

import pytest

from conftest import cli_main
from shardlab.errors import ShardlabError
from shardlab.specs.hf import checkpoint_weights, from_hf_config
from shardlab.specs.model import model_from_dict


def _json(*argv) -> dict:
    code, out, err = cli_main(*argv, "--json")
    assert code == 0, err
    return json.loads(out)


def _prec(d: dict) -> str:
    """The precision of an estimate's JSON as its label ('weights fp8 (the checkpoint's), activations fp8, ...')."""
    p = d["precision"]
    if isinstance(p, str):
        return p
    own = " (the checkpoint's)" if p["weights_from_checkpoint"] else ""
    return f"weights {p['weights']}{own}, activations {p['activations']}, KV {p['kv_cache']}"


def test_deepseek_v3_fits_eight_h200_in_its_own_fp8_and_not_as_a_bf16_copy():
    """The first question about DeepSeek-V3: one 8 x H200 node serves it as it ships (671B at one byte); a 16-bit
    copy (1.34 TB) does not fit there."""
    own = _json("estimate", "deepseek-v3", "--inference", "--tp", "8", "--gpu", "h200", "--prompt-len", "1000",
                "--output-len", "1000")
    assert _prec(own).startswith("weights fp8 (the checkpoint's), activations fp8")
    assert own["fits"] and own["max_batch"] > 100
    copy = _json("estimate", "deepseek-v3", "--inference", "--tp", "8", "--gpu", "h200", "--prompt-len", "1000",
                 "--output-len", "1000", "--weights", "bf16")
    assert _prec(copy).startswith("weights bf16, ") and not copy["fits"]
    assert copy["memory"]["per_gpu"]["weights"] > 1.9 * own["memory"]["per_gpu"]["weights"]


def test_gpt_oss_120b_fits_one_h100_in_its_mxfp4_weights():
    d = _json("estimate", "gpt-oss-120b", "--inference", "--gpu", "h100-sxm", "--prompt-len", "1000",
              "--output-len", "1000")
    assert _prec(d).startswith("weights fp4 (the checkpoint's), activations bf16") and d["fits"]


def test_a_dense_bf16_checkpoint_and_training_are_unchanged():
    d = _json("estimate", "llama-3.1-8b", "--inference", "--prompt-len", "1000", "--output-len", "100")
    assert _prec(d).startswith("weights bf16, activations bf16")
    t = _json("estimate", "deepseek-v3", "--gpus", "256", "--tp", "1", "--pp", "16", "--ep", "16", "--zero", "1",
              "--global-batch", "512", "--seq-len", "4096")
    assert t["workload"]["precision"] == "bf16-mixed" and not t["workload"]["fp8_params"]   # training: as asked


@pytest.mark.parametrize("q,want", [
    ({"quant_method": "fp8", "weight_block_size": [128, 128], "fmt": "e4m3"}, "fp8"),
    ({"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]}, "fp4"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "fp4"),
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, "fp8"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}, ("int4", 128)),
    ({"quant_method": "gptq", "bits": 4, "group_size": 64}, ("int4", 64)),
    ({"quant_method": "gptq", "bits": 8, "group_size": -1}, ("int8", 0)),
    ({"quant_method": "gptq", "bits": 4, "group_size": -1}, None),   # per-channel 4-bit: not a layout shardlab prices
    ({"quant_method": "awq", "bits": 4, "group_size": -1}, None),
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, None),
    ({"quant_method": "gptq", "bits": True, "group_size": 128}, None),
    ({"quant_method": "awq", "bits": 4.0, "group_size": 128}, None),
    ({"quant_method": "compressed-tensors", "config_groups": {}}, None),
    ("fp8", None),
    (None, None),
])
def test_quantization_config_names_the_checkpoint_weights(q, want):
    got = checkpoint_weights(q)
    if isinstance(want, tuple):
        assert got is not None and (got[0], got[2]) == want
    else:
        assert (got[0] if got else None) == want


@pytest.mark.parametrize("group", [None, 0, -5, True, "128", 128.0, [128], 2**40])
def test_a_malformed_group_size_is_refused_in_one_line(tmp_path, group):
    cfg = json.loads((__import__("pathlib").Path(__file__).parent / "data" / "llama-3.1-8b.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, **({} if group is None else {"group_size": group})}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    code, out, err = cli_main("estimate", str(path), "--inference", "--prompt-len", "8", "--output-len", "8")
    assert code == 2 and "group_size must be -1" in err and err.count("\n") == 1 and "Traceback" not in err


def _awq_config(tmp_path, group: int, **over):
    cfg = json.loads((__import__("pathlib").Path(__file__).parent / "data" / "llama-3.1-8b.json").read_text())
    cfg.update(over)
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_a_checkpoints_groups_that_a_tp_degree_splits_name_the_tp_not_a_flag(tmp_path):
    path = _awq_config(tmp_path, 128, intermediate_size=18944)          # 2,368 inputs per rank at TP 8
    code, out, err = cli_main("estimate", path, "--inference", "--gpu", "a100-80gb", "--tp", "8", "--prompt-len", "8",
                              "--output-len", "8")
    assert code == 2 and "the checkpoint's group_size 128" in err and "--group-size" not in err
    assert "use a TP degree" in err and err.count("\n") == 1
    d = _json("plan", path, "--inference", "--gpus", "8", "--gpu", "a100-80gb", "--prompt-len", "8", "--output-len", "8")
    assert d["plans"] and all(p["tp"] != 8 for p in d["plans"])    # plan drops TP 8 and keeps the rest


def test_another_group_size_or_the_same_type_given_is_not_called_the_checkpoints(tmp_path):
    path = _awq_config(tmp_path, 64)
    base = ["estimate", path, "--inference", "--gpu", "a100-80gb", "--prompt-len", "8", "--output-len", "8"]
    other = _json(*base, "--group-size", "32")["precision"]
    assert (other["weights"], other["group_size"], other["weights_from_checkpoint"]) == ("int4", 32, False)
    same = _json(*base, "--weights", "int4")["precision"]          # the type given: the checkpoint's groups, no label
    assert (same["group_size"], same["weights_from_checkpoint"]) == (64, False)
    own = _json(*base)["precision"]
    assert (own["group_size"], own["weights_from_checkpoint"]) == (64, True)


def test_a_config_json_with_fp8_weights_is_priced_as_it_ships(tmp_path):
    cfg = json.loads((__import__("pathlib").Path(__file__).parent / "data" / "llama-3.1-8b.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    spec = from_hf_config(cfg, "l8b-fp8")
    assert spec.checkpoint_weights == "fp8" and "checkpoint weights fp8" in spec.source
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    d = _json("estimate", str(path), "--inference", "--gpu", "h100-sxm", "--prompt-len", "500", "--output-len", "100")
    assert _prec(d).startswith("weights fp8 (the checkpoint's), activations fp8")


def test_an_awq_config_json_is_priced_in_its_int4_groups(tmp_path):
    cfg = json.loads((__import__("pathlib").Path(__file__).parent / "data" / "llama-3.1-8b.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True,
                                  "version": "gemm"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    own = _json("estimate", str(path), "--inference", "--gpu", "a100-80gb", "--prompt-len", "500", "--output-len", "100")
    given = _json("estimate", "llama-3.1-8b", "--inference", "--gpu", "a100-80gb", "--prompt-len", "500",
                  "--output-len", "100", "--weights", "int4", "--group-size", "64")
    assert own["precision"]["weights"] == "int4" and own["precision"]["group_size"] == 64
    assert own["precision"]["weights_from_checkpoint"] and not given["precision"]["weights_from_checkpoint"]
    assert own["memory"]["per_gpu"]["weights"] == given["memory"]["per_gpu"]["weights"]


def test_a_bad_checkpoint_weights_field_is_refused_in_one_line(tmp_path):
    with pytest.raises(ShardlabError, match="checkpoint_weights must be one of"):
        model_from_dict("m", {"family": "llama", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 4,
                              "ffn_hidden_size": 128, "vocab_size": 100, "max_seq_len": 64,
                              "checkpoint_weights": "int3"}, "m.yaml")
    path = tmp_path / "m.yaml"
    path.write_text("family: llama\nhidden_size: 64\nnum_layers: 2\nnum_heads: 4\nnum_kv_heads: 4\n"
                    "ffn_hidden_size: 128\nvocab_size: 100\nmax_seq_len: 64\ncheckpoint_weights: [fp8]\n")
    code, out, err = cli_main("estimate", str(path), "--inference", "--prompt-len", "8", "--output-len", "8")
    assert code == 2 and "checkpoint_weights must be one of" in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("target", ["vllm", "sglang", "tensorrt-llm"])
def test_launch_files_serve_a_quantized_checkpoint_as_it_ships(tmp_path, target):
    """No quantization flag (each engine reads the method from the checkpoint's config), no 'could not express'
    note, and the file reads back at the checkpoint's precision; another --weights is named as not carried over."""
    code, out, err = cli_main("export", "--to", target, "deepseek-v3", "--inference", "--gpu", "h200", "--tp", "8",
                              "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert not [u for u in doc["unsupported"] if u["setting"] == "weights"]
    assert "quantization" not in doc["text"]
    path = tmp_path / ("job.yaml" if target == "tensorrt-llm" else "serve.sh")
    path.write_text(doc["text"])
    if target != "tensorrt-llm":
        back = _json("estimate", "--from", str(path), "--gpu", "h200")
        assert back["precision"]["weights"] == "fp8" and back["precision"]["weights_from_checkpoint"]
    code, out, err = cli_main("export", "--to", target, "gpt-oss-120b", "--inference", "--gpu", "h100-sxm", "--tp", "4",
                              "--weights", "bf16", "--json")
    assert code == 0, err
    notes = [u["why"] for u in json.loads(out)["unsupported"] if u["setting"] == "weights"]
    assert notes and "as it ships (fp4" in notes[0]


def test_explain_prices_the_checkpoint_as_estimate_does():
    code, out, err = cli_main("explain", "kv-cache", "model=gpt-oss-120b", "gpu=h100-sxm", "tp=1", "--json")
    assert code == 0, err
    d = json.loads(out)
    est = _json("estimate", "gpt-oss-120b", "--inference", "--gpu", "h100-sxm", "--batch", "1", "--prompt-len", "2048",
                "--output-len", "2048")
    assert d["numbers"]["fits"] and d["numbers"]["weights_bytes"] == est["memory"]["per_gpu"]["weights"]


def test_an_int4_plans_launch_file_predicts_the_blocks_of_the_16_bit_checkpoint_it_serves(tmp_path):
    """vLLM cannot name an AWQ/GPTQ copy of a 16-bit catalog model: the file serves the bf16 checkpoint, and its
    predicted KV blocks are that checkpoint's, from a plan as from `export --inference`."""
    base = ["llama-3.1-8b", "--inference", "--gpu", "a100-80gb", "--weights", "int4", "--prompt-len", "500",
            "--output-len", "100"]
    code, out, err = cli_main("plan", *base, "--gpus", "1", "--json")
    assert code == 0, err
    plan = tmp_path / "plan.json"
    plan.write_text(out)
    texts = []
    for argv in (["--plan", str(plan)], base):
        code, out, err = cli_main("export", "--to", "vllm", *argv)
        assert code == 0, err
        texts.append(next(line for line in out.splitlines() if "predicted KV-cache blocks per GPU" in line))
    assert texts[0] == texts[1]


@pytest.mark.parametrize("model, gpu, flags, want", [
    ("gpt-oss-120b", "h100-sxm", [], ("fp4", None, "bf16", True)),          # the checkpoint's, under its name
    ("llama-3.1-8b", "a100-80gb", ["--weights", "int4", "--group-size", "32"], ("int4", 32, "bf16", False)),
    ("llama-3.1-8b", "h100-sxm", ["--weights", "fp8", "--activations", "bf16"], ("fp8", None, "bf16", False)),
])
def test_a_saved_serving_plan_reads_back_at_its_precision(tmp_path, model, gpu, flags, want):
    """A job file keeps the group size and the activations a plan chose (it dropped both: int4 g32 read back as g128,
    fp8 weights with bf16 GEMMs as fp8 GEMMs) and leaves the weights out where they are the checkpoint's, so the
    estimate read from it still calls them so."""
    job = tmp_path / "job.toml"
    d = _json("plan", model, "--inference", "--gpus", "1", "--gpu", gpu, "--prompt-len", "500", "--output-len", "100",
              *flags, "--save", str(job))
    text = job.read_text()
    assert ("weights =" in text) != want[3] and ("group_size = 32" in text) == (want[1] == 32)
    back = _json("estimate", str(job))["precision"]
    got = (back["weights"], back["group_size"], back["activations"], back["weights_from_checkpoint"])
    assert got == want
    assert d["serving"]["weights_from_checkpoint"] == want[3]
