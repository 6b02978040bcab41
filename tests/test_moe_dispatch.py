"""MoE token movement in training (comm/moe_dispatch.py): DeepEP's one copy per remote node against Megatron-core's
one copy per routed expert, the all-to-all overlap of combined 1F1B, and the busiest rank under uneven routing;
their flags, job files and the Megatron export."""

import json

import numpy as np
import pytest

from shardlab.catalog import get_catalog
from shardlab.cli import main
from shardlab.comm.moe_dispatch import MoeDispatch, overlapped_ep_s, remote_nodes_per_token
from shardlab.comm.pricing import ep_per_moe_block_s
from shardlab.errors import ShardlabError
from shardlab.estimate import estimate_training
from shardlab.layout import Layout
from shardlab.specs.hardware import Cluster

CAT = get_catalog()
H100 = CAT.accelerator("h100-sxm")
Q235 = CAT.model("qwen3-235b-a22b")


def _cluster(n):
    return Cluster(H100, n, 8, CAT.link("nvlink4"), CAT.link("ib-ndr"))


def test_remote_nodes_per_token():
    # one node: nothing crosses the network; k = 8 experts over 4 nodes: 3·(1 − 0.75^8) ≈ 2.70 of the 3 others
    assert remote_nodes_per_token(1, 8) == 0
    assert remote_nodes_per_token(4, 8) == pytest.approx(3 * (1 - 0.75 ** 8))
    assert remote_nodes_per_token(2, 1) == pytest.approx(0.5)
    # never more than the other nodes, nor than the k copies
    n = np.array([2, 4, 8, 64])
    assert np.all(remote_nodes_per_token(n, 8) <= np.minimum(n - 1, 8))


def _ep(dispatcher, ep, gpus_per_node=8, imbalance=1.0):
    cl = Cluster(H100, 256, gpus_per_node, CAT.link("nvlink4"), CAT.link("ib-ndr"))
    return float(ep_per_moe_block_s(cl, tp=1, cp=1, ep=ep, tokens=4096, hidden=4096, top_k=8, elem_bytes=2,
                                    recompute_code=0, num_experts=128, dispatcher=dispatcher, imbalance=imbalance))


def test_deepep_sends_a_token_once_per_remote_node():
    # inside one node the two dispatchers move the same copies over NVLink; DeepEP has no separate count all-gather
    assert _ep("deepep", 8) < _ep("alltoall", 8) < _ep("deepep", 8) * 1.05
    # across 4 nodes: the NIC carries ~2.7 copies per token instead of 8·24/32 = 6
    ratio = _ep("alltoall", 32) / _ep("deepep", 32)
    assert 1.8 < ratio < 2.4
    # the busiest rank's share scales the bytes every rank waits for
    assert _ep("alltoall", 32, imbalance=1.5) == pytest.approx(1.5 * _ep("alltoall", 32), rel=0.02)


def test_overlap_hides_under_another_micro_batch():
    # C = 1 s, W = 2 s, η = 0.5: the first micro-batch shows all of it, the others nothing
    assert overlapped_ep_s(1.0, 2.0, 4, 0.5) == pytest.approx(0.25)
    # C beyond ηW: the excess shows on every micro-batch
    assert overlapped_ep_s(3.0, 2.0, 4, 0.5) == pytest.approx(3 / 4 + 3 / 4 * 2.0)
    assert overlapped_ep_s(3.0, 2.0, 1, 0.5) == pytest.approx(3.0)


LAY = Layout(dp=16, tp=2, pp=8, vpp=4, schedule="interleaved", ep=16, sequence_parallel=True, recompute="selective",
             recompute_modules=("moe_act", "layernorm"))


def _est(lay=LAY, **moe):
    return estimate_training(Q235, lay, _cluster(256), seq_len=4096, global_batch=2048,
                             framework=CAT.framework("megatron-lm"), moe=MoeDispatch(**moe) if moe else None)


def test_estimate_orders_the_mechanisms():
    base, deepep = _est(), _est(dispatcher="deepep")
    over, both = _est(ep_comm_overlap=True), _est(dispatcher="deepep", ep_comm_overlap=True)
    assert base.breakdown["ep_comm_s"] > deepep.breakdown["ep_comm_s"] > both.breakdown["ep_comm_s"]
    assert base.breakdown["ep_comm_s"] > over.breakdown["ep_comm_s"] > both.breakdown["ep_comm_s"]
    assert both.step_time_s < min(deepep.step_time_s, over.step_time_s) < base.step_time_s
    skew = _est(expert_imbalance=1.25)
    assert skew.step_time_s > base.step_time_s and skew.breakdown["compute_s"] > base.breakdown["compute_s"]
    # the same work is done: model FLOPs per token do not change, only time
    assert skew.model_tflops_per_gpu * skew.step_time_s == pytest.approx(base.model_tflops_per_gpu * base.step_time_s)


def test_overlap_where_megatron_refuses_it_is_not_applied_and_said():
    full = Layout(dp=16, tp=2, pp=8, vpp=4, schedule="interleaved", ep=16, sequence_parallel=True, recompute="full")
    a, b = _est(full), _est(full, ep_comm_overlap=True)
    assert a.step_time_s == b.step_time_s and any("ep_comm_overlap not applied" in n for n in b.notes)
    no_vpp = Layout(dp=16, tp=2, pp=8, ep=16, sequence_parallel=True)
    a, b = _est(no_vpp), _est(no_vpp, ep_comm_overlap=True)
    assert a.step_time_s == b.step_time_s and any("virtual pipeline" in n for n in b.notes)
    dense = estimate_training(CAT.model("llama-3.1-8b"), Layout(dp=8), _cluster(8), seq_len=4096, global_batch=64,
                              moe=MoeDispatch("deepep"))
    assert any("is dense" in n for n in dense.notes)


@pytest.mark.parametrize("kw,msg", [({"dispatcher": "nccl"}, "dispatcher is one of"),
                                    ({"expert_imbalance": 0.5}, "in \\[1, 64\\]"),
                                    ({"expert_imbalance": float("nan")}, "in \\[1, 64\\]")])
def test_bad_settings_are_one_line(kw, msg):
    with pytest.raises(ShardlabError, match=msg):
        MoeDispatch(**kw)


def _run(argv, capsys):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


FLAGS = ["qwen3-235b-a22b", "--gpus", "256", "--tp", "2", "--sequence-parallel", "--pp", "8", "--vpp", "4",
         "--schedule", "interleaved", "--ep", "16", "--global-batch", "2048", "--seq-len", "4096",
         "--framework", "megatron-lm", "--moe-dispatcher", "deepep", "--ep-comm-overlap", "--expert-imbalance", "1.1"]


def test_flags_json_job_file_and_megatron_round_trip(tmp_path, capsys):
    rc, out, _ = _run(["estimate", *FLAGS, "--json"], capsys)
    assert rc == 0
    doc = json.loads(out)
    assert (doc["framework"]["moe_dispatcher"], doc["framework"]["ep_comm_overlap"],
            doc["framework"]["expert_imbalance"]) == ("deepep", True, 1.1)
    step = doc["step_time_s"]
    for to in ("shardlab", "megatron"):
        rc, out, err = _run(["export", *FLAGS, "--gpus-per-node", "8", "--to", to, "--json"], capsys)
        assert rc == 0, err
        text = json.loads(out)["text"]
        if to == "megatron":
            assert "--moe-token-dispatcher-type flex" in text and "--moe-flex-dispatcher-backend deepep" in text
            assert "--overlap-moe-expert-parallel-comm" in text
        f = tmp_path / f"job-{to}"
        f.write_text(text)
        rc, out, err = _run(["estimate", "--from", str(f), "--json"], capsys)
        assert rc == 0, err
        back = json.loads(out)
        assert back["framework"]["moe_dispatcher"] == "deepep" and back["framework"]["ep_comm_overlap"] is True
        if to == "shardlab":      # the job file keeps the imbalance too (no launch flag carries it)
            assert back["step_time_s"] == pytest.approx(step, rel=1e-9)
    # the serving flags of a training estimate are refused under --inference
    rc, _, err = _run(["estimate", "qwen3-30b-a3b", "--inference", "--ep-comm-overlap"], capsys)
    assert rc == 2 and "describe(s) training" in err


@pytest.mark.parametrize("moe", [MoeDispatch(), MoeDispatch("deepep"), MoeDispatch("alltoall", False, 1.3),
                                 MoeDispatch("deepep", False, 1.2)])
@pytest.mark.parametrize("model,lay", [
    ("qwen3-235b-a22b", Layout(dp=16, tp=2, pp=8, vpp=4, schedule="interleaved", ep=16, sequence_parallel=True,
                               recompute="selective", recompute_modules=("moe", "layernorm"))),
    ("deepseek-v3", Layout(dp=16, tp=2, pp=8, ep=16, sequence_parallel=True, recompute="selective",
                           recompute_modules=("mlp", "moe_act")))])
def test_comm_plan_prices_what_the_estimate_prices(model, lay, moe):
    """`comm plan`'s inventory lists the same calls the step model prices: DeepEP's dispatch, the busiest rank's
    copies, the third pass of a MoE layer re-run by 'moe' recomputation and a dense MLP's TP pair re-run by 'mlp'."""
    from shardlab.comm.exposure import exposure
    from shardlab.comm.inventory import layout_collectives

    spec, cl = CAT.model(model), _cluster(256)
    est = estimate_training(spec, lay, cl, seq_len=4096, global_batch=2048, moe=moe,
                            framework=CAT.framework("megatron-lm"))
    items = layout_collectives(spec, lay, cl, seq_len=4096, microbatches=est.microbatches, framework=est.workload)
    groups = exposure(items, est.breakdown, lay.zero)
    assert {g.group for g in groups} >= {"TP", "EP"}
    for g in groups:
        assert g.total_s == pytest.approx(est.comm_total_s[g.component], rel=1e-9), g
    counts = [i for i in items if i.axis == "EP" and i.op == "all-gather" and "token counts" in i.note]
    assert bool(counts) == (moe.dispatcher == "alltoall")


def test_comm_plan_reads_the_moe_settings_of_a_job_file(tmp_path, capsys):
    rc, out, err = _run(["export", *FLAGS, "--gpus-per-node", "8", "--to", "shardlab", "--json"], capsys)
    assert rc == 0, err
    job = tmp_path / "job.toml"
    job.write_text(json.loads(out)["text"])
    rc, out, err = _run(["comm", "plan", "--from", str(job), "--json"], capsys)
    assert rc == 0, err
    doc = json.loads(out)
    rc, est, _ = _run(["estimate", "--from", str(job), "--json"], capsys)
    assert doc["step_time_s"] == pytest.approx(json.loads(est)["step_time_s"], rel=1e-9)
    ep = [i for i in doc["items"] if i["axis"] == "EP" and i["op"] == "all-to-all"]
    assert ep and all("DeepEP" in i["note"] and "1.1×" in i["note"] for i in ep)
    assert not any("token counts" in i["note"] for i in doc["items"])
    rule = next(g["rule"] for g in doc["exposure"] if g["group"] == "EP")
    assert "all-to-all overlap" in rule


def test_refusals_and_what_is_not_applied():
    lay = Layout(dp=16, tp=2, pp=8, vpp=4, schedule="interleaved", ep=16, sequence_parallel=True,
                 recompute="selective", recompute_modules=("moe",))
    with pytest.raises(ShardlabError, match="fine-grained callables"):
        _est(lay, ep_comm_overlap=True)
    fp32 = estimate_training(Q235, LAY, _cluster(256), seq_len=4096, global_batch=2048, precision="fp32",
                             framework=CAT.framework("megatron-lm"), moe=MoeDispatch(ep_comm_overlap=True))
    plain = estimate_training(Q235, LAY, _cluster(256), seq_len=4096, global_batch=2048, precision="fp32",
                              framework=CAT.framework("megatron-lm"))
    assert fp32.step_time_s == plain.step_time_s and any("bf16 or fp16" in n for n in fp32.notes)


@pytest.mark.parametrize("lay", [LAY, Layout(dp=64, tp=4, ep=16, sequence_parallel=True, zero=1)])
def test_memory_holds_the_busiest_rank_and_the_overlaps_extra_micro_batch(lay):
    """The search's vectorised memory and the exact report agree; the overlap keeps one more micro-batch (PP 1) or
    virtual chunk (interleaved) in flight; the busiest rank holds F × the routed activations."""
    from shardlab.estimate.step import evaluate
    from shardlab.layout import layouts_to_arrays

    base, over, skew = _est(lay), _est(lay, ep_comm_overlap=True), _est(lay, expert_imbalance=1.5)
    for e in (base, over, skew):
        r = evaluate(Q235, _cluster(256), e.workload, layouts_to_arrays([lay]), recompute_modules=lay.recompute_modules)
        assert float(r["memory_bytes"][0]) == pytest.approx(e.memory.worst.total, rel=1e-9)
    extra = 1.0 if lay.pp == 1 else 1.0 / lay.vpp
    assert over.memory.worst.in_flight == pytest.approx(base.memory.worst.in_flight + extra)
    assert skew.memory.worst.activations > base.memory.worst.activations
