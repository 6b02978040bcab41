"""`shardlab bench matmul`: the GEMMs of a transformer layer, FLOP counts, the fitted efficiency curve."""

import json

import pytest

from conftest import cli_main

torch = pytest.importorskip("torch")

from shardlab.catalog import get_catalog  # noqa: E402
from shardlab.runtime.bench_matmul import GEMMS, analyse, bench_matmul  # noqa: E402


@pytest.fixture(scope="module")
def doc():
    d = bench_matmul("fp32", "cpu", (16, 32, 64), (16, 64), min_time_s=0.005)
    return analyse(d, get_catalog().accelerator("cpu-core"))


def test_rows_cover_the_layer_gemms_with_exact_flops(doc):
    assert len(doc["rows"]) == 3 * 2 * len(GEMMS)
    assert doc["device"] == "cpu" and doc["dtype"] == "fp32" and doc["threads"] == 1
    for r in doc["rows"]:
        kk, nn = {g: (k, n) for g, k, n in GEMMS}[r["gemm"]]
        assert (r["m"], r["k"], r["n"]) == (r["tokens"], kk * r["hidden"], nn * r["hidden"])
        assert r["flops"] == 2 * r["m"] * r["k"] * r["n"]
        assert r["size"] == min(r["m"], r["k"], r["n"])
        assert r["time_s"] > 0 and r["tflops"] == pytest.approx(r["flops"] / r["time_s"] / 1e12)
        assert r["fraction_of_peak"] == pytest.approx(r["tflops"] / 0.096)


def test_memory_bound_kernels_rate(doc):
    st = doc["stream"]
    assert st["gbps"] > 0 and set(st["gbps_by_op"]) == {"add", "mul", "silu", "rms_norm", "softmax"}
    assert min(st["gbps_by_size"]) <= st["gbps"] <= max(st["gbps_by_size"])


def test_operator_overhead_is_measured_on_cpu(doc):
    o = doc["op_overhead"]
    assert 0.1 < o["op_overhead_us"] < 5000 and o["ops"] > 100
    assert o["op_overhead_us"] == pytest.approx(o["step_s"] / (3 * o["ops"]) * 1e6)


def test_fit_is_relative_to_the_catalog_peak_and_rises_with_size(doc):
    f = doc["fit"]
    assert doc["accelerator"] == "cpu-core" and doc["peak_tflops"] == pytest.approx(0.096)
    assert f["peak_flops"] == pytest.approx(0.096e12) and f["points"] == len(doc["rows"])
    assert 0 < f["max_fraction"] and f["half_size"] > 0
    fitted = sorted((r["size"], r["fitted_tflops"]) for r in doc["rows"])
    assert all(a[1] <= b[1] + 1e-15 for a, b in zip(fitted, fitted[1:]))
    # the fit is centred on the measurements, and its reported residual is the residual of these rows
    ratios = sorted(r["fitted_tflops"] / r["tflops"] for r in doc["rows"])
    assert 0.5 < ratios[len(ratios) // 2] < 2
    rms = (sum((x - 1) ** 2 for x in ratios) / len(ratios)) ** 0.5
    assert f["rel_rms"] == pytest.approx(rms, rel=1e-6)


def test_cli_json_plot_and_cpu_dtype_rule(tmp_path):
    plot = tmp_path / "mm.png"
    code, out, err = cli_main("bench", "matmul", "--hidden", "16,32", "--tokens", "16", "--matmul-time", "0.005",
                              "--plot", str(plot), "--json")
    assert code == 0, err
    d = json.loads(out)
    assert len(d["rows"]) == 8 and "fit" in d and "emulated" in d["note"]
    assert plot.exists() and plot.stat().st_size > 10_000
    code, out, err = cli_main("bench", "matmul", "--hidden", "16", "--tokens", "16", "--matmul-time", "0.005")
    assert code == 0 and "measured GFLOP/s" in out and "fitted GFLOP/s" in out and "n = min(M, N, K)" in out
    code, _, err = cli_main("bench", "matmul", "--dtype", "bf16", "--device", "cpu")
    assert code == 2 and "emulates bf16" in err and "--dtype fp32" in err
    code, _, err = cli_main("bench", "matmul", "--gpu", "no-such-gpu")
    assert code == 2 and "unknown GPU" in err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_on_cuda_matches_a_catalog_gpu():
    code, out, err = cli_main("bench", "matmul", "--hidden", "1024,4096", "--tokens", "4096", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["dtype"] == "bf16" and d["device"] == "cuda" and d["accelerator"] in get_catalog().accelerators
    assert 0.2 < d["fit"]["max_fraction"] <= 1.2
