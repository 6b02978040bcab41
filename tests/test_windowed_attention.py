"""Sliding-window attention on some layers only (GPT-OSS and Gemma 2: every other layer; Gemma 3: five in six), and
GPT-OSS's attention sinks and expert biases: the layer split matches transformers, the KV cache and the attention
cost are the layers' average, and the parts of shardlab that build the model refuse it in one line."""

import math
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import cli_json, run_cli
from shardlab.catalog import get_catalog, load_model_file
from shardlab.errors import ShardlabError
from shardlab.memory.inference import cached_tokens, held_tokens, kv_cache_bytes, kv_cache_bytes_per_token

DIR = Path(__file__).parent / "data" / "hf-families"


@pytest.mark.parametrize("name", ["gemma-2-2b", "gemma-2-9b", "gemma-3-1b", "gemma-3-4b", "gpt-oss-20b",
                                  "gpt-oss-120b"])
def test_full_attention_layers_match_transformers_layer_types(name):
    transformers = pytest.importorskip("transformers")
    import json

    d = json.loads((DIR / f"{name}.json").read_text())
    d = dict(d.get("text_config", d))
    mt = d.pop("model_type", None) or "gemma3_text"
    cfg = transformers.AutoConfig.for_model("gemma3_text" if mt == "gemma3" else mt, **d)
    spec = load_model_file(DIR / f"{name}.json")
    assert spec.sliding_window == cfg.sliding_window
    assert spec.full_attention_layers == sum(t == "full_attention" for t in cfg.layer_types)
    assert 0 < spec.full_attention_layers < spec.num_layers


def test_kv_cache_is_the_layers_average():
    cat = get_catalog()
    oss = cat.model("gpt-oss-120b")
    assert (oss.sliding_window, oss.full_attention_layers, oss.windowed_layer_share) == (128, 18, 0.5)
    # 18 layers keep the window of 128, 18 keep all 9,216 tokens: the average layer holds 4,672
    assert cached_tokens(oss, 9216) == 4672 and cached_tokens(oss, 100) == 100
    assert float(held_tokens(oss, 1000)) == pytest.approx((128 + 1000) / 2)
    per_token = kv_cache_bytes_per_token(oss)[0]
    assert per_token == 36 * 2 * 8 * 64 * 2                       # every layer's K and V, bf16
    assert kv_cache_bytes(oss, 3, 9216) == 3 * 4672 * per_token
    mistral = cat.model("mistral-7b")                               # every layer slides: the window caps the cache
    assert mistral.windowed_layer_share == 1.0 and cached_tokens(mistral, 9000) == mistral.sliding_window
    llama = cat.model("llama-3.1-8b")
    assert llama.windowed_layer_share == 0.0 and cached_tokens(llama, 9000) == 9000


def test_estimate_holds_half_the_window_and_half_the_context():
    doc = cli_json("estimate", "gpt-oss-120b", "--inference", "--gpus", "1", "--gpu", "h200", "--prompt-len", "8192",
                   "--output-len", "1024", "--weights", "fp4", "--engine", "vllm")
    per_token = 36 * 2 * 8 * 64 * 2
    assert doc["memory"]["per_gpu"]["kv_cache"] == math.ceil((128 + 8192 + 1024) / 2) * per_token   # whole blocks of 16


def test_attention_cost_follows_the_window():
    from shardlab.rates.compute import layer_times
    from shardlab.rates.hardware import matmul_curve

    cat = get_catalog()
    oss, acc = cat.model("gpt-oss-120b"), cat.accelerator("h100-sxm")
    full = replace(oss, sliding_window=0, full_attention_layers=0)
    S = 8192

    def attn(spec):
        return layer_times(spec, 0, acc, matmul_curve(acc)[0], "bf16", seq_len=S, tp=1, cp=1, ep=1, micro_batch=1,
                           sequence_parallel=False, elem_bytes=2, flash_attention=True)["attn_s"]

    w = 128
    assert attn(oss) / attn(full) == pytest.approx((0.5 * (w - w * w / (2 * S)) + 0.5 * S / 2) / (S / 2))


@pytest.mark.parametrize("change, words", [
    ({"sliding_window": 0, "full_attention_layers": 4}, "needs a sliding_window"),
    ({"full_attention_layers": 40}, "exceeds num_layers 36"),
    ({"full_attention_layers": -1}, "full_attention_layers"),
])
def test_bad_window_fields_are_named(change, words):
    spec = get_catalog().model("gpt-oss-120b")
    with pytest.raises(ShardlabError, match=words):
        replace(spec, **change).validate()


def test_runtime_refuses_gpt_oss_in_one_line():
    r = run_cli("shard-check", "gpt-oss-20b", "--gpus", "4")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "attention sinks" in r.stderr, r.stderr


def test_expert_biases_are_column_parallel_and_not_matmuls():
    from shardlab.shard.rules import split_kind
    from shardlab.specs.tensors import is_matmul_weight, model_tensors

    spec = get_catalog().model("gpt-oss-20b")
    t = {x.name.rsplit(".", 1)[-1] if "experts" in x.name else x.name: x for x in model_tensors(spec) if x.layer == 0}
    assert split_kind(t["w1_bias"], spec, 2) == "column" and split_kind(t["w1"], spec, 2) == "column"
    assert split_kind(t["w2"], spec, 2) == "row" and not is_matmul_weight(t["w2_bias"])
    r = run_cli("models", "gpt-oss-20b")
    line = next(x for x in r.stdout.splitlines() if "experts.w1_bias" in x)
    assert "(column)" in line and "(row)" not in line


@pytest.mark.parametrize("types", [{"a": 1}, ["sliding_attention"] * 3, [1] * 24, ["chunked_attention"] * 24])
def test_malformed_layer_types_are_named(types):
    from shardlab.specs.hf import from_hf_config

    with pytest.raises(ShardlabError, match="'layer_types' must list"):
        from_hf_config({"model_type": "gpt_oss", "num_hidden_layers": 24, "layer_types": types})


def test_disaggregated_transfer_sends_what_the_engine_keeps():
    from shardlab.serving.case import prepare
    from shardlab.serving.disagg import kv_transfer
    from shardlab.serving.engines import get_engine
    from shardlab.specs.hardware import Cluster

    cat = get_catalog()
    acc = cat.accelerator("h200")
    cl = Cluster(acc, 1, 8, cat.link(acc.system["intra_link"]), cat.link(acc.system["inter_link"]))
    oss = cat.model("gpt-oss-120b")
    per_token = 36 * 2 * 8 * 64 * 2
    for engine, held in (("vllm", (128 + 8192) // 2), ("tensorrt-llm", 8192)):   # vLLM V1 drops what leaves a window
        case = prepare(oss, cl, get_engine(engine), prompt_len=8192, output_len=1024)
        assert kv_transfer(case, True)[0] == held * per_token


def test_export_refuses_a_window_the_launch_file_cannot_set():
    r = run_cli("export", "gpt-oss-20b", "--to", "tensorrt-llm", "--inference", "--gpus", "1", "--gpu", "h200",
                "--sliding-window-cache")
    assert r.returncode == 2 and "per-layer attention window" in r.stderr and r.stderr.count("\n") == 1
    # vLLM drops what leaves a window by itself: its file is written whatever engine priced the plan
    r = run_cli("export", "gpt-oss-20b", "--to", "vllm", "--inference", "--gpus", "1", "--gpu", "h200", "--engine",
                "sglang", "--sliding-window-cache")
    assert r.returncode == 0 and r.stdout.count("vllm serve openai/gpt-oss-20b") == 1, r.stderr


def test_qlora_leaves_gpt_oss_experts_16_bit():
    from shardlab.memory.lora import is_block_linear
    from shardlab.specs.tensors import model_tensors

    spec = get_catalog().model("gpt-oss-20b")
    quantized = {t.component for t in model_tensors(spec) if is_block_linear(t, spec)}
    assert quantized == {"attention"}                  # experts and router are nn.Parameter in transformers
    mixtral = get_catalog().model("mixtral-8x7b")
    assert {"experts", "router"} <= {t.component for t in model_tensors(mixtral) if is_block_linear(t, mixtral)}
