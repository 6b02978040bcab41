"""α–β collective costs against hand-derived cases (formulas.md "Communication"; nccl-tests PERFORMANCE.md)."""

import math

import numpy as np
import pytest

from shardlab.catalog import get_catalog
from shardlab.comm.collectives import (alpha_beta_time, bus_factor, collective_time, crossover_size_bytes)
from shardlab.errors import ShardlabError

CAT = get_catalog()
NVL = CAT.link("nvlink4")      # 450 GB/s × 0.82 = 369 GB/s, α = 2 µs
NDR = CAT.link("ib-ndr")       # 50 GB/s × 0.94 = 47 GB/s, α = 5 µs
ETH = CAT.link("ethernet-10g")  # 1.25 GB/s × 0.90 = 1.125 GB/s, α = 30 µs
MiB = 2**20


def test_link_beta_is_line_rate_times_efficiency():
    assert NVL.bytes_per_s == pytest.approx(369e9)
    assert ETH.bytes_per_s == pytest.approx(1.125e9)


@pytest.mark.parametrize("op,n,want", [
    ("all-reduce", 8, 2 * 7 / 8), ("all-reduce", 2, 1.0), ("all-reduce", 64, 2 * 63 / 64),
    ("reduce-scatter", 8, 7 / 8), ("all-gather", 4, 3 / 4), ("all-to-all", 16, 15 / 16),
    ("broadcast", 8, 1.0), ("send-recv", 2, 1.0)])
def test_nccl_tests_bus_factors(op, n, want):
    # nccl-tests doc/PERFORMANCE.md: 2(n-1)/n, (n-1)/n, 1
    assert bus_factor(op, n) == pytest.approx(want, rel=1e-15)


def test_ring_all_reduce_hand_case():
    # 256 MiB on 8 ranks, α = 2 µs, β = 369 GB/s: 2·7·2 µs + 2·7/8 · 268435456 / 369e9
    S = 256 * MiB
    want = 14 * 2e-6 + 1.75 * S / 369e9
    assert alpha_beta_time("all-reduce", S, 8, 2e-6, 369e9) == pytest.approx(want, rel=1e-12)
    c = collective_time("all-reduce", S, 8, NVL, "ring")
    assert c.time_s == pytest.approx(want, rel=1e-12)
    assert c.algbw_gbps == pytest.approx(S / want / 1e9, rel=1e-12)
    assert c.busbw_gbps == pytest.approx(c.algbw_gbps * 1.75, rel=1e-12)
    assert c.steps == 14 and c.regime == "bandwidth"
    assert "2(n−1)·α + 2(n−1)/n·S/β" in c.formula and "nccl-tests" in c.formula


def test_reduce_scatter_and_all_gather_are_each_half_an_all_reduce():
    for S in (1, 8192, 10**9):
        ar = alpha_beta_time("all-reduce", S, 8, 3e-6, 1e11)
        rs = alpha_beta_time("reduce-scatter", S, 8, 3e-6, 1e11)
        ag = alpha_beta_time("all-gather", S, 8, 3e-6, 1e11)
        assert rs == ag == pytest.approx(ar / 2, rel=1e-12)


def test_tree_all_reduce_hand_case_and_auto_choice():
    # double binary tree: 2·⌈log2 n⌉ α + 2 S / β; n = 8: 6 α + 2 S/β
    assert alpha_beta_time("all-reduce", 1000, 8, 2e-6, 369e9, "tree") == pytest.approx(6 * 2e-6 + 2 * 1000 / 369e9)
    assert alpha_beta_time("all-reduce", 1000, 5, 1.0, 1e9, "tree") == pytest.approx(6.0 + 2e-6)  # ⌈log2 5⌉ = 3
    small = collective_time("all-reduce", 8192, 8, NVL)          # latency-bound: fewer steps win
    large = collective_time("all-reduce", 2**30, 8, NVL)         # bandwidth-bound: ring's 2(n-1)/n < 2 wins
    assert small.algorithm == "tree" and large.algorithm == "ring"
    assert collective_time("all-gather", 8192, 8, NVL).algorithm == "ring"  # NCCL: ring only


def test_bruck_all_to_all_and_broadcast_terms():
    assert alpha_beta_time("all-to-all", 1e6, 8, 1e-6, 1e9, "tree") == pytest.approx(3e-6 + 1.5 * 1e6 / 1e9)
    assert alpha_beta_time("all-to-all", 1e6, 8, 1e-6, 1e9, "ring") == pytest.approx(7e-6 + 7 / 8 * 1e6 / 1e9)
    assert alpha_beta_time("broadcast", 1e6, 8, 1e-6, 1e9, "ring") == pytest.approx(7e-6 + 1e6 / 1e9)
    assert alpha_beta_time("send-recv", 1e6, 2, 1e-6, 1e9) == pytest.approx(1e-6 + 1e6 / 1e9)


def test_one_rank_costs_nothing_and_arrays_broadcast():
    assert alpha_beta_time("all-reduce", 10**9, 1, 1e-5, 1e9) == 0.0
    sizes = np.array([1.0, 1e3, 1e6, 1e9])
    ns = np.array([[1], [2], [8], [64]])
    got = alpha_beta_time("all-reduce", sizes, ns, 2e-6, 369e9)
    assert got.shape == (4, 4)
    for i, n in enumerate(ns[:, 0]):
        for j, s in enumerate(sizes):
            assert got[i, j] == pytest.approx(alpha_beta_time("all-reduce", float(s), int(n), 2e-6, 369e9), rel=1e-14)
    assert (got[0] == 0).all()
    c = collective_time("all-reduce", 10**6, 1, NVL)
    assert c.time_s == 0 and c.algbw_gbps == 0 and c.regime == "none"


def test_crossover_splits_latency_and_bandwidth_regimes():
    # ring all-reduce: S* = steps·α·β / coeff = 2(n-1)α / (2(n-1)/(nβ)) = n·α·β
    assert crossover_size_bytes("all-reduce", 8, 2e-6, 369e9) == pytest.approx(8 * 2e-6 * 369e9)
    c = collective_time("all-reduce", 10**6, 8, NVL, "ring")
    assert c.crossover_bytes == pytest.approx(8 * 2e-6 * 369e9)
    assert c.latency_s == pytest.approx(c.bandwidth_s * c.crossover_bytes / c.size_bytes)
    below = collective_time("all-reduce", int(c.crossover_bytes * 0.9), 8, NVL, "ring")
    above = collective_time("all-reduce", int(c.crossover_bytes * 1.1), 8, NVL, "ring")
    assert below.regime == "latency" and above.regime == "bandwidth"


def test_large_message_busbw_approaches_link_beta():
    c = collective_time("all-reduce", 2**32, 8, NVL, "ring")
    assert c.busbw_gbps == pytest.approx(369.0, rel=0.01) and c.busbw_gbps < 369.0


def test_hierarchical_all_reduce_hand_case():
    # 16 ranks on 2 nodes (g = 8): intra RS(S) + inter AR(S/8, k = 2) + intra AG(S)
    S = 2**30
    lat = 7 * 2e-6 + 2 * 5e-6 + 7 * 2e-6
    intra_bw = 2 * (7 / 8) * S / 369e9            # RS and AG both on NVLink
    inter_bw = 2 * (1 / 2) * (S / 8) / 47e9
    pipe = collective_time("all-reduce", S, 16, NDR, "ring", nodes=2, intra_link=NVL)
    seq = collective_time("all-reduce", S, 16, NDR, "ring", nodes=2, intra_link=NVL, pipelined=False)
    assert pipe.time_s == pytest.approx(lat + max(intra_bw, inter_bw), rel=1e-12)
    assert seq.time_s == pytest.approx(lat + intra_bw + inter_bw, rel=1e-12)
    assert [p.label.split(" (")[0] for p in pipe.phases] == ["intra reduce-scatter", "inter all-reduce of S/g", "intra all-gather"]
    assert pipe.algorithm.startswith("hierarchical")
    flat_eth = collective_time("all-reduce", S, 16, NDR, "ring")
    assert pipe.time_s < flat_eth.time_s                    # most bytes stay on NVLink


def test_hierarchical_all_to_all_prices_each_peer_on_its_link():
    S, n, g = 64 * MiB, 32, 8
    c = collective_time("all-to-all", S, n, NDR, nodes=4, intra_link=NVL, pipelined=False)
    want = (g - 1) * 2e-6 + (n - g) * 5e-6 + (g - 1) / n * S / 369e9 + (n - g) / n * S / 47e9
    assert c.time_s == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("call,msg", [
    (lambda: collective_time("allreduce", 10, 8, NVL), "did you mean all-reduce"),
    (lambda: collective_time("all-reduce", 10, 0, NVL), "positive"),
    (lambda: collective_time("all-reduce", -1, 8, NVL), "negative"),
    (lambda: collective_time("all-reduce", 10, 12, NDR, nodes=5, intra_link=NVL), "multiple of 5"),
    (lambda: collective_time("all-reduce", 10, 8, NVL, "butterfly"), "ring, tree or auto"),
])
def test_bad_input_names_the_fix(call, msg):
    with pytest.raises(ShardlabError, match=msg):
        call()


def test_formula_shows_the_numbers():
    c = collective_time("all-reduce", 8192, 2, ETH, "ring")
    assert "2 × 30.0 µs" in c.formula and "1.125 GB/s" in c.formula
    assert math.isclose(c.time_s, 2 * 30e-6 + 8192 / 1.125e9, rel_tol=1e-12)


def test_zero_or_one_rank_arrays_raise_no_warnings():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = alpha_beta_time("all-reduce", np.full(3, 1e6), np.array([0, 1, 8]), 1e-6, 1e9)
        f = bus_factor("reduce-scatter", np.array([0, 1, 4]))
    assert t[0] == t[1] == 0 and t[2] == pytest.approx(14e-6 + 1.75e-3)
    assert list(f) == [0.0, 0.0, 0.75]
