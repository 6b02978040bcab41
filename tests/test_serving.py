"""Serving model: quantized bytes (hand-checked), KV blocks, engine profiles, step model, steady state vs the
simulation, pipelined micro-batches."""

import math

import numpy as np
import pytest

from shardlab.catalog import get_catalog
from shardlab.errors import ShardlabError
from shardlab.estimate.inference import estimate_inference
from shardlab.memory.inference import activation_peak_bytes, kv_blocks, kv_cache_bytes_per_token, weight_bytes_per_rank
from shardlab.serving.case import prepare
from shardlab.serving.engines import builtin_engines, get_engine, load_engines
from shardlab.serving.limits import limits
from shardlab.serving.precision import InferencePrecision, make_precision
from shardlab.serving.simulate import simulate
from shardlab.serving.steady import arrays, fluid
from shardlab.specs.hardware import Cluster

CAT = get_catalog()
L8 = CAT.model("llama-3.1-8b")
H100 = CAT.accelerator("h100-sxm")


def node(gpu="h100-sxm"):
    acc = CAT.accelerator(gpu)
    return Cluster(acc, 8, 8, CAT.link(acc.system["intra_link"]), CAT.link(acc.system["inter_link"]))


# ---- precision: bytes by hand ------------------------------------------------------------------
def test_int4_group128_matrix_bytes_by_hand():
    """4096×4096 at 4 bits = 8,388,608 B; 4096 × 32 groups × (2 B fp16 scale + 0.5 B packed zero) = 327,680 B."""
    p = make_precision("int4")
    assert p.group_size == 128
    assert p.matrix_bytes(4096, 4096) == 8_388_608 + 262_144 + 65_536


def test_llama31_8b_int4_awq_weights_by_hand():
    """Per layer: q, o 8,716,288 B each; k, v 2,179,072; gate, up, down 30,507,008 (module doc's formula) = 113,311,744;
    × 32 layers + 16-bit norms (532,480 B) + 16-bit embedding and head (2 × 1,050,673,152 B). About the 5.7 GB of
    the community AWQ checkpoints of Llama 3 8B."""
    per_layer = 2 * 8_716_288 + 2 * 2_179_072 + 3 * 30_507_008
    assert per_layer == 113_311_744
    expect = 32 * per_layer + 32 * 2 * 4096 * 2 + 4096 * 2 + 2 * 128256 * 4096 * 2
    assert weight_bytes_per_rank(L8, 1, 1, precision=make_precision("int4")) == [expect] == [5_727_854_592]


def test_llama31_8b_fp8_weights_and_kv_by_hand():
    """FP8: 6,979,321,856 linear weights at 1 B + 224 matrices × 8 B of scales + 16-bit embeddings, head, norms."""
    p = make_precision("fp8", kv_cache="fp8", peaks=H100.peak_tflops)
    assert p.activations == "fp8"
    linear = 8_030_261_248 - 2 * 128256 * 4096 - (32 * 2 * 4096 + 4096)
    assert weight_bytes_per_rank(L8, 1, 1, precision=p) == [linear + 7 * 32 * 8 + 2 * 2 * 128256 * 4096 + 2 * (32 * 2 * 4096 + 4096)]
    assert kv_cache_bytes_per_token(L8, 1, 1, p.kv_bytes) == [2 * 32 * 8 * 128 * 1]
    tp2 = weight_bytes_per_rank(L8, 2, 1, precision=make_precision("int8"))[0]     # per-channel scales split with rows
    assert tp2 < weight_bytes_per_rank(L8, 2, 1)[0] * 0.6


def test_precision_choices_refused_with_the_fix():
    with pytest.raises(ShardlabError, match="serve.group_size applies"):
        make_precision("fp8", group_size=128)
    with pytest.raises(ShardlabError, match="8-bit weights"):
        make_precision("bf16", activations="fp8")
    with pytest.raises(ShardlabError, match="no fp8"):
        make_precision("fp8", activations="fp8", peaks=CAT.accelerator("a100-80gb").peak_tflops)
    # FP8 weights on an A100 run weight-only (fp8 dequantized into 16-bit GEMMs, as vLLM's Marlin kernels do)
    assert make_precision("fp8", peaks=CAT.accelerator("a100-80gb").peak_tflops).activations == "bf16"
    assert make_precision("int8", activations="int8", peaks=H100.peak_tflops).gemm_dtype == "int8"


# ---- KV blocks: vLLM's arithmetic by hand ---------------------------------------------------------
def test_vllm_kv_blocks_by_hand():
    """0.9 × 79.65 GiB − 16.06 GB weights − activation peak (8192 tokens, 256 rows) − 576 MiB = 28,405 blocks of
    16 tokens × 128 KiB (Llama 3.1 8B bf16, one H100)."""
    case = prepare(L8, node(), get_engine("vllm-0.6"), tp=1, prompt_len=1024, output_len=256)
    cap = int(79.65 * 2**30)
    act = 2 * 8192 * (2 * 4096 + 2 * 14336) + 4 * 256 * 128256
    assert case.blocks.activation_bytes == act == activation_peak_bytes(L8, 1, 8192, 256)
    free = int(cap * 0.9) - 8_030_261_248 * 2 - act - (512 + 64) * 2**20
    assert case.blocks.num_blocks == free // (16 * 131072) == 28_405
    assert case.blocks_per_seq == math.ceil((1024 + 128) / 16)                  # on demand: prompt + half the output
    assert case.capacity == 256 and case.capacity_bound == "max-num-seqs"      # 28,405 // 72 = 394 > 256


def test_tensorrt_rule_takes_a_share_of_the_free_memory():
    b = kv_blocks(100, 40, 5, 5, 1, block_size=10, utilization=0.9, rule="free")
    assert b.num_blocks == 4 and b.reserved_bytes == 50 + 45                    # 0.9 × (100 − 50) = 45 bytes → 4 blocks


# ---- engines -----------------------------------------------------------------------------------
def test_engine_catalog_is_strict(tmp_path):
    assert {"vllm", "tensorrt-llm", "sglang"} <= set(builtin_engines())
    text = (get_engine("vllm-0.6").sources and open(str(__import__("shardlab.serving.engines", fromlist=["x"]).ENGINES_FILE)).read())
    bad = tmp_path / "e.yaml"
    bad.write_text(text.replace("  kv_block_size: 16\n", "  kv_block_size: 16\n  warp_speed: 9\n", 1))
    with pytest.raises(ShardlabError, match="unknown field"):
        load_engines(bad)
    bad.write_text(text.replace("  gpu_memory_utilization: 0.9\n", "  gpu_memory_utilization: 1.5\n", 1))
    with pytest.raises(ShardlabError, match="share in"):
        load_engines(bad)
    bad.write_text(text.replace("    max_num_seqs: \"vllm", "    max_num_seqz: \"vllm", 1))
    with pytest.raises(ShardlabError, match="source for every field"):
        load_engines(bad)


def test_training_frameworks_are_refused_under_inference():
    with pytest.raises(ShardlabError, match="training framework"):
        get_engine("megatron-lm")
    with pytest.raises(ShardlabError, match="did you mean sglang"):
        get_engine("sglan")


# ---- step model and steady state ---------------------------------------------------------------
def test_int4_decode_is_faster_by_the_bytes_it_saves():
    """Batch-1 decode is weight-bandwidth-bound: the blocks' matrices (plus 16-bit norms) take 13,959,176,192 B in
    bf16 and 3,626,508,288 B as W4A16 g128, so their read time falls 3.85×; the 16-bit head is read alike."""
    kw = dict(tp=1, batch=1, prompt_len=512, output_len=128, engine=get_engine("vllm-0.6"))
    bf = estimate_inference(L8, node(), **kw)
    q4 = estimate_inference(L8, node(), precision=make_precision("int4"), **kw)
    # bf16 reads its weights; W4A16's GEMMs pay the 16-bit curve's small-M rate and come out compute-bound at batch 1
    # (docs/inference.md, limitations): the weights' read time still falls by the bytes
    assert bf.decode["bound"] == "memory" and q4.decode["linear_s"] >= q4.decode["weights_read_s"]
    ratio = bf.decode["weights_read_s"] / q4.decode["weights_read_s"]
    bf_blocks = 32 * (2 * (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096) + 2 * 2 * 4096) + 2 * 4096
    q4_blocks = 32 * (113_311_744 + 2 * 2 * 4096) + 2 * 4096
    assert (bf_blocks, q4_blocks) == (13_959_176_192, 3_626_508_288)
    assert ratio == pytest.approx(bf_blocks / q4_blocks, rel=1e-9)
    assert bf.decode["head_s"] == pytest.approx(q4.decode["head_s"])
    assert q4.decode_s_per_token < bf.decode_s_per_token


def test_pipeline_adds_throughput_not_latency():
    """Curriculum item 36: pp micro-batches in flight; each token still crosses every stage."""
    one, two, four = (estimate_inference(CAT.model("llama-3.1-70b"), node(), tp=2, pp=pp, batch=16, prompt_len=512,
                                         output_len=256) for pp in (1, 2, 4))
    assert two.tokens_per_s > 1.7 * one.tokens_per_s and four.tokens_per_s > 1.6 * two.tokens_per_s
    assert two.decode_s_per_token > 0.95 * one.decode_s_per_token and four.decode_s_per_token > 0.95 * one.decode_s_per_token
    assert two.in_flight == 32 and four.max_batch >= one.max_batch


def test_closed_loop_beyond_capacity_queues():
    case = prepare(L8, node(), get_engine("vllm-0.6").with_settings(max_num_seqs=32), tp=1, prompt_len=512, output_len=128)
    r = fluid(arrays([case] * 2), [1, 1], [16, 96])
    assert r["in_flight"][1] == 32 and r["queue_s"][1] > 0 and r["queue_s"][0] == 0
    assert r["ttft_s"][1] > 10 * r["ttft_s"][0]


def test_arrivals_beyond_capacity_overload():
    case = prepare(L8, node(), get_engine("tensorrt-llm"), tp=1, prompt_len=1024, output_len=512)
    sat = fluid(arrays([case]), [1], [10**6])["requests_per_s"][0]
    r = fluid(arrays([case] * 2), [2, 2], [0.5 * sat, 1.2 * sat])
    assert not r["overloaded"][0] and r["overloaded"][1] and math.isinf(r["ttft_s"][1])
    assert r["requests_per_s"][0] == pytest.approx(0.5 * sat, rel=1e-6)


@pytest.mark.parametrize("engine,settings,load", [("vllm", {}, {"arrival_rate": 3.0}), ("tensorrt-llm", {}, {"concurrency": 24}),
                                                  ("sglang", {}, {"concurrency": 8}),
                                                  ("vllm", {"scheduler_steps": 10}, {"arrival_rate": 2.0})])
def test_simulation_agrees_with_the_steady_state(engine, settings, load):
    """The two models of one scheduler: the simulation's means within 10% (TPOT, throughput) and 30% (TTFT). Multi-step
    scheduling at a low rate: the replica empties between arrivals, and an idle engine still admits the next request."""
    case = prepare(L8, node(), get_engine(engine).with_settings(**settings), tp=1, prompt_len=512, output_len=128)
    mode, n = (2, load["arrival_rate"]) if "arrival_rate" in load else (1, load["concurrency"])
    f = {k: float(v[0]) for k, v in fluid(arrays([case]), [mode], [n]).items()}
    s = simulate(case, requests=160, lifetime_s=f["e2e_s"], **load)
    assert s.tpot_s.mean == pytest.approx(f["tpot_s"], rel=0.10)
    assert s.ttft_s.mean == pytest.approx(f["ttft_s"], rel=0.30)
    assert s.output_tokens_per_s == pytest.approx(f["output_tokens_per_s"], rel=0.12)
    assert s.ttft_s.p50 <= s.ttft_s.p99 and s.tpot_s.p50 <= s.tpot_s.p99


def test_on_demand_blocks_preempt_when_the_pool_runs_out():
    eng = get_engine("vllm-0.6").with_settings(gpu_memory_utilization=0.25)     # a small pool: 64 long sequences overflow it
    case = prepare(L8, node(), eng, tp=1, prompt_len=2048, output_len=1024)
    s = simulate(case, concurrency=64, requests=128)
    assert case.capacity < 64 and s.preemptions > 0 and s.mean_running <= case.blocks.num_blocks / (2048 / 16)


def test_saturation_rate_is_where_the_steady_state_overloads():
    """limits' saturation rate under arrivals is the rate where fluid's overload test flips (both use the Poisson
    spread of prompts), so every rate the SLO sweep skips is overloaded."""
    from shardlab.serving.limits import limits

    case = prepare(CAT.model("llama-3.1-70b"), node(), get_engine("vllm-0.6"), tp=4, prompt_len=512, output_len=256)
    sat = limits(case, rate=True).saturation_rate
    over = fluid(arrays([case, case]), [2, 2], [0.999 * sat, 1.001 * sat])["overloaded"]
    assert (bool(over[0]), bool(over[1])) == (False, True)
    assert sat > limits(case, rate=False).saturation_rate * 0.95


def test_simulated_rate_of_a_stable_replica_is_what_arrives():
    """At 91% of saturation the replica keeps up but fills for tens of seconds: the simulation measures after the
    first lifetime and reports the arrival rate it kept up with, not a completion count diluted by the filling and
    the drain (which gave 0.88-0.90 of it). Its arrivals span N/λ exactly (conditioned on the count)."""
    case = prepare(CAT.model("llama-3.1-70b"), node(), get_engine("vllm-0.6"), tp=4, prompt_len=512, output_len=256)
    rate = 0.91 * limits(case, rate=True).saturation_rate
    f = {k: float(v[0]) for k, v in fluid(arrays([case]), [2], [rate]).items()}
    s = simulate(case, arrival_rate=rate, lifetime_s=f["e2e_s"])
    assert not f["overloaded"] and s.requests_per_s == pytest.approx(rate, rel=0.05)
    # at 91% of saturation Poisson bursts swing the batch, and a step's time is convex in it: the simulated mean
    # TPOT runs about 11% above the steady state's (whose batch is the mean)
    assert f["tpot_s"] < s.tpot_s.mean < 1.2 * f["tpot_s"]


def test_serve_estimate_notes_preemption():
    from conftest import cli_main
    import json

    args = ("estimate", "llama-3.1-70b", "--inference", "--serve", "--concurrency", "64", "--prompt-len", "1024",
            "--output-len", "256", "--json")
    tight = json.loads(cli_main(*args, "--tp", "2")[1])
    roomy = json.loads(cli_main(*args, "--tp", "8")[1])
    assert tight["simulation"]["preemptions"] > 0 and "recomputed" in tight["notes"][0]
    assert roomy["simulation"]["preemptions"] == 0 and "notes" not in roomy


def test_one_request_larger_than_the_pool_is_refused():
    case = prepare(CAT.model("llama-3.1-70b"), node(), get_engine("tensorrt-llm"), tp=2, precision=InferencePrecision(),
                   prompt_len=120000, output_len=1000)
    with pytest.raises(ShardlabError, match="KV blocks"):
        simulate(case, concurrency=1)


# ---- prompts per cycle: whole prompts, Poisson under arrivals --------------------------------------
def test_prompt_mix_keeps_the_mean_and_the_poisson_probabilities():
    """Closed loop: r = 2.3 prompts per cycle is 70% of cycles with 2 and 30% with 3. Poisson(r): none with
    probability e^−r, one with r·e^−r, the rest at their conditional mean; shares sum to 1 and the mean stays r."""
    from shardlab.serving.cycle import prompt_mix
    (w0, n0), (w1, n1) = prompt_mix(2.3)
    assert (float(w0), float(n0), float(w1), float(n1)) == pytest.approx((0.7, 2.0, 0.3, 3.0))
    for r in (1e-7, 0.05, 0.6, 2.5, 40.0):
        mix = prompt_mix(np.array([r]), np.array([True]))
        assert sum(float(w[0]) for w, _ in mix) == pytest.approx(1.0, abs=1e-12)
        assert sum(float(w[0] * n[0]) for w, n in mix) == pytest.approx(r, rel=1e-6, abs=1e-15)
        assert float(mix[0][0][0]) == pytest.approx(math.exp(-r)) and float(mix[1][0][0]) == pytest.approx(r * math.exp(-r))
        assert float(mix[2][1][0]) >= 2.0


def test_poisson_arrivals_lengthen_short_output_cycles_toward_the_simulation():
    """Llama-3.1-70B TP4 on H100, 467-token prompts, 16 output tokens, 16 req/s (TensorRT-LLM's published online
    sweep measured a 38 ms mean ITL): a decode cycle with no prompt is memory-bound, one prompt makes it
    compute-bound, so cycles are convex in prompts and Poisson-spread arrivals cost more than evenly spaced ones.
    The steady state moves toward the event simulation of the same arrivals (which has the spread built in) and
    stays at or below it (it still leaves out that crowded cycles also hold more decoding sequences)."""
    from shardlab.serving import cycle
    case = prepare(CAT.model("llama-3.1-70b"), node(), get_engine("tensorrt-llm"), tp=4, prompt_len=467, output_len=16)
    a = arrays([case])
    B = float(fluid(a, [2], [16.0])["in_flight"][0])
    D, r = B * 15 / 16, B / 16
    even = float(cycle.step_cycle(a, np.array([D]), np.array([r]))["cycle_s"][0])
    spread = float(cycle.step_cycle(a, np.array([D]), np.array([r]), poisson=np.array([True]))["cycle_s"][0])
    assert spread > 1.01 * even
    sim = np.mean([simulate(case, arrival_rate=16.0, requests=1500, seed=s).tpot_s.mean for s in range(3)])
    assert even < spread <= sim * 1.02


# ---- fixes from a review by hand (stacked experts, whole groups, saturation, chunked budget, SLO limits) --------
def test_stacked_experts_take_the_weight_precision():
    """Mixtral's routed experts (E, out, in) carry no '.weight' suffix; they are block matmuls all the same:
    32 layers × 8 experts × 3 × 14336 × 4096 = 45.1e9 parameters, at int4 g128 about 0.52 B each."""
    mix = CAT.model("mixtral-8x7b")
    bf16 = weight_bytes_per_rank(mix, 4, 1)[0]
    int4 = weight_bytes_per_rank(mix, 4, 1, precision=make_precision("int4"))[0]
    experts = 32 * 8 * 3 * 14336 * 4096 // 4
    assert bf16 - int4 > 0.7 * 2 * experts                       # the experts shrank from 2 B to about 0.52 B
    assert int4 < 0.3 * bf16


@pytest.mark.parametrize("tp,ok", [(1, True), (2, False), (4, False), (8, False)])
def test_group_size_must_divide_each_ranks_input_width(tp, ok):
    """Qwen2.5-72B's FFN is 29,568 wide: 231 groups of 128 at TP 1, but 14,784 per rank at TP 2 splits a group,
    which vLLM's AWQ/GPTQ create_weights refuse (the reason Qwen pads its AWQ checkpoints)."""
    q = CAT.model("qwen2.5-72b")
    if ok:
        assert weight_bytes_per_rank(q, tp, 1, precision=make_precision("int4"))[0] > 0
    else:
        with pytest.raises(ShardlabError, match="does not divide .* use a TP degree that keeps whole groups"):
            weight_bytes_per_rank(q, tp, 1, precision=make_precision("int4"))


def test_fp8_fix_offered_on_a100_is_one_the_engine_runs():
    with pytest.raises(ShardlabError) as e:
        make_precision("fp8", activations="fp8", peaks=CAT.accelerator("a100-80gb").peak_tflops)
    assert "int8" not in str(e.value).split("use serve.activations")[1]


def _case(**kw):
    from shardlab.serving.engines import get_engine

    eng = get_engine("vllm-0.6").with_settings(**kw) if kw else get_engine("vllm-0.6")
    return prepare(L8, node(), eng, tp=1, pp=1, precision=InferencePrecision(), prompt_len=1024, output_len=256)


@pytest.mark.parametrize("load", [{"concurrency": 1000}, {"arrival_rate": 40.0}])
def test_simulated_rate_never_beats_the_saturated_replica(load):
    """Clients far beyond the replica's 256 slots, or arrivals beyond its saturation rate: the simulation measures
    steady clients (not first requests into a building queue) and counts whole bursts of completions. Under a standing
    queue of arrivals the freed slots refill in groups that finish together (fixed lengths), so a prefill-first
    engine runs fewer, fuller prefill steps than the steady state's Poisson spread of prompts assumes: the simulated
    rate may exceed the saturated steady state by that grouping (13% here, vLLM 0.6's eager prefill steps), not more."""
    case = _case()
    res = fluid(arrays([case]), [1 if "concurrency" in load else 2], [list(load.values())[0]])
    sat = float(res["requests_per_s"][0])
    sim = simulate(case, **load, lifetime_s=float(res["e2e_s"][0]) if np.isfinite(res["e2e_s"][0]) else 0.0)
    assert sim.steady and sim.requests_per_s <= (1.05 if "concurrency" in load else 1.15) * sat


def test_too_few_requests_for_the_clients_is_flagged():
    sim = simulate(_case(), concurrency=300, requests=400)
    assert not sim.steady


@pytest.mark.parametrize("budget", [8192, 1024, 256])
def test_steady_state_follows_the_chunked_prefill_budget(budget):
    """A smaller token budget spreads each prompt over steps and cuts TPOT; the steady state follows the simulation
    (TPOT within 10%, TTFT within 30%, as docs/inference.md states)."""
    case = _case(chunked_prefill=True, max_num_batched_tokens=budget)
    res = fluid(arrays([case]), [1], [32])
    sim = simulate(case, concurrency=32, lifetime_s=float(res["e2e_s"][0]))
    assert abs(res["tpot_s"][0] / sim.tpot_s.mean - 1) < 0.10
    assert abs(res["ttft_s"][0] / sim.ttft_s.mean - 1) < 0.30


def test_slo_limit_is_the_largest_load_that_meets_it():
    from shardlab.serving.limits import limits

    case = prepare(CAT.model("llama-3.1-70b"), node(), builtin_engines()["vllm"], tp=8, pp=1, precision=InferencePrecision(),
                   prompt_len=1024, output_len=256)
    lim = limits(case, rate=False, ttft_slo=0.5, tpot_slo=0.05)
    for n, key, slo in ((lim.ttft_slo_load, "ttft_s", 0.5), (lim.tpot_slo_load, "tpot_s", 0.05)):
        assert fluid(arrays([case]), [1], [n])[key][0] <= slo < fluid(arrays([case]), [1], [n + 1])[key][0]


# ---- a static batch that outgrows its KV blocks ----------------------------------------------------------------
def _outgrown_reference(a, B: int, C: float, S: int, O: int, prefill_s: float) -> float:
    """Makespan of B sequences of S + O tokens stepped one token at a time: every running sequence grows by one
    token a step; when they would hold more than C tokens the newest is preempted (it keeps its generated tokens);
    once the pool has room for a waiting one's prompt and tokens, it is readmitted and recomputes them in that
    step. The integrals of ``outgrown.outgrown_batch`` approximate this loop."""
    from shardlab.serving.cycle import cycle_time

    gen = {i: 1 for i in range(B)}                  # the batch prefill sampled every first token
    running, waiting, t, done = list(range(B)), [], prefill_s, []
    while running or waiting:
        redo = []
        while waiting and sum(S + gen[r] for r in running) + S + gen[waiting[0]] + 1 <= C:
            r = waiting.pop(0)
            running.append(r)
            redo.append(r)
        while sum(S + gen[r] + 1 for r in running) > C:         # this step's growth must fit
            waiting.insert(0, running.pop())
            redo = [r for r in redo if r in running]
        ctx = float(sum(S + gen[r] for r in running))
        P = float(sum(S + gen[r] for r in redo))
        t += float(cycle_time(a, float(len(running)), ctx, P, sum((S + gen[r]) ** 2 / 2 for r in redo),
                              float(len(running))))
        for r in list(running):
            gen[r] += 1
            if gen[r] >= O:
                running.remove(r)
                done.append(t)
    return t, sum(done) / len(done)


@pytest.mark.parametrize("over", [1.1, 1.6, 2.4])
def test_outgrown_static_batch_matches_a_token_by_token_loop(over):
    """B sequences that need `over` times the KV pool by their last token (vLLM, on-demand blocks): the phases'
    integrals give the makespan and the mean completion of the explicit loop within 1%, and it is longer than the
    static batch that fits."""
    from dataclasses import replace as dc_replace

    from shardlab.serving.outgrown import outgrown
    from shardlab.serving.steady import scalars

    S, O, B = 64, 256, 200
    case = prepare(L8, node(), get_engine("vllm"), tp=1, prompt_len=S, output_len=O)
    C = B * (S + O) / over
    a = dc_replace(scalars(case), kv_tokens=C, on_demand=1.0)
    roomy = dc_replace(a, kv_tokens=10 * C)
    grown = {k: float(np.asarray(v).ravel()[0]) for k, v in fluid(a, np.array([0]), np.array([B])).items()}
    fits = {k: float(np.asarray(v).ravel()[0]) for k, v in fluid(roomy, np.array([0]), np.array([B])).items()}
    assert bool(outgrown(a, B)) and not bool(outgrown(roomy, B)) and grown["outgrown"] == 1.0
    span = B / grown["requests_per_s"]
    ref, mean_done = _outgrown_reference(a, B, C, S, O, grown["prefill_s"])
    assert span == pytest.approx(ref, rel=0.01) and grown["e2e_s"] == pytest.approx(mean_done, rel=0.01)
    assert grown["output_tokens_per_s"] < fits["output_tokens_per_s"]
    assert fits["prefill_s"] < grown["e2e_s"] <= span


@pytest.mark.parametrize("model,S,O,hit", [("llama-3.1-8b", 128, 512, 0.0), ("llama-3.1-8b", 128, 2, 0.0),
                                           ("llama-3.1-8b", 4096, 1024, 0.9)])
def test_outgrown_batch_meets_the_static_batch_at_the_pool_size(model, S, O, hit):
    """Continuity: a batch that exactly fills the pool by its last token runs as the static batch, with two output
    tokens (one decode step) and with a cached prefix every sequence reads."""
    from dataclasses import replace as dc_replace

    from shardlab.serving.outgrown import outgrown
    from shardlab.serving.steady import scalars

    B = 64
    case = prepare(CAT.model(model), node(), get_engine("vllm"), tp=1, prompt_len=S, output_len=O,
                   prefix_hit_rate=hit)
    a = scalars(case)
    own = case.prefill_tokens + O
    sides = [dc_replace(a, kv_tokens=B * own / f) for f in (0.999, 1.001)]
    assert [bool(outgrown(x, B)) for x in sides] == [False, True]
    got = [{k: float(np.asarray(v).ravel()[0]) for k, v in fluid(x, np.array([0]), np.array([B])).items()} for x in sides]
    for key in ("output_tokens_per_s", "e2e_s", "tpot_s"):
        assert got[1][key] == pytest.approx(got[0][key], rel=0.02), key


def test_sliding_windows_the_engine_frees_keep_the_static_price():
    """Where the engine evicts tokens that leave a window shorter than the sequence, blocks stop growing (or grow
    more slowly) past the window, which the phases do not follow: the batch keeps the static price."""
    from dataclasses import replace as dc_replace

    from shardlab.serving.outgrown import outgrown
    from shardlab.serving.steady import scalars

    for model in ("gpt-oss-20b", "mistral-7b"):
        case = prepare(CAT.model(model), node(), get_engine("vllm"), tp=1, prompt_len=4000, output_len=4000)
        a = scalars(case)
        assert a.kv_share < 1.0 and not bool(outgrown(dc_replace(a, kv_tokens=64 * 8000 / 1.5), 64))


def test_a_batch_whose_prompts_overflow_the_pool_is_not_priced_as_outgrown():
    """B·(S + 1) > C: not every prompt is admitted at once, which the phases do not describe (nor does a batch past
    2.5 pools, whose resumed sequences would outgrow the pool again)."""
    from dataclasses import replace as dc_replace

    from shardlab.serving.outgrown import outgrown
    from shardlab.serving.steady import scalars

    a = scalars(prepare(L8, node(), get_engine("vllm"), tp=1, prompt_len=2048, output_len=2048))
    assert not bool(outgrown(dc_replace(a, kv_tokens=100 * 2000), 100))          # prompts need 100 × 2049
    b = scalars(prepare(L8, node(), get_engine("vllm"), tp=1, prompt_len=512, output_len=2048))
    assert bool(outgrown(dc_replace(b, kv_tokens=100 * 2560 / 2.4), 100))
    assert not bool(outgrown(dc_replace(b, kv_tokens=100 * 2560 / 2.6), 100))


def test_reserving_engines_never_outgrow():
    """TensorRT-LLM reserves every request's blocks on admission: its static batches are never preempted."""
    from dataclasses import replace as dc_replace

    from shardlab.serving.outgrown import outgrown
    from shardlab.serving.steady import scalars

    case = prepare(L8, node(), get_engine("tensorrt-llm"), tp=1, prompt_len=64, output_len=256)
    assert not bool(outgrown(dc_replace(scalars(case), kv_tokens=200 * 320 / 1.5), 200))


def test_preempted_sequences_keep_their_tokens_and_recompute_them():
    """vLLM's recomputation (Kwon et al. 2023 §4.5): a preempted sequence keeps what it generated, is readmitted
    with blocks for its prompt and those tokens, and prefills them before it decodes on."""
    from shardlab.serving.simulate import _Replica

    case = prepare(L8, node(), get_engine("vllm-0.6").with_settings(gpu_memory_utilization=0.25), tp=1,
                   prompt_len=2048, output_len=1024)
    rep = _Replica(case, 2)
    rep.admit([0, 1])
    for r in (0, 1):
        rep.pre[r], rep.gen[r] = rep.S, 300
    rep.free = 0
    rep.gen[:] = 304                                   # both cross a block boundary: one must go
    queue: list[int] = []
    victims = rep.grow(np.array([0, 1]), queue)
    assert victims == {1} and queue == [1] and rep.gen[1] == 304 and rep.redo[1] == 304 and rep.pre[1] == 0
    assert rep.target(1) == 2048 + 304 and rep.need_of(1) == math.ceil((2048 + 304 + 1) / 16)
    decoders, chunks = rep.compose([1])
    assert not len(decoders) and chunks[0][0] == 1


def test_a_warm_started_run_begins_with_the_steady_states_sequences():
    """simulate(warm_start=True) puts the sequences the steady state keeps in flight at the rate into the replica at
    t = 0, spread over their decode and never measured: the run measures more requests (a tenth is warm-up) and
    keeps the replica fuller than a run that starts empty, and long runs agree."""
    from shardlab.serving.simulate import warm_in_flight

    case = prepare(L8, node(), get_engine("vllm"), tp=2, prompt_len=4000, output_len=500)
    f = {k: float(v[0]) for k, v in fluid(arrays([case]), [2], [6.9]).items()}
    n0 = warm_in_flight(case, 6.9)
    assert n0 == round(f["in_flight"]) and 60 < n0 <= case.capacity
    from shardlab.serving.steady import in_flight_at_rate

    for lam in (0.5, 3.0, 6.9, 7.7):        # the warm start's own solve (it stops at a quarter of a sequence)
        b = float(fluid(arrays([case]), [2], [lam])["in_flight"][0])
        assert in_flight_at_rate(arrays([case]), lam) == pytest.approx(b, abs=0.5)
    cold, warm = (simulate(case, arrival_rate=6.9, requests=300, lifetime_s=f["e2e_s"], warm_start=w)
                  for w in (False, True))
    assert warm.requests > cold.requests and warm.mean_running > cold.mean_running
    long = [simulate(case, arrival_rate=6.9, requests=2000, lifetime_s=f["e2e_s"], warm_start=w) for w in (False, True)]
    assert long[1].tpot_s.mean == pytest.approx(long[0].tpot_s.mean, rel=0.03)
    assert warm_in_flight(case, 1e6) == case.capacity              # an overloading rate: the replica full


def test_estimate_shows_the_outgrown_batchs_phases():
    """`estimate --inference --batch N` on a batch that outgrows the pool names the regime and its phases; they add
    up to the makespan the throughput rests on."""
    import json

    from conftest import cli_main

    code, out, err = cli_main("estimate", "llama-3.1-8b", "--inference", "--batch", "400", "--prompt-len", "512",
                              "--output-len", "2048", "--json")
    assert code == 0, err
    d = json.loads(out)
    ph = d["outgrown_phases"]
    assert d["outgrown"] and not d["fits"] and ph["preempted"] > 0 and ph["recompute_tokens"] > 0
    total = d["prefill_s"] + ph["phase1_s"] + ph["phase2_s"] + ph["recompute_s"] + ph["phase3_s"]
    assert ph["makespan_s"] == pytest.approx(total, rel=1e-9)
    assert d["tokens_per_s"] == pytest.approx(400 * 2048 / ph["makespan_s"], rel=1e-6)
    assert d["request_latency_s"] == pytest.approx(ph["mean_completion_s"], rel=1e-9)
    code, text, err = cli_main("estimate", "llama-3.1-8b", "--inference", "--batch", "400", "--prompt-len", "512",
                               "--output-len", "2048")
    assert code == 0 and "outgrow the KV cache" in text and "the full lengths do not" in text


def test_prefill_first_virtual_engines_pipeline_their_prefills():
    """vLLM 0.6 with pipeline stages runs a scheduler per virtual engine: one engine's prefill crosses the stages in
    turn while the others' micro-batches use the rest. The steady state pipelines the prefills as the simulation
    does (it added every prefill's time through all stages to the cycle: at PP 2 the simulation served 1.5× its
    rate); at PP 1 nothing changes."""
    def rates(pp):
        case = prepare(L8, node(), get_engine("vllm-0.6"), tp=1, pp=pp, prompt_len=462, output_len=16)
        st = {k: float(v[0]) for k, v in fluid(arrays([case]), [1], [500]).items()}
        return st["requests_per_s"], simulate(case, concurrency=500, seed=0).requests_per_s

    one, two = rates(1), rates(2)
    assert one[0] == pytest.approx(one[1], rel=0.05)
    assert two[0] == pytest.approx(two[1], rel=0.10)
    assert two[0] > 1.8 * one[0]
