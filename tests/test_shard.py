"""Tensor-parallel sharding report: per-rank shapes (Megatron column/row/vocabulary splits), collectives per
block, and the divisibility rules that cap T."""

import pytest

from shardlab.catalog import get_catalog
from shardlab.errors import ShardlabError
from shardlab.layout import Layout
from shardlab.layout_checks import validate
from shardlab.shard import block_collectives, block_mermaid, shard_report, valid_tp

CAT = get_catalog()


def rows_by_name(doc):
    return {r["name"]: r for r in doc["rows"]}


def test_llama_3_1_8b_tp4_shapes_by_hand():
    doc = shard_report(CAT.model("llama-3.1-8b"), 4, seq_len=4096)
    r = rows_by_name(doc)
    # h = 4096, 32 heads × 128, 8 KV heads, FFN 14336, V = 128256
    assert r["layers.0.attention.wq.weight"]["local_shape"] == [1024, 4096]          # 8 of 32 heads
    assert r["layers.0.attention.wk.weight"]["local_shape"] == [256, 4096]           # 2 of 8 KV heads
    assert r["layers.0.attention.wo.weight"]["local_shape"] == [4096, 1024]          # row-parallel
    assert r["layers.0.mlp.w1.weight"]["local_shape"] == [3584, 4096]
    assert r["layers.0.mlp.w2.weight"]["local_shape"] == [4096, 3584]
    assert r["tok_embeddings.weight"]["local_shape"] == [32064, 4096]
    assert r["layers.0.attention.wq.weight"]["split"] == "column"
    assert r["layers.0.attention.wo.weight"]["split"] == "row"
    assert r["output.weight"]["split"] == "vocabulary"
    assert r["layers.0.attention_norm.weight"]["split"] == "replicated"
    blk = doc["blocks"]["0"]
    norms = 2 * 4096 * 2
    assert blk["full_bytes"] == 2 * (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096) + norms
    assert blk["rank_bytes"] == (blk["full_bytes"] - norms) // 4 + norms
    assert doc["valid_tp"] == [1, 2, 4, 8, 16, 32] and doc["max_tp"] == 32


def test_vocabulary_padding_and_kv_replication_are_named():
    gpt2 = shard_report(CAT.model("gpt2"), 4, seq_len=1024)
    voc = [c for c in gpt2["constraints"] if c["what"] == "vocabulary"][0]
    assert not voc["ok"] and not voc["hard"] and "50260" in voc["note"]                 # 50257 → 4 × 12565
    assert rows_by_name(gpt2)["tok_embeddings.weight"]["local_shape"] == [12565, 768]
    mix = shard_report(CAT.model("mixtral-8x7b"), 16, seq_len=4096)
    kv = [c for c in mix["constraints"] if c["what"] == "KV heads"][0]
    assert kv["ok"] and "replicated on 2 ranks" in kv["note"]
    assert "KV heads replicated" in rows_by_name(mix)["layers.0.attention.wk.weight"]["split"]
    assert rows_by_name(mix)["layers.0.moe.experts.w1"]["local_shape"] == [8, 14336 // 16, 4096]


def test_valid_tp_agrees_with_layout_validation():
    for name in ("llama-3.1-8b", "gpt2", "qwen2.5-7b", "mixtral-8x7b", "deepseek-v3", "llama-2-7b"):
        spec = CAT.model(name)
        ok = set(valid_tp(spec, 64))
        for t in range(1, 65):
            try:
                validate(Layout(tp=t), spec)
                valid = True
            except ShardlabError:
                valid = False
            assert valid == (t in ok), (name, t)
    assert valid_tp(CAT.model("gpt2")) == [1, 2, 3, 4, 6, 12]
    assert valid_tp(CAT.model("qwen2.5-7b")) == [1, 2, 4]          # 28 heads, 4 KV heads, FFN 18944


def test_bad_tp_names_the_rule_and_the_valid_values():
    with pytest.raises(ShardlabError, match=r"attention heads.*valid T: 1, 2, 3, 4, 6, 12"):
        shard_report(CAT.model("gpt2"), 5, seq_len=1024)
    with pytest.raises(ShardlabError, match="KV heads"):
        shard_report(CAT.model("qwen2.5-7b"), 7, seq_len=1024)


def test_collectives_per_block():
    spec = CAT.model("llama-2-7b")
    tp = block_collectives(spec, 8, seq_len=2048, micro_batch=2, sequence_parallel=False)
    assert [(c["phase"], c["op"]) for c in tp] == [("forward", "all-reduce")] * 2 + [("backward", "all-reduce")] * 2
    assert all(c["bytes"] == 2 * 2048 * 4096 * 2 for c in tp)
    sp = block_collectives(spec, 8, seq_len=2048, micro_batch=2, sequence_parallel=True)
    assert sorted(c["op"] for c in sp) == ["all-gather"] * 4 + ["reduce-scatter"] * 4
    assert block_collectives(spec, 1, seq_len=2048, micro_batch=1, sequence_parallel=False) == []


def test_mermaid_diagram_is_well_formed():
    for name, t, sp in (("llama-3.1-8b", 4, False), ("deepseek-v3", 8, True), ("gpt2", 2, False)):
        text = block_mermaid(CAT.model(name), t, seq_len=1024, sequence_parallel=sp)
        lines = text.splitlines()
        assert lines[0] == "---" and lines[1].startswith("title:") and "flowchart TD" in lines
        assert sum(ln.strip().startswith("subgraph") for ln in lines) == sum(ln.strip() == "end" for ln in lines) == 2
        assert text.count('"') % 2 == 0
        assert ("reduce-scatter" in text) == sp and ("all-reduce" in text) == (not sp)
    text = block_mermaid(CAT.model("llama-3.1-8b"), 4, seq_len=4096)
    assert "4096 → 1024 per rank" in text and "8 of 32 heads" in text and "3584" in text


def test_the_block_diagram_divides_experts_by_ep():
    text = block_mermaid(CAT.model("mixtral-8x7b"), 1, seq_len=4096, ep=8)
    assert "1 of 8 experts (EP 8) per rank" in text and "1 expert on each of 8" in text
    assert "8 experts per rank" not in text
    assert "8 experts per rank" in block_mermaid(CAT.model("mixtral-8x7b"), 1, seq_len=4096)
