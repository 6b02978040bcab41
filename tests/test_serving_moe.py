"""MoE serving: expert parallelism, data-parallel attention, the all-to-alls and their overlap (serving.moe)."""

import json
import math
from pathlib import Path
from dataclasses import replace

import numpy as np
import pytest

from conftest import cli_main
from shardlab.catalog import get_catalog
from shardlab.errors import ShardlabError
from shardlab.memory.inference import kv_cache_bytes_per_token, weight_bytes_per_rank
from shardlab.rates.hardware import overlap_efficiency
from shardlab.serving.case import prepare
from shardlab.serving.engines import get_engine
from shardlab.serving.moe import DEFAULT_EXPERT_IMBALANCE
from shardlab.serving.precision import make_precision
from shardlab.serving.step import step_parts
from shardlab.specs.hardware import Cluster
from shardlab.specs.tensors import model_tensors

CAT = get_catalog()
DS = CAT.model("deepseek-v3")


def cluster(gpu: str, n: int) -> Cluster:
    acc = CAT.accelerator(gpu)
    return Cluster(acc, n, acc.system["gpus_per_node"], CAT.link(acc.system["intra_link"]),
                   CAT.link(acc.system["inter_link"]))


def test_weights_per_gpu_under_ep_are_exact():
    """Every routed expert whole on exactly one of the ep ranks (E/ep each), every other tensor TP-sliced: the ranks'
    expert bytes add up to the model's, and the rest is what TP 1 (or TP 2) holds."""
    tensors = model_tensors(DS)
    experts = sum(math.prod(t.shape) for t in tensors if t.ep_dim is not None)
    rest = sum(math.prod(t.shape) for t in tensors if t.ep_dim is None)
    assert weight_bytes_per_rank(DS, 1, 1, ep=16) == [2 * (rest + experts // 16)]
    # TP 2 attention: the dense tensors halve (the head and embeddings too), the experts stay whole
    tp2 = weight_bytes_per_rank(DS, 2, 1, ep=16)[0]
    dense_tp2 = weight_bytes_per_rank(DS, 2, 1)[0] - 2 * experts // 2
    assert tp2 == dense_tp2 + 2 * experts // 16
    # the MLA latent cache is per token and layer, whatever the split
    assert kv_cache_bytes_per_token(DS, 1, 1, 2) == [(512 + 64) * 61 * 2]


def _case(**kw):
    base = dict(tp=1, precision=make_precision("fp8", None, "fp8", "fp8", CAT.accelerator("h200").peak_tflops),
                prompt_len=1000, output_len=1000)
    base.update(kw)
    n = base["tp"] * (base.get("ep", 1) // base["tp"] if base.get("dp_attention") else 1)
    return prepare(DS, cluster("h200", n), get_engine("vllm"), **base)


def test_dp_attention_multiplies_the_sequences_and_splits_the_step():
    one = _case(tp=8, ep=8)                                   # experts over the TP group
    dpa = _case(ep=8, dp_attention=True)                      # 8 attention replicas sharing the experts
    assert (one.gpus, dpa.gpus, dpa.attention_dp) == (8, 8, 8)
    assert dpa.replica_blocks == 8 * dpa.blocks.num_blocks
    assert dpa.capacity == min(dpa.blocks.num_blocks // dpa.blocks_per_seq * 8, dpa.max_num_seqs)
    # a step of 64 decoding sequences: the busiest rank holds 8 of them (dense work, KV reads), the experts see 64
    m, k = dpa.whole, dpa.kernels
    alone = replace(m, attention_dp=1.0)                      # one rank's own work, as a replica of its own
    p = step_parts(m, k, 64.0, 64 * 1500.0, 0.0, 0.0, 64.0)
    assert p["attention_s"] == pytest.approx(float(step_parts(alone, k, 8.0, 8 * 1500.0, 0.0, 0.0, 8.0)["attention_s"]))
    assert p["weights_touched_bytes"] > step_parts(alone, k, 8.0, 8 * 1500.0, 0.0, 0.0, 8.0)["weights_touched_bytes"]
    # 9 sequences over 8 ranks: one rank holds 2 (a sequence lives on one rank)
    p9 = step_parts(m, k, 9.0, 9 * 1500.0, 0.0, 0.0, 9.0)
    assert p9["attention_s"] == pytest.approx(float(step_parts(alone, k, 2.0, 2 * 1500.0, 0.0, 0.0, 2.0)["attention_s"]))


def test_all_to_all_priced_with_dp_attention_and_hidden_by_two_batch_overlap():
    tp_ep = _case(tp=8, ep=8)
    dpa = _case(ep=8, dp_attention=True)
    tbo = _case(ep=8, dp_attention=True, two_batch_overlap=True)
    assert float(tp_ep.whole.a2a_s_per_token) == 0.0 and float(dpa.whole.a2a_s_per_token) > 0
    assert dpa.expert_imbalance == pytest.approx(DEFAULT_EXPERT_IMBALANCE)
    args = (512.0, 512 * 1500.0, 0.0, 0.0, 512.0)
    plain, hidden = step_parts(dpa.whole, dpa.kernels, *args), step_parts(tbo.whole, tbo.kernels, *args)
    assert plain["a2a_s"] > 0 and plain["a2a_s"] == plain["a2a_raw_s"]
    # two halves: each pays the all-to-alls' latency, and each reads the weights its GEMMs touch
    fixed = float(dpa.whole.a2a_decode_s_fixed)
    assert hidden["a2a_raw_s"] == pytest.approx(float(plain["a2a_raw_s"]) + fixed)
    assert hidden["linear_s"] > plain["linear_s"]
    # the all-to-alls hide under the overlap share of the other half's compute (the training fit's overlap efficiency)
    eta = overlap_efficiency(dpa.cluster.accelerator)
    assert float(tbo.whole.a2a_overlap) == pytest.approx(eta) and 0 < eta < 1
    compute = float(hidden["linear_s"] + hidden["attention_s"] + hidden["elementwise_s"])
    assert hidden["a2a_s"] == pytest.approx(max(0.0, float(hidden["a2a_raw_s"]) - eta * compute))
    # a rank with one sequence runs it whole: no halves, no hiding
    one = (8.0, 8 * 1500.0, 0.0, 0.0, 8.0)
    whole1, tbo1 = step_parts(dpa.whole, dpa.kernels, *one), step_parts(tbo.whole, tbo.kernels, *one)
    assert tbo1["step_s"] == pytest.approx(whole1["step_s"]) and tbo1["weights_touched_bytes"] == whole1["weights_touched_bytes"]
    # the halves' two weight reads are what the step reports it reads
    assert hidden["weights_touched_bytes"] > plain["weights_touched_bytes"]
    # one attention rank (EP over the TP group, --dp-attention at ep = tp) has no all-to-all for the overlap to hide
    solo = _case(tp=8, ep=8, dp_attention=True, two_batch_overlap=True)
    assert float(solo.whole.a2a_overlap) == 0.0
    # 64 sequences per GPU, 32 experts per GPU: each half reads them all, so the overlap costs more than it hides;
    # 16 experts per GPU across two nodes at 256 sequences per GPU, it pays (SGLang runs it on wide EP at large batch)
    assert hidden["step_s"] > plain["step_s"]
    wide_tbo = _case(ep=16, dp_attention=True, two_batch_overlap=True)
    big = (4096.0, 4096 * 1500.0, 0.0, 0.0, 4096.0)
    assert step_parts(wide_tbo.whole, wide_tbo.kernels, *big)["step_s"] < step_parts(
        _case(ep=16, dp_attention=True).whole, wide_tbo.kernels, *big)["step_s"]
    # across nodes the network carries each token once per remote node: 16 GPUs cost more than 8
    wide = _case(ep=16, dp_attention=True)
    assert float(wide.whole.a2a_s_per_token) > float(dpa.whole.a2a_s_per_token)
    # decoding steps go through DeepEP's low-latency kernels, straight to each remote expert's GPU: more network
    # bytes than the normal kernels' once-per-node (prefill); inside one node the two are the same
    assert float(wide.whole.a2a_decode_s_per_token) > float(wide.whole.a2a_s_per_token)
    assert float(dpa.whole.a2a_decode_s_per_token) == pytest.approx(float(dpa.whole.a2a_s_per_token))
    dec = step_parts(wide.whole, wide.kernels, *args)
    mixed = step_parts(wide.whole, wide.kernels, 512.0, 512 * 1500.0, 1.0, 1.0, 513.0)
    tokens = 512 / 16                                                    # 16 attention ranks: the busiest one's share
    assert dec["a2a_raw_s"] == pytest.approx(float(wide.whole.a2a_decode_s_fixed) + tokens * wide.expert_imbalance
                                             * float(wide.whole.a2a_decode_s_per_token))
    assert mixed["a2a_raw_s"] < dec["a2a_raw_s"]


def test_imbalance_scales_the_busiest_ranks_expert_work():
    even = _case(ep=8, dp_attention=True, expert_imbalance=1.0)
    skew = _case(ep=8, dp_attention=True, expert_imbalance=2.0)
    args = (2048.0, 2048 * 1500.0, 0.0, 0.0, 2048.0)
    a, b = step_parts(even.whole, even.kernels, *args), step_parts(skew.whole, skew.kernels, *args)
    fixed = float(even.whole.a2a_s_fixed)                  # the latency part does not scale with the tokens
    assert b["linear_s"] > a["linear_s"] and float(b["a2a_s"]) - fixed == pytest.approx(2 * (float(a["a2a_s"]) - fixed))


def test_mla_decode_attends_in_the_latent_space():
    """Absorbed MLA decode: 2·heads·(576 + 512) FLOPs per pair per layer for DeepSeek-V3; prefill keeps 192 + 128."""
    c = _case(tp=8, ep=8)
    assert float(c.whole.decode_attn_flops_per_pair) == pytest.approx(2 * 128 * (576 + 512) / 8 * 61)
    assert float(c.whole.attn_flops_per_pair) == pytest.approx(2 * 128 * (192 + 128) / 8 * 61)


@pytest.mark.parametrize("kw,needle", [
    (dict(ep=3, dp_attention=True), "does not divide"),
    (dict(tp=2, ep=8), "must equal layout.tp 2"),     # the library names fields; the CLI maps them to flags
    (dict(tp=4, ep=6, dp_attention=True), "does not divide"),
    (dict(tp=2, ep=4, dp_attention=True, pp=2), "not modelled"),
    (dict(ep=8, dp_attention=True, expert_imbalance=0.5), "[1, 64]"),
    (dict(tp=8, ep=8, two_batch_overlap=True), "--two-batch-overlap"),
    (dict(dp_attention=True), "add layout.ep"),
])
def test_layouts_an_engine_cannot_run_are_refused(kw, needle):
    with pytest.raises(ShardlabError, match=None) as e:
        _case(**kw)
    assert needle in str(e.value)


def test_dense_model_with_ep_refused():
    acc = CAT.accelerator("h100-sxm")
    with pytest.raises(ShardlabError, match="dense model"):
        prepare(CAT.model("llama-3.1-8b"), cluster("h100-sxm", 2), get_engine("vllm"), tp=2, ep=2,
                precision=make_precision("bf16", None, "bf16", None, acc.peak_tflops))


def test_estimate_serve_deepseek_wide_ep_json():
    """The issue's command: one replica of 16 H200, DP attention 16 with EP 16, no load given (its capacity)."""
    code, out, err = cli_main("estimate", "deepseek-v3", "--inference", "--serve", "--gpus", "16", "--gpu", "h200",
                              "--ep", "16", "--dp-attention", "--requests", "300", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert (d["ep"], d["dp_attention"]) == (16, 16)
    # the checkpoint's FP8 block weights (the default): exact per rank, half the bf16 copy's routed experts
    fp8 = make_precision("fp8", None, "bf16", None, CAT.accelerator("h200").peak_tflops)
    assert d["precision"].startswith("weights fp8 (the checkpoint's)")
    assert d["gpus"] == 16 and d["kv_blocks"]["weights_bytes"] == weight_bytes_per_rank(DS, 1, 1, ep=16, precision=fp8)[0]
    assert d["steady_state"]["output_tokens_per_s"] > 0
    code, out, err = cli_main("estimate", "deepseek-v3", "--inference", "--gpus", "16", "--gpu", "h200", "--ep", "16",
                              "--dp-attention", "--two-batch-overlap", "--batch", "64")
    assert code == 0, err
    assert "EP all-to-alls" in out and "16 data-parallel attention ranks" in out


@pytest.mark.parametrize("argv,needle", [
    (["llama-3.1-8b", "--tp", "2", "--ep", "2"], "dense model"),
    (["deepseek-v3", "--ep", "7", "--dp-attention"], "does not divide"),
    (["deepseek-v3", "--ep", "16", "--dp-attention", "--expert-imbalance", "nan"], "--expert-imbalance"),
    (["deepseek-v3", "--ep", "16", "--dp-attention", "--gpus", "8"], "--gpus"),
    (["deepseek-v3", "--tp", "8", "--ep", "8", "--two-batch-overlap"], "--two-batch-overlap"),
])
def test_bad_moe_flags_one_line(argv, needle):
    code, out, err = cli_main("estimate", *argv, "--inference", "--gpu", "h200")
    assert code == 2 and needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_ep_rows_are_predicted_not_fitted():
    from shardlab.validation.inference import expert_parallel, family_of, load_inference_runs
    runs = [r for r in load_inference_runs() if expert_parallel(r)]
    assert len(runs) >= 30
    assert all("MoE-EP" in family_of(r, "hopper") for r in runs)
    assert np.all([r.config["dp_attention"] for r in runs])
    # the fit sees target rows only: an informational row (DeepSeek-R1's MTP depths on B200) makes no generation
    # "seen" in a fold that holds out the only fitted source of it
    from shardlab.validation.inference import fitted, prepare_runs
    every = load_inference_runs()
    some = [r for r in every if r.source in ("trtllm-blog1-dsr1-mtp", "sglang-large-ep-2025", "nim-1.8-concurrency")]
    prep = prepare_runs(some, CAT)
    kept = {prep.runs[i].id for i in fitted(prep, np.arange(len(some)))}
    assert kept == {r.id for r in some if r.target in ("latency", "throughput") and r.config.get("ep", 1) == 1}


def test_mtp_draft_is_deepseeks_moe_block():
    """--draft mtp: one MoE block of the target's shape (DeepSeek-V3 §2.2), its weights beside the target's, its
    default acceptance from the report (85-90%); a model without an MTP module is refused."""
    from shardlab.serving.speculative import draft_spec, make_speculation

    sp = make_speculation(2, "mtp")
    assert sp.acceptance_length == pytest.approx(1 + 0.875 + 0.875 ** 2)
    d = draft_spec(DS, "mtp", CAT)
    assert d.num_layers == 1 and d.moe.first_dense_layers == 0 and d.is_moe_layer(0)
    plain = _case(tp=8, ep=8)
    spec = _case(tp=8, ep=8, speculation=sp, draft_spec=d)
    extra = spec.blocks.weights_bytes - plain.blocks.weights_bytes
    experts = sum(math.prod(t.shape) for t in model_tensors(d) if t.ep_dim is not None)
    assert extra > experts // 8 * 1.0          # fp8: a byte per expert weight on each of the 8 EP ranks, and more
    with pytest.raises(ShardlabError, match="multi-token-prediction"):
        draft_spec(CAT.model("llama-3.1-8b"), "mtp", CAT)


@pytest.mark.parametrize("flags,serve", [(["--ep", "16", "--dp-attention"], True), (["--disaggregated", "8:8"], True),
                                         (["--two-batch-overlap"], False)])
def test_plan_refuses_the_layout_flags_it_searches_itself(flags, serve):
    code, out, err = cli_main("plan", "deepseek-v3", "--inference", *(["--serve", "--concurrency", "64"] if serve else []),
                              "--gpus", "16", "--gpu", "h200", *flags)
    assert code == 2 and err.count("\n") == 1 and ("shardlab estimate" in err or "add --serve" in err)


def test_a_token_runs_each_expert_it_reaches_on_one_row():
    """At batch 1 the routed experts' GEMMs have M = 1 per touched expert (not k/E of a row on every expert): the
    decode step of one sequence is no slower than that of sixteen."""
    c = prepare(DS, cluster("h200", 16), get_engine("vllm"), tp=1, ep=16, dp_attention=True, prompt_len=1000,
                output_len=1000)
    m, k = c.whole, c.kernels
    one, many = (step_parts(m, k, d, d * 1500.0, 0.0, 0.0, d)["step_s"] for d in (1.0, 16.0))
    assert float(one) <= float(many)


def test_plan_serve_searches_wide_expert_parallelism_and_exports_it(tmp_path):
    """One search (DeepSeek-V3 FP8 on 16 H200): the aggregated winner is wide EP over attention ranks, more than twice
    the best TP-sliced layout's goodput; the prefill/decode split uses EP pools (the same layout in both) and wins,
    so --export writes it; --rank 1 exports the aggregated EP winner; both read back."""
    out, plan = tmp_path / "ds.sh", tmp_path / "plan.json"
    code, doc, err = cli_main("plan", "deepseek-v3", "--inference", "--serve", "--gpus", "16", "--gpu", "h200",
                              "--weights", "fp8", "--activations", "fp8", "--prompt-len", "4000", "--output-len", "500",
                              "--ttft-slo", "2", "--tpot-slo", "0.05", "--top", "40", "--export", "sglang", "--out",
                              str(out), "--json")
    assert code == 0, err
    d = json.loads(doc)
    best = d["plans"][0]
    assert (best["ep"], best["dp_attention"], best["tp"], best["gpus_per_replica"]) == (16, 16, 1, 16)
    tp_sliced = max(p["goodput_tokens_per_s_per_gpu"] for p in d["plans"] if p["ep"] == 1)
    assert best["goodput_tokens_per_s_per_gpu"] > 2 * tp_sliced
    assert d["capacity"]["layout"]["dp_attention"] == 16 and any(q["dp_attention"] == 16 for q in d["pareto"])
    # docs/inference.md §7 quotes the search's attention ranks of TP 1, 2 and 4 (EP 16)
    best_of = {t: max(p["goodput_tokens_per_s_per_gpu"] for p in d["plans"] if (p["tp"], p["ep"]) == (t, 16))
               for t in (1, 2, 4)}
    doc = " ".join((Path(__file__).resolve().parents[1] / "docs" / "inference.md").read_text().split())
    split = d["comparison"]["disaggregated_goodput_tokens_per_s_per_gpu"]
    assert f"an EP 8 decode pool at {split:.0f} output tokens/s per GPU against {best_of[1]:.0f} aggregated" in doc
    assert (f"against {best_of[1]:.0f} aggregated. Attention ranks of TP 2 serve {best_of[2]:.0f} output tokens/s per "
            f"GPU there (EP 16 as 8 ranks of TP 2), TP 4 {best_of[4]:.0f}:") in doc
    assert any("predicted, never fitted" in n and "upper bounds" in n for n in d["notes"])   # the validation's caveat
    pools = d["disaggregated"][0]
    assert pools["prefill"]["dp_attention"] == pools["decode"]["dp_attention"] == 8 and d["comparison"]["ratio"] > 1
    assert all(p["prefill"]["dp_attention"] == p["decode"]["dp_attention"] for p in d["disaggregated"])
    text = out.read_text()
    assert text.count("--enable-dp-attention") == 2 and text.count("--disaggregation-mode") == 2
    back = json.loads(cli_main("estimate", "--from", str(out), "--gpu", "h200", "--json")[1])["disaggregated"]
    assert back["prefill"]["ep"] == back["decode"]["ep"] == 8
    plan.write_text(json.dumps(d))
    agg = tmp_path / "agg.sh"
    code, _, err = cli_main("export", "--to", "sglang", "--plan", str(plan), "--rank", "1", "--out", str(agg))
    assert code == 0, err
    assert "--enable-dp-attention" in agg.read_text() and "--ep-size 16" in agg.read_text()
    back = json.loads(cli_main("estimate", "--from", str(agg), "--gpu", "h200", "--json")[1])
    assert (back["ep"], back["dp_attention"]) == (16, 16)
    code, txt, err = cli_main("plan", "deepseek-v3", "--inference", "--serve", "--gpus", "16", "--gpu", "h200",
                              "--prompt-len", "1000", "--output-len", "1000", "--concurrency", "256", "--wide")
    assert code == 0, err
    assert "EP (attn DP)" in txt and "16 (16)" in txt
    code, txt, err = cli_main("plan", "llama-3.1-8b", "--inference", "--serve", "--gpus", "2", "--concurrency", "8")
    assert code == 0 and "EP (attn DP)" not in txt and "never fitted" not in txt     # dense: no such column


def test_html_page_draws_the_experts_per_gpu(tmp_path):
    page = tmp_path / "ds.html"
    code, _, err = cli_main("estimate", "deepseek-v3", "--inference", "--serve", "--gpus", "16", "--gpu", "h200", "--ep",
                            "16", "--dp-attention", "--redundant-experts", "32", "--concurrency", "64", "--html",
                            str(page))
    assert code == 0, err
    html = page.read_text()
    assert "Experts per GPU" in html and "EP 16 (16 data-parallel attention ranks of TP 1)" in html
    assert html.count("<title>routed expert ") == 256 and html.count("<title>redundant slot") == 32
    assert html.count("GPU 15 (node 1)") == 1                     # 16 boxes over two nodes of 8


def test_attention_ranks_of_tp_above_one_where_the_engine_runs_them():
    """Wide EP over attention ranks of TP t > 1 (vLLM DP over TP, SGLang --dp-size below --tp-size) is searched for
    the engines that run it; TensorRT-LLM's attention ranks are one GPU each, so its search keeps TP 1, and its export
    of such a layout says what it wrote instead."""
    from shardlab.cli.serve_space import _candidates

    cl = cluster("h200", 16)
    got = {name: {(tp, ep, dpa) for tp, pp, cap, ep, dpa in _candidates(DS, cl, 16, get_engine(name)) if dpa > 1}
           for name in ("vllm", "sglang", "tensorrt-llm")}
    assert {(2, 16, 8), (4, 16, 4), (8, 16, 2), (2, 8, 4)} <= got["vllm"] == got["sglang"]
    assert got["tensorrt-llm"] == {(1, n, n) for n in (2, 4, 8, 16)}
    assert all(ep // tp == dpa for tp, ep, dpa in got["vllm"])
    code, doc, err = cli_main("export", "--to", "tensorrt-llm", "deepseek-v3", "--inference", "--gpu", "h200", "--tp", "2",
                              "--ep", "16", "--dp-attention", "--prompt-len", "4000", "--output-len", "500", "--json")
    assert code == 0, err
    said = {u["setting"]: u["why"] for u in json.loads(doc)["unsupported"]}
    assert "16 ranks of TP 1, not 8 of TP 2" in said["attention_tp"]


def test_docs_quote_the_fp8_wide_ep_search():
    """docs/inference.md §7's DeepSeek-V3 figures on 16 H200, 1,000/1,000 tokens (its FP8 checkpoint, the default
    weights), are the search's output."""
    code, out, err = cli_main("plan", "deepseek-v3", "--inference", "--serve", "--gpus", "16", "--gpu", "h200",
                              "--prompt-len", "1000", "--output-len", "1000", "--ttft-slo", "2", "--tpot-slo", "0.05",
                              "--top", "60", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["precision"].startswith("weights fp8 (the checkpoint's)")
    cap, lay = d["capacity"], d["capacity"]["layout"]
    tp2 = max(p["goodput_tokens_per_s_per_gpu"] for p in d["plans"] if p["dp_attention"] == 8)
    sliced = max(p["goodput_tokens_per_s_per_gpu"] for p in d["plans"] if p["dp_attention"] == 1)
    doc = " ".join((Path(__file__).resolve().parents[1] / "docs" / "inference.md").read_text().split())
    assert (f"EP {lay['ep']} over {lay['dp_attention']} attention ranks of TP {lay['tp']} serves "
            f"{cap['max_request_rate']:.1f} requests/s, {cap['goodput_tokens_per_s_per_gpu']:.0f} output tokens/s per "
            f"GPU (8 ranks of TP 2: {tp2:.0f}), against {sliced:.0f} for the best TP-sliced layout") in doc
