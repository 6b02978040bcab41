"""Pipeline topics: the bubble (closed form = simulation), GPipe vs 1F1B memory, interleaving, stragglers."""

from __future__ import annotations

from shardlab.teach.explanation import Explanation
from shardlab.teach.params import Param
from shardlab.teach.registry import Topic
from shardlab.teach.topics._common import catalog, gib, gpu, model, pct, serving_precision


def bubble(v: dict) -> Explanation:
    """(p−1)/(m+p−1) derived twice (algebra and the event simulation), and the m a bubble budget needs."""
    from shardlab.pipeline import min_microbatches, simulate
    from shardlab.pipeline.closed_form import bubble_fraction_closed_form, closed_form_text

    p, m, s = v["p"], v["m"], v["schedule"]
    vv = 2 if s == "interleaved" else 1
    cf = bubble_fraction_closed_form(s, p, m, vv)
    sim = simulate(s, p, m, vv)
    need = min_microbatches(s, p, v["max_bubble"], vv)
    rows = [[k, f"{100 * bubble_fraction_closed_form(s, p, k, vv):.1f}%"] for k in sorted({p, 2 * p, 4 * p, m, need})
            if s != "interleaved" or k % p == 0]
    return Explanation(
        "pipeline-bubble", "The pipeline bubble",
        f"{s} with p = {p} stages and m = {m} micro-batches: what share of the step do GPUs sit idle, and how many "
        f"micro-batches keep the bubble under {pct(v['max_bubble'])}?",
        dict(v),
        ["fill and drain (1F1B; stage i of 0 to p−1): i·F before its first forward, (p−1−i)·B waiting for the first "
         "gradient to come back from the last stage, (p−1−i)·F of gaps in the drain when its forwards have run out, "
         "and i·B after its last backward: (p−1)(F+B) idle per rank in all, against m(F+B) of work",
         f"closed form: {closed_form_text(s, p, m, vv)}",
         f"event simulation of the schedule (F = 1, B = 2): bubble {100 * sim.bubble_fraction:.2f}% over a step of "
         f"{sim.step_time_s:g} time units: {'the same' if abs(sim.bubble_fraction - cf) < 1e-9 else 'DIFFERENT'}",
         f"inverse: (p−1)/(m+p−1) ≤ {v['max_bubble']:g} ⇔ m ≥ (p−1)(1−x)/x → m = {need} "
         f"(bubble {100 * bubble_fraction_closed_form(s, p, need, vv):.2f}%)",
         "so PP's economics are batch economics: only many micro-batches in flight amortize the fill and drain"],
        f"A pipeline fills and drains once per step: the last stage waits for the first micro-batch to arrive, the first "
        f"waits for the last gradient to come back. That idle time is (p−1) stage-times out of (m+p−1), "
        f"{pct(cf)} for p = {p} and m = {m}, and the simulated schedule gives the same number. Keeping it under "
        f"{pct(v['max_bubble'])} takes m = {need} micro-batches, which is why pipelines need big batches.",
        {"bubble_closed_form": cf, "bubble_simulated": sim.bubble_fraction, "min_microbatches": need},
        table=(["m", "bubble"], rows),
        sources=["gpipe", "narayanan", "pipedream"], code=["meg-1f1b", "pt-pipe", "ds-pipe"],
        commands=[f"pipeline --schedule {s} --stages {p} --microbatches {m}",
                  f"pipeline --schedule {s} --stages {p} --max-bubble {v['max_bubble']:g}"])


def one_f_one_b(v: dict) -> Explanation:
    """GPipe holds all m micro-batches' activations, 1F1B at most min(p, m) (stage i: min(p − i, m)); same bubble."""
    from shardlab.errors import ShardlabError
    from shardlab.layout import Layout
    from shardlab.memory.activations import ActivationContext, in_flight, layer_activation_bytes
    from shardlab.memory.states import stage_tensors
    from shardlab.pipeline import simulate

    spec = catalog().model(v["model"])
    p, m = v["p"], v["m"]
    if p > spec.num_layers:      # as `estimate` (layout_checks): every stage needs at least one layer
        raise ShardlabError(f"p={p} exceeds {spec.name}'s {spec.num_layers} layers; each pipeline stage needs at least "
                            f"one layer (use p={spec.num_layers} or fewer)")
    n0 = min(p, m)               # stage 0's micro-batches in flight under 1F1B (memory.activations.in_flight)
    lay = Layout(pp=p)
    layers0 = len(stage_tensors(spec, lay)[0].layers)
    per_mb = layer_activation_bytes(spec, 0, lay, ActivationContext(seq_len=v["seq"], elem_bytes=2))[0] * layers0
    if p == 1:
        return _no_pipeline(v, spec, m, layers0, per_mb, in_flight(lay, 0, m), simulate("1f1b", 1, m))
    g, o = simulate("gpipe", p, m), simulate("1f1b", p, m)
    rows = []
    for i in range(p):
        ng, no = in_flight(lay.with_(schedule="gpipe"), i, m), in_flight(lay, i, m)
        rows.append([i, f"{ng:g}", g.peak_in_flight[i], f"{no:g}", o.peak_in_flight[i], gib(ng * per_mb), gib(no * per_mb)])
    return Explanation(
        "1f1b-memory", "GPipe vs 1F1B: same bubble, different memory",
        f"p = {p}, m = {m}: how many micro-batches' activations does each stage hold under GPipe and 1F1B, for "
        f"{spec.name} at {v['seq']} tokens?",
        dict(v),
        ["GPipe runs all m forwards, then all m backwards: every stage holds m micro-batches' activations at its peak",
         f"1F1B runs p−i−1 warm-up forwards on stage i (no more than m), then alternates one forward and one backward: "
         f"at most min(p − i, m) in flight, stage 0 holds min(p, m) = {n0}",
         f"bubble: GPipe {pct(g.bubble_fraction)}, 1F1B {pct(o.bubble_fraction)}: the same (p−1)/(m+p−1)",
         f"stage 0 ({layers0} layers of {spec.name}): one micro-batch's activations = {gib(per_mb)}; GPipe holds {m} → "
         f"{gib(m * per_mb)}, 1F1B holds {n0} → {gib(n0 * per_mb)}",
         "the simulation's peak per stage (table) matches the formula"],
        "Both schedules waste the same fill-and-drain time, but GPipe keeps every micro-batch's activations until the "
        "backward pass starts, while 1F1B starts backward as soon as the first micro-batch reaches the last stage and then "
        "frees one for every one it starts. So memory no longer grows with m: stage 0 holds at most p micro-batches, "
        + (f"{n0} instead of {m}, {gib(n0 * per_mb)} instead of {gib(m * per_mb)} here. " if m > p else
           f"and with m = {m} ≤ p = {p} both hold all {m} ({gib(m * per_mb)}) on stage 0 here; 1F1B's saving shows once "
           f"m exceeds p. ")
        + "That is what lets 1F1B use many micro-batches to shrink the bubble.",
        {"gpipe_peak_in_flight": g.peak_in_flight, "1f1b_peak_in_flight": o.peak_in_flight,
         "activation_bytes_per_microbatch": per_mb, "bubble": o.bubble_fraction},
        table=(["stage", "GPipe (formula)", "GPipe (sim)", "1F1B (formula)", "1F1B (sim)", "GPipe bytes", "1F1B bytes"], rows),
        sources=["gpipe", "pipedream", "narayanan", "korthikanti"], code=["meg-1f1b", "pt-pipe"],
        commands=[f"pipeline --schedule 1f1b --stages {p} --microbatches {m}",
                  f"pipeline --schedule gpipe --stages {p} --microbatches {m}"])


def _no_pipeline(v: dict, spec, m: int, layers: int, per_mb: float, n: float, sim) -> Explanation:
    """`1f1b-memory` with p = 1: one stage, no pipeline. Each micro-batch's backward follows its forward (gradient
    accumulation, Megatron-LM's forward_backward_no_pipelining), so 1 is in flight (a GPipe order would hold m)
    (``memory.activations.in_flight``); the simulation of the one-stage 1F1B schedule (F, B, F, B, ...) agrees."""
    more = min(4, spec.num_layers)           # a pipeline to compare with, if the model has layers for one
    return Explanation(
        "1f1b-memory", "GPipe vs 1F1B at p = 1: no pipeline, one micro-batch in flight",
        f"p = 1, m = {m}: with a single stage, how many micro-batches' activations does it hold, for {spec.name} at "
        f"{v['seq']} tokens?",
        dict(v),
        [f"p = 1: one stage holds all {layers} layers of {spec.name}, so there is no pipeline: nothing to fill or drain "
         f"(bubble {pct(sim.bubble_fraction)}), no warm-up forwards: 1F1B reduces to gradient accumulation, which is what "
         f"frameworks run on one stage",
         f"each micro-batch (m = {m} here) runs its forward, then its backward (gradient accumulation; Megatron-LM's "
         "forward_backward_no_pipelining), which frees its activations before the next one starts: "
         f"{n:g} in flight, whatever m is",
         f"one micro-batch's activations ({layers} layers of {spec.name}) = {gib(per_mb)}; the stage holds {n:g} → "
         f"{gib(n * per_mb)} (a GPipe order, every forward before any backward, would still hold all {m}: "
         f"{gib(m * per_mb)}; no framework runs it without a pipeline, and shardlab's memory model takes 1)",
         f"the simulated one-stage schedule (F, B, F, B, ...) peaks at {sim.peak_in_flight[0]} in flight, as the formula says",
         "the schedules differ from p = 2 on: GPipe holds all m micro-batches on every stage, 1F1B at most "
         "min(p − i, m) on stage i"],
        f"With one stage there is no pipeline: no fill, no drain, no bubble; frameworks run the micro-batches as "
        f"gradient accumulation. "
        f"Each micro-batch's backward pass follows its forward pass, so its activations ({gib(per_mb)} here) are freed "
        f"before the next micro-batch starts: the stage holds one micro-batch's activations at a time, whether m is "
        f"{m} or any other number (the m micro-batches only accumulate gradients). The difference between GPipe (all m "
        f"in flight) and 1F1B (at most p) appears once there are two stages or more.",
        {"gpipe_peak_in_flight": [int(n)], "1f1b_peak_in_flight": list(sim.peak_in_flight),
         "activation_bytes_per_microbatch": per_mb, "bubble": sim.bubble_fraction},
        table=(["stage", "layers", "in flight (formula)", "in flight (sim)", "activation bytes"],
               [[0, layers, f"{n:g}", sim.peak_in_flight[0], gib(n * per_mb)]]),
        sources=["gpipe", "pipedream", "narayanan", "korthikanti"], code=["meg-1f1b", "pt-pipe"],
        commands=[f"pipeline --schedule 1f1b --stages 1 --microbatches {m}"]
        + ([f"explain 1f1b-memory p={more} m={m} model={v['model']} seq={v['seq']}"] if more > 1 else []))


def interleaving(v: dict) -> Explanation:
    """Interleaved 1F1B: v chunks per rank divide the bubble by v at v× the p2p sends and a little more memory."""
    from shardlab.layout import Layout
    from shardlab.memory.activations import in_flight
    from shardlab.pipeline import simulate
    from shardlab.pipeline.closed_form import closed_form_text

    p, m, vv = v["p"], v["m"], v["v"]
    a, b = simulate("1f1b", p, m), simulate("interleaved", p, m, vv)
    n1 = in_flight(Layout(pp=p), 0, m)
    ni = in_flight(Layout(pp=p, vpp=vv, schedule="interleaved"), 0, m)
    return Explanation(
        "interleaving", "Interleaved pipelines: v chunks per GPU",
        f"p = {p}, m = {m}: what does giving each GPU v = {vv} model chunks do to the bubble, the sends and the memory?",
        dict(v),
        [f"1F1B: {closed_form_text('1f1b', p, m)}; simulated {pct(a.bubble_fraction)}",
         f"interleaved, v = {vv}: each fill/drain step is one chunk (1/v of a stage): "
         f"{closed_form_text('interleaved', p, m, vv)}; simulated {pct(b.bubble_fraction)}",
         f"step: {a.step_time_s:g} → {b.step_time_s:g} time units",
         f"cost 1: a micro-batch crosses every rank v times: {vv}× the point-to-point sends (m·v = {m * vv} per rank per "
         f"direction instead of {m})",
         f"cost 2: stage 0 holds {ni:g} stage-equivalents of activations instead of {n1:g} "
         f"(p·(1 + (p−1)/(p·v)), Korthikanti §4.3); and m must be a multiple of p"],
        f"Interleaving gives each GPU several thin slices of the model instead of one thick one, so the pipeline fills and "
        f"drains in thinner steps: the bubble's idle time shrinks by v (Narayanan's (p−1)/m becomes (1/v)(p−1)/m), and as a "
        f"share of the step it falls from {pct(a.bubble_fraction)} to {pct(b.bubble_fraction)}. "
        f"The price is more traffic (each micro-batch passes every GPU v times) and slightly more activation memory on the "
        f"first stage.",
        {"bubble_1f1b": a.bubble_fraction, "bubble_interleaved": b.bubble_fraction, "sends_per_rank": m * vv,
         "in_flight_1f1b": n1, "in_flight_interleaved": ni},
        sources=["narayanan", "korthikanti"], code=["meg-interleaved", "pt-pipe"],
        commands=[f"pipeline --schedule interleaved --stages {p} --microbatches {m} --vpp {vv}"])


def stragglers(v: dict) -> Explanation:
    """A slow stage sets the pipeline's pace; a slow data-parallel or TP rank sets everyone's step (estimate/straggler.py)."""
    from shardlab.errors import ShardlabError
    from shardlab.estimate import estimate_training
    from shardlab.estimate.inference import estimate_inference
    from shardlab.estimate.straggler import SlowRank, effect_of_estimate, straggler_effect
    from shardlab.layout import Layout
    from shardlab.pipeline import simulate
    from shardlab.teach.topics._common import cluster

    p, m, s, x, f = v["p"], v["m"], v["slow_stage"], v["slowdown"], v["fraction"]
    if not 0 < f <= 1:
        raise ShardlabError(f"fraction={f:g}: the share of slowed steps must be in (0, 1]")
    base = simulate("1f1b", p, m)
    slow = simulate("1f1b", p, m, stage_slowdown={s: x})
    spec, cl = catalog().model(v["model"]), cluster(v["gpu"], v["gpus"])
    seq = min(spec.max_seq_len, 4096)
    est = estimate_training(spec, Layout(dp=v["gpus"]), cl, seq_len=seq, global_batch=v["gpus"])
    dp = straggler_effect(est.breakdown, est.step_time_s, SlowRank(1, x))
    tail = straggler_effect(est.breakdown, est.step_time_s, SlowRank(1, x, f))
    tp = effect_of_estimate(estimate_inference(spec, cluster(v["gpu"], 2), tp=2,
                                               precision=serving_precision(spec, cl.accelerator)).to_dict(),
                            SlowRank(1, x))
    ms = lambda t: f"{t * 1e3:,.1f} ms"  # noqa: E731
    return Explanation(
        "stragglers", "Stragglers: the slowest rank sets the pace",
        f"What happens when one GPU runs {x:g}× slower: stage {s} of a 1F1B pipeline (p = {p}, m = {m}), one of "
        f"{v['gpus']} data-parallel replicas of {spec.name}, one of 2 TP ranks decoding, and when it is slow on only "
        f"{f:.0%} of the steps?",
        dict(v),
        [f"pipeline: every micro-batch must pass stage {s}; simulated step {base.step_time_s:g} → {slow.step_time_s:g} time "
         f"units ({slow.step_time_s / base.step_time_s:.2f}×), bubble {pct(base.bubble_fraction)} → "
         f"{pct(slow.bubble_fraction)}: the other stages wait [pipeline/simulate.py]",
         f"data parallelism: the gradient all-reduce is a barrier. The slow rank's own work (compute, recomputation, "
         f"optimizer: {ms(dp.scaled_s)} of the {ms(dp.base_step_s)} step) grows {x:g}×, communication does not: slowed "
         f"step = {ms(dp.base_step_s)} + ({x:g} − 1) × {ms(dp.scaled_s)} = {ms(dp.slow_step_s)} for every rank; the "
         f"others wait {ms(dp.wait_s)} ({dp.drag:+.0%}) [estimate/straggler.py: straggler_effect]",
         f"tensor parallelism, decoding: every all-reduce waits for the last rank, so each token takes "
         f"{ms(tp.base_step_s)} → {ms(tp.slow_step_s)} ({tp.drag:+.0%}) [inference_straggler]",
         f"slow on {f:.0%} of the steps only: mean {ms(tail.mean_step_s)} ({tail.mean_step_s / tail.base_step_s - 1:+.1%}), "
         f"p50 {ms(tail.percentile_step_s(50))}, p99 {ms(tail.percentile_step_s(99))}: the tail grows long before the "
         "mean does, which is why runs report per-rank p50/p99 and not only the mean",
         "finding it: the straggler is the rank whose own compute is longest while the others wait in their "
         "collectives; per-rank p50/p90/p99 with an injected slow rank are measured by `shardlab run train "
         "--slow-rank R:FACTOR`, and `shardlab logs` checks from a start-up log that every rank joined as expected"],
        f"Distributed training moves in lock step. In a pipeline every micro-batch passes through every stage, so one "
        f"stage running {x:g}× slower stretches the whole step {slow.step_time_s / base.step_time_s:.2f}×. In data "
        f"parallelism the all-reduce at the end of each step waits for the slowest replica: its compute grows {x:g}×, the "
        f"others sit idle for {ms(dp.wait_s)} per step. A rank that is slow only now and then hardly moves the mean, but "
        f"sets the p99. So one slow GPU (thermal throttling, a noisy neighbour, a bad link) drags everyone, and you look "
        f"for it in per-rank step times and their p99.",
        {"step_time_base": base.step_time_s, "step_time_slow": slow.step_time_s,
         "bubble_base": base.bubble_fraction, "bubble_slow": slow.bubble_fraction,
         "data_parallel": dp.to_dict(), "tail": tail.to_dict(), "tp_decode": tp.to_dict()},
        sources=["narayanan", "ddp", "tail-at-scale", "sync-sgd"], code=["meg-1f1b"],
        commands=[f"pipeline --schedule 1f1b --stages {p} --microbatches {m} --slow-stage {s} --slowdown {x:g}",
                  f"estimate {spec.name} --gpus {v['gpus']} --gpu {cl.accelerator.id} --global-batch {v['gpus']} "
                  f"--slow-rank 1:{x:g}:{f:g}",
                  f"run train --strategy ddp --nproc-per-node 2 --steps 20 --slow-rank 1:{x:g}"],
        notes=["cross-node TP and PP starving at low traffic: `shardlab explain tp-in-node` and `shardlab explain "
               "pp-inference`; start-up logs: docs/observability.md"])


_PM = (Param("p", "int", 8, "pipeline stages"), Param("m", "int", 32, "micro-batches per step"))
TOPICS = [
    Topic("pipeline-bubble", "Pipeline bubble", "(p−1)/(m+p−1): closed form = simulation; m for a bubble budget", (2, 35),
          _PM + (Param("schedule", "str", "1f1b", "schedule", ("gpipe", "1f1b", "interleaved")),
                 Param("max_bubble", "float", 0.10, "bubble budget (share)", minimum=0.001)), bubble),
    Topic("1f1b-memory", "GPipe vs 1F1B memory", "activations in flight per stage: m vs p − i", (24,),
          (Param("p", "int", 4, "pipeline stages"), Param("m", "int", 16, "micro-batches"), model("llama-3.1-8b"),
           Param("seq", "int", 4096, "tokens per sequence")), one_f_one_b),
    Topic("interleaving", "Interleaved 1F1B", "v chunks per rank: bubble / v, v× the sends", (24,),
          (Param("p", "int", 4, "pipeline stages"), Param("m", "int", 16, "micro-batches (a multiple of p)"),
           Param("v", "int", 2, "chunks per rank", minimum=2)), interleaving),
    Topic("stragglers", "Stragglers", "a slow stage or replica sets everyone's pace", (35, 37),
          (Param("p", "int", 4, "pipeline stages"), Param("m", "int", 16, "micro-batches"),
           Param("slow_stage", "int", 1, "the slow stage", minimum=0), Param("slowdown", "float", 1.5, "how much slower"),
           Param("fraction", "float", 0.05, "share of the steps a rank is slow on", minimum=0.001), model("llama-3.1-8b"),
           Param("gpus", "int", 16, "data-parallel GPUs", minimum=2), gpu("h100-sxm")), stragglers),
]
