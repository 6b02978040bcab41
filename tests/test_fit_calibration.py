"""Calibration fits (torch-free): α–β least squares on collective times, the matmul efficiency curve, and the
hardware profile they become (it must load with the strict catalog)."""

import numpy as np
import pytest

from shardlab.calibration import AlphaBetaFit, EfficiencyFit, fit_alpha_beta, fit_efficiency, gemm_size, ring_terms
from shardlab.catalog import get_catalog
from shardlab.comm.collectives import alpha_beta_time, bus_factor
from shardlab.errors import ShardlabError
from shardlab.rates.hardware import gemm_efficiency
from shardlab.runtime.bench_files import load_bench
from shardlab.runtime.calibrate import build_profile, match_accelerator, write_profile

OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv")
SIZES = [2 ** k for k in range(10, 27, 2)]


def _rows(alpha_s, beta, n, ops=OPS, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for op in ops:
        for s in SIZES:
            t = alpha_beta_time(op, s, n, alpha_s, beta, "ring") * (1 + noise * rng.standard_normal())
            rows.append({"op": op, "size_bytes": s, "time_s": t, "world_size": n})
    return rows


def test_ring_terms_are_the_estimate_model_and_nccl_tests_factors():
    # nccl-tests doc/PERFORMANCE.md: the bandwidth coefficient of the ring model is the busbw factor
    for n in (2, 3, 8, 64):
        for op in OPS:
            steps, factor = ring_terms(op, n)
            assert factor == pytest.approx(bus_factor(op, n))
        assert ring_terms("all-reduce", n)[0] == 2 * (n - 1)
        assert ring_terms("all-gather", n)[0] == n - 1
        assert ring_terms("send-recv", n)[0] == 1
    assert ring_terms("all-reduce", 8)[1] == pytest.approx(2 * 7 / 8)


@pytest.mark.parametrize("n", [2, 8])
def test_alpha_beta_fit_recovers_exact_parameters_per_op_and_joint(n):
    rows = _rows(50e-6, 3e9, n)
    for op in OPS + (None,):
        f = fit_alpha_beta(rows, op)
        assert f.alpha_s == pytest.approx(50e-6, rel=1e-6)
        assert f.beta_bytes_per_s == pytest.approx(3e9, rel=1e-6)
        assert f.rel_rms < 1e-9
        assert f.world_size == n
    assert fit_alpha_beta(rows).op == "joint" and fit_alpha_beta(rows).points == len(rows)


def test_alpha_beta_fit_tolerates_noise_and_large_messages_approach_beta():
    f = fit_alpha_beta(_rows(1e-3, 1e9, 2, noise=0.15, seed=3), "all-reduce")
    assert f.alpha_s == pytest.approx(1e-3, rel=0.35)
    assert f.beta_bytes_per_s == pytest.approx(1e9, rel=0.35)
    # busbw of the fitted model rises with size and tends to beta (nccl-tests: busbw comparable with the link)
    bus = [bus_factor("all-reduce", 2) * s / f.predict_s("all-reduce", s) for s in (1e3, 1e6, 1e9, 1e12)]
    assert all(a < b for a, b in zip(bus, bus[1:]))
    assert bus[-1] == pytest.approx(f.beta_bytes_per_s, rel=1e-3)


def test_alpha_beta_fit_clamps_negative_latency_and_rejects_flat_times():
    rows = [{"op": "send-recv", "size_bytes": s, "time_s": s / 2e9, "world_size": 2} for s in SIZES]
    rows[0]["time_s"] *= 0.5  # would pull an unconstrained intercept below zero
    f = fit_alpha_beta(rows, "send-recv")
    assert f.alpha_s >= 0 and f.beta_bytes_per_s > 0
    flat = [{"op": "all-reduce", "size_bytes": s, "time_s": 1e-3, "world_size": 2} for s in SIZES]
    with pytest.raises(ShardlabError, match="do not grow"):
        fit_alpha_beta(flat, "all-reduce")
    with pytest.raises(ShardlabError, match="at least two"):
        fit_alpha_beta(rows[:1], "send-recv")
    shrinking = [{"op": "all-reduce", "size_bytes": s, "time_s": 1.0 / s, "world_size": 2} for s in SIZES]
    with pytest.raises(ShardlabError, match="do not grow"):
        fit_alpha_beta(shrinking, "all-reduce")


def test_gemm_size_is_the_smallest_dimension():
    assert gemm_size(4096, 1024, 8192) == 1024
    assert gemm_size(16, 4096, 4096) == 16


@pytest.mark.parametrize("m,h", [(0.45, 10.0), (0.8, 300.0), (0.3, 2000.0)])
def test_efficiency_fit_recovers_curve(m, h):
    n = np.array([16, 32, 64, 128, 256, 512, 1024, 4096, 8192], float)
    peak = 100e12
    f = fit_efficiency(n, m * n / (n + h) * peak, peak)
    assert f.max_fraction == pytest.approx(m, rel=0.02)
    assert f.half_size == pytest.approx(h, rel=0.05)
    assert f.rel_rms < 0.01
    # the estimate's own curve reproduces the measurements
    assert np.allclose(f.predict_flops(n), gemm_efficiency(n, f.curve) * peak)
    assert np.allclose(f.predict_flops(n) / (m * n / (n + h) * peak), 1, rtol=0.02)


def test_efficiency_fit_with_noise_is_monotonic_and_close():
    rng = np.random.default_rng(1)
    n = np.repeat([32, 64, 128, 256, 512, 1024], 4).astype(float)
    meas = 0.6 * n / (n + 100) * 1e12 * (1 + 0.1 * rng.standard_normal(n.size))
    f = fit_efficiency(n, meas, 1e12)
    assert f.max_fraction == pytest.approx(0.6, rel=0.2)
    pred = f.predict_flops(np.array([32, 128, 1024]))
    assert pred[0] < pred[1] < pred[2]
    with pytest.raises(ShardlabError):
        fit_efficiency([64], [1e9], 1e12)


def _profile(tmp_path, eff, link_fit, base="cpu-core", dtype="fp32", stream=None, **kw):
    cat = get_catalog()
    acc = cat.accelerator(base)
    link = cat.link(acc.system["intra_link"])
    doc = build_profile(acc, link, eff, dtype, link_fit, gpus_per_node=4, source="unit test",
                        measured_at="2026-01-01T00:00:00+00:00", stream_gbps=stream, **kw)
    path = write_profile(doc, tmp_path / "profile.yaml", header="test")
    return doc, get_catalog([str(path)])


def test_profile_loads_strictly_and_reproduces_the_fits(tmp_path):
    eff = EfficiencyFit(0.42, 12.5, 0.096e12, 0.05, 24)
    ab = AlphaBetaFit("joint", 2, 350e-6, 0.7e9, 0.3, 45)
    doc, cat = _profile(tmp_path, eff, ab)
    prof = cat.profile
    assert set(prof) == {"gpu", "intra_link", "inter_link", "gpus_per_node", "source", "measured_at"}
    acc, link = cat.accelerator(prof["gpu"]), cat.link(prof["intra_link"])
    assert prof["gpu"] == "cpu-core-calibrated" and prof["intra_link"] == "loopback-calibrated"
    assert acc.system["intra_link"] == link.id and acc.system["gpus_per_node"] == 4
    assert acc.efficiency.max_fraction == pytest.approx(0.42) and acc.efficiency.half_size == pytest.approx(12.5)
    for n in (16, 256, 4096):  # eff(n) · peak reproduces the fitted FLOP/s
        assert gemm_efficiency(n, acc.efficiency) * acc.peak_flops("fp32") == pytest.approx(eff.predict_flops(n), rel=1e-3)
    assert link.bytes_per_s == pytest.approx(0.7e9, rel=1e-3)  # bandwidth_gbps x efficiency = beta
    assert link.latency_s == pytest.approx(350e-6, rel=1e-3)
    assert link.efficiency <= 1 and link.scope == "intra"
    assert cat.link(prof["inter_link"]).scope == "inter"
    assert acc.memory_bandwidth_gbps == 20  # no memory-bound measurement: the catalog's value stays


def test_profile_memory_rate_reproduces_the_measured_streaming_rate(tmp_path):
    from shardlab.rates.hardware import memory_time_s

    _, cat = _profile(tmp_path, EfficiencyFit(0.42, 12.5, 0.096e12, 0.05, 24), None, stream=4.5)
    acc = cat.accelerator(cat.profile["gpu"])
    assert memory_time_s(4.5e9, acc) == pytest.approx(1.0, rel=1e-3)  # the estimate streams at the measured rate
    assert "measured on eager memory-bound kernels" in acc.source


def test_profile_carries_operator_overhead_and_overlap(tmp_path):
    eff = EfficiencyFit(0.42, 12.5, 0.096e12, 0.05, 24)
    _, cat = _profile(tmp_path, eff, AlphaBetaFit("joint", 2, 3e-4, 1e9, 0.3, 10), op_overhead_us=17.25,
                      comm_overlap=False)
    assert cat.accelerator(cat.profile["gpu"]).op_overhead_us == pytest.approx(17.25)
    assert cat.profile["comm_overlap"] is False
    _, cat = _profile(tmp_path, eff, None)  # not measured: no key, the catalog's 0 overhead
    assert "comm_overlap" not in cat.profile and cat.accelerator(cat.profile["gpu"]).op_overhead_us == 0


def test_profile_raises_peak_when_measured_above_catalog_and_beta_above_line_rate(tmp_path):
    eff = EfficiencyFit(1.5, 10.0, 0.096e12, 0.05, 24)  # faster than the generic core's catalog peak
    ab = AlphaBetaFit("all-reduce", 2, 100e-6, 5e9, 0.2, 9)  # faster than loopback's 1 GB/s line rate
    doc, cat = _profile(tmp_path, eff, ab)
    acc, link = cat.accelerator(cat.profile["gpu"]), cat.link(cat.profile["intra_link"])
    assert acc.efficiency.max_fraction == 1.0
    assert acc.peak_flops("fp32") == pytest.approx(1.5 * 0.096e12, rel=1e-3)
    assert link.efficiency == 1.0 and link.bandwidth_gbps == pytest.approx(5.0, rel=1e-3)
    # no collectives: the catalog link is kept and named
    doc, cat = _profile(tmp_path, EfficiencyFit(0.5, 10.0, 0.096e12, 0.05, 24), None)
    assert cat.profile["intra_link"] == "loopback" and "links" not in doc


def test_gpu_profile_keeps_nvlink_line_rate(tmp_path):
    eff = EfficiencyFit(0.7, 300.0, 989.4e12, 0.05, 60)
    ab = AlphaBetaFit("joint", 8, 8e-6, 360e9, 0.1, 45)
    doc, cat = _profile(tmp_path, eff, ab, base="h100-sxm", dtype="bf16")
    link = cat.link(cat.profile["intra_link"])
    assert link.bandwidth_gbps == 450 and link.efficiency == pytest.approx(0.8, rel=1e-3)
    assert cat.accelerator(cat.profile["gpu"]).peak_tflops["bf16"] == pytest.approx(989.4)


@pytest.mark.parametrize("name,acc", [("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"),
                                      ("NVIDIA H100 NVL", "h100-nvl"), ("NVIDIA H200", "h200"),
                                      ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
                                      ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"), ("Tesla V100-SXM2-32GB", "v100"),
                                      ("NVIDIA L4", "l4"), ("NVIDIA L40S", "l40s"), ("NVIDIA GeForce RTX 4090", "rtx-4090")])
def test_match_accelerator(name, acc):
    assert match_accelerator(name, "cuda") == acc
    assert acc in get_catalog().accelerators


def test_match_accelerator_cpu_and_unknown():
    assert match_accelerator("AMD EPYC", "cpu") == "cpu-core"
    with pytest.raises(ShardlabError, match="--gpu"):
        match_accelerator("Some Future GPU 9000", "cuda")


def test_load_bench_rejects_other_json(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"rows": [{"op": "all-reduce"}]}')
    with pytest.raises(ShardlabError, match="not `shardlab bench collectives --json`"):
        load_bench(str(p), "collectives")
    p.write_text("not json")
    with pytest.raises(ShardlabError, match="not JSON"):
        load_bench(str(p), "matmul")
