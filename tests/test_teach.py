"""shardlab explain: every topic builds, its numbers are the core's, bad input is one line; plan --explain; numerics."""

import json
import os
import subprocess
import sys

import pytest

from conftest import cli_main

from shardlab.teach.registry import explain, topics


@pytest.mark.parametrize("name", list(topics()))
def test_every_topic_derives_with_defaults_and_prints_one_json_document(name):
    code, out, err = cli_main("explain", name, "--json")
    assert code == 0, err
    doc = json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))   # NaN/Infinity are not JSON
    assert doc["derivation"] and doc["plain"] and doc["question"]
    for c in doc["commands"]:               # every suggested command names a real shardlab command
        assert c.split()[0] in ("memory", "estimate", "comm", "shard", "pipeline", "plan", "cost", "guard", "run",
                                "links", "explain", "models")


def test_zero_reproduces_the_papers_worked_example_and_matches_memory():
    ex = explain("zero", ["params=7.5e9", "gpus=64"])
    per = ex.numbers["per_stage_bytes"]
    assert [round(x / 1e9, 2) for x in per] == [120.0, 31.41, 16.64, 1.88]   # ZeRO paper §5: 120, 31.4, 16.6, 1.9 GB
    code, out, _ = cli_main("memory", "--params", "7.5e9", "--dp", "64", "--zero", "2", "--framework", "deepspeed", "--json")
    assert json.loads(out)["per_gpu"]["model_states"] == per[2]
    assert ex.numbers["traffic_bytes"] == pytest.approx(1.5 * explain("zero-1").numbers["traffic_bytes"])


def test_numbers_come_from_the_core_functions():
    from shardlab.comm.collectives import collective_time
    from shardlab.catalog import get_catalog
    from shardlab.memory.inference import kv_cache_bytes_per_token
    from shardlab.pipeline import min_microbatches
    from shardlab.pipeline.closed_form import bubble_fraction_closed_form

    b = explain("pipeline-bubble", ["p=8", "m=32"]).numbers
    assert b["bubble_closed_form"] == bubble_fraction_closed_form("1f1b", 8, 32) == pytest.approx(7 / 39)
    assert b["bubble_simulated"] == pytest.approx(7 / 39) and b["min_microbatches"] == min_microbatches("1f1b", 8, 0.1) == 63
    cat = get_catalog()
    r = explain("ring-all-reduce", ["size=1GiB", "ranks=16", "link=ib-ndr"]).numbers
    assert r["time_s"] == collective_time("all-reduce", 2**30, 16, cat.link("ib-ndr"), "ring").time_s
    kv = explain("kv-cache", ["model=llama-3.1-8b", "tp=2", "gpu=h100-sxm"]).numbers
    assert kv["kv_bytes_per_token"] == kv_cache_bytes_per_token(cat.model("llama-3.1-8b"), 2)[0] == 65536
    assert explain("bytes-per-param", ["params=7B", "precision=fp32"]).numbers["model_states_bytes"] == 112 * 10**9
    assert explain("bytes-per-param", ["params=500K"]).numbers["model_states_bytes"] == 8_000_000


def test_derivations_agree_with_their_own_printed_inputs():
    """A learner redoing the arithmetic from the printed lines gets the printed answers."""
    two = explain("two-pressures").numbers
    assert two["tokens_per_s"] == pytest.approx(two["model_flops_per_s"] / two["model_flops_per_token"])
    assert two["one_gpu_days"] == pytest.approx(two["model_flops"] / two["model_flops_per_s"] / 86400)
    assert two["model_flops"] > two["flops"]           # attention and logits on top of 6Ψ (minus the embedding)
    ddp = explain("ddp-buckets").numbers
    last = ddp["all_reduce_s"] / ddp["buckets"]
    assert ddp["bucketed_exposed_s"] == pytest.approx(max(last, ddp["all_reduce_s"] - ddp["overlap_efficiency"] * ddp["backward_s"]))
    assert ddp["bucketed_exposed_s"] >= last > 0        # the last bucket is never hidden
    # the step model's line: its exposed time is its own all-reduce minus η × the window it prints
    assert ddp["exposed_s"] == pytest.approx(ddp["whole_all_reduce_s"] - ddp["overlap_efficiency"] * ddp["backward_s"])
    myth = explain("design-myths").numbers
    code, out, _ = cli_main("plan", "llama-3.1-70b", "--gpus", "64", "--top", "1", "--json")
    assert code == 0 and json.loads(out)["plans"][0]["step_time_s"] == pytest.approx(myth["best_step_time_s"])


def test_explanations_name_their_sources_and_the_upstream_code():
    doc = explain("tp-mlp").to_dict()
    assert any("arXiv 1909.08053" in s["citation"] for s in doc["sources"])
    paths = {c["symbol"]: c["path"] for c in doc["code"]}
    assert paths["ColumnParallelLinear"] == "megatron/core/tensor_parallel/layers.py"
    assert any("runtime/parallel/megatron.py" in c["shardlab"] for c in doc["code"])
    src = explain("source-map").to_dict()["code"]
    assert any(c["symbol"].startswith("fully_shard") and c["path"].startswith("torch/distributed/fsdp/") for c in src)


def test_decode_is_latency_bound_and_over_40_percent_on_10gbe():
    n = explain("decode-vs-prefill").numbers
    assert n["ethernet-10g"]["decode_regime"] == "latency" and n["ethernet-10g"]["prefill_regime"] == "bandwidth"
    assert n["ethernet-10g"]["decode_comm_fraction"] > 0.4 > n["nvlink4"]["decode_comm_fraction"]


def test_bf16_keeps_what_fp16_loses():
    n = explain("bf16-vs-fp16", ["grad=1e-8"]).numbers
    assert n["grad_fp16"] == "zero" and n["grad_bf16"] == "normal" and n["loss_scale_needed"] == 2**13


def test_loss_scale_verdict_tells_subnormal_from_zero():
    """grad 1e-8, largest 10: S = 2^13 makes 1e-8 normal but overflows 10 (81,920 > 65,504); S = 2^12 keeps both
    finite and non-zero (4.1e-5 is a subnormal: 687 × 2^-24, 10 significant bits). fp16 rounds to zero only below
    half its smallest subnormal, 2^-25 ≈ 3e-08."""
    ex = explain("bf16-vs-fp16", ["grad=1e-8", "max_grad=10"])
    n, text = ex.numbers, " ".join(ex.derivation) + " " + ex.plain
    assert (n["loss_scale_needed"], n["loss_scale_nonzero"], n["largest_safe_scale"]) == (2**13, 2**3, 2**12)
    assert n["significant_bits_at_safe_scale"] == 10
    assert "no single scale keeps both normal" in text and "NO single scale fits both" not in text
    assert "below about 3e-08" in text
    worst = explain("bf16-vs-fp16", ["grad=1e-12", "max_grad=10"]).derivation
    assert any("NO single scale fits both" in line for line in worst)
    assert "a scale that keeps both normal exists" in " ".join(explain("bf16-vs-fp16", ["grad=1e-6", "max_grad=1"]).derivation)


@pytest.mark.parametrize("args,msg", [
    (["explain"], "no topic"),
    (["explain", "zro"], "did you mean zero"),
    (["explain", "zero", "parms=3"], "did you mean params"),
    (["explain", "zero", "gpus=x"], "not a whole number"),
    (["explain", "zero", "stage=5"], "choose one of 0, 1, 2, 3"),
    (["explain", "zero", "64"], "key=value"),
    (["explain", "kv-cache", "model=nope"], "unknown model"),
    (["explain", "stragglers", "slow_stage=9"], "outside the pipeline"),
    (["explain", "ring-all-reduce", "ranks=1"], "at least 2"),
    (["explain", "zero", "--list"], "not both"),
    (["explain", "decode-vs-prefill", "tp=3"], "tp=3 does not divide"),
    (["explain", "sequence-parallel", "tp=64"], "tp=64 does not divide"),
    (["explain", "kv-cache", "seq=8192"], "4,096 positions"),
    (["explain", "fsdp-wrap", "seq=200000"], "131,072 positions"),
    (["explain", "pp-inference", "pp=3"], "power of two"),
    (["explain", "ring-all-reduce", "size=0"], "at least 1"),
])
def test_bad_input_is_one_line_exit_2(args, msg):
    code, out, err = cli_main(*args)
    assert code == 2 and msg in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_list_names_every_topic_with_keys_and_items():
    code, out, _ = cli_main("explain", "--list", "--json")
    doc = json.loads(out)
    ids = {t["id"] for t in doc["topics"]}
    for want in ("two-pressures", "bytes-per-param", "zero", "zero-3", "fsdp-wrap", "ring-all-reduce", "tree-all-reduce",
                 "ddp-buckets", "tp-mlp", "sequence-parallel", "pipeline-bubble", "1f1b-memory", "interleaving",
                 "activation-checkpointing", "bf16-vs-fp16", "kv-cache", "decode-vs-prefill", "tp-in-node",
                 "tp-vs-replicas", "stragglers"):
        assert want in ids
    assert all(t["items"] for t in doc["topics"])


def test_plan_explain_says_the_plan_out_loud_from_its_own_numbers():
    code, out, _ = cli_main("plan", "llama-3.1-70b", "--gpus", "64", "--explain", "--json")
    doc = json.loads(out)
    para, best = doc["explanation"], doc["plans"][0]
    assert f"{best['step_time_s']:.2f} s" in para and f"Tensor parallelism of {best['layout']['tp']}" in para
    assert "runner-up" in para
    code, out, _ = cli_main("plan", "llama-3.1-8b", "--inference", "--gpus", "8", "--batch", "32", "--explain")
    assert code == 0 and "said out loud:" in out and "tokens/s" in out
    code, out, _ = cli_main("plan", "llama-3.1-70b", "--gpus", "64", "--json")
    assert "explanation" not in json.loads(out)


def test_float_formats_match_ieee_and_bfloat16():
    from shardlab.numerics import FORMATS, classify, largest_safe_scale, loss_scale_for

    fp16, bf16, fp32 = FORMATS["fp16"], FORMATS["bf16"], FORMATS["fp32"]
    assert fp16.max_value == 65504 and fp16.min_normal == 2**-14 and fp16.min_subnormal == 2**-24 and fp16.epsilon == 2**-10
    assert bf16.min_normal == fp32.min_normal == 2**-126 and bf16.epsilon == 2**-7
    assert bf16.max_value == pytest.approx(3.3895e38, rel=1e-4)
    assert [classify(x, fp16) for x in (1e-8, 1e-6, 1.0, 1e5)] == ["zero", "subnormal", "normal", "overflow"]
    assert loss_scale_for(1e-8, fp16) == 2**13 and largest_safe_scale(10.0, fp16) == 2**12


def test_every_suggested_command_runs_as_written():
    seen = set()
    for name in topics():
        for c in explain(name).commands:
            if c.split()[0] in ("run", "guard") or c in seen:   # torch runs and the guard are tested elsewhere
                continue
            seen.add(c)
            code, out, err = cli_main(*c.split())
            assert code == 0, f"{name}: `shardlab {c}` -> {err}"
    assert len(seen) > 20


@pytest.mark.parametrize("topic", ["tp-mlp", "source-map"])
def test_a_suggested_run_train_steps_1_says_which_steps_are_timed_and_cites_the_practice(topic):
    """`run train --steps 1` runs step 0 alone (steps count from 0): the note says so, says the step time is the
    median of steps 2 and later, and names the warm-up practice with a source that can be checked."""
    import importlib.util
    from pathlib import Path

    ex = explain(topic)
    assert any(c.startswith("run train") and c.endswith("--steps 1") for c in ex.commands)
    note = next(n for n in ex.notes if n.startswith("which steps `run train` times"))
    assert "step 0 carries the memory tracker and the f/g counter" in note
    assert "median of steps 2 and later" in note and "`--steps 1` runs step 0 alone" in note
    assert "--steps 3 or more" in note and "torch/utils/benchmark/utils/timer.py: Timer.timeit" in note
    if topic == "tp-mlp":
        doc = ex.to_dict()
        assert any(s["id"] == "shardlab-runtime" for s in doc["sources"])
        assert any(c["id"] == "pt-timer" for c in doc["code"])
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:                  # the cited file really warms up before it measures
        src = (Path(spec.origin).parent / "utils" / "benchmark" / "utils" / "timer.py").read_text()
        body = src[src.index("    def timeit("):src.index("    def repeat(")]
        assert "# Warmup" in body


def test_bf16_vs_fp16_attributes_each_claim_to_its_paper():
    ex = explain("bf16-vs-fp16")
    line = lambda start: next(x for x in ex.derivation if x.startswith(start))  # noqa: E731
    assert "[Micikevicius et al. 2018 §3.2]" in line("loss scaling for fp16")
    assert "[Kalamkar et al. 2019]" in line("bf16 = 8 exponent") and "[Kalamkar et al. 2019]" in line("bf16 needs no scaler")
    assert "master copy of the weights and fp32 accumulation absorb [Micikevicius et al. 2018 §3.1, §3.3]" in \
        line("bf16 needs no scaler")
    assert "IEEE 754 binary16" in line("fp16 (IEEE 754 binary16)")
    src = {s["id"]: s for s in ex.to_dict()["sources"]}
    assert list(src) == ["mixed-precision", "bf16", "ieee754"]
    assert "arXiv 1710.03740" in src["mixed-precision"]["citation"] and "arXiv 1905.12322" in src["bf16"]["citation"]
    used = src["mixed-precision"]["used_for"]
    assert "master copy of the weights (§3.1)" in used and "loss scaling" in used and "(§3.2)" in used
    assert "no loss scaling" in src["bf16"]["used_for"]
    # FP8 (Micikevicius et al. 2022, arXiv 2209.05433) is cited only by a text that mentions FP8: this one does not
    text = json.dumps(ex.to_dict()).lower()
    assert "fp8" not in text and "2209.05433" not in text


def test_reading_notes_list_each_source_once_in_the_order_topics_first_cite_it():
    from shardlab.teach.explanation import render
    from shardlab.teach.sources import PAPERS

    ex = explain("reading-notes")
    assert len(ex.sources) == len(set(ex.sources)) == len(PAPERS)
    first = []                                             # first appearance, topics in teaching order
    for name, t in topics().items():
        if not t.presets and name not in ("reading-notes", "source-map"):
            first += [s for s in explain(name).sources if s not in first]
    assert ex.sources[:len(first)] == first and ex.numbers["cited"] == first
    assert ex.sources[len(first):] == [k for k in PAPERS if k not in first]
    text = render(ex, width=10_000)                        # unwrapped: a citation is one run of text
    for k, p in PAPERS.items():                            # each full citation printed once, in the sources
        assert text.count(f"- {p.citation}: {p.used_for}") == 1 and text.count(p.used_for) == 1, k
    assert len(ex.derivation) == len(PAPERS)               # one line per paper: the topics that use it
    assert ex.derivation[0].startswith("Rajbhandari et al. 2019 → two-pressures, bytes-per-param, zero")
    assert sum('Chen et al. 2016, "' in line for line in ex.derivation) == 2   # two Chen et al. 2016, told apart


def test_reading_notes_are_the_same_under_any_hash_seed(tmp_path):
    outs = []
    for seed in ("0", "1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "SHARDLAB_LEDGER": str(tmp_path / "l.sqlite"),
               "XDG_DATA_HOME": str(tmp_path)}
        runs = [subprocess.run([sys.executable, "-m", "shardlab", "explain", "reading-notes", *extra], capture_output=True,
                               text=True, timeout=300, env=env) for extra in ([], ["--json"])]
        assert all(r.returncode == 0 for r in runs), runs[0].stderr + runs[1].stderr
        outs.append((runs[0].stdout, runs[1].stdout))
    assert outs[0] == outs[1] == outs[2]
    assert [s["id"] for s in json.loads(outs[0][1])["sources"]] == explain("reading-notes").sources


def _guard(cmd: str, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "SHARDLAB_LEDGER": str(tmp_path / "ledger.sqlite"), "XDG_DATA_HOME": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "shardlab", *cmd.split()], capture_output=True, text=True, timeout=120,
                          env=env, cwd=tmp_path)


@pytest.mark.parametrize("words", [[], ["hours=4", "budget=3"]])
def test_the_cost_topics_guard_command_reserves_the_cost_it_states(words, tmp_path):
    """The guard line of `explain cost` reserves set-up + work hours: the same dollars as the derivation."""
    from shardlab.cost.estimate import fmt_usd

    ex = explain("cost", words)
    v, usd = ex.inputs, ex.numbers["usd"]
    assert f"= {fmt_usd(usd)}" in ex.derivation[2]
    guard = next(c for c in ex.commands if c.startswith("guard "))
    assert f"--hours {v['hours']:g} --setup-hours {v['setup']:g}" in guard
    r = _guard(guard, tmp_path)
    if ex.numbers["within_budget"]:
        assert r.returncode == 0, r.stderr
        assert f"estimate {fmt_usd(usd)} for {v['setup']:g} h set-up + {v['hours']:g} h" in r.stderr
    else:                                                  # "`shardlab guard` would refuse to launch it"
        assert r.returncode == 3, r.stderr
        assert f"estimate {fmt_usd(usd)} including {v['setup']:g} h set-up" in r.stderr and "refused" in r.stderr


def test_the_budgets_topics_guard_command_reserves_run_1s_cost(tmp_path):
    ex = explain("budgets")
    first = ex.table[1][0]
    assert first[4] == "reserved, ran, charged"
    ledger = [n.split("`")[1::2] for n in ex.notes if "create the budgets first" in n][0]
    for c in ledger:                                       # the notes' two ledger commands, then the guard
        assert _guard(c.removeprefix("shardlab "), tmp_path).returncode == 0
    guard = next(c for c in ex.commands if c.startswith("guard ")).replace("python lab.py", "true")
    r = _guard(guard, tmp_path)
    v = ex.inputs
    assert r.returncode == 0, r.stderr
    assert f"estimate {first[3]} for {v['setup']:g} h set-up + {v['hours']:g} h" in r.stderr


def test_wording_follows_the_computed_regime_and_ratio():
    big = explain("decode-vs-prefill", ["batch=1024"])
    assert "bandwidth-bound" in big.derivation[1] and "latency-bound" not in big.derivation[1]
    assert not big.title.startswith("Decode is latency-bound")
    assert explain("decode-vs-prefill").title.startswith("Decode is latency-bound")
    ratio = explain("link-bandwidth", ["links=nvlink4,nvlink3"])
    assert "1.6× longer" in " ".join([ratio.question, *ratio.derivation, ratio.plain])



def test_budgets_takes_a_catalog_gpu():
    code, _, err = cli_main("explain", "budgets", "gpu=banana")
    assert code == 2 and "unknown GPU 'banana'" in err and len(err.strip().splitlines()) == 1
    assert "2 × h100-sxm at" in json.dumps(explain("budgets", ["gpu=H100-SXM"]).to_dict(), ensure_ascii=False)
