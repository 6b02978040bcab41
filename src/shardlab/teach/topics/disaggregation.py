"""Disaggregated prefill and decode: when splitting the two phases onto GPU pools pays (DistServe, Zhong et al. 2024,
arXiv 2401.09670), with the user's model, GPUs and latency targets."""

from __future__ import annotations

from shardlab.teach.explanation import Explanation
from shardlab.teach.params import Param
from shardlab.teach.registry import Topic
from shardlab.teach.topics._common import catalog, cluster, gpu, model, serving_precision
from shardlab.units import fmt_bytes, fmt_time


def disaggregation(v: dict) -> Explanation:
    """When splitting prefill and decode onto separate GPU pools pays: the best aggregated and disaggregated layouts
    of the same GPUs at their capacity under the SLO, the interference a mixed step suffers, the KV transfer."""
    import numpy as np

    from shardlab.serving.capacity import Slo, fluid_capacity
    from shardlab.serving.case import prepare
    from shardlab.serving.disagg import steady_rate
    from shardlab.serving.disagg_split import search
    from shardlab.serving.engines import get_engine
    from shardlab.serving.steady import arrays, fluid
    from shardlab.planner.space import tp_ok
    from shardlab.errors import ShardlabError

    spec, n = catalog().model(v["model"]), v["gpus"]
    cl = cluster(v["gpu"], n)
    prec = serving_precision(spec, cl.accelerator)
    eng = get_engine(None)
    cases = {}
    for tp in [t for t in range(1, min(n, cl.gpus_per_node) + 1) if n % t == 0 and tp_ok(spec, t)]:
        c = prepare(spec, cl, eng, tp=tp, precision=prec, prompt_len=v["prompt"], output_len=v["output"])
        if c.capacity >= 1:
            cases[tp] = c
    if not cases:
        raise ShardlabError(f"no TP layout of {n} × {cl.accelerator.id} holds {spec.name} with a "
                            f"{v['prompt'] + v['output']}-token request: give more gpus")
    slo = Slo(v["ttft"], v["tpot"], "p50")
    tps = sorted(cases)
    fc = fluid_capacity(arrays([cases[t] for t in tps]), slo)
    agg_rates = {t: float(fc.request_rate_per_replica[i]) * (n // t) for i, t in enumerate(tps)}
    t_agg = max(agg_rates, key=agg_rates.get)
    found = search(cases, n, cl.gpus_per_node, v["ttft"], v["tpot"])
    d, r_dis = found[0] if found else (None, 0.0)
    r_agg, O = agg_rates[t_agg], v["output"]
    good_agg, good_dis = r_agg * O / n, r_dis * O / n
    # the interference: at the aggregated winner's rate, its mixed steps against a decode-only step of its batch
    rate_each = max(r_agg / (n // t_agg), 1e-9)
    a = arrays([cases[t_agg]])
    st = {k: float(np.ravel(x)[0]) for k, x in fluid(a, [2], [rate_each]).items()}
    from shardlab.serving.cycle import cycle_time
    D = st["decoding"]
    pure = float(np.ravel(cycle_time(a, D, D * float(a.ctx[0]), seqs=max(D, 1e-9)))[0])
    rows = [["aggregated", f"{n // t_agg} × TP {t_agg}", f"{r_agg:,.2f}", f"{good_agg:,.0f}",
             fmt_time(st["ttft_s"]), fmt_time(st["tpot_s"]), "–"]]
    steps = [f"aggregated: {n // t_agg} replica(s) of TP {t_agg}; each mixed step carries its decodes and the new "
             f"prompts' tokens (chunked prefill): at the most requests/s the SLO allows ({r_agg:,.2f}), TPOT "
             f"{fmt_time(st['tpot_s'])}, of which a decode-only step of the same {D:,.1f} sequences is "
             f"{fmt_time(pure)}: the prompts add {fmt_time(st['tpot_s'] - pure)} to every token "
             f"[serving/steady.py: fluid]"]
    if d is not None and r_dis > 0:
        ds = steady_rate(d, r_dis)
        rows.append(["disaggregated", f"{d.prefill_gpus} prefill (TP {d.prefill.tp}) + {d.decode_gpus} decode "
                     f"(TP {d.decode.tp})", f"{r_dis:,.2f}", f"{good_dis:,.0f}", fmt_time(ds["ttft_s"]),
                     fmt_time(ds["tpot_s"]), fmt_time(d.kv_transfer_s)])
        steps += [f"disaggregated: {d.prefill_gpus} GPUs prefill ({d.prefill_replicas} × TP {d.prefill.tp}), "
                  f"{d.decode_gpus} decode ({d.decode_replicas} × TP {d.decode.tp}); a prompt takes "
                  f"{fmt_time(ds['prefill_s'])} alone and waits {fmt_time(ds['prefill_wait_s'])} in the prefill queue "
                  f"(M/D/1, ρ = {ds['prefill_utilization']:.2f}) [serving/disagg.py: steady_rate]",
                  f"KV transfer: {v['prompt']:,} tokens × {d.kv_transfer_bytes // max(v['prompt'], 1):,} B per prefill "
                  f"rank = {fmt_bytes(d.kv_transfer_bytes)} over {'NVLink' if d.link == 'intra' else 'the NIC'} = "
                  f"{fmt_time(d.kv_transfer_s)} per request (α–β) [serving/disagg.py: kv_transfer]",
                  f"TTFT = overhead + wait + prefill + transfer + first decode step = {fmt_time(ds['ttft_s'])}; TPOT = "
                  f"a decode step of {ds['decode_batch']:,.1f} sequences and no prompt = {fmt_time(ds['tpot_s'])}"]
    ratio = good_dis / good_agg if good_agg > 0 else float("inf")
    verdict = ("neither meets the SLO at any load" if good_agg <= 0 and good_dis <= 0 else
               "only disaggregated meets the SLO" if good_agg <= 0 else
               f"disaggregated gives {ratio:.2f}× the goodput per GPU: splitting pays" if ratio > 1.05 else
               f"disaggregated gives {ratio:.2f}× the goodput per GPU: about the same, splitting buys nothing"
               if ratio >= 0.95 else f"disaggregated gives {ratio:.2f}× the goodput per GPU: keep the phases together")
    steps.append(f"goodput per GPU (output tokens/s per GPU at the capacity under the SLO): aggregated "
                 f"{good_agg:,.0f}, disaggregated {good_dis:,.0f}: {verdict}")
    plain = ("Prefill is compute-bound and decode is bandwidth-bound. In one engine, every new prompt rides in the same "
             "steps as the running decodes, so each decoding request waits for the prompt's compute: that is what "
             "pushes TPOT toward its target first. Splitting puts the prompts on their own GPUs, so decode steps carry "
             "only decodes and TPOT stays low at a larger batch; the price is fewer GPUs for each phase, a queue for "
             "the prefill pool and the KV cache sent between the pools. It pays when prompts are long and the TPOT "
             "target is tight (the interference is large) and the model is big enough that each pool still runs "
             f"full replicas; here: {verdict}.")
    return Explanation(
        "disaggregation", "Disaggregated prefill and decode: when splitting pays",
        f"{spec.name} on {n} × {cl.accelerator.id}, prompts of {v['prompt']} and outputs of {v['output']} tokens, TTFT ≤ "
        f"{v['ttft']:g} s and TPOT ≤ {1e3 * v['tpot']:g} ms: serve aggregated, or split prefill and decode?",
        dict(v), steps, plain,
        {"aggregated": {"tp": t_agg, "replicas": n // t_agg, "max_request_rate": r_agg,
                        "goodput_tokens_per_s_per_gpu": good_agg, "tpot_s": st["tpot_s"], "decode_only_step_s": pure},
         "disaggregated": ({"prefill_gpus": d.prefill_gpus, "prefill_tp": d.prefill.tp, "decode_gpus": d.decode_gpus,
                            "decode_tp": d.decode.tp, "max_request_rate": r_dis, "goodput_tokens_per_s_per_gpu": good_dis,
                            "kv_transfer_s": d.kv_transfer_s} if d is not None else None),
         "ratio": ratio if np.isfinite(ratio) else None},
        table=(["", "layout", "max req/s", "tok/s/GPU", "TTFT", "TPOT", "KV send"], rows),
        sources=["distserve", "vllm"], code=[],
        commands=[f"plan {spec.name} --inference --serve --gpus {n} --gpu {cl.accelerator.id} --prompt-len {v['prompt']} "
                  f"--output-len {v['output']} --ttft-slo {v['ttft']:g} --tpot-slo {v['tpot']:g}"])


TOPICS = [
    Topic("disaggregation", "Disaggregated prefill/decode", "split prefill and decode onto GPU pools: when it pays", (33, 34),
          (model("llama-3.1-70b"), gpu("h100-sxm"), Param("gpus", "int", 16, "GPUs for both pools; every split of them is priced, so at most 1,024",
                                                     maximum=1024),
           Param("prompt", "int", 4000, "prompt tokens"), Param("output", "int", 500, "generated tokens"),
           Param("ttft", "float", 1.0, "TTFT target, s", minimum=0.001),
           Param("tpot", "float", 0.025, "TPOT target, s", minimum=0.0001)), disaggregation)
]
