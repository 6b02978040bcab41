"""The communication inventory of a layout: counts and sizes derived by hand from formulas.md."""

import pytest

from shardlab.catalog import get_catalog
from shardlab.comm.collectives import bus_factor, collective_time
from shardlab.comm.inventory import DDP_BUCKET_BYTES, layout_collectives, summarize
from shardlab.layout import Layout
from shardlab.specs.hardware import Cluster
from shardlab.specs.tensors import param_counts

CAT = get_catalog()
L7 = CAT.model("llama-2-7b")       # L = 32, h = 4096, untied, 6.74B params
MIX = CAT.model("mixtral-8x7b")    # 32 MoE layers, top-2 of 8


def cluster(n, gpn=8):
    return Cluster(CAT.accelerator("h100-sxm"), n, gpn, CAT.link("nvlink4"), CAT.link("ib-ndr"))


def items(spec, lay, n=None, gpn=8, seq=4096, m=1):
    return layout_collectives(spec, lay, cluster(n or lay.world_size, gpn), seq_len=seq, microbatches=m)


def find(its, axis, op, phase):
    got = [i for i in its if i.axis == axis and i.op == op and i.phase == phase]
    assert got, f"no {axis} {op} {phase}"
    return got[0]


def test_megatron_tp_two_all_reduces_per_layer_each_way():
    its = items(L7, Layout(tp=8), m=4)
    fwd, bwd = (find(its, "TP", "all-reduce", ph) for ph in ("forward", "backward"))
    assert fwd.calls_per_step == 2 * 32 * 4 and bwd.calls_per_step == 2 * 32 * 4
    assert fwd.bytes_per_call == 1 * 4096 * 4096 * 2              # b·s·h elements, bf16
    assert fwd.link_id == "nvlink4" and fwd.nodes_spanned == 1 and fwd.overlap == "critical"
    assert fwd.time_per_call_s == pytest.approx(collective_time("all-reduce", 4096 * 4096 * 2, 8, CAT.link("nvlink4")).time_s)
    assert fwd.time_per_step_s == pytest.approx(fwd.time_per_call_s * fwd.calls_per_step)


def test_full_recomputation_repeats_the_forward_all_reduces_in_backward():
    its = items(L7, Layout(tp=4, recompute="full"), m=2)
    assert find(its, "TP", "all-reduce", "backward").calls_per_step == 4 * 32 * 2


def test_sequence_parallel_pairs_have_the_all_reduce_volume():
    its = items(L7, Layout(tp=8, sequence_parallel=True))
    ag, rs = find(its, "SP", "all-gather", "forward"), find(its, "SP", "reduce-scatter", "forward")
    assert ag.calls_per_step == rs.calls_per_step == 2 * 32
    assert ag.bytes_per_call == rs.bytes_per_call == 4096 * 4096 * 2
    # volume per rank: (n-1)/n·S each, together 2(n-1)/n·S = one all-reduce of S
    assert (bus_factor("all-gather", 8) + bus_factor("reduce-scatter", 8)) == pytest.approx(bus_factor("all-reduce", 8))
    assert not [i for i in its if i.axis == "TP" and i.op == "all-reduce" and "g:" in i.note]


def test_tp_across_nodes_is_flagged():
    its = items(L7, Layout(tp=16), n=16, gpn=8)
    fwd = find(its, "TP", "all-reduce", "forward")
    assert fwd.link_id == "ib-ndr" and fwd.nodes_spanned == 2 and "crosses nodes" in fwd.risk


def test_pipeline_send_recv_per_micro_batch_per_boundary():
    its = items(L7, Layout(pp=2, dp=8), m=8)                   # pp stride 8 = a node: stages on two nodes
    f, b = find(its, "PP", "send-recv", "forward"), find(its, "PP", "send-recv", "backward")
    assert f.calls_per_step == b.calls_per_step == 8
    assert f.bytes_per_call == 4096 * 4096 * 2 and f.link_id == "ib-ndr"
    its = items(L7, Layout(pp=4, vpp=2, schedule="interleaved", tp=2), m=8)
    f = find(its, "PP", "send-recv", "forward")
    assert f.calls_per_step == 8 * 2 and f.link_id == "nvlink4" and f.overlap == "overlappable"
    sp = find(items(L7, Layout(pp=2, tp=4, sequence_parallel=True), m=4), "PP", "send-recv", "forward")
    assert sp.bytes_per_call == 4096 * 4096 * 2 // 4          # Megatron sends the sequence-scattered tensor


def test_ddp_all_reduces_every_gradient_in_buckets():
    its = items(L7, Layout(dp=8))
    dp = find(its, "DP", "all-reduce", "backward")
    grads = param_counts(L7).total * 2                         # bf16 gradients, 2Ψ bytes
    assert dp.bytes_per_call * dp.calls_per_step == pytest.approx(grads, rel=1e-7)  # buckets rounded to whole bytes
    assert dp.bytes_per_call <= DDP_BUCKET_BYTES and dp.overlap == "overlappable" and dp.group_size == 8


def _volume(its):
    """Bytes through each rank's link per step: Σ bus factor × S × calls (nccl-tests busbw convention)."""
    return sum(bus_factor(i.op, i.group_size) * i.bytes_per_call * i.calls_per_step for i in its
               if i.axis in ("DP", "ZeRO", "FSDP"))


def test_zero_traffic_ratios_match_the_paper():
    # ZeRO §7: stages 1-2 move 2Ψ like DDP; stage 3 moves 3Ψ (1.5×)
    ddp = _volume(items(L7, Layout(dp=8)))
    assert _volume(items(L7, Layout(dp=8, zero=1))) == pytest.approx(ddp, rel=1e-7)
    assert _volume(items(L7, Layout(dp=8, zero=2))) == pytest.approx(ddp, rel=1e-7)
    # DeepSpeed's module-wise ZeRO-3 gathers every module again for backward: 3Ψ
    ds = CAT.framework("deepspeed")
    z3ds = layout_collectives(L7, Layout(dp=8, zero=3), cluster(8, 8), seq_len=4096, microbatches=1, framework=ds)
    assert _volume([i for i in z3ds if "recomputed" not in i.note]) == pytest.approx(1.5 * ddp, rel=1e-7)
    # FSDP keeps the root unit gathered from forward through backward: the embedding and head (2 × 32000 × 4096)
    # and the final norm (4096) are not re-gathered
    root, psi = 2 * 32000 * 4096 + 4096, param_counts(L7).total
    assert _volume(items(L7, Layout(dp=8, zero=3))) == pytest.approx((1.5 - 0.5 * root / psi) * ddp, rel=1e-7)
    z3 = items(L7, Layout(dp=8, zero=3), m=4)
    gathers = [i for i in z3 if i.axis == "FSDP" and i.op == "all-gather"]
    assert [(i.phase, i.calls_per_step, i.overlap) for i in gathers] == [
        ("forward", 32 * 4, "overlappable"), ("backward", 32 * 4, "overlappable"), ("forward", 4, "critical")]
    # each block unit carries one block; the root unit its own size (not the average of 33 units)
    assert gathers[0].bytes_per_call == (psi - root) // 32 * 2
    assert gathers[2].bytes_per_call == root * 2
    rs = [i for i in z3 if i.axis == "FSDP" and i.op == "reduce-scatter"]
    assert [(i.calls_per_step, i.overlap) for i in rs] == [(32 * 4, "overlappable"), (4, "critical")]


def test_context_parallel_ring_passes_kv_blocks():
    its = items(L7, Layout(cp=4, dp=2), m=2)
    f = find(its, "CP", "send-recv", "forward")
    assert f.calls_per_step == 32 * 2 * 3                      # layers × m × (cp - 1) ring steps
    assert f.bytes_per_call == 2 * (4096 // 4) * 32 * 128 * 2  # K and V of s/cp tokens, 32 KV heads × 128
    b = find(its, "CP", "send-recv", "backward")    # K/V and dK/dV: two messages of the block's size per ring step
    assert (b.bytes_per_call, b.calls_per_step) == (f.bytes_per_call, 2 * f.calls_per_step)
    assert f.overlap == "overlappable"
    # ZeRO/DDP reduce over dp × cp (CP ranks hold the same weights)
    assert find(its, "DP", "all-reduce", "backward").group_size == 8


def test_expert_parallel_all_to_alls():
    its = items(MIX, Layout(dp=8, ep=8), m=2)
    f = find(its, "EP", "all-to-all", "forward")
    assert f.calls_per_step == 2 * 32 * 2 and f.group_size == 8
    assert f.bytes_per_call == 4096 * 2 * 4096 * 2              # b·s tokens × top-2 copies × h × bf16
    dps = [i for i in its if i.axis == "DP"]
    assert [i.group_size for i in dps] == [8]                  # experts: dp/ep = 1 replica each, nothing to reduce
    its = items(MIX, Layout(dp=8, ep=4))
    assert [i.group_size for i in its if i.axis == "DP"] == [8, 2]  # dense over dp, experts over dp/ep


def test_expert_dispatch_under_tp_sends_each_tp_ranks_share_and_gathers_over_tp():
    """Megatron-core's alltoall dispatcher with experts split by TP: each TP rank all-to-alls its 1/t share of the
    group's routed copies over EP, the TP group all-gathers what it received and reduce-scatters the experts' output;
    those replace the MLP's TP pair, so a MoE layer issues one SP pair (attention) per pass, not two."""
    lay = Layout(dp=8, tp=2, ep=4, sequence_parallel=True)
    its = items(MIX, lay, m=2)
    routed = 1 * 4096 * 2 * 4096 * 2                              # b·s tokens × top-2 copies × h × bf16
    a2a = find(its, "EP", "all-to-all", "forward")
    assert a2a.bytes_per_call == routed // 2 and a2a.group_size == 4 and a2a.calls_per_step == 2 * 32 * 2
    etp = [i for i in its if i.axis == "EP" and i.op != "all-to-all" and i.phase == "forward" and i.group_size == 2]
    assert sorted((i.op, i.bytes_per_call, i.calls_per_step, i.link_id) for i in etp) == [
        ("all-gather", routed, 32 * 2, "nvlink4"), ("reduce-scatter", routed, 32 * 2, "nvlink4")]
    counts = [i for i in its if i.axis == "EP" and i.group_size == 8]      # the dispatcher's token counts, TP × EP
    assert [(i.op, i.phase, i.bytes_per_call, i.calls_per_step) for i in counts] == [("all-gather", "forward", 8 * 8 * 8, 32 * 2)]
    assert find(its, "SP", "all-gather", "forward").calls_per_step == 32 * 2       # attention only: 1 per layer
    # without EP the dispatcher still gathers the copies (and the counts) over TP in place of the MLP's pair, with
    # no all-to-all; with EP and no TP nothing is gathered over TP
    noep = items(MIX, Layout(dp=8, tp=2, sequence_parallel=True), m=2)
    assert find(noep, "SP", "all-gather", "forward").calls_per_step == 32 * 2
    assert sorted((i.op, i.bytes_per_call) for i in noep if i.axis == "EP" and i.phase == "forward") == [
        ("all-gather", 2 * 8 * 8), ("all-gather", routed), ("reduce-scatter", routed)]
    assert [(i.op, i.group_size) for i in items(MIX, Layout(dp=8, ep=8), m=2) if i.axis == "EP" and i.op != "all-to-all"
            ] == [("all-gather", 8)]                                   # only the token counts


def test_summary_adds_up():
    its = items(L7, Layout(tp=8, pp=2, dp=4), m=8)
    s = summarize(its)
    assert s["total_s"] == pytest.approx(s["critical_s"] + s["overlappable_s"])
    assert s["total_s"] == pytest.approx(sum(s["by_axis_s"].values()))
