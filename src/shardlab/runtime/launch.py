"""Start a rank program with ``torchrun`` (PyTorch's elastic launcher), enforce a timeout, summarise failures.

One node: ``python -m shardlab.runtime.bound_run --standalone --nproc-per-node N -m MODULE ARGS`` (torchrun,
``torch.distributed.run``, with its rendezvous store listening on one address: ``runtime.bound_run``). Several
nodes: pass torchrun's rendezvous flags in ``torchrun_args`` (``--nnodes 2 --node-rank 0
--rdzv-backend c10d --rdzv-endpoint host:29500 --rdzv-id job1``) and run the same command on every node.

Every rank writes into a per-run directory named by ``SHARDLAB_RUN_DIR``: ``rank{r}.json`` (its
results), ``rank{r}.error.json`` (the exception it died of) and ``rank{r}.heartbeat.json`` (the last
phase it reached; see ``shardlab.runtime.worker``). A failed rank makes torchrun stop the others; a hung
rank makes its peers' collectives time out (the process-group timeout) or, at the latest, this
launcher's ``timeout_s`` kills the whole process group. Either way the result carries a one-line
summary naming the rank.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from shardlab.errors import ShardlabError
from shardlab.runtime.dist import DEFAULT_PG_TIMEOUT_S
from shardlab.runtime.rendezvous import RENDEZVOUS_FILE, note_rendezvous, read_json, rendezvous_of

_TIMEOUT_WORDS = ("timed out", "timeout", "connection closed by peer", "connection reset", "broken pipe")


@dataclass
class LaunchResult:
    """What a torchrun launch produced."""

    returncode: int
    """torchrun's exit status (0 = every rank succeeded; -9 when this launcher killed it on timeout)."""
    stdout: str
    """Captured standard output of torchrun and all ranks."""
    stderr: str
    """Captured standard error of torchrun and all ranks."""
    duration_s: float
    """Wall time of the launch, start-up included."""
    run_dir: Path
    """Per-run directory the ranks wrote their JSON into (``SHARDLAB_RUN_DIR``)."""
    timed_out: bool = False
    """True when the launcher's timeout killed the job."""
    failed_rank: int | None = None
    """The rank blamed for the failure (root cause), or None."""
    summary: str = ""
    """One line: 'ok' or what failed, on which rank, and why."""
    command: list[str] = field(default_factory=list)
    """The command that was run."""
    warnings: list[str] = field(default_factory=list)
    """What the launcher warned about (more CPU ranks than cores), for the run's JSON and page."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def rank_results(self) -> list[dict]:
        """The ``rank{r}.json`` documents in rank order."""
        return read_rank_files(self.run_dir, "json")

    def raise_for_failure(self) -> LaunchResult:
        """Raise a ShardlabError (one line, exit 2) carrying the summary unless every rank succeeded."""
        if not self.ok:
            raise ShardlabError(self.summary)
        return self


def torchrun_command(module: str, nproc: int, args: list[str], torchrun_args: list[str] | None = None,
                     log_dir: str | os.PathLike | None = None) -> list[str]:
    """The torchrun command line: standalone on one node, or with the caller's rendezvous flags. ``log_dir``: where
    torchelastic keeps its per-run folder (by default a new /tmp/torchelastic_* that nothing removes), unless the
    caller's flags name one."""
    cmd = [sys.executable, "-m", "shardlab.runtime.bound_run"]     # torchrun, its store on one address
    extra = list(torchrun_args or [])
    if not any(a.startswith(("--rdzv", "--rdzv_", "--master")) for a in extra):
        cmd.append("--standalone")
        if not any(a.startswith(("--local-addr", "--local_addr")) for a in extra):
            # the ranks' shared store listens on this node's address torchrun hands out (its fqdn, often a LAN
            # address): one node needs only loopback
            cmd += ["--local-addr", "127.0.0.1"]
    if log_dir is not None and not any(a.startswith(("--log-dir", "--log_dir")) for a in extra):
        cmd += ["--log-dir", str(log_dir)]
    cmd += ["--nproc-per-node", str(nproc), *extra, "-m", module, *args]
    return cmd


def launch(module: str, nproc: int, args: list[str], *, timeout_s: float, env: dict | None = None,
           torchrun_args: list[str] | None = None, run_dir: str | os.PathLike | None = None,
           observer=None) -> LaunchResult:
    """Run ``module`` on ``nproc`` ranks with torchrun; never hangs longer than ``timeout_s``.

    ``env`` entries are added to the environment (OMP_NUM_THREADS defaults to 1 for every rank: ranks share
    the cores). No process of the job outlives it: on timeout, Ctrl-C (SIGINT), SIGTERM or SIGHUP the
    whole job is stopped (torchrun, every rank, anything they started) before this returns or raises; if
    this process dies, even by SIGKILL, the kernel signals torchrun (PR_SET_PDEATHSIG) and a watchdog
    process stops every rank (``shardlab.proctree``). A temporary ``run_dir`` is removed when the
    process exits, or by the watchdog when it is killed (set SHARDLAB_KEEP_RUN_DIR=1 to keep it). ``observer`` (a
    ``shardlab.runtime.observe.launcher.Observation``) adds the ranks' metrics settings and scrapes them while
    they run.
    """
    if nproc < 1:
        raise ShardlabError(f"--nproc-per-node must be at least 1, got {nproc}")
    temporary = not run_dir and not os.environ.get("SHARDLAB_KEEP_RUN_DIR")
    rd = Path(run_dir) if run_dir else _temp_run_dir()
    rd.mkdir(parents=True, exist_ok=True)
    from shardlab.runtime.preflight import launch_env

    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    for k, v in launch_env(torchrun_args).items():     # the store's address, the collectives' interface
        if k.endswith("_SOCKET_IFNAME"):
            full_env.setdefault(k, v)                   # an interface the user set wins
        else:
            full_env[k] = v
    full_env.update(env or {})
    full_env["SHARDLAB_RUN_DIR"] = str(rd)
    # collectives time out well before the launcher does, so a hung rank's peers fail and name it
    full_env.setdefault("SHARDLAB_PG_TIMEOUT_S", f"{max(5.0, min(DEFAULT_PG_TIMEOUT_S, 0.5 * timeout_s)):g}")
    full_env.setdefault("TORCHELASTIC_ERROR_FILE", str(rd / "torchelastic_error.json"))
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    warning = warn_oversubscribed(nproc, args, full_env)
    if observer is not None:
        full_env.update(observer.prepare(rd))
    cmd = torchrun_command(module, nproc, args, torchrun_args, log_dir=rd / "torchelastic")
    try:
        proc, out, err, timed_out, t0 = _run_job(cmd, full_env, rd, timeout_s, temporary, observer)
    except KeyboardInterrupt as e:      # the job is stopped; the run command reports what it left in the folder
        e.run_dir = rd
        raise
    res = LaunchResult(proc.returncode, out or "", err or "", time.monotonic() - t0, rd, timed_out, command=cmd,
                       warnings=[warning] if warning else [])
    res.failed_rank, res.summary = summarise(res, timeout_s)
    return res


def _run_job(cmd: list[str], full_env: dict, rd: Path, timeout_s: float, temporary: bool, observer):
    """Start the job, wait for it (or its deadline) and stop every process of it: (torchrun's Popen, stdout, stderr,
    timed out, monotonic start). Ctrl-C, SIGTERM and SIGHUP raise ``interrupts.Interrupted`` once the job is stopped."""
    from shardlab import interrupts, proctree

    timed_out = False
    out = err = None
    with interrupts.signals_raise() as caught, proctree.subreaper():
        before = proctree.children_of(os.getpid())
        tree = proctree.ProcessTree(exclude=before)
        watchdog = proctree.Watchdog(tree.marker, exclude=before, grace_s=STOP_GRACE_S)
        tree.exclude |= {watchdog.pid} if watchdog.pid else set()
        if temporary:                       # a SIGKILLed driver runs no atexit: the watchdog removes the folder
            watchdog.remove_on_death(rd)
        t0 = time.monotonic()
        proc = None
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=tree.env(full_env),
                                    start_new_session=True, preexec_fn=proctree.die_with_parent(signal.SIGTERM))
            tree.track(proc.pid)
            watchdog.track(proc.pid)
            if observer is not None:
                observer.start()
            out, err, timed_out = wait_job(proc, t0 + timeout_s, caught)
            if timed_out:
                if not read_rank_files(rd, "heartbeat.json"):   # still waiting for nodes: count them before the
                    note_rendezvous(cmd, rd)                   # store (maybe this node's torchrun) is stopped
                _stop_job(proc, tree)
                out, err = proc.communicate()
        finally:
            with interrupts.shielded():
                if proc is not None:
                    if proc.poll() is None:             # interrupted (Ctrl-C, SIGTERM): stop the whole job
                        _stop_job(proc, tree)
                    tree.stop(0.0, groups=[proc.pid], skip_reap=[proc.pid])   # ranks torchrun left behind
                watchdog.close()
                if observer is not None:
                    observer.stop()
    if caught.signum is not None:               # a signal whose exception was dropped after the job ended
        raise interrupts.Interrupted(caught.signum)
    return proc, out, err, timed_out, t0


def wait_job(proc: subprocess.Popen, deadline: float, caught) -> tuple[str | None, str | None, bool]:
    """Collect the job's output until it exits or ``deadline`` (monotonic) passes: (stdout, stderr, timed out).

    Waits in slices of POLL_S and checks ``caught`` (``interrupts.signals_raise``) between them: a Ctrl-C or SIGTERM
    whose exception Python dropped (raised while a finaliser ran) still ends the wait, as ``Interrupted``."""
    from shardlab import interrupts

    while True:
        if caught.signum is not None:
            raise interrupts.Interrupted(caught.signum)
        left = deadline - time.monotonic()
        if left <= 0:
            return None, None, True
        try:
            out, err = proc.communicate(timeout=min(POLL_S, left))
            return out, err, False
        except subprocess.TimeoutExpired:
            continue


POLL_S = 0.5
"""Longest slice of ``wait_job``: how late a dropped signal can be noticed."""
STOP_GRACE_S = 5.0
"""Seconds torchrun gets after SIGTERM to stop its ranks before everything left is SIGKILLed."""
_TEMP_DIRS: list[Path] = []


def _temp_run_dir() -> Path:
    """A new per-run folder, removed at exit unless SHARDLAB_KEEP_RUN_DIR is set."""
    import atexit
    import shutil

    d = Path(tempfile.mkdtemp(prefix="shardlab-run-"))
    if not os.environ.get("SHARDLAB_KEEP_RUN_DIR"):
        if not _TEMP_DIRS:
            atexit.register(lambda: [shutil.rmtree(p, ignore_errors=True) for p in _TEMP_DIRS])
        _TEMP_DIRS.append(d)
    return d


def removed_at_exit(path: str | os.PathLike | None) -> bool:
    """Whether ``path`` is a temporary run folder this process removes when it exits."""
    return path is not None and Path(path) in _TEMP_DIRS


def warn_oversubscribed(nproc: int, args: list[str], env: dict) -> str:
    """On CPU, more ranks than cores time-slice: say that timings will be meaningless (stderr). Returns the
    warning, or "" when there is none."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if nproc <= cores:
        return ""
    device = env.get("SHARDLAB_DEVICE") or (args[args.index("--device") + 1] if "--device" in args[:-1] else None)
    if device is None:
        try:
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            device = "cpu"
    if device != "cpu":
        return ""
    msg = (f"{nproc} ranks on {cores} CPU core(s): the ranks take turns on the cores, so step times and bandwidths "
           f"will be meaningless (correctness checks still hold); use --nproc-per-node {cores} or fewer for timings")
    sys.stderr.write(f"warning: {msg}\n")
    return msg


def _stop_job(proc: subprocess.Popen, tree, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM torchrun (it forwards to its ranks) and every process of the job; SIGKILL what is left
    after ``grace_s``. Ranks run in sessions of their own, so they are found by ``tree``, not by group."""
    tree.stop(grace_s, groups=[proc.pid], skip_reap=[proc.pid])
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def read_rank_files(run_dir: Path, kind: str) -> list[dict]:
    """``rank{r}.{kind}`` documents (kind: json, error.json, heartbeat.json), sorted by rank."""
    docs = []
    for p in Path(run_dir).glob(f"rank*.{kind}"):
        m = re.fullmatch(rf"rank(\d+)\.{re.escape(kind)}", p.name)
        if not m:
            continue
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        d.setdefault("rank", int(m.group(1)))
        docs.append(d)
    return sorted(docs, key=lambda d: d["rank"])


def _root_cause(stderr: str) -> tuple[int | None, str]:
    """(rank, exit description) of torchrun's 'Root Cause (first observed failure)' block."""
    block = stderr.split("Root Cause", 1)[1] if "Root Cause" in stderr else ""
    m = re.search(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)", block)
    if not m:
        return None, ""
    ec = re.search(r"exitcode\s*:\s*(-?\d+)[^\n]*", block)
    host = re.search(r"host\s*:\s*(\S+)", block)
    how = ""
    if ec:
        code = int(ec.group(1))
        how = f"exit code {code}" if code >= 0 else f"killed by {_signame(-code)}"
    if host:
        how += f" on host {host.group(1)}"
    return int(m.group(1)), how


def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _last_exception_line(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines()]
    cands = [ln for ln in lines if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b.*", ln)
             and "ChildFailedError" not in ln]
    return cands[-1][:300] if cands else ""


def _is_timeout(msg: str) -> bool:
    low = msg.lower()
    return any(w in low for w in _TIMEOUT_WORDS)


def _progress(hb: dict) -> tuple[int, float]:
    return hb.get("seq", 0), hb.get("time", 0.0)


def _clean(msg: str) -> str:
    """Drop gloo's source-path prefixes and keep the first sentence-sized part."""
    msg = re.sub(r"\[/[^\]]*\]\s*", "", msg)
    return msg.split(". This is typically")[0][:240]


def summarise(res: LaunchResult, timeout_s: float) -> tuple[int | None, str]:
    """(blamed rank, one-line summary).

    A rank's own exception wins over peers that only timed out or lost the connection while waiting for
    it. When there are only such waiting errors, the blamed rank is one that left no error and no result
    (it died, or hung and was stopped): the rank the others waited for.
    """
    if res.returncode == 0 and not res.timed_out:
        return None, f"ok: {len(res.rank_results())} ranks finished in {res.duration_s:.1f} s"
    errors = sorted(read_rank_files(res.run_dir, "error.json"), key=lambda e: e.get("time", 0.0))
    beats = {hb["rank"]: hb for hb in read_rank_files(res.run_dir, "heartbeat.json")}
    done = {d["rank"] for d in res.rank_results()}
    real = [e for e in errors if not _is_timeout(e.get("error", ""))]
    if real:
        e = real[0]
        return e["rank"], f"rank {e['rank']} failed: {_clean(e.get('error', '?'))}{_where(beats.get(e['rank']))}"
    root, how = _root_cause(res.stderr)
    if root is not None and root not in beats and root not in done and beats:
        # it died before its first heartbeat, while its peers were past theirs: the peers only waited for it
        exc = _last_exception_line(res.stderr)
        return root, (f"rank {root} died during start-up ({how}), before it joined the process group"
                      + (f": {exc}" if exc else "") + "; the other ranks waited for it")
    silent = sorted((beats[r] for r in beats if r not in done and r not in {e["rank"] for e in errors}), key=_progress)
    ambiguous = len(silent) > 1 and silent[0].get("seq") == silent[1].get("seq")
    if silent and not (res.timed_out and ambiguous):
        s = silent[0]
        what = f"died at '{s.get('phase', '?')}' ({how})" if root == s["rank"] and how else \
            f"stopped responding at '{s.get('phase', '?')}'"
        waited = f"; rank {errors[0]['rank']} gave up waiting: {_clean(errors[0].get('error', ''))}" if errors else ""
        late = f"; the job was stopped after {timeout_s:g} s" if res.timed_out else ""
        return s["rank"], f"rank {s['rank']} {what}{waited}{late}"
    nodes, endpoint = rendezvous_of(res.command)
    if res.timed_out and not beats and nodes > 1:
        exc = _last_exception_line(res.stderr)
        joined = read_json(res.run_dir / RENDEZVOUS_FILE).get("joined")
        count = f"only {joined} of its {nodes} nodes joined" if isinstance(joined, int) else \
            f"never gathered its {nodes} nodes"
        return None, (f"timed out after {timeout_s:g} s before any rank of this node started: the rendezvous at "
                      f"{endpoint}: {count} (another node was not started, stopped before it joined, or cannot reach "
                      "the endpoint); start the same command on every node, or raise --timeout"
                      + (f"; torchrun said: {exc}" if exc else ""))
    if res.timed_out:
        return None, (f"timed out after {timeout_s:g} s and was stopped; no rank reported an error "
                      f"(last phases: {_phases(beats)}); raise --timeout or look for a hung rank")
    if errors:
        e = errors[0]
        return e["rank"], f"rank {e['rank']} failed: {_clean(e.get('error', '?'))}{_where(beats.get(e['rank']))}"
    exc = _last_exception_line(res.stderr)
    joined = re.search(r"(\d+)/(\d+) clients joined", res.stderr or "")
    if joined and not beats and nodes > 1:      # a static rendezvous' host store gave up waiting for the nodes
        return None, (f"the rendezvous at {endpoint}: only {joined.group(1)} of its {nodes} nodes joined before its "
                      "join timeout (another node was not started, stopped before it joined, or cannot reach the "
                      "endpoint); start the same command on every node, or raise --timeout")
    if root is not None:
        return root, f"rank {root} failed ({how}){': ' + exc if exc else ''}{_where(beats.get(root))}"
    return None, f"torchrun exited with code {res.returncode}{': ' + exc if exc else ''}"


def _where(hb: dict | None) -> str:
    return f" (at '{hb['phase']}')" if hb and hb.get("phase") else ""


def _phases(beats: dict) -> str:
    return ", ".join(f"rank {r}: {b.get('phase', '?')}" for r, b in sorted(beats.items())) or "none"
