"""Config families beyond Llama/GPT: exact parameter counts from published config.json files.

Each file in tests/data/hf-families is reconstructed from the model's published config.json (the fields that matter;
the rest are ignored by both readers). The expected totals are what transformers builds from the same file on the meta device
(its state dict as the checkpoint loads), which the second test re-derives when transformers is installed (the
`test` extra), so the table cannot drift from the library.
"""

import json
from pathlib import Path

import pytest

from shardlab.catalog import load_model_file
from shardlab.errors import ShardlabError
from shardlab.specs.hf import from_hf_config
from shardlab.specs.tensors import model_tensors, param_counts

DIR = Path(__file__).parent / "data" / "hf-families"

EXPECTED = {
    # what transformers' state dict holds (re-derived below); model cards round them: Gemma 2B "2.51B", Gemma-2 2B
    # "2.61B", Phi-3-mini "3.8B", Qwen1.5-MoE-A2.7B "14.3B", Qwen3-30B-A3B "30.5B", Qwen3-235B-A22B "235B"
    "falcon-40b": 41_303_293_952, "falcon-7b": 6_921_720_704,
    "gemma-2b": 2_506_172_416, "gemma-7b": 8_537_680_896,
    "gemma-2-2b": 2_614_341_888, "gemma-2-9b": 9_241_705_984, "gemma-2-27b": 27_227_128_320,
    "gemma-3-1b": 999_885_952, "gemma-3-4b": 3_880_263_168,
    "gpt-j-6b": 6_050_882_784, "mpt-7b": 6_649_286_656,
    "gpt-oss-20b": 20_914_757_184, "gpt-oss-120b": 116_829_156_672,      # model card: 20.91B, 116.83B
    "olmo-2-1124-7b": 7_298_617_344, "olmo-2-1124-13b": 13_716_198_400,
    "opt-125m": 125_239_296, "opt-350m": 331_196_416, "opt-6.7b": 6_658_473_984,
    "phi-3-mini-4k": 3_821_079_552, "phi-3-medium-4k": 13_960_238_080,
    "qwen1.5-moe-a2.7b": 14_315_784_192, "qwen2-57b-a14b": 57_408_658_944,
    "qwen3-0.6b": 596_049_920, "qwen3-8b": 8_190_735_360,
    "qwen3-30b-a3b": 30_532_122_624, "qwen3-235b-a22b": 235_093_634_560,
}


def test_every_file_has_an_expected_count():
    assert {p.stem for p in DIR.glob("*.json")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_exact_count(name):
    assert param_counts(load_model_file(DIR / f"{name}.json")).total == EXPECTED[name]


def _transformers_count(d: dict) -> tuple[int, int]:
    """(parameters, tensors) of the transformers model built from config mapping ``d`` on the meta device."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    d = dict(d)
    mt = d.pop("model_type")
    if mt == "gemma3":  # the multimodal file: shardlab counts the text decoder, so build Gemma3ForCausalLM from it
        mt, d = "gemma3_text", dict(d["text_config"])
        d.pop("model_type", None)
    cfg = transformers.AutoConfig.for_model(mt, **d)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    params = list(model.parameters())  # tied weights appear once
    return sum(p.numel() for p in params), len(params)


UNIFORM_MOE = {"qwen2-57b-a14b", "qwen3-30b-a3b", "qwen3-235b-a22b"}
"""Every block identical (no dense-first or sparse-step pattern) and slow to build on the meta device (one module per
expert): transformers builds them with 1 and 2 blocks and the count is extrapolated, exactly, to the full depth."""


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_count_equals_transformers_meta_model(name):
    d = json.loads((DIR / f"{name}.json").read_text())
    if name in UNIFORM_MOE:
        assert d.get("decoder_sparse_step", 1) == 1 and not d.get("mlp_only_layers")
        one, _ = _transformers_count({**d, "num_hidden_layers": 1})
        two, _ = _transformers_count({**d, "num_hidden_layers": 2})
        n = one + (d["num_hidden_layers"] - 1) * (two - one)
    else:
        n, _ = _transformers_count(d)
    assert n == EXPECTED[name]


def test_qwen2_moe_shared_expert_and_gate():
    spec = load_model_file(DIR / "qwen1.5-moe-a2.7b.json")
    assert spec.moe.shared_width == 5632 and spec.moe.shared_expert_gate
    t = {x.name: x.shape for x in model_tensors(spec)}
    assert t["layers.0.moe.shared_gate.weight"] == (1, 2048)
    assert t["layers.0.moe.shared.w1.weight"] == (5632, 2048)
    pc = param_counts(spec)
    assert 2.6e9 < pc.active < 2.8e9  # "A2.7B": 2.7B activated parameters (Qwen1.5-MoE model card)


def test_family_specific_tensors():
    opt = load_model_file(DIR / "opt-350m.json")
    t = {x.name: x.shape for x in model_tensors(opt)}
    assert t["pos_embeddings.weight"] == (2050, 1024)            # 2048 positions + OPT's offset of 2
    assert t["tok_embeddings.weight"] == (50272, 512) and t["project_in.weight"] == (1024, 512)
    assert t["project_out.weight"] == (512, 1024) and "norm.weight" not in t
    gptj = {x.name for x in model_tensors(load_model_file(DIR / "gpt-j-6b.json"))}
    assert "output.bias" in gptj and "layers.0.ffn_norm.weight" not in gptj   # one shared LayerNorm
    mpt = {x.name for x in model_tensors(load_model_file(DIR / "mpt-7b.json"))}
    assert "layers.0.attention_norm.weight" in mpt and "layers.0.attention_norm.bias" not in mpt
    g2 = [x.name for x in model_tensors(load_model_file(DIR / "gemma-2-2b.json")) if x.layer == 0 and x.component == "norm"]
    assert len(g2) == 4   # sandwich norms
    olmo = {x.name: x.shape for x in model_tensors(load_model_file(DIR / "olmo-2-1124-7b.json"))}
    assert olmo["layers.0.attention.q_norm.weight"] == (4096,) and "layers.0.attention_norm.weight" not in olmo
    q3 = {x.name: x.shape for x in model_tensors(load_model_file(DIR / "qwen3-8b.json"))}
    assert q3["layers.0.attention.k_norm.weight"] == (128,)


def test_gemma3_multimodal_reads_text_config_and_says_so():
    spec = load_model_file(DIR / "gemma-3-4b.json")
    assert spec.family == "gemma3_text" and spec.vocab_size == 262208 and spec.head_dim_ == 256  # transformers' defaults
    assert "vision tower" in spec.source


def test_qwen_moe_with_dense_layers_is_refused():
    d = json.loads((DIR / "qwen3-30b-a3b.json").read_text())
    d["mlp_only_layers"] = [0]
    with pytest.raises(ShardlabError, match="mlp_only_layers"):
        from_hf_config(d)


def test_falcon_variants():
    d = json.loads((DIR / "falcon-7b.json").read_text())
    spec = from_hf_config(d)
    assert spec.num_kv_heads == 1 and spec.block_norms == "shared" and spec.tied_embeddings
    spec40 = load_model_file(DIR / "falcon-40b.json")
    assert spec40.num_kv_heads == 8 and spec40.block_norms == "pre"


def _shrink(d: dict, layers: int = 2) -> dict:
    return {**d, "num_hidden_layers": layers}


@pytest.mark.parametrize("name, drop, extra", [
    ("qwen3-30b-a3b", "head_dim", {}),                                # Qwen3MoeConfig: hidden / heads, not 128
    ("qwen1.5-moe-a2.7b", "shared_expert_intermediate_size", {}),     # Qwen2MoeConfig: 5632
    ("gemma-7b", "num_key_value_heads", {}),                          # GemmaConfig: 16
    ("gemma-2-2b", "num_key_value_heads", {}),                        # Gemma2Config: 4
    ("qwen3-8b", "num_key_value_heads", {}),                          # Qwen3Config: 32
    ("phi-3-mini-4k", None, {"attention_bias": True, "mlp_bias": True}),  # Phi3 builds no biases
    ("qwen1.5-moe-a2.7b", None, {"qkv_bias": False}),                 # Qwen2MoeAttention honours qkv_bias
])
def test_missing_or_ignored_fields_follow_transformers(name, drop, extra):
    d = _shrink(json.loads((DIR / f"{name}.json").read_text()))
    d = {k: v for k, v in d.items() if k != drop}
    d.update(extra)
    n, _ = _transformers_count(d)
    assert param_counts(from_hf_config(dict(d))).total == n


def test_qwen_sliding_window_applies_from_max_window_layers():
    d = json.loads((DIR / "qwen3-8b.json").read_text())
    on = {**d, "use_sliding_window": True, "sliding_window": 4096}
    spec = from_hf_config({**on, "max_window_layers": d["num_hidden_layers"]})      # no layer slides
    assert spec.sliding_window == 0
    assert from_hf_config({**on, "max_window_layers": 0}).sliding_window == 4096   # every layer slides
    part = from_hf_config({**on, "max_window_layers": 20})                          # 20..35 slide, 0..19 do not
    assert (part.sliding_window, part.full_attention_layers) == (4096, 20)
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.for_model("qwen3", **{k: v for k, v in on.items() if k != "model_type"},
                                            max_window_layers=20)
    assert sum(t == "full_attention" for t in cfg.layer_types) == 20
    assert from_hf_config({**on, "sliding_window": None, "max_window_layers": 0}).sliding_window == 0   # null: none


@pytest.mark.parametrize("field, value, words", [
    ("num_key_value_heads", "8", "'num_key_value_heads' must be a positive integer"),
    ("max_position_embeddings", -1, "'max_position_embeddings' must be a positive integer"),
    ("head_dim", 1.5, "'head_dim' must be an integer >= 0"),
])
def test_bad_optional_fields_name_the_files_own_key(field, value, words):
    d = json.loads((DIR / "qwen3-8b.json").read_text())
    with pytest.raises(ShardlabError, match=words):
        from_hf_config({**d, field: value})


def test_an_absurd_total_is_refused():
    d = json.loads((DIR / "qwen3-30b-a3b.json").read_text())
    with pytest.raises(ShardlabError, match="above the limit"):
        from_hf_config({**d, "num_experts": 2 ** 20, "num_hidden_layers": 10_000, "moe_intermediate_size": 2 ** 16})
