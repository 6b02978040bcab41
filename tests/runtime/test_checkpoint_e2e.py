"""Checkpoints end to end through the CLI and torchrun: GPT-2's vocabulary and Qwen3 under TP 2 against transformers'
generate, a pipeline, fine-tuning under FSDP from transformers' step-0 loss, and one-line refusals."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).parent))
from ckpt_fixtures import build  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e-ckpt")
    return {f: build(f, root / f) for f in ("gpt2", "qwen3", "llama")}


def shardlab(*args, timeout=240):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "shardlab", *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def run_json(*args):
    r = shardlab(*args, "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_gpt2_vocabulary_tp2_matches_transformers_with_padding_and_half_the_bytes_each(ckpts):
    d = run_json("run", "infer", "--model", str(ckpts["gpt2"]), "--tp", "2", "--prompt-ids", "50256,11,464,2068",
                 "--max-new-tokens", "6", "--check-parity")
    assert d["matches_transformers"] is True and d["generated_token_ids"] == d["transformers_token_ids"]
    assert d["vocab"]["padded_vocab_size"] == 50258 and d["vocab"]["padding_rows"] == 1
    assert d["memory_exact"] and d["ranks_agree"]
    ck = d["checkpoint"]
    assert ck["family"] == "gpt2" and ck["dtypes"] == ["F32"]
    for r in ck["bytes_read_per_rank"]:
        assert 0.49 < r / ck["checkpoint_bytes"] < 0.52       # each reads its half (norms, biases, positions twice)
    for r in d["ranks"]:
        kv = r["kv_blocks"]
        assert kv["bytes_per_block"] == d["predicted"]["kv_blocks"]["bytes_per_block"]
        assert r["kv_cache_bytes"] == d["predicted"]["kv_blocks"]["blocks"] * kv["bytes_per_block"]


def test_qwen3_tp2_and_a_pipeline_match_transformers(ckpts):
    d = run_json("run", "infer", "--model", str(ckpts["qwen3"]), "--tp", "2", "--prompt-ids", "9,8,7,6,5",
                 "--max-new-tokens", "6", "--check-parity")
    assert d["matches_transformers"] is True and d["memory_exact"]
    p = run_json("run", "infer", "--model", str(ckpts["llama"]), "--tp", "1", "--pp", "2", "--prompt-ids", "1,2,3",
                 "--max-new-tokens", "5", "--check-parity", "--strategy", "tp")
    assert p["matches_transformers"] is True and p["memory_exact"] and p["pp"] == 2
    assert [r["stage"] for r in p["ranks"]] == [0, 1]
    reads = p["checkpoint"]["bytes_read_per_rank"]
    assert abs(sum(reads) - p["checkpoint"]["checkpoint_bytes"]) == 0     # untied: each stage reads its own tensors


def test_fsdp_fine_tuning_starts_at_transformers_loss(ckpts):
    d = run_json("run", "train", "--model", str(ckpts["llama"]), "--strategy", "fsdp", "--nproc-per-node", "2", "--steps", "2",
                 "--global-batch", "4", "--seq-len", "16", "--check-parity")
    par = d["parity"]
    assert par["ok"] and par["transformers"]["ok"] and par["transformers"]["abs_err"] <= 1e-5
    assert d["memory_states_exact"] and d["checkpoint"]["family"] == "llama"
    assert d["losses"][1] < d["losses"][0]                   # it trains from there


def test_bad_checkpoints_and_ids_are_one_line_exit_2(ckpts, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(ckpts["qwen3"], bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["num_hidden_layers"] = 3
    (bad / "config.json").write_text(json.dumps(cfg))
    for args, msg in ((["run", "infer", "--model", str(bad), "--tp", "1"], "has no tensor 'model.layers.2."),
                      (["run", "train", "--model", str(bad), "--strategy", "ddp", "--nproc-per-node", "1"], "has no tensor"),
                      (["run", "infer", "--model", str(ckpts["qwen3"]), "--tp", "1", "--prompt-ids", "5,1001"],
                       "outside the vocabulary"),
                      (["run", "infer", "--check-parity"], "compares with transformers on a checkpoint"),
                      (["run", "infer", "--model", str(ckpts["qwen3"]), "--tp", "3"], "must divide qwen3's 4 heads"),
                      (["run", "infer", "--model", str(ckpts["qwen3"]), "--tp", "1", "--prompt-ids", "1,x"],
                       "token ids are whole numbers")):
        r = shardlab(*args)
        err = r.stderr.strip()
        assert r.returncode == 2 and "\n" not in err and msg in err, (args, err)
        assert "Traceback" not in r.stderr


def test_readme_gpt2_example(tmp_path):
    """The README's checkpoint example: GPT-2's published shapes, TP 2, the lines it quotes."""
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, str(root / "examples" / "make_checkpoint.py"), str(root / "tests" / "data" / "gpt2.json"),
                        str(tmp_path / "gpt2")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = shardlab("run", "infer", "--model", str(tmp_path / "gpt2"), "--tp", "2", "--prompt-ids", "464,2068,7586,21831",
                   "--max-new-tokens", "8", "--check-parity")
    assert out.returncode == 0, out.stderr[-2000:]
    readme = (root / "README.md").read_text(encoding="utf-8")
    block = readme.split("$ shardlab run infer --model gpt2 --tp 2", 1)[1].split("```", 1)[0]
    got = out.stdout
    for line in block.splitlines():
        if line.startswith(("weights from checkpoint", "vocabulary ", "identical to transformers")):  # tokens: init-dependent
            assert line.replace("checkpoint gpt2 ", f"checkpoint {tmp_path / 'gpt2'} ") in got, line
        if line.startswith(("   0 ", "   1 ")):                   # the byte columns (times vary)
            assert " ".join(line.split()[:5]) in {" ".join(g.split()[:5]) for g in got.splitlines()}, line


def test_random_weights_with_a_vocabulary_tp_does_not_divide(ckpts):
    """A config with 1,001 tokens (random weights) under TP 2: padded, identical to TP 1; training parity holds."""
    d = run_json("run", "infer", "--model", str(ckpts["qwen3"] / "config.json"), "--tp", "2", "--max-new-tokens", "4")
    assert d["matches_tp1"] is True and d["memory_exact"] and d["vocab"]["padded_vocab_size"] == 1002
    t = run_json("run", "train", "--model", str(ckpts["gpt2"] / "config.json"), "--strategy", "tp", "--nproc-per-node", "2",
                 "--steps", "1", "--global-batch", "2", "--seq-len", "8", "--check-parity")
    assert t["parity"]["ok"] and t["memory_states_exact"] and t["vocab"]["padded_vocab_size"] == 50258


def test_neox_and_moe_family_classes(tmp_path):
    """GPT-NeoX (interleaved qkv, partial rotary, parallel residual) under Megatron TP 2 against transformers, and
    Qwen3-MoE fine-tuned under ddp+ep (each rank reads only its experts) from transformers' loss."""
    neox, moe = build("gpt_neox", tmp_path / "neox"), build("qwen3_moe", tmp_path / "moe")
    d = run_json("run", "infer", "--model", str(neox), "--tp", "2", "--prompt-ids", "3,4,5", "--max-new-tokens", "5",
                 "--check-parity")
    assert d["matches_transformers"] is True and d["memory_exact"]
    t = run_json("run", "train", "--model", str(moe), "--strategy", "ddp+ep", "--nproc-per-node", "2", "--steps", "1",
                 "--global-batch", "2", "--seq-len", "8", "--check-parity")
    assert t["parity"]["ok"] and t["parity"]["transformers"]["ok"] and t["memory_states_exact"]
