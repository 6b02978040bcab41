"""Communication topics: ring and tree all-reduce, DDP buckets and overlap, link bandwidth figures, TP inside a node."""

from __future__ import annotations

from shardlab.teach.explanation import Explanation
from shardlab.teach.params import Param
from shardlab.teach.registry import Topic
from shardlab.teach.topics._common import catalog, cluster, gpu, link, model, pct
from shardlab.units import fmt_bytes, fmt_count, fmt_time


def all_reduce(v: dict) -> Explanation:
    """Ring vs tree all-reduce: the α–β formula with the numbers, the regime, and where ring and tree cross."""
    from shardlab.comm.collectives import collective_time, crossover_size_bytes

    ln = catalog().link(v["link"])
    n, S, algo = v["ranks"], v["size"], v["algorithm"]
    other = "tree" if algo == "ring" else "ring"
    c = collective_time("all-reduce", S, n, ln, algo)
    o = collective_time("all-reduce", S, n, ln, other)
    cross = crossover_size_bytes("all-reduce", n, ln.latency_s, ln.bytes_per_s, algo)
    sizes = [2**k for k in range(10, 31, 4)]
    rows = []
    for s in sizes:
        r, t = (collective_time("all-reduce", s, n, ln, a) for a in ("ring", "tree"))
        rows.append([fmt_bytes(s), fmt_time(r.time_s), r.regime, fmt_time(t.time_s), "ring" if r.time_s <= t.time_s else "tree"])
    bw_share = c.bandwidth_s / c.time_s if c.time_s else 0.0
    steps = {"ring": f"2(n−1) = {2 * (n - 1)}", "tree": f"2⌈log₂n⌉ = {int(c.steps)}"}[algo]
    return Explanation(
        f"{algo}-all-reduce", f"{algo.capitalize()} all-reduce: latency and bandwidth terms",
        f"How long does a {algo} all-reduce of {fmt_bytes(S)} take on {n} ranks over {ln.name}, and is it latency- or "
        f"bandwidth-bound?",
        dict(v),
        [c.formula.splitlines()[0],
         f"latency term: {steps} steps × α {ln.latency_us:g} µs = {fmt_time(c.latency_s)}; bandwidth term: "
         f"{fmt_time(c.bandwidth_s)} ({pct(bw_share)} of the total {fmt_time(c.time_s)})",
         f"β = {ln.bandwidth_gbps:g} GB/s line rate × {ln.efficiency:.2f} efficiency = {ln.bytes_per_s / 1e9:.1f} GB/s; "
         f"busbw = algbw × 2(n−1)/n = {c.busbw_gbps:.1f} GB/s, comparable with β whatever n is",
         f"crossover: below S* = steps·α·β/coeff = {fmt_bytes(cross)} the latency term dominates; {fmt_bytes(S)} is "
         f"{c.regime}-bound",
         f"{other}: {fmt_time(o.time_s)} ({'faster' if o.time_s < c.time_s else 'slower'}): "
         + ("the ring moves the minimum bytes 2(n−1)/n·S but takes 2(n−1) latency steps; the tree takes ~2·log₂n steps "
            "but sends 2·S, so trees win on small messages and many ranks, rings on large messages")],
        f"An all-reduce of S bytes on n ranks cannot move less than about 2·S per rank: the ring sends 2(n−1)/n·S in "
        f"2(n−1) small steps, which is optimal in bandwidth. For {fmt_bytes(S)} on {n} ranks that is "
        f"{fmt_time(c.bandwidth_s)} of pure transfer plus {fmt_time(c.latency_s)} of per-step latency, so this size is "
        f"{c.regime}-bound. Gradients are big, which is why data-parallel all-reduces are bandwidth-bound and why the "
        f"link's bandwidth, not its latency, decides their cost; tiny decode messages are the opposite.",
        {"time_s": c.time_s, "latency_s": c.latency_s, "bandwidth_s": c.bandwidth_s, "regime": c.regime,
         "crossover_bytes": cross, "busbw_gbps": c.busbw_gbps, f"{other}_time_s": o.time_s},
        table=(["size", "ring", "ring regime", "tree", "faster"], rows),
        sources=["ring", "thakur", "hockney", "nccl-tree", "nccl-tests"], code=[],
        commands=[f"comm all-reduce --size {S} --gpus {n} --link {ln.id} --algorithm {algo}",
                  f"comm all-reduce --sweep --gpus {n} --link {ln.id}"])


def ddp_buckets(v: dict) -> Explanation:
    """DDP: gradients in 25 MiB buckets all-reduced while backward runs; only what outlasts backward is exposed."""
    from shardlab.comm.inventory import DDP_BUCKET_BYTES, layout_collectives
    from shardlab.estimate import estimate_training
    from shardlab.rates.hardware import overlap_efficiency
    from shardlab.layout import Layout

    spec, cl = catalog().model(v["model"]), cluster(v["gpu"], v["gpus"])
    seq = min(spec.max_seq_len, 2048)
    lay = Layout(dp=v["gpus"])
    fw = catalog().framework("megatron-lm")          # the estimate's default framework: fp32 gradients under bf16
    item = next(i for i in layout_collectives(spec, lay, cl, seq_len=seq, microbatches=1, framework=fw) if i.axis == "DP")
    est = estimate_training(spec, lay, cl, seq_len=seq, global_batch=v["gpus"])
    total = item.time_per_step_s
    grads = item.bytes_per_call * item.calls_per_step
    backward = est.dp_window_s          # the blocks' backward: the window the step model hides the reduction under
    exposed = est.breakdown["dp_comm_s"]
    eta = overlap_efficiency(cl.accelerator)
    # bucket by bucket: the reductions hide under η of the backward, but the last bucket is ready only when backward ends
    bucketed = max(item.time_per_call_s, total - eta * backward)
    return Explanation(
        "ddp-buckets", "DDP: gradient buckets and overlap with backward",
        f"DDP of {spec.name} on {v['gpus']} × {cl.accelerator.id}: how many buckets, how many bytes, how long, and how "
        f"much of it hides behind backward?",
        dict(v),
        [f"gradients: {fmt_count(grads / 4)} params × 4 B (under bf16-mixed Megatron-LM holds and reduces gradients in "
         f"an fp32 main_grad buffer, --grad-reduce-in-bf16 halves it; PyTorch DDP under autocast keeps fp32 parameters "
         f"and reduces 4-byte gradients too) = {fmt_bytes(grads)}",
         f"buckets: ⌈{fmt_bytes(grads)} / {DDP_BUCKET_BYTES // 2**20} MiB⌉ = {item.calls_per_step} all-reduces of "
         f"{fmt_bytes(item.bytes_per_call)} per step (PyTorch DDP bucket_cap_mb = 25; DDP also caps its first bucket "
         f"at 1 MiB, one small extra call left out here)",
         f"each bucket: ring all-reduce over {item.group_size} ranks on {item.link_id}: {fmt_time(item.time_per_call_s)}; "
         f"all buckets {fmt_time(total)} (one all-reduce of everything would take {fmt_time(est.dp_comm_total_s)}: "
         f"bucketing adds {item.calls_per_step - 1} × the latency term but lets communication start early)",
         f"a bucket is reduced as soon as backward has produced all its gradients, so the reductions run under the "
         f"blocks' backward ({fmt_time(backward)} of the {fmt_time(est.breakdown['compute_s'])} forward + backward compute; "
         f"backward costs 2× forward, and the head and loss run before the first bucket fills); overlapped communication hides under η = {eta:.0%} of that "
         f"compute (the {cl.accelerator.id}'s overlap share: docs/validation.md), and the last bucket is ready only when "
         f"backward ends: exposed ≈ max(last bucket {fmt_time(item.time_per_call_s)}, {fmt_time(total)} − {eta:.4f} × "
         f"{fmt_time(backward)}) = {fmt_time(bucketed)}",
         f"the step model (`shardlab estimate`) prices the gradients as one all-reduce of {fmt_time(est.dp_comm_total_s)} "
         f"under the same η: max(0, {fmt_time(est.dp_comm_total_s)} − {eta:.4f} × {fmt_time(backward)}) = {fmt_time(exposed)} "
         f"exposed ({pct(exposed / est.step_time_s)} of the {fmt_time(est.step_time_s)} step); the bucket-level figure "
         f"differs by the latency terms and the last bucket",
         "the bottleneck: the all-reduce moves 2(n−1)/n × the whole gradient every step whatever the GPU count; when it "
         "outlasts backward, adding GPUs stops helping"],
        f"Data parallelism keeps a full model on every GPU and averages gradients with an all-reduce each step. DDP does "
        f"not wait for backward to finish: it groups gradients into 25 MiB buckets and starts reducing each bucket as soon "
        f"as it is ready. {spec.name} has {item.calls_per_step} buckets taking {fmt_time(total)} in total, of which "
        f"about {fmt_time(bucketed)} is left once backward is done (at least the last bucket, which nothing can hide). The bytes per step are fixed by the model, not by the number of "
        f"GPUs, so the all-reduce bandwidth is DDP's bottleneck.",
        {"gradient_bytes": grads, "buckets": item.calls_per_step, "bucket_bytes": item.bytes_per_call,
         "all_reduce_s": total, "exposed_s": exposed, "bucketed_exposed_s": bucketed, "overlap_efficiency": eta,
         "whole_all_reduce_s": est.dp_comm_total_s, "backward_s": backward, "step_time_s": est.step_time_s},
        sources=["ddp", "ring"], code=["pt-ddp", "pt-reducer", "meg-ddp"],
        commands=[f"comm plan {spec.name} --gpus {v['gpus']} --gpu {cl.accelerator.id}",
                  "run train --strategy ddp --nproc-per-node 2 --check-parity"],
        notes=["the window is the transformer blocks' backward of the last micro-batch (backward costs 2× forward); "
               "the embedding, head and loss are outside it"])


def link_bandwidth(v: dict) -> Explanation:
    """Per-direction vs bidirectional link figures (NVLink 600 GB/s vs InfiniBand 200 Gb/s) and what a collective sees."""
    from shardlab.comm.collectives import collective_time

    cat = catalog()
    ids = [x.strip() for x in v["links"].split(",") if x.strip()]
    links = [cat.link(i) for i in ids]
    rows, times = [], {}
    for ln in links:
        c = collective_time("all-reduce", v["size"], v["ranks"], ln)
        times[ln.id] = c.time_s
        rows.append([ln.id, f"{2 * ln.bandwidth_gbps:g}", f"{ln.bandwidth_gbps:g}", f"{8 * ln.bandwidth_gbps:g}",
                     f"{ln.bytes_per_s / 1e9:.1f}", f"{ln.latency_us:g}", fmt_time(c.time_s)])
    fast, slow = min(links, key=lambda x: times[x.id]), max(links, key=lambda x: times[x.id])
    return Explanation(
        "link-bandwidth", "Link bandwidth: per direction, both directions, bits and bytes",
        f"What do the datasheet figures of {', '.join(ids)} mean for an all-reduce of {fmt_bytes(v['size'])} on "
        f"{v['ranks']} ranks?",
        dict(v),
        [f"{ln.id}: {ln.bandwidth_gbps:g} GB/s per direction (catalog), {2 * ln.bandwidth_gbps:g} GB/s both directions added, "
         f"{8 * ln.bandwidth_gbps:g} Gb/s per direction; a collective reaches {ln.efficiency:.0%} of it = "
         f"{ln.bytes_per_s / 1e9:.1f} GB/s [{ln.source}]" for ln in links]
        + ["NVLink datasheets quote both directions added (A100: 600 GB/s = 300 each way; H100: 900 = 450 each way); "
           "InfiniBand and Ethernet quote bits per second per direction (HDR 200 Gb/s = 25 GB/s each way): compare "
           "like with like",
           f"the all-reduce: {fmt_time(times[fast.id])} on {fast.id} vs {fmt_time(times[slow.id])} on {slow.id} "
           f"({times[slow.id] / times[fast.id]:,.1f}× slower)"],
        f"A link's bandwidth is quoted in two ways that differ by up to 16×: NVLink's '600 GB/s' adds both directions, "
        f"so one direction carries 300 GB/s; InfiniBand's '200 Gb/s' is bits in one direction, 25 GB/s. A ring collective "
        f"sends one way around the ring, so the per-direction byte rate is the number to use. That is why the same "
        f"all-reduce takes {_ratio(times[slow.id] / times[fast.id])}× longer on {slow.id} than on {fast.id}, and why the "
        f"chattiest parallelism stays on the fastest link.",
        {"time_s": times, "per_direction_gbps": {ln.id: ln.bandwidth_gbps for ln in links}},
        table=(["link", "GB/s both ways", "GB/s per direction", "Gb/s per direction", "β GB/s", "α µs", "all-reduce"], rows),
        sources=["nvlink", "infiniband", "nccl-tests"], code=[],
        commands=["links", f"comm all-reduce --size {v['size']} --gpus {v['ranks']} --link {slow.id}"])


def tp_in_node(v: dict) -> Explanation:
    """TP inside a node: the same TP degree with its group on NVLink vs stretched across nodes."""
    from shardlab.estimate import estimate_training
    from shardlab.layout import Layout

    from shardlab.errors import ShardlabError

    spec = catalog().model(v["model"])
    cl = cluster(v["gpu"], v["gpus"])
    gpn = cl.gpus_per_node
    if v["gpus"] % (2 * gpn):
        raise ShardlabError(f"gpus={v['gpus']}: comparing TP {gpn} with TP {2 * gpn} needs a multiple of {2 * gpn} GPUs "
                            f"({cl.accelerator.id} servers hold {gpn})")
    seq = min(spec.max_seq_len, 4096)
    res = {}
    gb = v["gpus"] // gpn * 8                         # the same global batch for both
    for t in (gpn, 2 * gpn):
        lay = Layout(dp=v["gpus"] // t, tp=t, zero=1)
        est = estimate_training(spec, lay, cl, seq_len=seq, global_batch=gb)
        res[t] = est
    a, b = res[gpn], res[2 * gpn]
    return Explanation(
        "tp-in-node", "Tensor parallelism stays inside a node",
        f"{spec.name} on {v['gpus']} × {cl.accelerator.id} ({gpn} per node): TP {gpn} on {cl.intra_link.id} vs TP "
        f"{2 * gpn} across two nodes on {cl.inter_link.id}?",
        dict(v),
        ["TP issues 4 all-reduces of b·s·h per block per micro-batch (2 forward, 2 backward), on the critical path: "
         "the next matmul needs the result",
         f"TP {gpn} (inside a node, {cl.intra_link.id} {cl.intra_link.bandwidth_gbps:g} GB/s): TP communication "
         f"{a.breakdown['tp_comm_s']:.3f} s of a {a.step_time_s:.3f} s step ({pct(a.breakdown['tp_comm_s'] / a.step_time_s)})",
         f"TP {2 * gpn} (across nodes, {cl.inter_link.id} {cl.inter_link.bandwidth_gbps:g} GB/s): TP communication "
         f"{b.breakdown['tp_comm_s']:.3f} s of a {b.step_time_s:.3f} s step ({pct(b.breakdown['tp_comm_s'] / b.step_time_s)})",
         f"throughput: {a.tokens_per_s:,.0f} vs {b.tokens_per_s:,.0f} tokens/s: stretching TP over the node boundary "
         f"costs {100 * (1 - b.tokens_per_s / a.tokens_per_s):.0f}% of throughput"],
        f"Tensor parallelism talks after every attention and every MLP, and the GPUs wait for each answer. Inside a node "
        f"those all-reduces ride NVLink; across nodes they ride a network link about "
        f"{cl.intra_link.bandwidth_gbps / cl.inter_link.bandwidth_gbps:.0f}× slower per GPU. For {spec.name}, TP "
        f"communication goes from {pct(a.breakdown['tp_comm_s'] / a.step_time_s)} to "
        f"{pct(b.breakdown['tp_comm_s'] / b.step_time_s)} of the step. So TP stays within the {gpn} GPUs of a node, and "
        f"the layers or replicas are split across nodes instead (pipeline and data parallelism).",
        {"intra": {"tp": gpn, "tp_comm_s": a.breakdown["tp_comm_s"], "step_time_s": a.step_time_s, "tokens_per_s": a.tokens_per_s},
         "inter": {"tp": 2 * gpn, "tp_comm_s": b.breakdown["tp_comm_s"], "step_time_s": b.step_time_s, "tokens_per_s": b.tokens_per_s}},
        sources=["megatron", "narayanan"], code=["meg-ranks", "pt-mesh"],
        commands=[f"estimate {spec.name} --gpus {v['gpus']} --tp {2 * gpn} --zero 1 --gpu {cl.accelerator.id}",
                  f"comm plan {spec.name} --gpus {v['gpus']} --tp {2 * gpn} --gpu {cl.accelerator.id}"],
        notes=[f"ZeRO-1, {gb} sequences per step for both, the planner's step-time model"])


def _ar(algo: str):
    return lambda v: all_reduce({**v, "algorithm": algo})


_AR_PARAMS = (Param("size", "size", 256 * 2**20, "message size S (256MiB, 8KB)", minimum=1),
              Param("ranks", "int", 8, "ranks n", minimum=2), link("nvlink4"))
TOPICS = [
    Topic("ring-all-reduce", "Ring all-reduce", "2(n−1)/n·S/β + 2(n−1)·α; why it is bandwidth-bound", (30,), _AR_PARAMS,
          _ar("ring")),
    Topic("tree-all-reduce", "Tree all-reduce", "2⌈log₂n⌉·α + 2·S/β; when trees beat rings", (30,), _AR_PARAMS,
          _ar("tree")),
    Topic("ddp-buckets", "DDP buckets and overlap", "gradient buckets, bytes, time and how much hides behind backward",
          (22, 7), (model("gpt2-xl"), Param("gpus", "int", 8, "data-parallel GPUs", minimum=2), gpu("a100-80gb")), ddp_buckets),
    Topic("link-bandwidth", "Link bandwidth figures", "per-direction vs bidirectional, bits vs bytes (NVLink vs InfiniBand)",
          (15,), (Param("links", "str", "nvlink3,ib-hdr,ethernet-10g", "comma-separated link ids"),
                  Param("size", "size", 2**30, "all-reduce size"), Param("ranks", "int", 8, "ranks", minimum=2)), link_bandwidth),
    Topic("tp-in-node", "TP inside a node", "TP all-reduces on NVLink vs across nodes", (16, 38),
          (model("llama-3.1-70b"), Param("gpus", "int", 64, "GPUs"), gpu("h100-sxm")), tp_in_node),
]


def _ratio(x: float) -> str:
    """A ratio as people say it: two significant figures below 10 (1.6), whole numbers above (27)."""
    return f"{x:.2g}" if x < 10 else f"{x:,.0f}"
