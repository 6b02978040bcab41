"""`shardlab shard-check`: PyTorch's real FSDP2/TP shards on a fake process group vs the memory model, byte for
byte. Every rank a check plays runs in its own interpreter (a 2-D fake mesh cannot be re-initialised)."""

import json

import pytest

from conftest import cli_main, run_cli

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")  # torch.testing._internal (FakeStore) imports it

import shardlab.runtime.shard_check as sc  # noqa: E402


def test_ranges_and_coords():
    assert sc._ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8" and sc._ranges([3]) == "3"
    assert sc.coords(13, 4) == {"dp": 3, "tp": 1}  # tp fastest, as shardlab.layout's rank grid


def test_compare_reports_shape_bytes_and_missing_tensors():
    pred = {"a": {"alloc_shape": [4, 2], "alloc_bytes": 16}, "b": {"alloc_shape": [3], "alloc_bytes": 6}}
    meas = {"a": {"alloc_shape": [4, 2], "alloc_bytes": 16, "local_shape": [3, 2], "placements": "S(0)"},
            "c": {"alloc_shape": [1], "alloc_bytes": 2, "local_shape": [1], "placements": "plain"}}
    bad = {m["tensor"]: m for m in sc.compare(pred, meas)}
    assert set(bad) == {"b", "c"} and bad["b"]["measured_bytes"] is None and bad["c"]["predicted_bytes"] is None
    meas["b"] = {"alloc_shape": [3], "alloc_bytes": 12, "local_shape": [3], "placements": "plain"}  # fp32 vs bf16
    del meas["c"]
    assert [m["tensor"] for m in sc.compare(pred, meas)] == ["b"]


def test_derivation_errors_flag_ranks_whose_real_shards_differ():
    classes = [{"ranks": [0, 1], "local_shapes": {"w": [2, 4]}}]
    runs = {0: {"params": {"w": {"local_shape": [2, 4]}}}, 1: {"params": {"w": {"local_shape": [1, 4]}}}}
    errs = sc._derivation_errors(runs, classes, [0, 0])
    assert errs == [{"rank": 1, "tensor": "w", "derived": [2, 4], "executed": [1, 4]}]


ODD = """models:
  odd-vocab:
    family: llama
    hidden_size: 64
    num_layers: 2
    num_heads: 4
    num_kv_heads: 2
    ffn_hidden_size: 160
    vocab_size: 257
    max_seq_len: 128
    source: test model, vocabulary not divisible by tp
"""


@pytest.mark.slow
def test_uneven_tp_and_fsdp_every_rank_exact(tmp_path):
    # vocabulary 257 over tp 2: 129 and 128 rows (torch.chunk), then FSDP over dp 2: 65 (padded) or 64 rows
    (tmp_path / "odd.yaml").write_text(ODD)
    r = run_cli("shard-check", "odd-vocab", "--catalog", str(tmp_path / "odd.yaml"), "--dp", "2", "--tp", "2",
                "--dtype", "fp32", "--json")
    assert r.returncode == 0, r.stderr + r.stdout
    doc = json.loads(r.stdout)
    assert doc["exact"] and not doc["mismatches"] and doc["memory_model_consistent"]
    assert sorted(sum((c["ranks"] for c in doc["classes"]), [])) == [0, 1, 2, 3]
    by_rank = {r: c for c in doc["classes"] for r in c["ranks"]}
    assert by_rank[1]["measured_bytes"] == by_rank[0]["measured_bytes"] - 64 * 4 * 2  # one row less, embedding + head
    assert doc["memory_model_bytes_per_rank"] == max(c["predicted_bytes"] for c in doc["classes"])  # the worst rank
    assert set(doc["executed_ranks"]) >= {c["ranks"][0] for c in doc["classes"]}  # one real run per shard class


@pytest.mark.slow
def test_llama_3_1_70b_dp8_tp8_on_64_ranks_exact():
    r = run_cli("shard-check", "llama-3.1-70b", "--gpus", "64", "--dp", "8", "--tp", "8", "--json")
    assert r.returncode == 0, r.stderr + r.stdout
    doc = json.loads(r.stdout)
    assert doc["world_size"] == 64 and doc["layout"] == {"dp": 8, "tp": 8, "zero": 3} and doc["exact"]
    assert sum(len(c["ranks"]) for c in doc["classes"]) == 64
    assert all(c["tensors"] == 723 for c in doc["classes"])  # 80 blocks x 9 + embedding, norm, head
    # about 70.6e9 / 64 parameters per rank, bf16
    assert 2.1e9 < doc["memory_model_bytes_per_rank"] < 2.3e9


def test_a_difference_fails_loudly_with_the_tensor(monkeypatch):
    """The host logic on canned rank results (no subprocess): one measured tensor a row short -> exit 1, named."""

    def fake_run(model, catalog, dp, tp, zero, rank, dtype, derive, timeout_s):
        spec = sc.resolve_spec(model, catalog)
        from shardlab.layout import Layout

        params = {n: {**p, "local_shape": p["alloc_shape"], "placements": "plain", "fsdp": False}
                  for n, p in sc.predicted(spec, Layout(dp=dp, tp=tp, zero=zero), 4).items()}
        w = params["layers.1.mlp.w2.weight"]
        w["alloc_shape"] = w["local_shape"] = [w["alloc_shape"][0] - 1, *w["alloc_shape"][1:]]
        w["alloc_bytes"] -= w["alloc_shape"][1] * 4
        doc = {"rank": rank, "world_size": dp * tp, "params": params}
        if derive:
            doc.update(classes=[{"ranks": list(range(dp * tp)), "local_shapes": {}}], rank_class=[0] * dp * tp)
        return doc

    monkeypatch.setattr(sc, "run_rank", fake_run)
    code, out, err = cli_main("shard-check", "tiny", "--tp", "2", "--dtype", "fp32")
    assert code == 1, err
    assert "MISMATCH class 0 (rank 0) layers.1.mlp.w2.weight" in out and "result: MISMATCH" in out
    code, out, err = cli_main("shard-check", "tiny", "--tp", "2", "--dtype", "fp32", "--json")
    doc = json.loads(out)
    assert code == 1 and not doc["exact"] and [m["tensor"] for m in doc["mismatches"]] == ["layers.1.mlp.w2.weight"]
    m = doc["mismatches"][0]
    assert m["predicted_shape"] == [64, 96] and m["measured_shape"] == [63, 96]  # (h, f/tp): one row short
    assert m["predicted_bytes"] - m["measured_bytes"] == 96 * 4


@pytest.mark.parametrize("args,words", [
    (["no-such-model", "--fsdp", "4"], "unknown model"),
    (["tiny", "--fsdp", "4", "--dp", "2"], "disagree"),
    (["tiny", "--fsdp", "2", "--zero", "0"], "--dp 2 --zero 0"),
    (["tiny", "--world-size", "6", "--tp", "4"], "not divisible"),
    (["tiny", "--fsdp", "2", "--ranks", "5"], "ranks run from 0 to 1"),
    (["tiny", "--fsdp", "2", "--ranks", "x"], "comma list"),
    (["tiny", "--tp", "3"], "--tp 3"),
    (["deepseek-v3", "--fsdp", "8"], "Latent Attention"),
])
def test_bad_input_exit_2(args, words):
    code, _, err = cli_main("shard-check", *args)
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
