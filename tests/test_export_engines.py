"""Launch files for the serving engines: vllm serve, sglang.launch_server, trtllm-serve (+ its options YAML), dense and
MoE with expert parallelism and data-parallel attention; each checked against its flag schema and read back."""

import pytest

from conftest import cli_main
from shardlab.catalog import get_catalog
from shardlab.export import read_text, sniff
from shardlab.export.flags import check_flags
from shardlab.export.tensorrt_llm import check_options
from shardlab.export.text import HEREDOC
from shardlab.export.text import flags_dict, split_command
from shardlab.safeio import yaml_load

CAT = get_catalog([])
ENGINES = ("vllm", "sglang", "tensorrt-llm")
LINE = {"vllm": "vllm serve", "sglang": "sglang.launch_server", "tensorrt-llm": "trtllm-serve"}


def export(tmp_path, target, *args):
    out = tmp_path / f"{target}.sh"
    code, _, err = cli_main("export", "--to", target, *args, "--out", str(out))
    assert code == 0, err
    return out.read_text(), out


def flags_of(target: str, text: str) -> dict:
    words = split_command(HEREDOC.sub("", text))
    start = next(i for i, w in enumerate(words) if LINE[target].split()[-1] in w)
    fl = flags_dict(words[start + 1:])
    fl.pop("model-path", None) if target != "sglang" else None
    return fl


@pytest.mark.parametrize("target", ENGINES)
def test_dense_replicas_round_trip(tmp_path, target):
    text, path = export(tmp_path, target, "llama-3.1-8b", "--inference", "--gpus", "4", "--tp", "2", "--batch", "64",
                        "--prompt-len", "2000", "--output-len", "500", "--kv-cache-dtype", "fp8")
    assert sniff(text) == target
    assert check_flags(target, flags_of(target, text)) == []
    imp = read_text(text, CAT)
    f = imp.fields
    assert (f["model"], f["tp"], f["pp"], f["prompt_len"], f["output_len"]) == ("llama-3.1-8b", 2, 1, 2000, 500)
    assert f["max_num_seqs"] == 32 and str(f["kv_cache_dtype"]).startswith("fp8")
    if target == "tensorrt-llm":                     # one server per replica: the file says so and serves one
        assert "could not express replicas=2" in text and "replicas" not in f
        options = yaml_load(HEREDOC.search(text).group(2))
        assert check_options(options) == [] and options["kv_cache_config"]["dtype"] == "fp8"
    else:
        assert f["replicas"] == 2
    code, out, err = cli_main("estimate", "--from", str(path))
    assert code == 0, err


@pytest.mark.parametrize("target", ENGINES)
def test_wide_ep_with_dp_attention_round_trips(tmp_path, target):
    text, path = export(tmp_path, target, "deepseek-v3", "--inference", "--gpu", "h200", "--ep", "16",
                        "--dp-attention", "--batch", "256")
    fl = flags_of(target, text)
    assert check_flags(target, fl) == []
    expect = {"vllm": {"tensor-parallel-size": "1", "data-parallel-size": "16", "enable-expert-parallel": True},
              "sglang": {"tp-size": "16", "dp-size": "16", "enable-dp-attention": True, "ep-size": "16"},
              "tensorrt-llm": {"tp_size": "16", "ep_size": "16"}}[target]
    assert {k: fl[k] for k in expect} == expect
    if target == "tensorrt-llm":
        assert yaml_load(HEREDOC.search(text).group(2))["enable_attention_dp"] is True
    f = read_text(text, CAT).fields
    assert (f["tp"], f["ep"], f["dp_attention"]) == (1, 16, 16)
    code, out, err = cli_main("estimate", "--from", str(path), "--gpu", "h200", "--json")
    assert code == 0, err
    assert '"dp_attention": 16' in out and '"ep": 16' in out


def test_schemas_refuse_what_the_engines_do_not_take():
    assert check_flags("sglang", {"tensor-parallel-size": "2"})          # vLLM's spelling, not SGLang's
    assert check_flags("sglang", {"kv-cache-dtype": "fp8"})              # SGLang names fp8_e4m3 / fp8_e5m2
    assert check_flags("tensorrt-llm", {"tp-size": "2"})                 # trtllm-serve uses underscores
    assert check_options({"enable_attention_dp": "yes"}) and check_options({"kv_cache_config": {"dtyp": "fp8"}})
    assert check_options({"speculative_config": {}})                     # a key shardlab does not write


@pytest.mark.parametrize("target", ["vllm", "sglang"])
def test_replicas_of_an_expert_parallel_group_are_refused_in_one_line(target):
    code, _, err = cli_main("export", "--to", target, "deepseek-v3", "--inference", "--gpu", "h200", "--ep", "16",
                            "--dp-attention", "--gpus", "32")
    assert code == 2 and err.count("\n") == 1 and "replica" in err and "Traceback" not in err


def test_tampered_options_yaml_is_one_line(tmp_path):
    text, path = export(tmp_path, "tensorrt-llm", "llama-3.1-8b", "--inference", "--tp", "2")
    path.write_text(text.replace("enable_padding: true", "- [unbalanced"))
    code, _, err = cli_main("estimate", "--from", str(path))
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
