"""CLI: tables by default, one JSON document with --json, one-line errors with exit code 2."""

import json
import re

import pytest

from conftest import DATA, cli_main, run_cli


def test_json_documents_parse():
    for args in (["models"], ["gpus"], ["links"], ["models", "mixtral-8x7b"],
                 ["memory", "llama-2-7b", "--gpus", "8", "--zero", "3"]):
        code, out, err = cli_main(*args, "--json")
        assert code == 0, err
        json.loads(out)


def test_models_list_ids_are_lowercase_hyphenated():
    code, out, _ = cli_main("models", "--json")
    ids = [m["id"] for m in json.loads(out)["models"]]
    for want in ("llama-2-7b", "llama-3.1-405b", "mixtral-8x7b", "gpt2", "gpt2-xl", "deepseek-v3"):
        assert want in ids
    assert all(i == i.lower() and " " not in i and "_" not in i for i in ids)


def test_gpus_and_links_catalog_ids_and_sources():
    _, out, _ = cli_main("gpus", "--json")
    gpus = {g["id"]: g for g in json.loads(out)["gpus"]}
    for want in ("v100", "a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "l4", "l40s", "rtx-4090", "mi300x"):
        assert want in gpus and gpus[want]["source"]
    assert gpus["h100-sxm"]["peak_tflops"]["bf16"] == 989.4
    _, out, _ = cli_main("links", "--json")
    links = {l["id"]: l for l in json.loads(out)["links"]}
    for want in ("nvlink3", "nvlink4", "nvlink5", "pcie4", "pcie5", "ib-hdr", "ib-ndr", "ethernet-10g", "ethernet-100g",
                 "ethernet-400g"):
        assert want in links and links[want]["source"]


def test_memory_human_output_shows_work():
    code, out, _ = cli_main("memory", "llama-3.1-70b", "--gpus", "64", "--tp", "8", "--pp", "2", "--zero", "1",
                            "--microbatches", "8")
    assert code == 0
    assert "worst rank: rank 0" in out and "embedding" in out
    assert "ZeRO paper" in out and "Korthikanti" in out and "FITS" in out


def test_memory_params_mode():
    code, out, _ = cli_main("memory", "--params", "7.5e9", "--dp", "64", "--zero", "3", "--framework", "deepspeed", "--json")
    assert json.loads(out)["per_gpu"]["model_states"] == 1_875_000_000


BAD = [
    (["memory", "llama-2-8b", "--gpus", "8"], "did you mean"),
    (["memory", "llama-2-7b", "--gpus", "8", "--tp", "3"], "not divisible"),
    (["memory", "llama-2-7b", "--gpus", "12", "--tp", "12"], "does not divide"),   # 32 heads
    (["memory", "qwen2.5-7b", "--gpus", "7", "--tp", "7"], "KV heads"),
    (["memory", "llama-2-7b", "--gpus", "8", "--dp", "3"], "product is 8"),
    (["memory", "llama-2-7b", "--gpus", "8", "--gpu", "h100"], "did you mean"),
    (["memory", "llama-2-7b", "--gpus", "0"], "positive"),
    (["memory", "llama-2-7b", "--micro-batch", "-2"], "positive"),
    (["memory", "llama-2-7b", "--seq-len", "0"], "positive"),
    (["memory", "--params", "-5"], "positive"),
    (["memory", "--params", "abc"], "cannot parse"),
    (["memory", "llama-2-7b", "--params", "7e9"], "not both"),
    (["memory", "llama-2-7b", "--ep", "2", "--gpus", "2"], "dense"),
]


@pytest.mark.parametrize("args,msg", BAD)
def test_bad_input_one_line_exit_2(args, msg):
    code, out, err = cli_main(*args)
    assert code == 2
    assert msg in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_malformed_and_incomplete_config_json(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama", "hidden_size": 4096,')
    code, _, err = cli_main("memory", str(bad))
    assert code == 2 and "not valid" in err and len(err.strip().splitlines()) == 1
    missing = tmp_path / "m.json"
    missing.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 2,
                                   "num_attention_heads": 32, "vocab_size": 100}))
    code, _, err = cli_main("memory", str(missing))
    assert code == 2 and "intermediate_size" in err
    neg = tmp_path / "n.json"
    neg.write_text(json.dumps({"model_type": "gpt2", "n_embd": -768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
                               "n_positions": 1024}))
    code, _, err = cli_main("memory", str(neg))
    assert code == 2 and "n_embd" in err
    unknown = tmp_path / "u.json"
    unknown.write_text(json.dumps({"model_type": "t5"}))
    code, _, err = cli_main("models", str(unknown))
    assert code == 2 and "not supported" in err


def test_user_catalog_adds_gpu(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("""accelerators:
  my-gpu:
    name: My GPU
    vendor: acme
    peak_tflops: {fp32: 10, tf32: null, bf16: 100, fp16: 100, fp8: null}
    memory_gib: 48
    memory_bandwidth_gbps: 1000
    scale_up_link: pcie4
    host_link: pcie4
    tdp_w: 300
    system: {gpus_per_node: 4, intra_link: pcie4, inter_link: ethernet-100g}
    source: my own measurements
""")
    code, out, err = cli_main("gpus", "--catalog", str(f), "--json")
    assert code == 0 and any(g["id"] == "my-gpu" for g in json.loads(out)["gpus"])
    code, out, err = cli_main("memory", "llama-2-7b", "--gpu", "my-gpu", "--catalog", str(f), "--json")
    assert code == 0 and json.loads(out)["capacity_bytes"] == 48 * 2**30
    f.write_text("accelerators:\n  x:\n    name: X\n    colour: red\n")
    code, _, err = cli_main("gpus", "--catalog", str(f))
    assert code == 2 and "missing" in err


def test_entry_point_subprocess():
    r = run_cli("memory", "--params", "1e9", "--dp", "2", "--zero", "1")
    assert r.returncode == 0 and "ZeRO-1" in r.stdout
    r = run_cli("memory", "nope-model")
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_command_owner_map_matches_registration():
    """`shardlab CMD` imports only CMD's module: the static map must name exactly what each module registers."""
    import importlib

    from shardlab.cli import COMMAND_MODULES, COMMAND_OWNERS, _Parser

    for mod in COMMAND_MODULES:
        p = _Parser(prog="x")
        sub = p.add_subparsers()
        importlib.import_module(mod).register(sub)
        registered = set(sub.choices)
        assert registered == {c for c, m in COMMAND_OWNERS.items() if m == mod}, mod


def test_config_without_model_type(tmp_path):
    """A file with `architectures` but no `model_type` is read by its class name; with neither it is refused."""
    cfg = json.loads((DATA / "qwen2.5-7b.json").read_text())
    del cfg["model_type"]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    code, out, _ = cli_main("models", str(p), "--json")
    assert code == 0 and json.loads(out)["params"] == 7_615_616_512   # QKV biases kept: it was read as qwen2
    del cfg["architectures"]
    p.write_text(json.dumps(cfg))
    code, _, err = cli_main("models", str(p))
    assert code == 2 and "model_type" in err


def test_inference_estimate_refuses_flags_it_would_ignore():
    code, _, err = cli_main("estimate", "mixtral-8x7b", "--inference", "--tp", "2", "--ep", "2")
    assert code == 2 and "--ep" in err
    code, _, err = cli_main("estimate", "llama-3.1-8b", "--inference", "--tp", "2", "--gpus", "16")
    assert code == 2 and "--gpus" in err


def test_the_readme_catalog_example_adds_a_gpu_a_link_and_a_price():
    """README: `shardlab memory llama-2-7b --gpu my-gpu --catalog examples/my-hardware.yaml` (and cost uses its price)."""
    from pathlib import Path

    example = str(Path(__file__).resolve().parents[1] / "examples" / "my-hardware.yaml")
    code, out, err = cli_main("memory", "llama-2-7b", "--gpu", "my-gpu", "--catalog", example, "--json")
    assert code == 0, err
    assert json.loads(out)["gpu"] == "my-gpu"
    code, out, err = cli_main("cost", "llama-2-7b", "--gpu", "my-gpu", "--gpus", "4", "--tokens", "1e9", "--catalog",
                              example, "--json")
    assert code == 0, err
    assert json.loads(out)["price"]["usd_per_gpu_hour"] == 0.90


def test_help_describes_what_each_command_does_with_shared_flags():
    """--params only where a bare count works; plan's help gives plan's defaults and names estimate-only flags."""
    for cmd in (["estimate"], ["plan"], ["cost"], ["comm", "plan"]):
        code, out, _ = cli_main(*cmd, "--help-all")
        assert code == 0 and "--params" not in out
    code, out, _ = cli_main("memory", "--help-all")
    assert "--params" in out and "--framework deepspeed   # the ZeRO paper's worked example (16.64 GB)" in out
    code, out, _ = cli_main("plan", "--help")
    flat = " ".join(out.split())
    assert "GPUs to plan for (default 64" in flat and "default: 4M tokens per step" in flat
    flat = " ".join(cli_main("plan", "--help-all")[1].split())
    assert "--dp DP estimate only" in flat and "--wrap POLICY estimate only" in flat
    code, out, _ = cli_main("report", "--help")
    assert "data-parallel degree" in " ".join(out.split())


def test_flash1_line_shows_the_rate_it_uses_and_pinned_plans_name_the_pins():
    rates = {}
    for k in ("flash1", "flash2"):
        code, out, err = cli_main("estimate", "llama-3.1-8b", "--gpus", "8", "--attention-kernel", k)
        assert code == 0, err
        rates[k] = int(re.search(rf"attention kernel \({k}\) at (\d+)%", out).group(1))
    assert abs(rates["flash1"] * 2 - rates["flash2"]) <= 1
    code, _, err = cli_main("plan", "--framework", "deepspeed", "--fix", "zero=3", "--fix", "pp=2")
    assert code == 2 and "pin fewer axes (pinned: zero=3, pp=2)" in err


def test_names_from_folders_print_no_terminal_control_sequences(tmp_path):
    """A model named after its folder (ESC sequences, a bidirectional override) prints escapes in the human output,
    in `models` and `memory` alike; the JSON document carries the name as it is (JSON escapes it)."""
    import shutil

    folder = tmp_path / "m\x1b[31mred\u202e"
    folder.mkdir()
    shutil.copy(DATA / "gpt2.json", folder / "config.json")
    for argv in (["models", str(folder)], ["memory", str(folder / "config.json"), "--gpus", "1"]):
        code, out, _ = cli_main(*argv)
        assert code == 0 and "\x1b" not in out and "\u202e" not in out and "m\\x1b[31mred\\u202e" in out, argv
    code, out, _ = cli_main("models", str(folder), "--json")
    assert json.loads(out)["model"]["name"] == "m\x1b[31mred\u202e"
