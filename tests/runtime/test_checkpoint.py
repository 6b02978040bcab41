"""Hugging Face checkpoints in the runtime, in process: every family's logits and greedy tokens against transformers
on the same checkpoint, the name maps, dtypes, sharded indexes, refusals, vocabulary padding and the paged cache."""

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

sys.path.insert(0, str(Path(__file__).parent))
from ckpt_fixtures import build, configs  # noqa: E402

from shardlab.errors import ShardlabError  # noqa: E402
from shardlab.runtime.checkpoint.config import FAMILIES, CheckpointSource  # noqa: E402
from shardlab.runtime.checkpoint.load import load_into  # noqa: E402
from shardlab.runtime.checkpoint.reference import hf_generate, load_hf  # noqa: E402
from shardlab.runtime.gpt import KVCache, build_model, tiny_spec  # noqa: E402
from shardlab.runtime.infer_worker import generate  # noqa: E402
from shardlab.runtime.paged_kv import PagedKVCache, blocks_for  # noqa: E402
from shardlab.runtime.vocab import pad_spec, padded_vocab_size  # noqa: E402

LOGIT_TOL = 1e-5
"""fp32 on both sides: the same operations in another order differ by ~2e-7 at these sizes."""


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {f: build(f, root / f) for f in FAMILIES}


def ours(folder, tp_pad: int = 1):
    """Our GPT loaded from ``folder`` in this process (vocabulary padded as for TP = tp_pad)."""
    src = CheckpointSource(str(folder))
    assert src.check() == []           # every checkpoint tensor is used
    spec, cut = pad_spec(src.spec, tp_pad)
    model = build_model(spec, numerics=src.numerics(cut), init=False).eval()
    rep = load_into([model], src.open(), src.family, src.spec)
    return model, src, rep


def test_families_list_matches_the_fixtures():
    assert set(configs()) == set(FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_and_greedy_tokens_equal_transformers(ckpts, family):
    model, src, rep = ours(ckpts[family])
    assert rep.bytes_read == rep.checkpoint_bytes          # one process reads every byte exactly once
    hf = load_hf(src.folder)
    x = torch.randint(0, src.spec.vocab_size, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (model(x) - hf(x).logits).abs().max().item()
    assert diff <= LOGIT_TOL, f"{family}: logits differ by {diff:.2e}"
    prompt = [3, 141, 59, 26, 535]
    cache = PagedKVCache(list(range(src.spec.num_layers)), blocks_for(len(prompt) + 8, 4), src.spec.num_kv_heads,
                         src.spec.head_dim_, block_size=4)
    toks, _, _ = generate(model, torch.tensor([prompt]), 8, cache)
    assert toks == hf_generate(src.folder, prompt, 8, model=hf)


def test_padded_vocabulary_changes_no_logit(ckpts):
    """GPT-2's 50,257 tokens padded for TP 2 (one zero row): the logits are cut back and equal the unpadded model's."""
    padded, src, _ = ours(ckpts["gpt2"], tp_pad=2)
    plain, _, _ = ours(ckpts["gpt2"])
    assert padded.tok_embeddings.weight.shape[0] == 50258 and padded.tok_embeddings.weight[-1].abs().sum() == 0
    x = torch.tensor([[1, 50256, 7]])
    with torch.no_grad():
        a, b = padded(x), plain(x)
    assert a.shape[-1] == 50257 and torch.equal(a, b)


def test_padding_rule():
    assert padded_vocab_size(50257, 2) == 50258
    assert padded_vocab_size(50257, 1) == 50257
    assert padded_vocab_size(50257, 2, 128) == 50432        # Megatron-LM's default multiple: 128 x tp
    assert padded_vocab_size(1000, 4) == 1000
    with pytest.raises(ShardlabError, match="divisible-by"):
        padded_vocab_size(10, 2, 0)


def test_bf16_and_sharded_index(tmp_path):
    """A bf16 checkpoint split into shards by an index: read, upcast, equal to transformers on the same files."""
    folder = build("qwen3", tmp_path / "q", dtype=torch.bfloat16, max_shard_size="200KB")
    assert (folder / "model.safetensors.index.json").is_file() and len(list(folder.glob("*.safetensors"))) > 1
    model, src, rep = ours(folder)
    assert rep.dtypes == ("BF16",) and rep.bytes_read == rep.checkpoint_bytes
    x = torch.tensor([[5, 9, 200, 31]])
    with torch.no_grad():
        assert (model(x) - load_hf(folder)(x).logits).abs().max().item() <= LOGIT_TOL


def test_a_mismatched_checkpoint_is_refused_naming_the_first_mismatch(ckpts, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(ckpts["llama"], bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["intermediate_size"] = 128
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ShardlabError, match=r"tensor 'model\.layers\.0\.mlp\.gate_proj\.weight' has shape \(96, 64\)"):
        CheckpointSource(str(bad)).check()
    from safetensors.torch import load_file, save_file

    missing = tmp_path / "missing"
    shutil.copytree(ckpts["qwen3"], missing)
    tensors = load_file(missing / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_norm.weight"]
    save_file(tensors, missing / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ShardlabError, match=r"has no tensor 'model\.layers\.1\.self_attn\.k_norm\.weight'"):
        CheckpointSource(str(missing)).check()
    (missing / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    with pytest.raises(ShardlabError, match="not a readable safetensors file"):
        CheckpointSource(str(missing)).check()


def test_families_and_numerics_the_runtime_does_not_compute_are_refused(ckpts, tmp_path):
    import shutil

    for change, match in (({"model_type": "gemma"}, "loads llama"),
                          ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling type 'yarn'"),
                          ({"hidden_act": "relu2"}, "activation 'relu2'")):
        d = tmp_path / str(abs(hash(match)))
        shutil.copytree(ckpts["llama"], d)
        cfg = {**json.loads((d / "config.json").read_text()), **change}
        (d / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(ShardlabError, match=match):
            CheckpointSource(str(d)).check()
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    with pytest.raises(ShardlabError, match="has no model.safetensors"):
        CheckpointSource(str(empty))


def test_paged_cache_gives_the_contiguous_caches_tokens_and_the_memory_models_block():
    from shardlab.memory.inference import kv_cache_bytes_per_token

    spec = tiny_spec()
    model = build_model(spec).eval()
    prompt = torch.tensor([[1, 2, 3, 4, 5]])
    total = 5 + 20
    flat = KVCache(list(range(spec.num_layers)), 1, total, spec.num_kv_heads, spec.head_dim_)
    paged = PagedKVCache(list(range(spec.num_layers)), blocks_for(total, 4), spec.num_kv_heads, spec.head_dim_, 4)
    a, _, _ = generate(model, prompt, 20, flat)
    b, _, _ = generate(model, prompt, 20, paged)
    assert a == b
    # 5 prompt + 19 fed-back tokens cached (the last new token is never fed back): 6 of the 7 blocks reserved, taken
    # from the end of the pool, so not contiguous: the block table is used
    assert paged.blocks_used == 6 and paged.table == [6, 5, 4, 3, 2, 1]
    assert paged.bytes_per_block == 4 * kv_cache_bytes_per_token(spec, 1, 1, 4)[0]
    with pytest.raises(ShardlabError, match="blocks of 4 tokens are full"):
        paged.update(0, torch.zeros(1, 4, spec.num_kv_heads, spec.head_dim_), torch.zeros(1, 4, spec.num_kv_heads,
                                                                                       spec.head_dim_), 26)


def test_prompt_text_uses_the_checkpoints_tokenizer(ckpts, tmp_path):
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers

    from shardlab.runtime.infer import prompt_ids

    folder = tmp_path / "tok"
    shutil.copytree(ckpts["llama"], folder)
    vocab = {"[UNK]": 0, "hello": 17, "world": 300}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    assert prompt_ids("hello world", None, 1001, folder) == [17, 300]
    assert prompt_ids("ignored", (4, 5), 1001, folder) == [4, 5]
    assert prompt_ids("ab", None, 1001, None) == [97, 98]          # no tokenizer: bytes
    with pytest.raises(ShardlabError, match="outside the vocabulary"):
        prompt_ids("", (1, 1001), 1001, None)


def test_hub_reference_reads_the_cached_snapshot(ckpts, tmp_path, monkeypatch):
    """hf:ORG/NAME: the snapshot in the Hugging Face cache (offline here), config and weights alike."""
    import shutil

    pytest.importorskip("huggingface_hub")
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = tmp_path / "hub" / "models--tiny-org--tiny-qwen3"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    shutil.copytree(ckpts["qwen3"], root / "snapshots" / commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    src = CheckpointSource("hf:tiny-org/tiny-qwen3")
    assert src.folder == root / "snapshots" / commit and src.family == "qwen3" and src.spec.name == "hf:tiny-org/tiny-qwen3"
    assert src.check() == []
    with pytest.raises(ShardlabError, match="is not in the Hugging Face cache"):
        CheckpointSource("hf:tiny-org/not-cached")


def _edited(src, dst, **changes):
    import shutil

    shutil.copytree(src, dst)
    cfg = {**json.loads((dst / "config.json").read_text()), **changes}
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_a_config_smaller_than_its_weights_is_refused_as_transformers_refuses_it(ckpts, tmp_path):
    """Fewer KV heads or a smaller vocabulary than the tensors hold, or tensors of layers the config does not have:
    refused naming the tensor (transformers' from_pretrained raises a size mismatch), never loaded in part."""
    with pytest.raises(ShardlabError, match=r"k_proj.weight' has shape \(32, 64\), but config.json uses only 16"):
        CheckpointSource(str(_edited(ckpts["llama"], tmp_path / "kv", num_key_value_heads=1))).check()
    with pytest.raises(ShardlabError, match=r"embed_tokens.weight' has shape \(1001, 64\), but config.json uses only 900"):
        CheckpointSource(str(_edited(ckpts["llama"], tmp_path / "vocab", vocab_size=900))).check()
    with pytest.raises(ShardlabError, match=r"tensor 'model.layers.1.* is not used by the model config.json describes"):
        CheckpointSource(str(_edited(ckpts["llama"], tmp_path / "layers", num_hidden_layers=1))).check()
    with pytest.raises(ShardlabError, match="activation"):
        CheckpointSource(str(_edited(ckpts["llama"], tmp_path / "act", hidden_act=["silu"]))).check()


def test_base_model_tensor_names_load(ckpts, tmp_path):
    """A GPT-2 saved from the base model ('h.0.attn...', 'wte.weight', as openai-community/gpt2 is): transformers
    loads it into GPT2LMHeadModel, and so does the runtime."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "base"
    shutil.copytree(ckpts["gpt2"], folder)
    t = load_file(folder / "model.safetensors")
    save_file({k.removeprefix("transformer."): v for k, v in t.items() if k != "lm_head.weight"},
              folder / "model.safetensors", metadata={"format": "pt"})
    model, src, _ = ours(folder)
    x = torch.tensor([[464, 2068, 7586]])
    with torch.no_grad():
        assert (model(x) - load_hf(folder)(x).logits).abs().max().item() <= LOGIT_TOL


def test_greedy_comparison_ignores_the_checkpoints_generation_settings(ckpts, tmp_path):
    """A generation_config.json asking for a repetition penalty and banned n-grams: the comparison is still greedy
    argmax decoding (a fresh generation config), so the runtime's tokens match."""
    import shutil

    folder = tmp_path / "gen"
    shutil.copytree(ckpts["qwen3"], folder)
    (folder / "generation_config.json").write_text(json.dumps({"repetition_penalty": 1.3, "no_repeat_ngram_size": 2}))
    model, src, _ = ours(folder)
    prompt = [3, 141, 59, 26, 535]
    cache = KVCache(list(range(src.spec.num_layers)), 1, len(prompt) + 10, src.spec.num_kv_heads, src.spec.head_dim_)
    toks, _, _ = generate(model, torch.tensor([prompt]), 10, cache)
    assert toks == hf_generate(folder, prompt, 10)


def test_training_past_a_sliding_window_is_refused(ckpts, tmp_path):
    from shardlab.runtime.train import TrainRequest, prepare

    folder = _edited(ckpts["mistral"], tmp_path / "win", sliding_window=8)
    with pytest.raises(ShardlabError, match="exceeds mistral's sliding window|exceeds win's sliding window"):
        prepare(TrainRequest(strategy="ddp", nproc=1, model=str(folder), seq_len=16))
