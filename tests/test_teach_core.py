"""The explain topics built on the merged core give the same numbers as the commands they point at:
fsdp-wrap (memory / comm plan / estimate --wrap), finetune-memory (memory --lora-rank --quantize-base nf4 and
--finetune-ladder), pp-inference and kv-cache (estimate --inference), stragglers (estimate --slow-rank)."""

import json

import pytest

from conftest import cli_main

from shardlab.teach.registry import explain


def _json(*args: str) -> dict:
    code, out, err = cli_main(*args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_fsdp_wrap_prices_each_policy_with_memory_comm_and_estimate():
    n = explain("fsdp-wrap", ["model=llama-3.1-8b", "gpus=8", "gpu=h100-sxm"]).numbers["policies"]
    assert list(n) == ["block", "4-blocks", "model"]
    base = ("llama-3.1-8b", "--gpus", "8", "--zero", "3", "--gpu", "h100-sxm", "--seq-len", "4096", "--global-batch", "8",
            "--framework", "pytorch-fsdp")
    for wrap, p in n.items():
        mem = _json("memory", *base, "--wrap", wrap)["per_gpu"]
        assert p["total_bytes"] == mem["total"] and p["fsdp_buffers_bytes"] == mem["other_breakdown"]["fsdp_buffers"]
        items = [i for i in _json("comm", "plan", *base, "--wrap", wrap)["items"] if i["axis"] == "FSDP"]
        assert p["calls_per_step"] == sum(i["calls_per_step"] for i in items)
        est = _json("estimate", *base, "--wrap", wrap)
        assert p["zero3_exposed_s"] == pytest.approx(est["breakdown"]["zero3_comm_s"])
        assert p["step_time_s"] == pytest.approx(est["step_time_s"])
    # what the policies must show: fewer, larger units -> fewer calls, a higher gathered peak, more exposed time
    b, g, m = n["block"], n["4-blocks"], n["model"]
    assert b["units"] == 33 and g["units"] == 9 and m["units"] == 1                  # 32 blocks (+ the root unit)
    assert b["calls_per_step"] > g["calls_per_step"] > m["calls_per_step"] == 2     # the whole model: no backward gather
    # forward gathers + reduce-scatters of every unit, backward gathers of all but the one forward ends with
    assert (b["calls_per_step"], g["calls_per_step"]) == (33 + 33 + 32, 9 + 9 + 8)
    assert b["unit_bytes"] < g["unit_bytes"] < m["unit_bytes"]
    # the largest unit of 'block' and '4-blocks' is the root (FSDP's root wrapper: embedding 128,256 × 4096, final norm
    # 4096, head 4096 × 128,256 = 1,050,677,248 parameters), 2 gathered + 1 reducing, 2 bytes each
    assert b["fsdp_buffers_bytes"] == g["fsdp_buffers_bytes"] == 3 * 2 * (2 * 128256 * 4096 + 4096)
    assert g["fsdp_buffers_bytes"] < m["fsdp_buffers_bytes"]
    assert b["zero3_exposed_s"] < g["zero3_exposed_s"] < m["zero3_exposed_s"]


def test_fsdp_wrap_refuses_more_blocks_than_the_model_has():
    code, _, err = cli_main("explain", "fsdp-wrap", "blocks=40")
    assert code == 2 and "has 32 blocks" in err and len(err.strip().splitlines()) == 1


def test_finetune_memory_equals_memory_with_the_recipe_and_the_ladder():
    ex = explain("finetune-memory", ["model=llama-2-7b", "gpu=rtx-4090", "seq=2048"]).numbers
    args = ("llama-2-7b", "--gpus", "1", "--gpu", "rtx-4090", "--seq-len", "2048", "--framework", "pytorch-fsdp")
    assert ex["full"]["total_bytes"] == _json("memory", *args)["per_gpu"]["total"]
    assert ex["lora"]["total_bytes"] == _json("memory", *args, "--lora-rank", "16")["per_gpu"]["total"]
    q = _json("memory", *args, "--lora-rank", "16", "--quantize-base", "nf4")
    assert ex["qlora"]["total_bytes"] == q["per_gpu"]["total"]
    assert ex["trainable_params"] == q["recipe"]["lora"]["trainable_params"]
    assert ex["nf4_bits_per_weight"] == pytest.approx(4 + 8 / 64 + 32 / (64 * 256))        # QLoRA §3
    assert not ex["full"]["fits"] and ex["qlora"]["fits"]
    ladder = _json("memory", "--finetune-ladder", "--gpu", "rtx-4090", "--seq-len", "2048", "--framework", "pytorch-fsdp")
    assert ex["largest_fitting"] == ladder["largest_fitting"]
    assert ex["qlora"]["total_bytes"] == next(r for r in ladder["rows"] if r["model"] == "llama-2-7b")["qlora"]
    assert ex["largest_fitting"]["qlora"] == "llama-3.1-8b"      # QLoRA on a 24 GB GPU stops near 7-8B


def test_pp_inference_grows_throughput_not_latency_and_starves_one_request():
    st = explain("pp-inference").numbers["stages"]
    pps = sorted(st)
    assert pps == [1, 2, 4, 8]
    tps = [st[p]["tokens_per_s"] for p in pps]
    tpot = [st[p]["decode_s_per_token"] for p in pps]
    alone = [st[p]["one_request_tokens_per_s"] for p in pps]
    assert all(b > a for a, b in zip(tps, tps[1:]))
    assert all(b >= a for a, b in zip(tpot, tpot[1:]))
    assert all(b < a for a, b in zip(alone, alone[1:]))   # one request: every extra stage costs, none helps
    est = _json("estimate", "llama-3.1-8b", "--inference", "--pp", "8", "--batch", "64", "--gpu", "h100-sxm")
    assert st[8]["tokens_per_s"] == pytest.approx(est["tokens_per_s"])


def test_pp_inference_one_request_pays_each_stages_step_and_send():
    """The single-request column is the serving model priced stage by stage: on one stage it is the estimator's
    static batch of one; each further stage adds the engine's per-step and per-sequence overheads (its own step)
    and one send, as the derivation prints, and the words say it falls."""
    from shardlab.catalog import get_catalog
    from shardlab.estimate.inference import static_batch
    from shardlab.serving.engines import get_engine
    from shardlab.teach.topics._common import cluster

    ex = explain("pp-inference")
    n, st = ex.numbers, ex.numbers["stages"]
    spec = get_catalog().model("llama-3.1-8b")
    _, one = static_batch(spec, cluster("h100-sxm", 1), tp=1, pp=1, in_flight=1, prompt_len=1024, output_len=256)
    assert st[1]["one_request_tokens_per_s"] == pytest.approx(one["output_tokens_per_s"], rel=1e-12)
    assert st[1]["one_request_s_per_token"] == pytest.approx(one["tpot_s"], rel=1e-12)
    vllm = get_engine("vllm")                                 # the default engine's fitted overheads, no new constant
    assert n["stage_overhead_s"] == pytest.approx((vllm.step_overhead_us + vllm.seq_overhead_us) * 1e-6)
    assert n["send_s"] > 0
    for p in (2, 4, 8):
        extra = (p - 1) * (n["stage_overhead_s"] + n["send_s"])
        assert st[p]["one_request_s_per_token"] == pytest.approx(st[1]["one_request_s_per_token"] + extra, rel=1e-9)
    a1, a8 = st[1]["one_request_tokens_per_s"], st[8]["one_request_tokens_per_s"]
    assert a8 < 0.97 * a1                                     # about 8% fewer on 8 stages of an H100
    assert f"throughput falls from {a1:,.0f} to {a8:,.0f} tokens/s" in ex.plain and "stays" not in ex.plain
    line = next(x for x in ex.derivation if x.startswith("low traffic"))
    assert f"{a1:,.0f} tokens/s on 1 stage, {a8:,.0f} on 8" in line and "7 × (" in line
    # the full pipeline's time per token: the cycle the derivation prints is the estimator's
    cycle = next(x for x in ex.derivation if "decode cycle is max(" in x)
    assert f"= {st[8]['decode_s_per_token'] * 1e3:.2f} ms at PP 8" in cycle and "output head" in cycle


def test_kv_cache_blocks_are_the_serving_engines():
    n = explain("kv-cache", ["tp=2"]).numbers
    est = _json("estimate", "llama-2-7b", "--inference", "--tp", "2", "--gpu", "rtx-4090", "--batch", "1",
                "--prompt-len", "2048", "--output-len", "2048")
    assert n["kv_blocks"] == est["kv_blocks"]["num_blocks"] and n["block_size"] == est["kv_blocks"]["block_size"]
    assert n["per_tp"][1]["kv_bytes_per_token"] == 2 * n["per_tp"][2]["kv_bytes_per_token"]
    code, out, _ = cli_main("explain", "kv-cache", "tp=2")
    assert f"'# GPU blocks: {n['kv_blocks']}'" in out


def test_stragglers_use_the_straggler_model_of_estimate():
    n = explain("stragglers", ["slowdown=1.5", "fraction=0.05"]).numbers
    est = _json("estimate", "llama-3.1-8b", "--gpus", "16", "--gpu", "h100-sxm", "--global-batch", "16", "--slow-rank",
                "1:1.5:0.05")["straggler"]
    for k in ("base_step_s", "wait_s", "mean_step_s", "p50_step_s", "p99_step_s"):
        assert n["tail"][k] == pytest.approx(est[k]), k
    assert n["tail"]["p50_step_s"] == n["tail"]["base_step_s"] < n["tail"]["p99_step_s"]   # the tail grows first
    assert n["step_time_slow"] > n["step_time_base"] and n["tp_decode"]["drag"] > 0
