"""The runtime GPT: parameter names and shapes equal the tensor inventory; KV-cache decoding equals a full forward."""

import pytest

torch = pytest.importorskip("torch")

from shardlab.catalog import get_catalog  # noqa: E402
from shardlab.runtime.gpt import KVCache, build_model, small_spec, tiny_gpt2_spec, tiny_spec  # noqa: E402
from shardlab.specs.tensors import model_tensors  # noqa: E402


def _names_shapes(model):
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()]


@pytest.mark.parametrize("spec", [tiny_spec(), small_spec(), tiny_gpt2_spec(), get_catalog().model("tiny-moe")],
                         ids=lambda s: s.name)
def test_presets_match_inventory(spec):
    model = build_model(spec)
    assert _names_shapes(model) == [(t.name, t.shape) for t in model_tensors(spec)]


@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-2-70b", "gpt2", "mixtral-8x7b", "qwen2.5-7b"])
def test_catalog_models_on_meta_match_inventory(name):
    spec = get_catalog().model(name)
    model = build_model(spec, device="meta")
    assert _names_shapes(model) == [(t.name, t.shape) for t in model_tensors(spec)]
    assert all(p.device.type == "meta" for p in model.parameters())


def test_init_is_deterministic_and_seeded():
    a, b, c = build_model(tiny_spec(), seed=0), build_model(tiny_spec(), seed=0), build_model(tiny_spec(), seed=1)
    for (n, pa), (_, pb), (_, pc) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters()):
        assert torch.equal(pa, pb), n
        if pa.dim() == 2:
            assert not torch.equal(pa, pc), n


@pytest.mark.parametrize("spec", [tiny_spec(), tiny_gpt2_spec()], ids=lambda s: s.name)
def test_kv_cache_decoding_matches_full_forward(spec):
    """Prefill + one-token steps with the cache give the logits of a full causal forward (float32: 1e-5)."""
    model = build_model(spec).eval()
    tokens = torch.randint(0, spec.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(tokens)
        cache = KVCache(list(range(spec.num_layers)), 2, 12, spec.num_kv_heads, spec.head_dim_)
        steps = [model(tokens[:, :5], 0, cache)]
        steps.append(model(tokens[:, 5:8], 5, cache))  # a chunk after a cached prefix: explicit causal mask
        steps += [model(tokens[:, j:j + 1], j, cache) for j in range(8, 12)]
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)
    assert cache.nbytes == 2 * spec.num_layers * 2 * 12 * spec.kv_size * 4


def test_mla_is_refused():
    from shardlab.errors import ShardlabError

    spec = get_catalog().model("deepseek-v3")
    with pytest.raises(ShardlabError, match="Latent Attention"):
        build_model(spec, device="meta")
