"""Disaggregated prefill/decode: the two pools' steady state, the KV transfer, the simulation, the CLI."""

import json
from pathlib import Path

import pytest

from conftest import cli_main
from shardlab.catalog import get_catalog
from shardlab.comm.collectives import collective_time
from shardlab.errors import ShardlabError
from shardlab.memory.inference import kv_cache_bytes_per_token
from shardlab.serving.case import prepare
from shardlab.serving.disagg import make_disagg, max_rate_within, saturation_rate, steady_concurrency, steady_rate
from shardlab.serving.disagg_sim import simulate_disagg
from shardlab.serving.engines import get_engine
from shardlab.serving.precision import make_precision
from shardlab.serving.steady import arrays, fluid
from shardlab.serving.cycle import cycle_time
from shardlab.specs.hardware import Cluster

CAT = get_catalog()
ACC = CAT.accelerator("h100-sxm")
CL = Cluster(ACC, 16, 8, CAT.link(ACC.system["intra_link"]), CAT.link(ACC.system["inter_link"]))
PREC = make_precision("bf16", None, "bf16", None, ACC.peak_tflops)
L8 = CAT.model("llama-3.1-8b")


def _case(tp: int, S: int = 4000, O: int = 500, model=L8):
    return prepare(model, CL, get_engine("vllm"), tp=tp, precision=PREC, prompt_len=S, output_len=O)


def test_kv_transfer_is_the_prompts_slice_over_the_link():
    pre, dec = _case(2), _case(2)
    one_node, two_nodes = make_disagg(pre, dec, 4, 4), make_disagg(pre, dec, 8, 8)
    per_rank = 4000 * kv_cache_bytes_per_token(L8, 2, 1, 2)[0]
    assert one_node.kv_transfer_bytes == two_nodes.kv_transfer_bytes == per_rank
    assert (one_node.link, two_nodes.link) == ("intra", "inter")
    assert one_node.kv_transfer_s == pytest.approx(collective_time("send-recv", per_rank, 2, CL.intra_link).time_s)
    assert two_nodes.kv_transfer_s == pytest.approx(collective_time("send-recv", per_rank, 2, CL.inter_link).time_s)
    assert two_nodes.kv_transfer_s > one_node.kv_transfer_s


def test_steady_state_adds_up():
    d = make_disagg(_case(1), _case(2), 4, 4)
    r = steady_rate(d, 10.0)
    a = arrays([d.decode])
    B = r["decode_batch"]
    cyc = float(cycle_time(a, B, B * float(a.ctx[0]), seqs=B)[0])
    assert r["tpot_s"] == pytest.approx(cyc, rel=2e-3)                   # decode steps carry no prefill
    assert B == pytest.approx(10.0 / d.decode_replicas * 500 * r["tpot_s"], rel=1e-3)   # Little's law per replica
    over = d.decode.engine.request_overhead_us * 1e-6
    assert r["ttft_s"] == pytest.approx(over + r["prefill_wait_s"] + r["prefill_s"] + d.kv_transfer_s + r["tpot_s"])
    assert not r["overloaded"] and steady_rate(d, 1.01 * saturation_rate(d))["overloaded"]
    c = steady_concurrency(d, 64)
    assert 64 == pytest.approx(c["requests_per_s"] * c["e2e_s"], rel=1e-3)


def test_decode_pool_tpot_beats_mixed_steps_with_long_prompts():
    """Long prompts in mixed steps slow every decode; the decode pool does not see them (the reason to split)."""
    d = make_disagg(_case(2), _case(2), 4, 4)
    rate = 8.0
    dis = steady_rate(d, rate)
    agg = fluid(arrays([_case(2)]), [2], [rate / 4])               # 4 replicas of TP 2 on the same 8 GPUs
    assert dis["tpot_s"] < float(agg["tpot_s"][0])


def test_simulation_agrees_with_the_steady_state():
    d = make_disagg(_case(1), _case(2), 4, 4)
    st = steady_rate(d, 16.0)
    sim = simulate_disagg(d, arrival_rate=16.0, requests=800, lifetime_s=st["e2e_s"])
    assert sim.tpot_s.mean == pytest.approx(st["tpot_s"], rel=0.15)
    assert sim.requests_per_s == pytest.approx(16.0, rel=0.1)
    assert sim.ttft_s.mean <= 1.2 * st["ttft_s"]                # M/D/1 with one prompt per service: an upper side
    closed = simulate_disagg(d, concurrency=32, requests=300, lifetime_s=st["e2e_s"])
    assert closed.requests > 0 and closed.tpot_s.p99 >= closed.tpot_s.p50


def test_capacity_within_slo():
    d = make_disagg(_case(1), _case(2), 4, 4)
    rate = max_rate_within(d, 1.0, 0.025)
    r = steady_rate(d, rate)
    assert 0 < rate < saturation_rate(d)
    assert r["ttft_s"] <= 1.0 + 1e-9 and r["tpot_s"] <= 0.025 + 1e-9
    worse = steady_rate(d, rate * 1.02)
    assert worse["overloaded"] or worse["ttft_s"] > 1.0 or worse["tpot_s"] > 0.025


def test_pipeline_stages_in_the_prefill_pool_pipeline_the_prompts():
    """TP 2 × PP 2 prefill replicas: one prompt takes longer (through both stages) than on TP 4, but a replica takes
    its next prompts when its slowest stage is free, so the pool saturates later; the simulation pipelines too."""
    L70 = CAT.model("llama-3.1-70b")
    tp4 = _case(4, model=L70)
    pp2 = prepare(L70, CL, get_engine("vllm"), tp=2, pp=2, precision=PREC, prompt_len=4000, output_len=500)
    dec = prepare(L70, CL, get_engine("vllm"), tp=4, pp=2, precision=PREC, prompt_len=4000, output_len=500)
    flat, piped = make_disagg(tp4, dec, 8, 8), make_disagg(pp2, dec, 8, 8)
    a, b = steady_rate(flat, 3.0), steady_rate(piped, 3.0)
    assert b["prefill_s"] > a["prefill_s"] and saturation_rate(piped) > 1.1 * saturation_rate(flat)
    sim = simulate_disagg(piped, arrival_rate=3.0, requests=300, lifetime_s=b["e2e_s"])
    assert sim.requests_per_s == pytest.approx(3.0, rel=0.15)
    assert sim.ttft_s.mean >= b["prefill_s"]                        # every prompt goes through both stages


def test_pools_must_hold_whole_replicas():
    with pytest.raises(ShardlabError, match="whole replicas"):
        make_disagg(_case(2), _case(2), 3, 4)


def test_estimate_disaggregated_json_and_text():
    code, out, err = cli_main("estimate", "llama-3.1-8b", "--inference", "--serve", "--tp", "2", "--prefill-tp", "1",
                              "--disaggregated", "4:4", "--arrival-rate", "8", "--prompt-len", "4000", "--output-len",
                              "500", "--requests", "200", "--json")
    assert code == 0, err
    doc = json.loads(out)
    dis = doc["disaggregated"]
    assert (dis["prefill"]["gpus"], dis["prefill"]["tp"], dis["decode"]["gpus"], dis["decode"]["tp"]) == (4, 1, 4, 2)
    assert doc["kv_transfer_s"] > 0 and doc["steady_state"]["tpot_s"] > 0 and doc["simulation"]["requests"] > 0
    assert doc["aggregated"]["replicas"] == 4
    code, out, err = cli_main("estimate", "llama-3.1-8b", "--inference", "--serve", "--tp", "2", "--disaggregated",
                              "4:4", "--concurrency", "16", "--requests", "100")
    assert code == 0, err
    assert "KV transfer per request" in out and "aggregated instead" in out


@pytest.mark.parametrize("argv,needle", [
    (["--serve", "--disaggregated", "4:0", "--concurrency", "4"], "P:D"),
    (["--serve", "--disaggregated", "four", "--concurrency", "4"], "P:D"),
    (["--serve", "--tp", "2", "--disaggregated", "3:4", "--concurrency", "4"], "whole replicas"),
    (["--serve", "--pp", "3", "--disaggregated", "4:4", "--concurrency", "4"], "whole replicas"),
    (["--serve", "--prefill-pp", "2", "--concurrency", "4"], "add --disaggregated"),
    (["--disaggregated", "4:4"], "add --serve"),
    (["--serve", "--prefill-tp", "2", "--concurrency", "4"], "add --disaggregated"),
    (["--serve", "--disaggregated", "4:4", "--gpus", "16", "--concurrency", "4"], "--gpus"),
])
def test_bad_disaggregated_flags_one_line(argv, needle):
    code, out, err = cli_main("estimate", "llama-3.1-8b", "--inference", *argv)
    assert code == 2 and needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_plan_lists_disaggregated_beside_aggregated():
    """The issue's question: 70B on 16 H100, 4000/500 tokens, TTFT ≤ 1 s, TPOT ≤ 25 ms, no load given."""
    code, out, err = cli_main("plan", "llama-3.1-70b", "--inference", "--serve", "--gpus", "16", "--gpu", "h100-sxm",
                              "--prompt-len", "4000", "--output-len", "500", "--ttft-slo", "1", "--tpot-slo", "0.025",
                              "--requests", "200", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["pareto"] and doc["capacity"]["max_request_rate"] > 0
    best = doc["disaggregated"][0]
    assert best["prefill"]["gpus"] + best["decode"]["gpus"] == 16 and best["kv_transfer_s"] > 0
    assert best["ttft_s"] <= 1.0 + 1e-9 and best["tpot_s"] <= 0.025 + 1e-9
    goods = [p["goodput_tokens_per_s_per_gpu"] for p in doc["disaggregated"]]
    assert all(a >= b * (1 - 1e-9) for a, b in zip(goods, goods[1:]))   # ranked (ties: to a part in 10⁹)
    cmp = doc["comparison"]
    assert cmp["winner"] == ("disaggregated" if cmp["disaggregated_goodput_tokens_per_s_per_gpu"]
                             > cmp["aggregated_goodput_tokens_per_s_per_gpu"] else "aggregated")
    # the pools' replicas may run pipeline stages too, each priced as --prefill-pp / --pp price them
    staged = [p for p in doc["disaggregated"] if p["prefill"]["pp"] > 1 or p["decode"]["pp"] > 1]
    assert staged and all(p["prefill"]["tp"] * p["prefill"]["pp"] <= p["prefill"]["gpus"] for p in staged)
    tie = next(p for p in staged if (p["prefill"]["tp"], p["prefill"]["pp"]) == (4, 2))   # docs/inference.md §8 quotes it
    assert tie["max_request_rate"] == pytest.approx(best["max_request_rate"], rel=1e-3)
    doc = " ".join((Path(__file__).resolve().parents[1] / "docs" / "inference.md").read_text().split())
    assert f"ties it at {best['max_request_rate']:.2f} requests/s" in doc
    p = next(p for p in staged if p["prefill"]["pp"] > 1)
    code, out, err = cli_main("estimate", "llama-3.1-70b", "--inference", "--serve", "--gpu", "h100-sxm",
                              "--disaggregated", f"{p['prefill']['gpus']}:{p['decode']['gpus']}",
                              "--prefill-tp", str(p["prefill"]["tp"]), "--prefill-pp", str(p["prefill"]["pp"]),
                              "--tp", str(p["decode"]["tp"]), "--pp", str(p["decode"]["pp"]), "--prompt-len", "4000",
                              "--output-len", "500", "--arrival-rate", str(max(p["max_request_rate"], 0.05)), "--json")
    assert code == 0, err
    if p["max_request_rate"] > 0:
        assert json.loads(out)["steady_state"]["tpot_s"] == pytest.approx(p["tpot_s"], rel=1e-6)


def test_explain_disaggregation_derives_the_verdict():
    code, out, err = cli_main("explain", "disaggregation", "--json")
    assert code == 0, err
    n = json.loads(out)["numbers"]
    agg, dis = n["aggregated"], n["disaggregated"]
    assert n["ratio"] == pytest.approx(dis["goodput_tokens_per_s_per_gpu"] / agg["goodput_tokens_per_s_per_gpu"])
    assert n["ratio"] > 1.1                                   # 70B, 4000-token prompts, 25 ms TPOT: splitting pays
    assert agg["decode_only_step_s"] < agg["tpot_s"]          # the prompts' interference the split removes
    code, out, err = cli_main("explain", "disaggregation", "model=llama-3.1-8b", "gpus=8", "prompt=512", "output=512")
    assert code == 0, err and "goodput per GPU" in out


def test_capacity_page_draws_the_pools(tmp_path):
    out = tmp_path / "cap.html"
    code, _, err = cli_main("plan", "llama-3.1-8b", "--inference", "--serve", "--gpus", "8", "--gpu", "h100-sxm",
                            "--prompt-len", "4000", "--output-len", "500", "--ttft-slo", "1", "--tpot-slo", "0.025",
                            "--html", str(out))
    assert code == 0, err
    html = out.read_text()
    assert "Disaggregated prefill and decode" in html and 'aria-label="prefill pool, KV transfer, decode pool"' in html
    assert html.count("prefill replica") >= 1 and "decode replica 1" in html


def test_estimate_page_of_a_disaggregated_serve(tmp_path):
    out = tmp_path / "d.html"
    code, _, err = cli_main("estimate", "llama-3.1-8b", "--inference", "--serve", "--tp", "2", "--disaggregated", "4:4",
                            "--arrival-rate", "8", "--requests", "100", "--html", str(out))
    assert code == 0, err
    html = out.read_text()
    assert "The two pools and the KV transfer" in html and "aggregated instead" in html


def test_plan_splits_over_two_gpu_kinds_per_dollar(tmp_path):
    """`plan --prefill-gpu KIND`: prefill replicas on one kind, decode on --gpu (Splitwise); a GPU of one kind is not
    one of the other, so the splits rank, and the comparison runs, per dollar at the catalog's prices; the winner
    exports as a script of both kinds that reads back."""
    from shardlab.export.build import price_notes

    args = ["llama-3.1-70b", "--inference", "--serve", "--gpus", "16", "--gpu", "h200", "--prefill-gpu", "h100-sxm",
            "--prompt-len", "4000", "--output-len", "500", "--ttft-slo", "1", "--tpot-slo", "0.025"]
    out = tmp_path / "pd.sh"
    code, doc, err = cli_main("plan", *args, "--export", "vllm", "--out", str(out), "--json")
    assert code == 0, err
    d = json.loads(doc)
    c, found = d["comparison"], d["disaggregated"]
    assert c["basis"] == "per dollar" and found
    assert all(p["prefill"]["gpu"] == "h100-sxm" and p["decode"]["gpu"] == "h200" and p["kv_link"] == "inter"
               for p in found)
    per = [p["output_tokens_per_usd"] for p in found]
    assert all(a >= b * (1 - 1e-9) for a, b in zip(per, per[1:]))
    for a, b in zip(found, found[1:]):          # equal to a part in 10⁹ (bisection noise): the lower TPOT, then TTFT
        if a["output_tokens_per_usd"] == pytest.approx(b["output_tokens_per_usd"], rel=1e-9):
            assert (a["tpot_s"], a["ttft_s"]) <= (b["tpot_s"], b["ttft_s"]) or a["tpot_s"] < b["tpot_s"]
    h100, h200 = (price_notes(get_catalog(), g)["usd_per_gpu_hour"] for g in ("h100-sxm", "h200"))
    best = found[0]
    assert best["usd_per_hour"] == pytest.approx(best["prefill"]["gpus"] * h100 + best["decode"]["gpus"] * h200)
    assert best["output_tokens_per_usd"] == pytest.approx(best["max_request_rate"] * 500 * 3600 / best["usd_per_hour"])
    assert c["aggregated_usd_per_hour"] == pytest.approx(16 * h200)
    assert c["aggregated_output_tokens_per_usd"] == pytest.approx(
        c["aggregated_goodput_tokens_per_s_per_gpu"] * 16 * 3600 / (16 * h200))
    assert c["winner"] == "disaggregated" and c["ratio"] > 1     # 12 H100 prefill + 4 H200 decode beat 16 H200 per $
    doc = " ".join((Path(__file__).resolve().parents[1] / "docs" / "inference.md").read_text().split())
    pre, dec = best["prefill"], best["decode"]
    assert (f"{pre['gpus']} H100 prefill GPUs ({pre['replicas']} × TP {pre['tp']}) and {dec['gpus']} H200 decode GPUs "
            f"(TP {dec['tp']}) serve {best['max_request_rate']:.2f} requests/s at ${best['usd_per_hour']:.2f} an hour, "
            f"{best['output_tokens_per_usd']:,.0f} output tokens per dollar, against "
            f"{c['aggregated_output_tokens_per_usd']:,.0f} for 16 H200 aggregated (${c['aggregated_usd_per_hour']:.2f} an "
            f"hour): {c['ratio']:.2f}×.") in doc
    back = json.loads(cli_main("estimate", "--from", str(out), "--gpu", "h200", "--arrival-rate", "1", "--json")[1])
    assert (back["disaggregated"]["prefill"]["gpu"], back["disaggregated"]["prefill"]["gpus"]) == (
        "h100-sxm", best["prefill"]["gpus"])
    # one GPU kind stays per GPU; the mixed search needs the capacity search
    same = json.loads(cli_main("plan", *[a for a in args if a not in ("--prefill-gpu", "h100-sxm")], "--json")[1])
    assert same["comparison"]["basis"] == "per GPU"
    code, _, err = cli_main("plan", "llama-3.1-8b", "--inference", "--serve", "--gpus", "8", "--concurrency", "8",
                            "--prefill-gpu", "h100-sxm")
    assert code == 2 and "--prefill-gpu" in err and len(err.strip().splitlines()) == 1


def test_the_split_search_runs_the_scalar_model_on_arrays():
    """serving.disagg_split bisects every split of a pair of layouts at once: each split's rate, TTFT, TPOT and
    prefill load are what max_rate_within and steady_rate give it alone (a part in 10⁹), over one node (NVLink,
    every split of 8 GPUs) and four (whole nodes over the NIC), with SLOs that bind on TTFT, on TPOT, and neither."""
    from shardlab.serving.disagg_split import pool_sizes, search_splits

    cl32 = Cluster(ACC, 32, 8, CAT.link(ACC.system["intra_link"]), CAT.link(ACC.system["inter_link"]))
    for cl, gpus in ((CL, 8), (cl32, 32)):
        cases = {t: prepare(L8, cl, get_engine("vllm"), tp=t, precision=PREC, prompt_len=4000, output_len=500)
                 for t in (1, 2)}
        for ttft, tpot in ((0.3, None), (None, 0.012), (1.0, 0.025)):
            sp = search_splits(cases, gpus, 8, ttft, tpot)
            assert len(sp) == sum(1 for P in pool_sizes(gpus, 8) for a in cases.values() for b in cases.values()
                                  if P % a.gpus == 0 and (gpus - P) % b.gpus == 0)
            binding = 0
            for i in range(len(sp)):
                d = sp.case(i)
                rate = max_rate_within(d, ttft, tpot)
                assert sp.rate[i] == pytest.approx(rate, rel=1e-9, abs=1e-12)
                at = steady_rate(d, rate if rate > 0 else 1e-6 * d.prefill_replicas)
                assert sp.tpot_s[i] == pytest.approx(at["tpot_s"], rel=1e-9)
                assert sp.ttft_s[i] == pytest.approx(at["ttft_s"], rel=1e-9)
                assert sp.prefill_utilization[i] == pytest.approx(at["prefill_utilization"], rel=1e-9)
                binding += 0 < rate < saturation_rate(d) * (1 - 1e-5)
            assert binding > 0                             # the SLO, not the saturation, sets some rates
            ranked = [float(sp.rate[i]) for i in sp.ranked()]
            assert ranked == sorted(ranked, reverse=True)
