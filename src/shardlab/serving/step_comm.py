"""Communication of one serving step as lines in its tokens (fixed seconds + seconds per token): the TP all-reduce,
the pipeline send, and expert parallelism's dispatch and combine (DeepEP's normal kernels for steps with prompt
tokens, its low-latency ones for decoding steps). Each is the α–β collective model (``comm.collectives``) through 1
and 4096 tokens; ``serving.step`` sums them per stage."""

from __future__ import annotations

from shardlab.comm.collectives import collective_time
from shardlab.comm.moe_dispatch import distinct_per_token
from shardlab.serving.precision import InferencePrecision
from shardlab.specs.hardware import Cluster
from shardlab.specs.model import ModelSpec


def per_token_line(op: str, bytes_per_token: float, ranks: int, link) -> tuple[float, float]:
    """(fixed seconds, seconds per token) of one collective whose message grows with a step's tokens: the α–β line
    (``comm.collectives``) through 1 and 4096 tokens."""
    one = collective_time(op, max(1, round(bytes_per_token)), ranks, link).time_s
    big = collective_time(op, max(1, round(4096 * bytes_per_token)), ranks, link).time_s
    slope = (big - one) / 4095
    return one - slope, slope


def allreduce_terms(tokens_bytes: int, tp: int, cluster: Cluster) -> tuple[float, float]:
    """(fixed seconds, seconds per token) of one TP all-reduce."""
    if tp == 1:
        return 0.0, 0.0
    return per_token_line("all-reduce", tokens_bytes, tp, cluster.intra_link if tp <= cluster.gpus_per_node
                          else cluster.inter_link)


def a2a_terms(spec: ModelSpec, ep: int, tp: int, precision: InferencePrecision, cluster: Cluster,
               low_latency: bool = False) -> tuple[float, float]:
    """(fixed seconds, seconds per token) of one MoE layer's dispatch and combine across ``ep`` ranks, as DeepEP
    moves them (deepseek-ai/DeepEP README; DeepSeek-V3 report §3.2.2, arXiv 2412.19437): each token goes to its
    top-k experts (h values at the activations' width: fp8 when they are fp8) and comes back at 16 bits; an attention
    TP group of ``tp`` ranks splits its tokens between them. Inside a node, an all-to-all of the k copies over
    NVLink. Across nodes, DeepEP's normal kernels (prefill) send a token over the network once per remote node
    holding one of its experts (NVLink forwards it there), n·(1 − (1 − 1/n)^k) distinct nodes of n under uniform
    routing; its low-latency kernels (``low_latency``: decoding, 'pure RDMA' in the README) send it straight to each
    remote GPU holding one of its experts, ep·(1 − (1 − 1/ep)^k) distinct GPUs of ep. Either way (r − 1)/r of them
    are remote. α–β per phase (``comm.collectives``), the phases added."""
    if ep <= 1 or spec.moe is None:
        return 0.0, 0.0
    k, h = spec.moe.top_k, spec.hidden_size
    local = min(ep, cluster.gpus_per_node)
    nodes = -(-ep // max(cluster.gpus_per_node, 1))
    distinct = float(distinct_per_token(nodes, k))                # nodes a token's k experts fall on
    if low_latency:                                               # remote GPUs, each reached by RDMA, not via NVLink
        distinct = float(distinct_per_token(ep, k)) * (ep - local) / ep * nodes / max(nodes - 1, 1)
    fixed = per_tok = 0.0
    for width in ((1 if precision.activations == "fp8" else 2), 2):  # dispatch, then combine
        phases = [(k * h * width / tp, local, cluster.intra_link)]              # NVLink inside the node
        if nodes > 1:
            phases.append((distinct * h * width / tp, nodes, cluster.inter_link))   # the NIC to the other nodes
        for b, n, link in phases:
            if n > 1:
                f, t = per_token_line("all-to-all", b, n, link)
                fixed, per_tok = fixed + f, per_tok + t
    return fixed, per_tok
