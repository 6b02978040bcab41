"""The worksheet's risk column (planner.risk): pure functions of a plan's numbers, every row filled with a number."""

import json
import re

import pytest

from conftest import cli_main
from shardlab.catalog import get_catalog
from shardlab.comm.collectives import collective_time
from shardlab.planner.risk import AXIS_KEYS, RiskInputs, axis_risk, collective_risk, tp_across_nodes_s

CAT = get_catalog()
NV, IB = CAT.link("nvlink4"), CAT.link("ib-ndr")
GIB = 2**30


def inputs(**kw) -> RiskInputs:
    """A hand-made layout: dp 4 × tp 8 × pp 4, 32 micro-batches, 80 layers (20 per stage), step 10 s."""
    lay = {"dp": 4, "tp": 8, "pp": 4, "cp": 1, "ep": 1, "zero": 1, "vpp": 1, "micro_batch": 1, "recompute": "selective",
           "sequence_parallel": False, "schedule": "1f1b", "stage_layers": None, "microbatches": 32}
    lay.update(kw.pop("layout", {}))
    tp_call = collective_time("all-reduce", 64 * 2**20, 8, NV)
    comm = [
        {"axis": "TP", "op": "all-reduce", "phase": "forward", "bytes_per_call": 64 * 2**20, "calls_per_step": 2 * 20 * 32,
         "group_size": 8, "link_id": "nvlink4", "nodes_spanned": 1, "time_per_call_s": tp_call.time_s,
         "time_per_step_s": tp_call.time_s * 1280, "overlap": "critical", "regime": "bandwidth", "risk": ""},
        {"axis": "ZeRO", "op": "all-gather", "phase": "step", "bytes_per_call": 25 * 2**20, "calls_per_step": 40,
         "group_size": 4, "link_id": "ib-ndr", "nodes_spanned": 4, "time_per_call_s": 0.002, "time_per_step_s": 0.08,
         "overlap": "critical", "regime": "bandwidth", "risk": "on the critical path over ib-ndr"},
        {"axis": "PP", "op": "send-recv", "phase": "forward", "bytes_per_call": 2**20, "calls_per_step": 32,
         "group_size": 2, "link_id": "ib-ndr", "nodes_spanned": 2, "time_per_call_s": 1e-4, "time_per_step_s": 0.0032,
         "overlap": "critical", "regime": "latency", "risk": ""},
    ]
    base = dict(layout=lay, step_time_s=10.0,
                breakdown={"compute_s": 8.0, "recompute_s": 0.5, "tp_comm_s": 0.6, "pp_bubble_s": 0.8, "pp_p2p_s": 0.05,
                           "dp_comm_s": 0.05},
                comm=tuple(comm), intra_link=NV, inter_link=IB, gpus_per_node=8, memory_bytes=60 * GIB,
                capacity_bytes=80 * GIB, stage_layers=20, seq_len=4096)
    base.update(kw)
    return RiskInputs(**base)


def test_pipeline_bubble_share_is_the_breakdown_over_the_step():
    assert axis_risk("pp", inputs()).startswith("PP 4 with 32 micro-batches: bubble 8.0% (0.80 s)")


def test_tp_inside_a_node_names_collectives_per_layer_and_the_cost_across_nodes():
    inp = inputs()
    s = axis_risk("tp", inp)
    # 1280 calls per step = 2 per layer per micro-batch over 20 layers × 32 micro-batches
    assert "TP 8 inside a node: 2 collectives per layer per micro-batch on 450 GB/s nvlink4 cost 0.60 s (6.0%)" in s
    extra = tp_across_nodes_s(inp)
    flat = collective_time("all-reduce", 64 * 2**20, 8, IB)          # one TP rank per node: a ring over IB
    assert extra == pytest.approx((flat.time_s - inp.comm[0]["time_per_call_s"]) * 1280)
    assert extra > 0 and f"+{100 * extra / 10:.1f}% step time" in s and "50 GB/s ib-ndr" in s


def test_zero3_gathers_say_bytes_link_and_exposed_time():
    c = {"axis": "FSDP", "op": "all-gather", "phase": "forward", "bytes_per_call": 1_200_000_000, "calls_per_step": 81 * 4,
         "group_size": 32, "link_id": "ib-ndr", "nodes_spanned": 4, "time_per_call_s": 0.03, "time_per_step_s": 9.72,
         "overlap": "overlappable", "regime": "bandwidth", "risk": ""}
    inp = inputs(layout={"zero": 3}, comm=(c,), breakdown={"compute_s": 9.0, "zero3_comm_s": 0.1})
    assert axis_risk("zero", inp) == ("ZeRO-3 gathers 1.12 GiB per unit per micro-batch over 50 GB/s ib-ndr: exposed "
                                      "9.72 s (97.2%) if prefetch fails (now 0.10 s)")
    assert collective_risk(c, inp).startswith("hidden behind compute while overlap holds; if it fails +9.72 s (97.2%)")


def test_critical_collective_keeps_the_inventory_warning_and_flags_latency():
    inp = inputs()
    zero_ag, pp = inp.comm[1], inp.comm[2]
    assert collective_risk(zero_ag, inp) == ("critical path: 40 × 2.00 ms = 80.00 ms per step (0.8%) on 50 GB/s ib-ndr; "
                                             "on the critical path over ib-ndr")
    assert "latency-bound (1.00 MiB messages)" in collective_risk(pp, inp)


def test_headroom_and_single_axis_rows_still_carry_a_number():
    inp = inputs(layout={"tp": 1, "pp": 1, "sequence_parallel": False}, memory_bytes=78 * GIB)
    assert axis_risk("tp", inp) == "TP 1: every GPU holds whole weight matrices; memory is the limit (78.0 GiB of 80.0 GiB used, 2.5% headroom)"
    assert axis_risk("sched", inp) == "no pipeline: bubble 0%"
    for key in AXIS_KEYS:
        assert re.search(r"\d", axis_risk(key, inp)), key


@pytest.mark.parametrize("argv", [
    ("plan",),                                                                            # the README's main job
    ("plan", "llama-3.1-405b", "--gpus", "1024", "--seq-len", "8192", "--global-batch", "2048"),  # 3-D
    ("plan", "mixtral-8x7b", "--gpus", "32", "--gpu", "a100-80gb"),                          # MoE
])
def test_every_worksheet_and_communication_row_has_a_risk_with_a_number(argv):
    code, out, err = cli_main(*argv, "--json")
    assert code == 0, err
    doc = json.loads(out)
    rows = doc["worksheet"] + doc["communication"]
    assert rows and all(re.search(r"\d", r["risk"]) for r in rows), [r for r in rows if not re.search(r"\d", r["risk"])]
    code, text, _ = cli_main(*argv)
    assert "risk" in text.split("design worksheet")[1].splitlines()[1]           # the terminal worksheet has the column
    assert doc["worksheet"][0]["risk"] in text
