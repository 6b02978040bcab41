"""`shardlab calibrate`: measured (2 gloo ranks + tiny matmuls) or from saved bench JSON, the profile it writes
loads with the strict catalog and carries the fitted numbers."""

import json

import numpy as np
import pytest

from conftest import cli_main, run_cli

from shardlab.catalog import get_catalog
from shardlab.comm.collectives import alpha_beta_time, bus_factor
from shardlab.rates.hardware import gemm_efficiency


def _bench_files(tmp_path, alpha=400e-6, beta=0.8e9, m=0.45, h=20.0):
    """Synthetic `bench ... --json` documents generated from known parameters."""
    rows = []
    for op in ("all-reduce", "send-recv"):
        for s in (1e3, 1e4, 1e5, 1e6, 1e7):
            t = alpha_beta_time(op, s, 2, alpha, beta, "ring")
            rows.append({"op": op, "size_bytes": int(s), "time_s": t, "algbw_gbps": s / t / 1e9,
                         "busbw_gbps": s / t / 1e9 * bus_factor(op, 2), "world_size": 2})
    coll = {"backend": "gloo", "device": "cpu", "world_size": 2, "rows": rows}
    mrows = [{"gemm": "qkv", "hidden": n, "tokens": 512, "m": 512, "k": n, "n": 3 * n, "size": n, "flops": 1.0,
              "time_s": 1.0, "tflops": m * n / (n + h) * 0.096} for n in (16, 32, 64, 128, 256, 512)]
    mm = {"device": "cpu", "device_name": "test cpu", "dtype": "fp32", "threads": 1, "torch_version": "x", "rows": mrows}
    (tmp_path / "c.json").write_text(json.dumps(coll))
    (tmp_path / "m.json").write_text(json.dumps(mm))
    return str(tmp_path / "m.json"), str(tmp_path / "c.json")


def test_from_saved_bench_output_reproduces_known_parameters(tmp_path):
    m_json, c_json = _bench_files(tmp_path)
    out = tmp_path / "profile.yaml"
    code, stdout, err = cli_main("calibrate", "--out", str(out), "--from-matmul", m_json, "--from-collectives", c_json,
                                 "--link-fit", "all-reduce", "--json")
    assert code == 0, err
    doc = json.loads(stdout)
    cat = get_catalog([str(out)])
    acc, link = cat.accelerator(cat.profile["gpu"]), cat.link(cat.profile["intra_link"])
    assert acc.id == "cpu-core-calibrated" and doc["profile_path"] == str(out)
    assert acc.efficiency.max_fraction == pytest.approx(0.45, rel=1e-2)
    assert acc.efficiency.half_size == pytest.approx(20.0, rel=2e-2)
    assert link.latency_s == pytest.approx(400e-6, rel=1e-3) and link.bytes_per_s == pytest.approx(0.8e9, rel=1e-3)
    assert "all-reduce" in link.source and "per op" in link.source
    assert out.read_text().startswith("# shardlab hardware profile")
    # the printed command works as given (a CPU profile has an fp32 peak only: it names --precision fp32), and
    # leaving the precision out is one line naming the flag
    use = cli_main("calibrate", "--out", str(out), "--from-matmul", m_json, "--from-collectives", c_json)[1]
    cmd = next(ln for ln in use.splitlines() if "shardlab estimate MODEL" in ln).split("shardlab estimate MODEL", 1)[1]
    assert "--precision fp32" in cmd and "--precision fp32" in out.read_text().splitlines()[1]
    flags = cmd.split("(")[0].replace("...", "").split()
    code, _, err = cli_main("estimate", "gpt2", "--gpus", "2", "--seq-len", "128", *flags)
    assert code == 0, err
    code, _, err = cli_main("estimate", "gpt2", "--gpus", "2", "--seq-len", "128", "--profile", str(out))
    assert code == 2 and "pass --precision fp32" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("args,words", [
    (["--out", "/no/such/dir/p.yaml"], "does not exist"),
    (["--out", "p.yaml", "--link-fit", "allreduce"], "unknown collective"),
    (["--out", "p.yaml", "--link-fit", "broadcast"], "no such fit"),
    (["--out", "p.yaml", "--from-matmul", "/no/such.json"], "does not exist"),
    (["--out", "p.yaml", "--nproc-per-node", "1", "--from-matmul", "M"], "at least 2"),
])
def test_bad_input_exit_2(tmp_path, monkeypatch, args, words):
    monkeypatch.chdir(tmp_path)
    m_json, c_json = _bench_files(tmp_path)
    args = [m_json if a == "M" else a for a in args]
    extra = [] if "--from-matmul" in args else ["--from-matmul", m_json]
    if "--nproc-per-node" not in args:
        extra += ["--from-collectives", c_json]
    code, _, err = cli_main("calibrate", *args, *extra)
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def _matmul_file(tmp_path, sizes, m=0.45, h=20.0, name="m.json") -> str:
    """A `bench matmul --json` document whose GEMMs have the sizes n = min(M, N, K) in ``sizes``."""
    mrows = [{"gemm": "qkv", "hidden": n, "tokens": 512, "m": 512, "k": n, "n": 3 * n, "size": n, "flops": 1.0,
              "time_s": 1.0, "tflops": m * n / (n + h) * 0.096 * (1 + 0.01 * i)} for i, n in enumerate(sizes)]
    mm = {"device": "cpu", "device_name": "test cpu", "dtype": "fp32", "threads": 1, "torch_version": "x", "rows": mrows}
    (tmp_path / name).write_text(json.dumps(mm))
    return str(tmp_path / name)


@pytest.mark.parametrize("sizes, h, words", [
    ([1, 1, 1, 1], 20.0, "every GEMM measured has the same size n = 1"),
    ([64, 64, 64], 20.0, "every GEMM measured has the same size n = 64"),
    ([1, 2, 4, 8], 20.0, "the largest GEMM measured has n = 8"),
    ([16, 32, 64, 128], 1e9, "grow in proportion to n up to the largest GEMM (n = 128)"),
])
def test_a_matmul_fit_the_sizes_do_not_determine_is_refused(tmp_path, sizes, h, words):
    """One GEMM size (n/(n + h) is then one number), only tiny GEMMs, or FLOP/s still linear in n at the largest:
    exit 2, one line naming the file and the flags that set the sizes; no profile written."""
    out = tmp_path / "p.yaml"
    code, stdout, err = cli_main("calibrate", "--out", str(out), "--from-matmul", _matmul_file(tmp_path, sizes, h=h),
                                 "--skip-collectives", "--json")
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err and "Traceback" not in err, err
    assert "m.json: " in err and "--hidden" in err and "--tokens" in err and "shardlab bench matmul" in err
    assert json.loads(stdout)["exit_code"] == 2 and not out.exists()


def test_a_matmul_fit_extrapolated_past_the_sizes_is_written_with_a_warning(tmp_path):
    out = tmp_path / "p.yaml"
    m_json = _matmul_file(tmp_path, [16, 32, 64], h=300.0)        # the half size lies above every GEMM measured
    code, stdout, err = cli_main("calibrate", "--out", str(out), "--from-matmul", m_json, "--skip-collectives", "--json")
    assert code == 0, err
    warnings = json.loads(stdout)["warnings"]
    assert len(warnings) == 1 and "above the largest GEMM measured (n = 64)" in warnings[0] and out.exists()
    assert "# warning: the fitted half size" in out.read_text()
    code, text, _ = cli_main("calibrate", "--out", str(out), "--from-matmul", m_json, "--skip-collectives")
    assert code == 0 and [ln for ln in text.splitlines() if ln.startswith("warning:")] == [f"warning: {warnings[0]}"]
    # a well-measured curve, as the default sizes give: no warning
    code, stdout, _ = cli_main("calibrate", "--out", str(out), "--from-matmul", _matmul_file(tmp_path, [32, 64, 128, 256, 512]),
                               "--skip-collectives", "--json")
    assert code == 0 and json.loads(stdout)["warnings"] == []


def test_fit_problems_of_the_default_grids():
    """The default --hidden/--tokens grids have several sizes, all above the overhead floor: nothing to refuse."""
    from shardlab.calibration import efficiency_fit_problems, gemm_size
    from shardlab.runtime.bench_matmul import GEMMS, default_grid

    for device in ("cpu", "cuda"):
        hidden, tokens = default_grid(device)
        sizes = [gemm_size(t, nn * h, kk * h) for h in hidden for t in tokens for _, kk, nn in GEMMS]
        assert efficiency_fit_problems(sizes) == ([], [])


@pytest.mark.slow
def test_measured_profile_on_this_machine(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "p.yaml"
    r = run_cli("calibrate", "--out", str(out), "--nproc-per-node", "2", "--ops", "all-reduce,send-recv", "--sizes", "1KB:4MB:4",
                "--iters", "2", "--min-time", "0.01", "--hidden", "32,128,512", "--tokens", "32,256", "--matmul-time", "0.005",
                "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    cat = get_catalog([str(out)])
    prof = cat.profile
    acc, link = cat.accelerator(prof["gpu"]), cat.link(prof["intra_link"])
    fit = doc["matmul"]["fit"]
    n = np.array([16.0, 64.0])
    expect = fit["max_fraction"] * n / (n + fit["half_size"]) * fit["peak_flops"]
    assert np.allclose(gemm_efficiency(n, acc.efficiency) * acc.peak_flops("fp32"), expect, rtol=2e-3)
    joint = doc["collectives"]["fits"]["joint"]
    assert link.bytes_per_s == pytest.approx(joint["beta_bytes_per_s"], rel=2e-3)
    assert link.latency_s == pytest.approx(joint["alpha_s"], rel=2e-3) or joint["alpha_s"] < 1e-9
    assert prof["gpus_per_node"] >= 2 and prof["inter_link"] == "ethernet-10g" and prof["measured_at"]
    from shardlab.rates.hardware import memory_efficiency

    assert acc.memory_bandwidth_gbps * memory_efficiency(acc) == pytest.approx(doc["matmul"]["stream"]["gbps"], rel=2e-3)
    assert acc.op_overhead_us == pytest.approx(doc["matmul"]["op_overhead"]["op_overhead_us"], rel=2e-3)
    assert prof["comm_overlap"] is doc["collectives"]["overlap"]["overlaps"]
    # the estimate runs on the calibrated hardware
    code, out_txt, err = cli_main("estimate", "gpt2", "--gpus", "2", "--precision", "fp32", "--seq-len", "128",
                                  "--catalog", str(out), "--gpu", prof["gpu"], "--json")
    assert code == 0, err
    assert json.loads(out_txt)


def _run_doc(model, layout, global_batch, seq_len, measured):
    """A `shardlab run train --json` document with the fields calibrate --from-run reads."""
    return {"model_ref": model, "layout": layout.to_dict(), "step_time": {"measured_median_s": measured},
            "workload": {"seq_len": seq_len, "global_batch": global_batch, "optimizer": "adamw", "precision": "fp32"},
            "ranks": [{"device": "cpu"}]}


def test_framework_host_times_fitted_from_runs(tmp_path):
    """Runs measured at a known host time per block pass (2 ms) and per step (30 ms) give those back, and the written
    profile makes the calibrated framework the default of `estimate --profile`."""
    from dataclasses import replace

    from shardlab.estimate import estimate_training
    from shardlab.layout import Layout
    from shardlab.runtime.framework_fit import calibrate_framework, fit_host_times
    from shardlab.specs.hardware import Cluster

    cat = get_catalog()
    truth = replace(cat.framework("torchtitan"), layer_host_s=2e-3, step_overhead_s=30e-3, layer_host_min_zero=0)
    from shardlab.runtime.train_worker import resolve_spec

    spec = resolve_spec("tiny")
    docs = []
    for i, (dp, gb, rc) in enumerate(((2, 8, "none"), (2, 32, "full"), (1, 16, "none"), (4, 8, "none"))):
        lay = Layout(dp=dp, micro_batch=2 if gb > 8 else 1, recompute=rc)
        acc, ln = cat.accelerator("cpu-core"), cat.link("loopback")
        cl = Cluster(accelerator=acc, num_gpus=dp, gpus_per_node=dp, intra_link=ln, inter_link=ln)
        t = estimate_training(spec, lay, cl, seq_len=64, global_batch=gb, precision="fp32", framework=truth).step_time_s
        docs.append((f"run{i}.json", _run_doc("tiny", lay, gb, 64, t)))
    out, fit = calibrate_framework(docs, cat, base="torchtitan", suffix="mine")
    assert fit.step_fitted and fit.rel_rms_after < 1e-9
    assert fit.layer_host_s == pytest.approx(2e-3, rel=1e-6) and fit.step_overhead_s == pytest.approx(30e-3, rel=1e-6)
    entry = out["frameworks"]["torchtitan-mine"]
    assert entry["kernels"] == "eager" and "shardlab calibrate" in entry["source"]
    # one run cannot separate the two terms; a negative solution is clamped
    assert fit_host_times([(1.0, 100.0, 1.0, 1.2)])[2] is False
    assert fit_host_times([(1.0, 100.0, 1.0, 0.9), (2.0, 300.0, 1.0, 1.9)])[0] == 0.0
    path = tmp_path / "fw.yaml"
    from shardlab.runtime.calibrate import write_profile

    write_profile(out, path)
    code, out_text, _ = cli_main("estimate", "llama-3.1-8b", "--gpus", "8", "--zero", "3", "--profile", str(path), "--json")
    doc = json.loads(out_text)
    assert code == 0 and doc["framework"]["id"] == "torchtitan-mine" and doc["framework"]["layer_host_s"] == 0.002


def test_from_run_bad_input_exit_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = run_cli("calibrate", "--from-run", str(bad), "--out", str(tmp_path / "o.yaml"))
    assert r.returncode == 2 and "is not JSON" in r.stderr and "Traceback" not in r.stderr
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rows": []}))
    r = run_cli("calibrate", "--from-run", str(other), "--out", str(tmp_path / "o.yaml"))
    assert r.returncode == 2 and "run train --json" in r.stderr


def test_a_fit_above_the_peak_raises_it_and_says_so():
    from shardlab.calibration import EfficiencyFit
    from shardlab.catalog import get_catalog
    from shardlab.runtime.calibrate import accelerator_entry

    base = get_catalog().accelerator("h100-sxm")
    fit = EfficiencyFit(max_fraction=1.2, half_size=100.0, peak_flops=base.peak_tflops["bf16"] * 1e12, rel_rms=0.01,
                        points=9)
    d = accelerator_entry(base, fit, "bf16", "nvlink4", 8, "test")
    assert d["peak_tflops"]["bf16"] == pytest.approx(1.2 * base.peak_tflops["bf16"], rel=1e-3)
    assert d["efficiency"]["max_fraction"] == 1.0 and "peak raised from the catalog's" in d["efficiency"]["source"]
    below = accelerator_entry(base, EfficiencyFit(0.8, 100.0, fit.peak_flops, 0.01, 9), "bf16", "nvlink4", 8, "test")
    assert below["peak_tflops"]["bf16"] == base.peak_tflops["bf16"] and "raised" not in below["efficiency"]["source"]
