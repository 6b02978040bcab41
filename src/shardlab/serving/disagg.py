"""Disaggregated prefill and decode: two GPU pools, the KV cache moved between them (steady state).

DistServe (Zhong et al. 2024, OSDI, arXiv 2401.09670) and Splitwise (Patel et al. 2024, ISCA, arXiv
2311.18677) run the compute-bound prefill and the bandwidth-bound decode on separate GPUs, so that neither
phase's steps carry the other's work. Here: ``n_p`` prefill replicas and ``n_d`` decode replicas (each a
prepared ``ServeCase``: its TP, MoE layout, KV blocks); every request

1. waits for a prefill replica and is prefilled there, alone or batched with other prompts up to the step's
   token budget. The prefill pool is an M/D/1 queue per replica, as DistServe §3.1 models it: with arrival
   rate λ_p per replica and t₁ the prefill time of one prompt, the mean wait is ρ·t₁ / (2(1 − ρ)), where
   ρ = λ_p·s and s is the time per prompt of a full step (prompts batched up to the budget; s = t₁ for a
   prompt that fills it alone; with pipeline stages, s is the slowest stage's share, the next step entering
   the pipeline while the last one runs on the later stages);
2. sends its prompt's KV cache to a decode replica: every prefill rank sends its slice (the prompt's
   tokens × the rank's KV bytes per token) over its own link, NVLink when both pools sit in one node,
   the RDMA NIC otherwise, α–β (``comm.collectives``, send-recv), after the prefill ends (no layer-wise
   overlap); the link's load λ_p × transfer time must stay below 1;
3. decodes on a decode replica whose steps hold only decodes: B_d sequences per replica, each step
   ``cycle.cycle_time`` of B_d decodes at the mean context (prompt + half the output); B_d solves
   B_d = λ_d · O · cycle(B_d) (Little's law) up to the replica's capacity (its KV blocks hold the whole
   prompt and the output it grows into).

TTFT = request overhead + prefill wait + prefill + KV transfer + the first decode step; TPOT = the decode
cycle. A closed loop of C clients finds its request rate X by bisection on C = X × (TTFT + O·cycle).
``serving.disagg_sim`` simulates the same two pools request by request for the percentiles.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from shardlab.comm.collectives import collective_time
from shardlab.errors import ShardlabError, field_name
from shardlab.memory.inference import kv_cache_bytes_per_token
from shardlab.serving.case import ServeCase, engine_held_tokens
from shardlab.serving.steady import arrays
from shardlab.serving.cycle import cycle_time, micro_batch_times


@dataclass(frozen=True)
class DisaggCase:
    """Two pools of replicas serving one workload."""

    prefill: ServeCase
    """One prefill replica (its layout, step model, budget)."""
    decode: ServeCase
    """One decode replica (its layout, KV blocks, capacity)."""
    prefill_replicas: int
    """Replicas in the prefill pool."""
    decode_replicas: int
    """Replicas in the decode pool."""
    kv_transfer_bytes: int
    """KV bytes one prefill rank sends per request (its slice of the prompt's cache)."""
    kv_transfer_s: float
    """Seconds to send them (every prefill rank in parallel, over ``link``)."""
    link: str
    """The link between the pools: 'intra' (NVLink, one node) or 'inter' (the NIC)."""
    pre_arrays: object = field(default=None, repr=False, compare=False)
    """``steady.arrays`` of the prefill replica (built once)."""
    dec_arrays: object = field(default=None, repr=False, compare=False)
    """... of the decode replica."""
    prefill_times: tuple = field(default=(), repr=False, compare=False)
    """(t₁, s) of ``_prefill_times``, computed once."""
    grid: tuple = field(default=(), repr=False, compare=False)
    """(batches, decode step seconds at the mean context, seconds per cached token beyond it) on a grid up to the
    decode replica's capacity, interpolated by the solvers and the simulation (the step time is piecewise smooth in
    the batch and linear in the cached tokens: one vectorised evaluation instead of one per step)."""

    @property
    def prefill_gpus(self) -> int:
        return self.prefill_replicas * self.prefill.gpus

    @property
    def decode_gpus(self) -> int:
        return self.decode_replicas * self.decode.gpus

    @property
    def gpus(self) -> int:
        return self.prefill_gpus + self.decode_gpus

    def to_dict(self) -> dict:
        pool = lambda c, n: {"gpus": n * c.gpus, "gpu": c.cluster.accelerator.id, "replicas": n, "tp": c.tp,  # noqa: E731
                             "pp": c.pp, "ep": c.ep,
                             "layout": c.layout_label,
                             "dp_attention": c.attention_dp, "capacity_per_replica": c.capacity,
                             "kv_blocks_per_gpu": c.blocks.num_blocks, "weights_per_gpu": c.blocks.weights_bytes}
        return {"prefill": pool(self.prefill, self.prefill_replicas), "decode": pool(self.decode, self.decode_replicas),
                "gpus": self.gpus, "kv_transfer_bytes_per_rank": self.kv_transfer_bytes,
                "kv_transfer_s": self.kv_transfer_s, "kv_link": self.link}


def kv_transfer(pre: ServeCase, same_node: bool) -> tuple[int, float, str]:
    """(bytes per prefill rank, seconds, link) of moving one request's prompt KV from the prefill pool to the decode
    pool. Each prefill rank holds its TP slice of the cache and sends it over its own link; the decode pool
    stores it at its own layout (a different TP re-slices it on arrival, which costs no extra link time). A sliding
    layer sends only its window where the engine keeps only the window (``memory.inference.cached_tokens``)."""
    cl = pre.cluster
    link = cl.intra_link if same_node else cl.inter_link
    per_tok = max(kv_cache_bytes_per_token(pre.spec, pre.tp, pre.pp, pre.precision.kv_bytes))
    nbytes = int(engine_held_tokens(pre.spec, pre.engine, pre.prompt_len) * per_tok)
    return nbytes, float(collective_time("send-recv", max(1, nbytes), 2, link).time_s), "intra" if same_node else "inter"


def _decode_grid(dec: ServeCase):
    """(steady.arrays of the decode replica, (batches, step seconds, seconds per extra cached token)): module doc."""
    a = arrays([dec])
    cap = float(max(dec.capacity, 1))
    B = np.unique(np.concatenate([np.arange(0.0, min(cap, 64.0) + 1), np.geomspace(1.0, cap, 192), [cap]]))
    ctx = float(a.ctx[0])
    cyc = np.ravel(cycle_time(a, B, B * ctx, seqs=np.maximum(B, 1e-9)))
    more = np.ravel(cycle_time(a, B, B * ctx * 1.25, seqs=np.maximum(B, 1e-9)))
    slope = np.where(B > 0, (more - cyc) / np.maximum(B * ctx * 0.25, 1e-9), 0.0)
    return a, (B, cyc, slope)


def make_disagg(pre: ServeCase, dec: ServeCase, prefill_gpus: int, decode_gpus: int, _cache: dict | None = None) -> DisaggCase:
    """The two pools from one prepared replica of each and the GPUs each pool gets (whole replicas). ``_cache``
    (a dict the caller keeps) reuses each replica's arrays, decode grid and prefill times across splits."""
    for name, n, c in (("prefill", prefill_gpus, pre), ("decode", decode_gpus, dec)):
        if n < c.gpus or n % c.gpus:
            raise ShardlabError(f"the {name} pool's {n} GPUs do not hold whole replicas of {c.gpus} GPUs "
                                f"({c.layout_label}); give --disaggregated P:D with P and D multiples of the pools' "
                                f"replica sizes")
    if dec.capacity < 1:
        raise ShardlabError(f"a decode replica ({dec.layout_label}) has room for no {dec.prompt_len + dec.output_len}-"
                            f"token sequence: give the decode pool more GPUs per replica ({field_name('layout.tp')}), or "
                            f"quantize")
    # two GPU kinds never share a node (Splitwise's mixed pools): their KV crosses the NIC
    same_node = (pre.cluster.accelerator.id == dec.cluster.accelerator.id
                 and prefill_gpus + decode_gpus <= pre.cluster.gpus_per_node)
    cache = {} if _cache is None else _cache
    if ("kv", id(pre), same_node) not in cache:
        cache[("kv", id(pre), same_node)] = kv_transfer(pre, same_node)
    nbytes, secs, link = cache[("kv", id(pre), same_node)]
    if ("dec", id(dec)) not in cache:
        cache[("dec", id(dec))] = _decode_grid(dec)
    a, grid = cache[("dec", id(dec))]
    if ("pre", id(pre)) not in cache:
        cache[("pre", id(pre))] = arrays([pre])
    pre_a = cache[("pre", id(pre))]
    d = DisaggCase(pre, dec, prefill_gpus // pre.gpus, decode_gpus // dec.gpus, nbytes, secs, link, pre_a, a, (), grid)
    if ("times", id(pre)) not in cache:
        cache[("times", id(pre))] = _prefill_times(d)
    return replace(d, prefill_times=cache[("times", id(pre))])


def _prefill_times(d: DisaggCase) -> tuple[float, float]:
    """(t₁: one prompt's prefill alone, s: seconds per prompt in a step filled to the budget) on a prefill replica."""
    if d.prefill_times:
        return d.prefill_times
    pre = d.prefill
    a = d.pre_arrays
    S = float(pre.prefill_tokens)
    L = float(pre.prefill_keys_per_token)
    one = float(micro_batch_times(a, 0.0, 0.0, S, S * L, 1.0)[0][0])
    per_step = max(1, int(pre.budget_tokens // max(S, 1.0)))
    through, stage = micro_batch_times(a, 0.0, 0.0, per_step * S, per_step * S * L, float(per_step))
    # pipeline stages pipeline the prompts: a replica takes the next step when its slowest stage is free
    full = float(stage[0] if pre.pp > 1 else through[0])
    chunks = max(1, int(-(-S // pre.budget_tokens)))            # a prompt longer than the budget takes several steps
    overhead = (chunks - 1) * float(a.kernels.step_overhead_s[0])
    return one + overhead, full / per_step + overhead


def _decode_cycle(d: DisaggCase, B: float) -> float:
    """Seconds of one decode step of B sequences on a decode replica (decodes only; ``DisaggCase.grid``)."""
    return float(np.interp(B, d.grid[0], d.grid[1]))


def _decode_batch(d: DisaggCase, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(B, full): per entry of c = λ_d·O, the decode replica's batch solving B = c·cycle(B) on [0, capacity] (module
    doc): the first grid point where B ≥ c·cycle(B), linear between it and the point before; and whether none is
    (the replica is full, B = capacity). That point is the first where the running maximum of B / cycle(B) reaches
    c: a binary search per entry rather than a pass over the grid."""
    Bg, cg, _ = d.grid
    ratio = np.maximum.accumulate(Bg / np.maximum(cg, 1e-300))
    full = ratio[-1] < c
    k = np.minimum(np.searchsorted(ratio, c, side="left"), len(Bg) - 1)
    km = np.maximum(k - 1, 0)
    f0, f1 = Bg[km] - c * cg[km], Bg[k] - c * cg[k]
    between = Bg[km] + (Bg[k] - Bg[km]) * (-f0) / np.where(k > 0, f1 - f0, 1.0)
    return np.where(full, float(d.decode.capacity), np.where(k == 0, 0.0, between)), full


def saturation_many(d: DisaggCase, n_p, n_d, kv_s) -> np.ndarray:
    """Requests/s past which a queue grows, for pools of n_p prefill and n_d decode replicas of ``d``'s two layouts
    sending their KV in kv_s seconds (arrays: one entry per split): the smallest of the prefill pool's, the decode
    pool's (full replicas) and the KV link's rates."""
    _, s = _prefill_times(d)
    dec = d.decode
    cap = float(dec.capacity)
    decode_rate = n_d * cap / (dec.output_len * float(_decode_cycle(d, cap)))
    link_rate = np.where(kv_s > 0, n_p / np.where(kv_s > 0, kv_s, 1.0), np.inf)
    return np.minimum(np.minimum(n_p / s, decode_rate), link_rate)


def steady_many(d: DisaggCase, n_p, n_d, kv_s, sat, rate) -> dict:
    """Steady state of the two pools under Poisson arrivals at ``rate`` requests/s (module doc), for splits of
    ``d``'s two layouts (arrays as ``saturation_many``'s; ``sat`` its result): arrays of ttft_s, tpot_s, e2e_s, ...
    (``steady_rate``'s keys). The capacity search (``serving.disagg_split``) evaluates every split at once."""
    dec = d.decode
    O = dec.output_len
    t1, s = _prefill_times(d)
    rate = np.broadcast_to(np.asarray(rate, dtype=float), np.shape(sat))
    # past saturation the pools complete their saturation rate: the decode pool sees that, a queue holds the rest
    lam_p, lam_d = rate / n_p, np.minimum(rate, sat) / n_d
    rho = lam_p * s
    link_load = lam_p * kv_s
    B, over_d = _decode_batch(d, lam_d * O)
    cycle = np.interp(np.maximum(B, 1e-9), d.grid[0], d.grid[1])
    overloaded = over_d | (rho >= 1) | (link_load >= 1) | (rate >= sat)
    wait = np.where(rho < 1, rho * t1 / (2 * np.where(rho < 1, 1 - rho, 1.0)), np.inf)
    ttft = np.where(overloaded, np.inf, dec.engine.request_overhead_us * 1e-6 + wait + t1 + kv_s + cycle)
    served = np.where(overloaded, sat, rate)
    return {"ttft_s": ttft, "tpot_s": cycle, "e2e_s": ttft + (O - 1) * cycle, "requests_per_s": served,
            "output_tokens_per_s": served * O, "overloaded": overloaded, "prefill_s": np.full(np.shape(sat), t1),
            "prefill_wait_s": wait, "prefill_utilization": np.minimum(rho, 1.0), "kv_transfer_s": kv_s,
            "kv_link_utilization": np.minimum(link_load, 1.0), "decode_batch": B, "in_flight": B * n_d,
            "saturation_rate": sat}


def _one(d: DisaggCase) -> tuple:
    """(n_p, n_d, kv_s) of the split ``d`` itself, as one-entry arrays."""
    return (np.array([float(d.prefill_replicas)]), np.array([float(d.decode_replicas)]),
            np.array([float(d.kv_transfer_s)]))


def steady_rate(d: DisaggCase, rate: float) -> dict:
    """Steady state of the split ``d`` under Poisson arrivals at ``rate`` requests/s (``steady_many`` of one)."""
    one = _one(d)
    r = steady_many(d, *one, saturation_many(d, *one), rate)
    return {k: bool(v[0]) if k == "overloaded" else float(v[0]) for k, v in r.items()}


def saturation_rate(d: DisaggCase) -> float:
    """Requests/s past which a queue grows (``saturation_many`` of one)."""
    return float(saturation_many(d, *_one(d))[0])


def steady_concurrency(d: DisaggCase, clients: int) -> dict:
    """Steady state under a closed loop of ``clients``: the rate X with clients = X × (TTFT(X) + (O − 1)·TPOT(X)),
    by bisection below the saturation rate (a loop that would exceed it queues: the saturated state)."""
    top = saturation_rate(d) * (1 - 1e-6)
    at_top = steady_rate(d, top)
    if clients >= top * at_top["e2e_s"]:            # more clients than the pools serve at once: they queue
        res = dict(at_top)
        res["ttft_s"] = clients / top - (d.decode.output_len - 1) * at_top["tpot_s"]
        res["e2e_s"] = clients / top
        return {**res, "requests_per_s": top, "output_tokens_per_s": top * d.decode.output_len, "overloaded": False}
    lo, hi = 0.0, top
    for _ in range(60):
        mid = (lo + hi) / 2
        if mid * steady_rate(d, mid)["e2e_s"] < clients:
            lo = mid
        else:
            hi = mid
    return steady_rate(d, lo)


def max_rate_within(d: DisaggCase, ttft_slo: float | None, tpot_slo: float | None) -> float:
    """Highest Poisson request rate whose steady-state mean TTFT and TPOT meet the SLOs (0 when none does)."""
    def ok(rate: float) -> bool:
        r = steady_rate(d, rate)
        return (not r["overloaded"] and (ttft_slo is None or r["ttft_s"] <= ttft_slo)
                and (tpot_slo is None or r["tpot_s"] <= tpot_slo))
    top = saturation_rate(d) * (1 - 1e-6)
    lo, hi = 0.0, top
    if not ok(top * 1e-6):
        return 0.0
    if ok(top):
        return top
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo
