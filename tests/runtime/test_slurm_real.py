"""A real Slurm on this host (Debian's slurm-wlm and munge): munged, slurmctld and slurmd started by the test with a
private key, socket, config, ports and state folder, stopped afterwards; the script `shardlab export --to slurm
--launch shardlab` writes runs under `sbatch --wait` as written (issue: the exported script failed as written)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import cli_main
from shardlab.runtime.dist import free_port as _free_port

pytestmark = pytest.mark.slow
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo")


def _conf(d: Path, host: str) -> str:
    return "\n".join([
        "ClusterName=shardlabtest", f"SlurmctldHost={host}(127.0.0.1)", f"SlurmctldPort={_free_port()}",
        f"SlurmdPort={_free_port()}", "AuthType=auth/munge", f"AuthInfo=socket={d}/munge.sock", "CredType=cred/munge",
        "SlurmUser=root", "SlurmdUser=root", f"StateSaveLocation={d}/state", f"SlurmdSpoolDir={d}/spool",
        f"SlurmctldPidFile={d}/slurmctld.pid", f"SlurmdPidFile={d}/slurmd.pid", f"SlurmctldLogFile={d}/slurmctld.log",
        f"SlurmdLogFile={d}/slurmd.log", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SwitchType=switch/none", "MpiDefault=none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "ReturnToService=2", "SchedulerType=sched/builtin",
        f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN",
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""])


def _ours(pid: int, conf: str) -> bool:
    try:
        return f"SLURM_CONF={conf}".encode() in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


@pytest.fixture
def slurm():
    """(environment for Slurm's commands, folder): a one-node Slurm of our own, running until the test ends."""
    missing = [d for d in DAEMONS if not shutil.which(d)]
    if os.geteuid() != 0 or missing:
        pytest.skip(f"a private Slurm needs root and Debian's slurm-wlm and munge (missing: {missing or 'root'})")
    d = Path(tempfile.mkdtemp(prefix="slt", dir="/tmp"))          # a short path: the munge socket's name is bounded
    (d / "state").mkdir()
    (d / "spool").mkdir()
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    host = socket.gethostname()
    conf = d / "slurm.conf"
    conf.write_text(_conf(d, host))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs = []
    try:
        procs.append(subprocess.Popen(["munged", "-F", "-f", f"--socket={d}/munge.sock", f"--key-file={key}",
                                       f"--log-file={d}/munged.log", f"--pid-file={d}/munged.pid",
                                       f"--seed-file={d}/munged.seed"], env=env, start_new_session=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for _ in range(50):
            if (d / "munge.sock").exists():
                break
            time.sleep(0.1)
        for cmd in (["slurmctld", "-D", "-f", str(conf)], ["slurmd", "-D", "-f", str(conf), "-N", host]):
            procs.append(subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, timeout=10)
            if r.stdout.strip() == "idle":
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"the private Slurm did not come up: {(d / 'slurmctld.log').read_text()[-800:]}")
        yield env, d
    finally:
        for p in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in reversed(procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        for pid in (int(x) for x in os.listdir("/proc") if x.isdigit()):   # step daemons our slurmd forked
            if _ours(pid, str(conf)):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shutil.rmtree(d, ignore_errors=True)


def test_the_exported_slurm_script_runs_as_written(slurm):
    """`export --to slurm --launch shardlab` for 2 CPU ranks on one node: sbatch runs it unedited (no GPU request,
    the environment activated from $VENV, threads from the node's cores), its srun line is `shardlab run train`,
    which finds its rendezvous in Slurm's environment, and the job's one report has both ranks, memory exact."""
    env, d = slurm
    script = d / "job.sbatch"
    code, _, err = cli_main("export", "--to", "slurm", "llama-3.1-8b", "--gpu", "cpu-core", "--gpus", "2",
                            "--gpus-per-node", "2", "--precision", "fp32", "--launch", "shardlab", "--out", str(script))
    assert code == 0, err
    assert "srun shardlab run train --strategy ddp --nproc-per-node 2" in script.read_text()
    run_env = {**env, "VENV": sys.prefix, "SHARDLAB_PROBE": "0"}
    r = subprocess.run(["sbatch", "--wait", f"--output={d}/out.txt", str(script)], env=run_env, cwd=d,
                       capture_output=True, text=True, timeout=240)
    out = (d / "out.txt").read_text() if (d / "out.txt").exists() else ""
    assert r.returncode == 0, (r.stderr + out)[-2000:]
    doc = json.loads(out)
    assert doc["world_size"] == 2 and [x["rank"] for x in doc["ranks"]] == [0, 1] and doc["memory_states_exact"]
