"""Inference estimates: memory per rank (a serving engine's numbers), latency regimes, max batch, TP vs replicas."""

import json

import pytest

from conftest import cli_main
from shardlab.catalog import get_catalog
from shardlab.estimate.inference import estimate_inference, tp_versus_replicas
from shardlab.specs.hardware import Cluster

CAT = get_catalog()


def cl(intra="nvlink4", inter="ib-ndr", gpu="h100-sxm"):
    return Cluster(CAT.accelerators[gpu], 8, 8, CAT.link(intra), CAT.link(inter))


def test_llama31_8b_tp2_weights_match_a_serving_engine():
    """vLLM loads Llama-3.1-8B in bf16 at TP=2 with about 7.5 GiB of weights per rank."""
    est = estimate_inference(CAT.models["llama-3.1-8b"], cl(), tp=2, batch=1)
    assert est.weights_bytes / 2**30 == pytest.approx(7.48, abs=0.02)
    assert est.kv_cache_bytes_per_token == 2 * 32 * (8 // 2) * 128 * 2


def test_decode_memory_bound_prefill_compute_bound():
    est = estimate_inference(CAT.models["llama-3.1-8b"], cl(), tp=2, batch=8, prompt_len=2048, output_len=128)
    assert est.decode["bound"] == "memory" and est.prefill["bound"] == "compute"
    assert est.decode_s_per_token < est.prefill_s


def test_max_batch_fills_the_memory():
    spec = CAT.models["llama-3.1-8b"]
    est = estimate_inference(spec, cl(), tp=1, batch=1, prompt_len=1024, output_len=1024)
    big = estimate_inference(spec, cl(), tp=1, batch=est.max_batch, prompt_len=1024, output_len=1024)
    over = estimate_inference(spec, cl(), tp=1, batch=est.max_batch + 8, prompt_len=1024, output_len=1024)
    assert big.fits and not over.fits


def test_replicas_beat_tp_across_10gbe_but_not_over_nvlink():
    """Two RTX 4090 machines joined by 10 GbE: at batch 64 two TP=1 replicas out-serve one TP=2 group (every decode
    step pays 64 all-reduces of 512 KiB over the network, each prefill 64 of 32 MiB); at batch 8 TP=2 still gives the
    lower per-token decode latency (decode is weight-bandwidth-bound and TP halves the bytes each GPU reads).
    On NVLink TP=2 wins on throughput too."""
    spec = CAT.models["llama-3.1-8b"]
    two_boxes = Cluster(CAT.accelerators["rtx-4090"], 2, 1, CAT.link("pcie4"), CAT.link("ethernet-10g"))
    big = tp_versus_replicas(spec, two_boxes, tp=2, batch=64, prompt_len=512, output_len=256)
    assert big["replicas"]["fits"] and big["replicas"]["tokens_per_s"] > big["group"]["tokens_per_s"]
    assert "replicas" in big["verdict"]
    small = tp_versus_replicas(spec, two_boxes, tp=2, batch=8, prompt_len=512, output_len=256)
    assert small["group"]["decode_s_per_token"] < small["replicas"]["decode_s_per_token"]
    assert "latency" in small["verdict"]
    nv = tp_versus_replicas(spec, cl(), tp=2, batch=64, prompt_len=512, output_len=256)
    assert nv["group"]["tokens_per_s"] > nv["replicas"]["tokens_per_s"]


def test_inference_json_contract():
    code, out, err = cli_main("estimate", "llama-3.1-8b", "--inference", "--tp", "2", "--batch", "4", "--json")
    assert code == 0, err
    d = json.loads(out)
    pg = d["memory"]["per_gpu"]
    assert isinstance(pg["weights"], int) and isinstance(pg["kv_cache"], int)
    for k in ("kv_cache_bytes_per_token", "prefill_s", "decode_s_per_token", "tokens_per_s", "max_batch"):
        assert k in d


def test_inference_plan_picks_tp_for_70b():
    code, out, err = cli_main("plan", "llama-3.1-70b", "--inference", "--gpus", "8", "--batch", "16", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["plans"] and all(p["tp"] * p["pp"] >= 2 for p in d["plans"])   # 141 GB of weights never fit one GPU


def test_one_request_on_more_pipeline_stages_pays_each_stages_engine_step_and_send():
    """A lone request crosses the stages in turn, and every stage runs an engine step of its own for it: each extra
    stage adds the engine's per-step and per-sequence overheads plus one send (the estimator and `explain
    pp-inference` price it the same way)."""
    from shardlab.catalog import get_catalog
    from shardlab.estimate.inference import static_batch
    from shardlab.teach.topics._common import cluster

    spec = get_catalog().model("llama-3.1-8b")
    one = {p: static_batch(spec, cluster("h100-sxm", p), tp=1, pp=p, in_flight=1, prompt_len=512, output_len=256)
           for p in (1, 2, 8)}
    case2, r2 = one[2]
    k = case2.kernels
    per_stage = k.step_overhead_s + k.seq_overhead_s + case2.p2p_fixed_s + case2.p2p_s_per_token
    assert r2["tpot_s"] - one[1][1]["tpot_s"] == pytest.approx(per_stage, rel=1e-6)
    rates = [one[p][1]["output_tokens_per_s"] for p in (1, 2, 8)]
    assert rates[0] > rates[1] > rates[2]
