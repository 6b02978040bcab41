"""`shardlab bench collectives`: nccl-tests definitions on real gloo ranks, α–β fits, bad input, NCCL on GPUs."""

import json

import pytest

from conftest import cli_main, run_cli

torch = pytest.importorskip("torch")

from shardlab.comm.collectives import bus_factor  # noqa: E402
from shardlab.errors import ShardlabError  # noqa: E402
from shardlab.runtime.bench_collectives import parse_ops, parse_sizes, round_size  # noqa: E402

OPS = ["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv"]


def test_parse_sizes_range_list_and_errors():
    assert parse_sizes("1KB:8KB") == [1000, 2000, 4000, 8000]
    assert parse_sizes("1K:1M:4") == [1024, 4096, 16384, 65536, 262144, 1048576]
    assert parse_sizes("1KB:5KB") == [1000, 2000, 4000, 5000]  # the end is always measured
    assert parse_sizes("1KB,1MiB") == [1000, 2 ** 20]
    for bad in ("1XB:2MB", "2MB:1KB", "1KB:2MB:1", "1KB:2MB:x", "a:b:c:d", "0"):
        with pytest.raises(ShardlabError):
            parse_sizes(bad)


def test_default_sizes_double_in_binary_units_and_the_plot_labels_them_so():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from shardlab.runtime.bench.plots import size_ticks

    sizes = parse_sizes("1KiB:64MiB")        # the CPU default, nccl-tests' 1K..64M
    assert sizes[0] == 1024 and sizes[-1] == 64 * 2 ** 20 and all(b == 2 * a for a, b in zip(sizes, sizes[1:]))
    fig, ax = plt.subplots()
    ax.set_xscale("log")
    size_ticks(ax, sizes)
    labels = [t.get_text() for t in ax.get_xticklabels()]
    plt.close(fig)
    assert labels[0] == "1 KiB" and labels[-1] == "64 MiB" and len(labels) <= 9


def test_parse_ops_and_rounding():
    assert parse_ops("all") == OPS
    assert parse_ops("send-recv,all-reduce") == ["send-recv", "all-reduce"]
    with pytest.raises(ShardlabError, match="did you mean all-reduce"):
        parse_ops("all-reduse")
    assert round_size(1000, 2) == 1000 and round_size(1001, 3) == 996 and round_size(1, 4) == 16


@pytest.mark.parametrize("args,words", [
    (["--nproc-per-node", "1"], "at least 2"),
    (["--ops", "allreduce"], "unknown collective"),
    (["--sizes", "1KB:2XB"], "unknown unit"),
    (["--plot", "x.txt"], ".png"),
])
def test_bad_input_is_one_line_exit_2(args, words):
    code, out, err = cli_main("bench", "collectives", *args)
    assert code == 2 and words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    plot = tmp_path_factory.mktemp("coll") / "busbw.png"
    r = run_cli("bench", "collectives", "--nproc-per-node", "2", "--sizes", "1KB:4MB:4", "--iters", "3",
                "--min-time", "0.01", "--device", "cpu", "--plot", str(plot), "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), plot


@pytest.mark.slow
def test_rows_follow_nccl_tests_definitions(bench):
    doc, _ = bench
    assert doc["backend"] == "gloo" and doc["device"] == "cpu" and doc["world_size"] == 2
    assert [r["op"] for r in doc["rows"]] == [op for op in OPS for _ in range(7)]
    for r in doc["rows"]:
        assert set(r) >= {"op", "size_bytes", "time_s", "algbw_gbps", "busbw_gbps", "world_size", "fitted_time_s"}
        assert r["world_size"] == 2 and r["time_s"] > 0 and r["size_bytes"] % 8 == 0
        assert r["algbw_gbps"] == pytest.approx(r["size_bytes"] / r["time_s"] / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * bus_factor(r["op"], 2))
    sizes = [r["size_bytes"] for r in doc["rows"] if r["op"] == "all-reduce"]
    assert sizes == sorted(sizes) and sizes[0] == 1000 and sizes[-1] == 4_000_000


@pytest.mark.slow
def test_fits_are_positive_and_describe_the_measurements(bench):
    doc, plot = bench
    assert set(doc["fits"]) | set(doc["fit_errors"]) == set(OPS) | {"joint"}
    assert len(doc["fits"]) >= 4, doc["fit_errors"]  # 1 KB .. 4 MB spans latency- and bandwidth-bound on gloo
    for name, f in doc["fits"].items():
        assert f["alpha_s"] >= 0 and f["beta_bytes_per_s"] > 0 and f["points"] == (35 if name == "joint" else 7)
        assert f["latency_us"] == pytest.approx(f["alpha_s"] * 1e6)
    for op in doc["fits"].keys() - {"joint"}:  # fitted time grows with size (alpha-beta is monotonic) and tracks the measurement loosely
        rows = [r for r in doc["rows"] if r["op"] == op]
        fitted = [r["fitted_time_s"] for r in rows]
        assert all(a <= b for a, b in zip(fitted, fitted[1:]))
        assert rows[-1]["fitted_time_s"] == pytest.approx(rows[-1]["time_s"], rel=4.0)
    assert plot.exists() and plot.stat().st_size > 10_000 and doc["plot"] == str(plot)


@pytest.mark.slow
def test_human_table_says_measured_and_fitted(bench):
    from shardlab.runtime.bench_collectives import render

    text = render(bench[0])
    assert "measured time (us)" in text and "fitted time (us)" in text and "busbw (GB/s)" in text
    assert "alpha-beta fits" in text and "gloo collectives, 2 ranks" in text and "comm_overlap:" in text


@pytest.mark.slow
def test_overlap_test_reports_a_share(bench):
    ov = bench[0]["overlap"]
    assert 0 <= ov["share"] <= 1 and ov["overlaps"] == (ov["share"] >= 0.5) and len(ov["shares"]) == 7
    assert ov["comm_s"] > 0 and ov["compute_s"] > 0 and ov["both_s"] > 0 and ov["matmuls"] >= 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_nccl_on_gpus():
    r = run_cli("bench", "collectives", "--nproc-per-node", "2", "--sizes", "1KB:16MB:16", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["backend"] == "nccl" and doc["device"] == "cuda"
    assert doc["fits"]["all-reduce"]["beta_bytes_per_s"] > 1e9
