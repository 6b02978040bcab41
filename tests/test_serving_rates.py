"""Rates from the hardware, mechanisms from the engine: per-generation serving rates, versioned engine profiles,
GQA-aware decode attention, CUDA graphs, the static first-token cost, NVFP4, mesh links, and the joint fit."""

import numpy as np
import pytest

from shardlab.catalog import get_catalog
from shardlab.comm.collectives import collective_time
from shardlab.errors import ShardlabError
from shardlab.serving.case import prepare
from shardlab.serving.engines import builtin_engines, get_engine
from shardlab.serving.precision import InferencePrecision, make_precision
from shardlab.serving.rates import RATE_FIELDS, builtin_rates, load_rates, rates_for
from shardlab.serving.step import step_parts
from shardlab.specs.hardware import Cluster

CAT = get_catalog()
L8 = CAT.model("llama-3.1-8b")


def node(gpu="h100-sxm", n=8):
    acc = CAT.accelerator(gpu)
    return Cluster(acc, n, acc.system["gpus_per_node"], CAT.link(acc.system["intra_link"]), CAT.link(acc.system["inter_link"]))


def test_engines_share_their_generations_rates():
    """Two engines on one GPU run at the same rates; another generation's differ; an unlisted one takes the default."""
    a = prepare(L8, node(), get_engine("vllm"), tp=1).kernels
    b = prepare(L8, node(), get_engine("tensorrt-llm"), tp=1).kernels
    c = prepare(L8, node("a100-80gb"), get_engine("vllm"), tp=1).kernels
    assert a.gemm_efficiency == b.gemm_efficiency == rates_for("hopper").gemm16_efficiency
    assert a.weight_bandwidth_efficiency == b.weight_bandwidth_efficiency
    assert c.gemm_efficiency == rates_for("ampere").gemm16_efficiency != a.gemm_efficiency
    assert rates_for("volta") == builtin_rates()["default"]
    assert all(builtin_rates()[g].rows > 0 for g in ("ampere", "hopper", "blackwell", "ada", "cdna3"))


def test_rates_file_is_strict(tmp_path):
    bad = tmp_path / "r.yaml"
    bad.write_text("default: {weight_bandwidth_efficiency: 1.5, kv_bandwidth_efficiency: 0.7, gemm16_efficiency: 0.7, "
                   "gemm8_efficiency: 0.6, gemm4_efficiency: 0.5, attention_efficiency: 0.5, rows: 0, source: x}\n")
    with pytest.raises(ShardlabError, match="share in"):
        load_rates(bad)
    bad.write_text("hopper: {weight_bandwidth_efficiency: 0.5}\n")
    with pytest.raises(ShardlabError, match="default"):
        load_rates(bad)


def test_engine_versions():
    """Today's engines are the defaults; older versions keep their own profiles."""
    eng = builtin_engines()
    assert {"vllm", "vllm-0.6", "sglang", "sglang-0.3", "tensorrt-llm", "tensorrt-llm-0.17"} <= set(eng)
    assert get_engine(None).id == "vllm" and get_engine(None).version.startswith("0.11")
    assert eng["vllm"].scheduling == "mixed" and eng["vllm"].chunked_prefill and eng["vllm"].scheduler_steps == 1
    assert eng["vllm-0.6"].scheduling == "prefill-first" and not eng["vllm-0.6"].chunked_prefill
    assert all(e.sources["version"] for e in eng.values())


def _decode(case, D=64, ctx=2048):
    return step_parts(case.whole, case.kernels, D, D * ctx, 0.0, 0.0, D)


def test_a_per_head_decode_kernel_reads_the_kv_cache_once_per_query_head():
    """vLLM 0.6 runs decode attention in FlashAttention for a 16-bit cache (one read per KV head for the group) but
    in the per-head PagedAttention kernel for an fp8 cache: Llama-3.1-8B has 4 query heads per KV head, so the KV
    read time is 4× what the same bytes take in a grouped kernel (V1)."""
    fp8 = InferencePrecision(kv_cache="fp8")
    old = prepare(L8, node(), get_engine("vllm-0.6"), tp=1, precision=fp8)
    new = prepare(L8, node(), get_engine("vllm"), tp=1, precision=fp8)
    old16 = prepare(L8, node(), get_engine("vllm-0.6"), tp=1)
    assert old.kernels.per_head_kv == 1.0 and new.kernels.per_head_kv == 0.0 and old16.kernels.per_head_kv == 0.0
    assert old.whole.kv_group == 4.0
    assert _decode(old)["attention_s"] == pytest.approx(4 * _decode(new)["attention_s"], rel=1e-9)


def test_cuda_graph_decode_steps_pay_no_launch_gaps():
    """A pure decode batch up to the engine's capture size replays a graph: it pays the per-layer kernel floor but no
    eager launches; a larger batch or a step with prefill tokens pays both for every layer."""
    case = prepare(L8, node(), get_engine("vllm"), tp=1)
    k, m = case.kernels, case.whole
    assert k.eager_layer_overhead_s > 0 and k.layer_overhead_s > 0
    small, big = _decode(case, D=int(k.graph_max_batch)), _decode(case, D=int(k.graph_max_batch) + 1)
    assert small["overhead_s"] == pytest.approx(k.step_overhead_s + k.seq_overhead_s * k.graph_max_batch
                                                + k.layer_overhead_s * m.layers)
    assert big["overhead_s"] == pytest.approx(k.step_overhead_s + k.seq_overhead_s * (k.graph_max_batch + 1)
                                              + (k.layer_overhead_s + k.eager_layer_overhead_s) * m.layers)
    mixed = step_parts(m, k, 8, 8 * 1000, 512, 512 * 256, 9)
    assert mixed["overhead_s"] == pytest.approx(k.step_overhead_s + 9 * k.seq_overhead_s
                                                + (k.layer_overhead_s + k.eager_layer_overhead_s) * 32)
    trt = prepare(L8, node(), get_engine("tensorrt-llm-0.17"), tp=1).kernels      # no graphs: every step is eager
    assert trt.graph_max_batch == 0


def test_pcie_rings_across_sockets_stage_through_host_memory():
    """An 8-GPU PCIe server: a TP-4 ring stays under one socket (direct peer copies), a TP-8 ring crosses the CPU
    interconnect through host memory at half the bandwidth."""
    link = CAT.link("pcie4")
    assert link.ring_bytes_per_s(4) == link.bytes_per_s and link.ring_bytes_per_s(8) == link.bytes_per_s / 2
    big = 256 * 2**20
    t4 = collective_time("all-reduce", big, 4, link, "ring").time_s - 6 * link.latency_s
    t8 = collective_time("all-reduce", big, 8, link, "ring").time_s - 14 * link.latency_s
    assert t8 / t4 == pytest.approx(2 * (7 / 8) / (3 / 4), rel=1e-6)
    assert CAT.link("nvlink4").ring_bytes_per_s(8) == CAT.link("nvlink4").bytes_per_s


def test_static_batch_first_token_pays_the_fixed_cost():
    from shardlab.serving.steady import arrays, fluid

    case = prepare(L8, node(), get_engine("vllm"), tp=1, prompt_len=128, output_len=64)
    a = arrays([case])
    with_cost = float(fluid(a, [0], [1])["ttft_s"][0])
    from dataclasses import replace
    free = float(fluid(replace(a, kernels=replace(a.kernels, first_token_overhead_s=np.zeros(1))), [0], [1])["ttft_s"][0])
    assert with_cost - free == pytest.approx(get_engine("vllm").first_token_overhead_us * 1e-6)


def test_moe_experts_have_their_own_roofline():
    """Qwen3-30B-A3B at 256 decoding sequences: each of 128 experts sees 256·8/128 = 16 tokens, so the experts stay
    weight-bound (a 16-row GEMM runs far from the large-shape rate, and still reads its weights longer) while the
    dense attention matrices are not; the linear time is the sum of the two rooflines."""
    spec = CAT.model("qwen3-30b-a3b")
    case = prepare(spec, node(), get_engine("vllm"), tp=1)
    p = _decode(case, D=256)
    m, k = case.whole, case.kernels
    bw = m.bandwidth_bytes_per_s * k.weight_bandwidth_efficiency
    rate = m.gemm_peak_flops * k.gemm_efficiency
    touched_e = m.expert_weight_bytes * (1 - (1 - m.expert_share) ** 256)
    half = m.gemm_half_tokens                    # each GEMM at M / (M + m_half) of the large-shape rate, M its tokens
    per_expert = 256 * m.expert_share
    assert per_expert == pytest.approx(16)
    expert_compute = 256 * m.expert_flops_per_token / rate * (per_expert + half) / per_expert
    expect = max(m.dense_weight_bytes / bw, 256 * (m.gemm_flops_per_token - m.expert_flops_per_token) / rate * (256 + half) / 256) \
        + max(touched_e / bw, expert_compute)
    assert p["linear_s"] == pytest.approx(expect, rel=1e-12)
    assert touched_e / bw > expert_compute


def test_nvfp4_weights():
    """NVFP4: 4-bit elements, an E4M3 scale per 16 inputs and two fp32 scales: 4.5 bits per weight and 8 bytes."""
    p = make_precision("fp4", peaks=CAT.accelerator("b200").peak_tflops)
    assert p.activations == "fp4" and p.gemm_dtype == "fp4"
    assert p.matrix_bytes(4096, 4096) == 4096 * 4096 // 2 + 4096 * 256 + 8
    assert make_precision("fp4", peaks=CAT.accelerator("h100-sxm").peak_tflops).activations == "bf16"
    with pytest.raises(ShardlabError, match="fp4"):
        make_precision("fp4", activations="fp4", peaks=CAT.accelerator("h100-sxm").peak_tflops)
    with pytest.raises(ShardlabError):
        make_precision("fp8", activations="fp4")


def test_a_full_mesh_drives_one_ring_per_peer_link():
    """MI300X's seven Infinity Fabric links: a TP-8 all-reduce of 64 MiB moves at seven links' bandwidth, TP-2 at one."""
    link = CAT.link("infinity-fabric")
    big = 64 * 2**20
    t8 = collective_time("all-reduce", big, 8, link, "ring").time_s
    one_link = 2 * 7 / 8 * big / link.bytes_per_s
    assert t8 == pytest.approx(one_link / 7 + 14 * link.latency_s, rel=1e-6)
    assert link.lanes(2) == 1 and link.lanes(8) == 7 and CAT.link("nvlink4").lanes(8) == 1


def test_validation_families_and_verdict():
    """Families are engine version × generation; the verdict names every family of ≥ 5 over its goal."""
    from shardlab.validation.inference_loso import FAMILY_MIN, GOALS, verdict

    loso = {"by_family": {"vllm × hopper": {"tpot": {"n": 5, "mean_abs_error": 0.11, "max_abs_error": 0.2}},
                          "vllm × ampere": {"tpot": {"n": 4, "mean_abs_error": 0.5, "max_abs_error": 0.3}}}}
    v = verdict(loso)
    assert FAMILY_MIN == 5 and GOALS == {"tpot": 0.10, "ttft": 0.12, "throughput": 0.10}
    assert not v["met"] and [m["family"] for m in v["family_misses"]] == ["vllm × hopper"]
    loso["by_family"]["vllm × hopper"]["tpot"]["mean_abs_error"] = 0.09
    assert verdict(loso)["met"]
    loso["by_family"]["vllm × ampere"]["tpot"]["max_abs_error"] = 0.4
    assert not verdict(loso)["met"]


def test_joint_fit_recovers_known_rates():
    """Rows predicted with known rates and overheads, then fitted from other values, give the known ones back:
    the column-grouped Jacobian sees every generation and engine."""
    from shardlab.validation.inference import Params, load_inference_runs, predict, prepare_runs
    from shardlab.validation.inference_fit import catalog_params, fit

    runs = [r for r in load_inference_runs() if r.target in ("latency", "throughput")][::6]
    prep = prepare_runs(runs, CAT)
    truth = catalog_params(prep)
    pred = predict(prep, truth)
    fake = [type(r)(**{**r.__dict__, "measured": {m: float(pred[m][i]) for m in r.measured}}) for i, r in enumerate(runs)]
    prep = prepare_runs(fake, CAT)
    start = Params({g: {f: 0.5 for f in RATE_FIELDS} for g in truth.rates}, truth.engines)
    got = fit(prep, np.arange(len(fake)), start, prior=truth)
    for g in truth.rates:
        for f in ("weight_bandwidth_efficiency", "gemm16_efficiency" if g != "cdna3" else "gemm8_efficiency"):
            assert got.rates[g][f] == pytest.approx(truth.rates[g][f], rel=0.05), (g, f)


def test_vllm_v1_defaults_depend_on_the_gpu():
    """vLLM V1 serves with 1024 sequences and an 8192-token budget on GPUs of 70 GiB or more other than A100, with 256
    and 2048 on the rest; settings given explicitly stay."""
    eng = get_engine("vllm")
    big = prepare(L8, node("h100-sxm"), eng, tp=1).engine
    a100 = prepare(L8, node("a100-80gb"), eng, tp=1).engine
    l40s = prepare(L8, node("l40s"), eng, tp=1).engine
    assert (big.max_num_seqs, big.max_num_batched_tokens) == (1024, 8192)
    assert (a100.max_num_seqs, a100.max_num_batched_tokens) == (l40s.max_num_seqs, l40s.max_num_batched_tokens) == (256, 2048)
    mine = prepare(L8, node("a100-80gb"), eng.with_settings(max_num_seqs=512), tp=1).engine
    assert (mine.max_num_seqs, mine.max_num_batched_tokens) == (512, 2048)
    old = prepare(L8, node("l40s"), get_engine("vllm-0.6"), tp=1).engine
    assert old.max_num_seqs == get_engine("vllm-0.6").max_num_seqs


def test_prefix_cache_hits_skip_their_prefill_and_share_their_blocks():
    """A 75% hit on a 2,176-token prompt computes 544 tokens, each attending (2176² − 544²)/(2·544) = 4,080 keys on
    average, and a sequence holds only its own suffix and output in KV blocks; the steady state and the simulation
    agree; an engine without prefix caching refuses the flag."""
    from shardlab.serving.simulate import simulate
    from shardlab.serving.steady import arrays, fluid

    eng = get_engine("sglang")
    hit = prepare(L8, node("a100-80gb"), eng, tp=1, prompt_len=2176, output_len=256, prefix_hit_rate=0.75)
    cold = prepare(L8, node("a100-80gb"), eng, tp=1, prompt_len=2176, output_len=256)
    assert hit.prefill_tokens == 544 and cold.prefill_tokens == 2176
    assert hit.prefill_keys_per_token == pytest.approx((2176**2 - 1632**2) / (2 * 544))
    assert cold.prefill_keys_per_token == pytest.approx(2176 / 2)
    assert hit.blocks_per_seq == 544 + 128 and cold.blocks_per_seq == 2176 + 128       # block size 1, half the output
    assert hit.capacity > 2 * cold.capacity
    f_hit = {k: float(v[0]) for k, v in fluid(arrays([hit]), [1], [64]).items()}
    f_cold = {k: float(v[0]) for k, v in fluid(arrays([cold]), [1], [64]).items()}
    assert f_hit["ttft_s"] < f_cold["ttft_s"] and f_hit["output_tokens_per_s"] > f_cold["output_tokens_per_s"]
    sim = simulate(hit, concurrency=64, seed=0, lifetime_s=f_hit["e2e_s"])
    assert sim.output_tokens_per_s == pytest.approx(f_hit["output_tokens_per_s"], rel=0.1)
    with pytest.raises(ShardlabError, match="does not cache prefixes"):
        prepare(L8, node(), get_engine("tensorrt-llm-0.17"), tp=1, prefix_hit_rate=0.5)
    with pytest.raises(ShardlabError, match="share in"):
        prepare(L8, node(), eng, tp=1, prefix_hit_rate=1.0)


def test_prefix_hit_rate_flag():
    from conftest import cli_main

    code, out, err = cli_main("estimate", "llama-3.1-8b", "--inference", "--serve", "--concurrency", "32",
                              "--prefix-hit-rate", "0.5", "--json")
    assert code == 0, err
    code, _, err = cli_main("estimate", "llama-3.1-8b", "--prefix-hit-rate", "0.5")
    assert code == 2 and err.count("\n") == 1 and "--inference" in err
    for bad in ("1", "-0.1", "nan"):
        code, _, err = cli_main("estimate", "llama-3.1-8b", "--inference", "--prefix-hit-rate", bad)
        assert code == 2 and err.count("\n") == 1, bad


def test_static_estimate_holds_a_cached_prefix_once():
    """16 sequences of 2,000 + 256 tokens with 90% of the prompt cached: 16 × ⌈456/16⌉ own blocks and ⌈1800/16⌉
    shared ones."""
    from shardlab.estimate.inference import estimate_inference

    est = estimate_inference(L8, node(), tp=1, batch=16, prompt_len=2000, output_len=256, prefix_hit_rate=0.9)
    b = est.case.blocks
    assert est.shared_prefix_tokens == 1800
    assert est.kv_cache_bytes == (16 * -(-456 // 16) + -(-1800 // 16)) * b.bytes_per_block
    assert est.max_batch == (b.num_blocks - -(-1800 // 16)) // -(-456 // 16)
    cold = estimate_inference(L8, node(), tp=1, batch=16, prompt_len=2000, output_len=256)
    assert cold.kv_cache_bytes == 16 * -(-2256 // 16) * b.bytes_per_block and est.prefill_s < cold.prefill_s


def test_estimate_serve_falls_back_to_the_steady_state():
    """1,500 clients on a replica that runs 92 sequences: the simulation's cycle bound ends before a measured request
    finishes; the estimate still answers (steady state, a note, simulation null), one JSON document."""
    import json

    from conftest import cli_main

    code, out, err = cli_main("estimate", "llama-3.1-70b", "--inference", "--framework", "tensorrt-llm", "--gpu", "b200",
                              "--weights", "fp4", "--kv-cache-dtype", "fp8", "--prompt-len", "8192", "--output-len", "1024",
                              "--serve", "--concurrency", "1500", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["simulation"] is None and "stands alone" in d["notes"][0] and d["steady_state"]["tpot_s"] > 0


def test_review_fixes(tmp_path):
    """A rank's GQA group under TP (Qwen3-30B-A3B: 32 query heads, 4 KV heads; at TP 8 each rank keeps one KV head
    for its 4 query heads); --export from a --serve plan carries fp8 and the memory share; leave-one-source-out
    predicts a generation no other source covers from the others' mean."""
    import numpy as np

    from conftest import cli_main
    from shardlab.validation.inference import Params, load_inference_runs, prepare_runs
    from shardlab.validation.inference_fit import unseen_from_others

    spec = CAT.model("qwen3-30b-a3b")
    assert prepare(spec, node(), get_engine("vllm-0.6"), tp=8).whole.kv_group == 4.0
    assert prepare(spec, node(), get_engine("vllm-0.6"), tp=2).whole.kv_group == 8.0
    out = tmp_path / "x.sh"
    code, _, err = cli_main("plan", "llama-3.1-8b", "--gpus", "8", "--inference", "--serve", "--ttft-slo", "0.5",
                            "--weights", "fp8", "--kv-cache-dtype", "fp8", "--gpu-memory-utilization", "0.7",
                            "--export", "vllm", "--out", str(out))
    assert code == 0, err
    text = out.read_text()
    assert "--quantization fp8" in text and "--kv-cache-dtype fp8" in text and "--gpu-memory-utilization 0.7" in text
    runs = [r for r in load_inference_runs() if r.source in ("trtllm-0.17-offline", "trtllm-1.0-pytorch-offline")][::8]
    prep = prepare_runs(runs, CAT)
    keep = np.array([i for i, g in enumerate(prep.generations) if g != "ada"])
    fitted = Params({g: {f: (0.3 if g == "ada" else 0.6) for f in RATE_FIELDS} for g in set(prep.generations)},
                    {e: {"step_overhead_us": 100.0} for e in {r.engine for r in runs}})
    got = unseen_from_others(prep, keep, fitted)
    assert got.rates["ada"]["weight_bandwidth_efficiency"] == pytest.approx(0.6)
    # Hopper's 16-bit GEMM share is the training fit's matmul curve (pinned), the rest what was fitted
    hopper_curve = CAT.accelerator("h100-sxm").efficiency.max_fraction
    assert got.rates["hopper"] == {**fitted.rates["hopper"], "gemm16_efficiency": hopper_curve}
    assert got.rates["ada"]["gemm16_efficiency"] == pytest.approx(0.6)      # ada: no training curve, the others' mean


def test_validate_reports_folds_done_of_total():
    """validate --inference's progress: the refit, then one call per held-out source, counted against the total."""
    from shardlab.catalog import get_catalog
    from shardlab.validation.inference import load_inference_runs
    from shardlab.validation.inference_loso import validate

    runs = load_inference_runs()
    pick = sorted({r.source for r in runs})[:2]
    calls = []
    validate(get_catalog(), [r for r in runs if r.source in pick], progress=lambda d, t, label: calls.append((d, t, label)))
    assert calls == [(1, 3, "refit"), (2, 3, f"held out {pick[0]}"), (3, 3, f"held out {pick[1]}")]


def test_gemm_rows_set_the_share_of_the_large_shape_rate():
    """A GEMM of M token rows runs at M / (M + m½) of the large-shape rate (the training estimate's matmul curve):
    Llama-3.1-8B prefill on an H100, one 1,024-token prompt against eight in one step: the compute side per token
    is (1024 + m½)/1024 against (8192 + m½)/8192, about 10% more, and m½ is the curve's half size."""
    from shardlab.rates.hardware import matmul_curve

    case = prepare(CAT.model("llama-3.1-8b"), node(), get_engine("vllm"), tp=1)
    m, k = case.whole, case.kernels
    half = matmul_curve(CAT.accelerator("h100-sxm"))[0].half_size
    assert m.gemm_half_tokens == half == pytest.approx(120.1)
    one = step_parts(m, k, 0.0, 0.0, 1024.0, 1024.0 * 512, 1.0)["linear_s"] / 1024
    eight = step_parts(m, k, 0.0, 0.0, 8192.0, 8192.0 * 512, 8.0)["linear_s"] / 8192
    assert one / eight == pytest.approx((1024 + half) / 1024 / ((8192 + half) / 8192), rel=1e-9)


def test_the_serving_fit_keeps_the_training_curve_share():
    """Hopper's 16-bit GEMM share comes from the training runs' matmul curve: the serving fit does not move it, and
    serving_rates.yaml carries it (with that source), while the fp8 share is fitted."""
    from shardlab.validation.inference import load_inference_runs, prepare_runs
    from shardlab.validation.inference_fit import catalog_params, fit

    runs = [r for r in load_inference_runs() if r.source == "trtllm-0.14-triton-online"][::6]
    prep = prepare_runs(runs, CAT)
    curve = CAT.accelerator("h100-sxm").efficiency.max_fraction
    assert prep.pinned["hopper"] == {"gemm16_efficiency": curve}
    got = fit(prep, np.arange(len(runs)), catalog_params(prep), iterations=3)
    assert got.rates["hopper"]["gemm16_efficiency"] == curve
    assert rates_for("hopper").gemm16_efficiency == pytest.approx(curve, abs=1e-4)
    assert "training fit's matmul max_fraction" in rates_for("hopper").source
    assert "gemm16" not in rates_for("ada").source                      # no training curve: fitted


def test_offline_runs_of_an_engine_that_reserves_run_in_waves():
    """trtllm-bench offline, N requests of one length on an engine that admits a request only with its whole output's
    blocks free: ⌊N/C⌋ full waves of C and one of N mod C, each a static batch (validation.inference.offline_waves);
    an engine that admits on demand keeps the steady state. The last, partial wave makes it slower than the steady
    state's full batches, and a whole number of waves costs what that many static batches cost."""
    from dataclasses import replace

    from shardlab.serving.steady import fluid, take
    from shardlab.validation.inference import load_inference_runs, offline_waves, predict, prepare_runs

    row = next(r for r in load_inference_runs() if r.id == "trtllm-0.17-offline/a100-80gb/l8b/tp1/1000-1000/offline")
    prep0 = prepare_runs([row], CAT)
    C = prep0.cases[0].capacity
    assert C < row.config["requests"] and offline_waves(row, prep0.cases[0]) == divmod(row.config["requests"], C)
    runs = [replace(row, id=f"w{n}", config={**row.config, "requests": n}) for n in (3 * C, 3 * C + C // 4)]
    prep = prepare_runs(runs, CAT)
    assert prep.waves.tolist() == [3, 3] and prep.tail.tolist() == [0, C // 4]
    got = predict(prep)["output_tokens_per_s"]
    static = fluid(take(prep.arrays, np.array([0])), np.array([0]), np.array([float(C)]))["output_tokens_per_s"][0]
    assert got[0] == pytest.approx(static, rel=1e-12)            # three full waves: one static batch's rate
    assert got[1] < got[0]                                       # a quarter-full last wave lowers it
    vllm = replace(runs[1], engine="vllm", settings={})
    assert offline_waves(vllm, prepare_runs([vllm], CAT).cases[0]) == (0, 0)
    from conftest import cli_main       # validate --run: the load it prints is the command's, one full wave
    code, out, err = cli_main("validate", "--inference", "--run", row.id, "--json")
    d = __import__("json").loads(out)
    assert code == 0 and d["load"] == {"mode": "batch", "value": float(C)} and d["waves"]["size"] == C
    assert f"--batch {C}" in d["command"]
