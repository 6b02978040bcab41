"""Real 2-rank runs (torchrun, gloo): scrape every rank's endpoint while it runs, name an injected straggler,
and leave no port or process behind. A Prometheus server scrapes a live job when its binary is installed."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("prometheus_client")

from shardlab.runtime.observe.names import COMMON_LABELS, series_names  # noqa: E402
from shardlab.runtime.observe.scrape import scrape  # noqa: E402

pytestmark = pytest.mark.slow


def _two_free_ports() -> int:
    """A base port with base and base + 1 free (one per local rank), below the kernel's ephemeral range: a port from
    that range can be taken, between this check and the rank's bind, as the local end of any outgoing connection
    (the Prometheus server's scrapes, the rendezvous), which failed a run with 'Address already in use'."""
    import random

    from shardlab.runtime.dist import free_port
    from shardlab.runtime.observe.launcher import port_free

    try:
        low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    for _ in range(200):
        p = random.randrange(20000, low - 2) if low > 20002 else free_port()
        if p < 65535 and port_free("127.0.0.1", p) and port_free("127.0.0.1", p + 1):
            return p
    raise RuntimeError("no two consecutive free ports")


def _start(*args, seed: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "shardlab", "run", *args, "--seed", str(seed), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _scrape_until(ports, pred, timeout_s=90.0):
    """Scrape every port until ``pred(scrapes)`` holds; returns the scrapes."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        got = [scrape("127.0.0.1", p, timeout_s=1.0) for p in ports]
        if all(s.ok for s in got) and pred(got):
            return got
        time.sleep(0.3)
    raise AssertionError(f"endpoints never satisfied the condition: {[s.error for s in got]}")


def _no_process_with(marker: str) -> bool:
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if marker in (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    return False
            except OSError:
                continue
    return True


def _closed(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_live_endpoints_straggler_named_and_everything_gone_after(tmp_path):
    base, seed = _two_free_ports(), 4217
    tb = tmp_path / "tb"
    proc = _start("train", "--strategy", "fsdp", "--nproc-per-node", "2", "--steps", "24", "--slow-rank", "1:2",
                  "--metrics-port", str(base), "--tensorboard", str(tb), "--steps-jsonl", str(tmp_path / "s.jsonl"),
                  seed=seed)
    try:
        ports = [base, base + 1]
        first = _scrape_until(ports, lambda ss: all((s.value("shardlab_steps_total") or 0) >= 3 for s in ss))
        later = _scrape_until(ports, lambda ss: all(
            (s.value("shardlab_steps_total") or 0) > (f.value("shardlab_steps_total") or 0) for s, f in zip(ss, first)))
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    for rank, (a, b) in enumerate(zip(first, later)):
        names = {n for n, _, _ in b.samples}
        assert names <= series_names(gpu=False)                       # only names the catalog (and dashboard) know
        assert {"shardlab_step_seconds_bucket", "shardlab_collective_calls_total", "shardlab_memory_bytes"} <= names
        labels = {k: b.label(k) for k in COMMON_LABELS}
        assert labels["rank"] == str(rank) and labels["node"] == "0" and labels["strategy"] == "fsdp"
        for counter in ("shardlab_steps_total", "shardlab_collective_calls_total", "shardlab_collective_bytes_total",
                        "shardlab_step_seconds_count", "shardlab_compute_seconds_total"):
            assert b.value(counter) > a.value(counter) > 0, counter
        # FSDP2 over the dp group: all-gathers and reduce-scatters, nothing else
        assert {lab.get("op") for n, lab, _ in b.samples if n == "shardlab_collective_calls_total"} == \
            {"all_gather", "reduce_scatter"}
        assert b.value("shardlab_collective_calls_total", group="dp") == b.value("shardlab_collective_calls_total")
    assert later[0].label("job_id") == later[1].label("job_id")
    d = json.loads(out)
    obs = d["observability"]
    st = obs["straggler"]
    assert st["rank"] == 1 and st["is_straggler"]
    # within 20% of the injected factor, times how much slower the rank was on its own (a busier core of a
    # shared machine; about 1 on an idle one, where the factor itself must come out)
    nat = st["natural_compute_ratio"]
    assert abs(st["compute_ratio"] / (2.0 * nat) - 1) < 0.20, st
    assert abs(nat - 1) > 0.10 or abs(st["compute_ratio"] / 2.0 - 1) < 0.20, st
    # it drags the job: by 20%, or, where the rank ran faster on its own (nat < 1, a quieter core) so that the factor
    # left it less slower than 2x, by at least a quarter of the excess it measured (the others' waits absorb the rest)
    assert st["drag"] > min(0.2, 0.25 * (st["compute_ratio"] - 1)), st
    assert st["others_wait_s"] > 3 * st["own_wait_s"], st
    assert obs["predicted_vs_measured"]["injected_rank_named"]
    assert obs["metrics"]["ports"] == ports and all(v > 0 for v in obs["metrics"]["scrapes_ok"].values())
    recs = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert len(recs) == 48 and {r["rank"] for r in recs} == {0, 1}
    from shardlab.runtime.observe.tensorboard import read_scalars

    back = read_scalars(str(tb))
    assert sorted(back) == ["rank0", "rank1"] and len(back["rank1"]["step/seconds"]) == 24
    # the endpoints and every process are gone with the run
    assert all(_closed(p) for p in ports)
    assert _no_process_with(f"--seed {seed}")


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="no Prometheus server binary (Debian: apt-get install prometheus)")
def test_a_prometheus_server_scrapes_a_live_job(tmp_path):
    from shardlab.runtime.dist import free_port

    base, web, seed = _two_free_ports(), free_port(), 4218
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(f"global: {{scrape_interval: 1s, scrape_timeout: 1s}}\nscrape_configs:\n  - job_name: shardlab\n"
                   f"    static_configs: [{{targets: ['127.0.0.1:{base}', '127.0.0.1:{base + 1}']}}]\n")
    server = subprocess.Popen(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'data'}",
                               f"--web.listen-address=127.0.0.1:{web}"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    end = time.monotonic() + 60                    # the server first: a job that ends before its first scrape
    while time.monotonic() < end and server.poll() is None:   # leaves nothing to query
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{web}/-/ready", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        time.sleep(0.2)
    # 300 steps (about 9 s of training): the endpoints come up a few seconds into the job, and the server must get
    # several scrapes in before it ends however fast this machine runs it
    job = _start("train", "--strategy", "ddp", "--nproc-per-node", "2", "--steps", "300", "--metrics-port", str(base),
                 "--slow-link", "0:0.002", seed=seed)
    try:
        # last_over_time: what the server stored, also after the job ended (an instant query then sees the stale
        # markers Prometheus writes when a target goes away, and a fast job on a busy machine can end first)
        q = urllib.parse.quote('sum by (rank, job_id) (last_over_time(shardlab_collective_calls_total{job="shardlab"}[10m]))')
        end, result, ended = time.monotonic() + 120, [], None
        while time.monotonic() < end and (ended is None or time.monotonic() < ended + 10):
            if ended is None and job.poll() is not None:
                ended = time.monotonic()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{web}/api/v1/query?query={q}", timeout=2) as r:
                    result = json.loads(r.read())["data"]["result"]
            except OSError:
                result = []
            if len(result) == 2 and all(float(x["value"][1]) > 0 for x in result):
                break
            time.sleep(0.5)
        out, err = job.communicate(timeout=240)
    finally:
        job.kill()
        server.terminate()
        server.wait(timeout=30)
    assert job.returncode == 0, err[-3000:]
    assert sorted(x["metric"]["rank"] for x in result) == ["0", "1"], result   # the server stored both ranks
    assert len({x["metric"]["job_id"] for x in result}) == 1
    obs = json.loads(out)["observability"]
    assert obs["injected"]["slow_link"]["rank"] == 0
    rows = {r["rank"]: r for r in obs["ranks"]}
    # DDP's bucket all-reduces went through the tap, and the 2 ms delay per call shows on both ranks' collectives
    assert rows[0]["collective_calls_per_step"] >= 1 and rows[1]["mean_blocked_s"] >= 0.0
    assert rows[0]["mean_injected_s"] == pytest.approx(0.002 * rows[0]["collective_calls_per_step"], rel=0.05)
    assert _no_process_with(f"--seed {seed}")
