"""Exact parameter counts for every catalog model and Hugging Face config files."""

import pytest

from shardlab.catalog import get_catalog, load_model_file
from shardlab.specs.tensors import model_tensors, param_counts

CAT = get_catalog()

# Published exact counts (checkpoint totals); DEVELOPERS' examples and ../shared/reference/hf-configs/README.md.
EXACT = {
    "gpt2": 124_439_808, "gpt2-medium": 354_823_168, "gpt2-large": 774_030_080, "gpt2-xl": 1_557_611_200,
    "llama-2-7b": 6_738_415_616, "llama-2-13b": 13_015_864_320, "llama-2-70b": 68_976_648_192,
    "llama-3.1-8b": 8_030_261_248, "llama-3.1-70b": 70_553_706_496, "llama-3.1-405b": 405_853_388_800,
    "mistral-7b": 7_241_732_096, "mixtral-8x7b": 46_702_792_704, "mixtral-8x22b": 140_620_634_112,
    "qwen2.5-7b": 7_615_616_512, "qwen2.5-72b": 72_706_203_648, "gpt-neox-20b": 20_554_567_680,
    "bloom-176b": 176_247_271_424, "deepseek-v3": 671_026_419_200, "qwen3-30b-a3b": 30_532_122_624,
    "qwen3-235b-a22b": 235_093_634_560,       # from the config's dimensions (the model card rounds: 235B total, 22B active)
    "gpt-oss-120b": 116_829_156_672, "gpt-oss-20b": 20_914_757_184,   # model card (arXiv 2508.10925): 116.83B, 20.91B;
}                                                                     # transformers' count: tests/test_hf_families.py


@pytest.mark.parametrize("model_id", sorted(EXACT))
def test_exact_count(model_id):
    spec = CAT.models[model_id]
    assert param_counts(spec).total == EXACT[model_id]
    assert spec.params_reference == EXACT[model_id]


def test_every_preset_is_checked():
    """Each catalog model has an exact published count tested above, or is GPT-3 (none published: checked against
    Narayanan Eq. 2 below), or is a runtime preset (held against the real PyTorch module in tests/runtime)."""
    assert set(CAT.models) - set(EXACT) == {"gpt3-175b", "tiny", "small", "tiny-gpt2", "tiny-moe"}


def test_gpt3_matches_narayanan_eq2():
    """GPT-3 has no published exact count: Narayanan et al. 2021 Eq. 2 (12Lh² + 13Lh + (V+s)h) plus the final LayerNorm."""
    m = CAT.models["gpt3-175b"]
    L, h, V, s = m.num_layers, m.hidden_size, m.vocab_size, m.max_seq_len
    assert param_counts(m).total == 12 * L * h * h + 13 * L * h + (V + s) * h + 2 * h
    assert abs(param_counts(m).total - 175e9) / 175e9 < 0.003


@pytest.mark.parametrize("model_id,active", [
    ("mixtral-8x7b", 12_879_925_248),   # "12.9B active" (Mistral AI)
    ("mixtral-8x22b", 39_152_031_744),  # "39.2B active"
    ("deepseek-v3", 37_552_297_472),    # "37B activated" (README); 37.6B counting embeddings and head
])
def test_moe_active(model_id, active):
    pc = param_counts(CAT.models[model_id])
    assert pc.active == active
    assert pc.active < pc.total


@pytest.mark.parametrize("model_id, card", [("gpt-oss-120b", 5.13e9), ("gpt-oss-20b", 3.61e9)])
def test_gpt_oss_active_matches_the_model_card(model_id, card):
    """The model card (arXiv 2508.10925, Table 1) counts the unembedding and not the embedding table, to 0.01B."""
    pc = param_counts(CAT.models[model_id])
    assert round((pc.active - pc.by_component["embedding"]) / 1e7) == round(card / 1e7)


def test_components_sum_and_layers():
    pc = param_counts(CAT.models["llama-2-7b"])
    assert sum(pc.by_component.values()) == pc.total
    assert pc.by_component["embedding"] == 32000 * 4096 == pc.by_component["head"]
    assert pc.by_component["norm"] == 4096 * (2 * 32 + 1)
    assert pc.embedding + sum(pc.per_layer) + pc.head == pc.total
    assert len(set(pc.per_layer)) == 1  # identical blocks


def test_deepseek_dense_and_moe_layers_differ():
    pc = param_counts(CAT.models["deepseek-v3"])
    assert pc.per_layer[0] == pc.per_layer[2] < pc.per_layer[3] == pc.per_layer[60]


def test_tied_embeddings_have_no_head():
    names = {t.name for t in model_tensors(CAT.models["gpt2"])}
    assert "output.weight" not in names and "tok_embeddings.weight" in names and "pos_embeddings.weight" in names


@pytest.mark.parametrize("fname,catalog_id", [
    ("gpt2.json", "gpt2"), ("llama-2-7b.json", "llama-2-7b"), ("llama-3.1-8b.json", "llama-3.1-8b"),
    ("mistral-7b-v0.1.json", "mistral-7b"), ("mixtral-8x7b.json", "mixtral-8x7b"), ("qwen2.5-7b.json", "qwen2.5-7b"),
    ("gpt-neox-20b.json", "gpt-neox-20b"),
])
def test_hf_config_equals_catalog(data_dir, fname, catalog_id):
    spec = load_model_file(data_dir / fname)
    assert param_counts(spec).total == EXACT[catalog_id]
    cat = CAT.models[catalog_id]
    for f in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size", "mlp", "norm",
              "tied_embeddings", "qkv_bias", "moe"):
        assert getattr(spec, f) == getattr(cat, f), f


def test_gpt2_style_file_describes_gpt3(tmp_path):
    import json

    p = tmp_path / "gpt3.json"
    p.write_text(json.dumps({"n_embd": 12288, "n_layer": 96, "n_head": 96, "vocab_size": 50257, "n_positions": 2048}))
    assert param_counts(load_model_file(p)).total == param_counts(CAT.models["gpt3-175b"]).total


def test_yaml_model_file(tmp_path):
    p = tmp_path / "tiny.yaml"
    p.write_text("family: llama\nhidden_size: 64\nnum_layers: 2\nnum_heads: 4\nnum_kv_heads: 2\n"
                 "ffn_hidden_size: 128\nvocab_size: 100\nmax_seq_len: 32\n")
    spec = load_model_file(p)
    # embed 6400 + head 6400 + final norm 64 + 2 × (q 4096 + k,v 2×2048 + o 4096 + mlp 3×8192 + norms 128)
    assert param_counts(spec).total == 6400 * 2 + 64 + 2 * (4096 + 4096 + 4096 + 3 * 8192 + 128)
