"""Every process a command starts, tracked and stopped: what ``shardlab guard`` and ``shardlab run`` use so
that no process outlives its job (Linux; elsewhere only the process group is signalled).

- ``ProcessTree`` finds the descendants of a root process by scanning ``/proc`` (the parent pid of every
  process) and remembers each one with its start time, so a process that left its process group
  (``setsid``) or was orphaned (its parent exited) is still known and can be stopped; pids reused by
  unrelated processes are told apart by their start time. The job's environment carries a marker
  (``SHARDLAB_JOB_<token>=1``, inherited by every process it starts), and a final sweep stops any process
  that carries it, even one that was orphaned to init between two scans.
- ``subreaper`` makes the root a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``): orphaned
  descendants (double-forked daemons) are re-parented to the root instead of to init, so the scan sees them.
- ``die_with_parent`` is a ``preexec_fn`` asking the kernel to signal the child when its parent dies
  (``prctl(PR_SET_PDEATHSIG)``).
- ``Watchdog`` starts a small helper process (``python -m shardlab.proctree``) in its own session that
  tracks the root's descendants too; if the root dies, even by SIGKILL, the helper stops them all.
- How a driver turns SIGINT/SIGTERM/SIGHUP into its clean-up is in ``shardlab.interrupts``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager

LINUX = sys.platform.startswith("linux")
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 1, 36, 37
SCAN_INTERVAL_S = 0.2
"""How often the guard and the watchdog look for new descendants."""


def _prctl():
    if not LINUX:
        return None
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` making the kernel send ``sig`` to the child when this process dies (None off Linux)."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)   # the guard ignores Ctrl-Z; the command keeps its default
        prctl(PR_SET_PDEATHSIG, int(sig))
        if os.getppid() != parent:          # the parent died before prctl took effect
            os._exit(128 + int(sig))
    return preexec


@contextmanager
def subreaper():
    """Make this process a child subreaper for the duration (orphaned descendants are re-parented to it)."""
    prctl = _prctl()
    if prctl is None:
        yield False
        return
    import ctypes

    before = ctypes.c_int(0)
    prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(before))
    ok = prctl(PR_SET_CHILD_SUBREAPER, 1) == 0
    try:
        yield ok
    finally:
        if ok and not before.value:
            prctl(PR_SET_CHILD_SUBREAPER, 0)


def _stat(pid: int) -> tuple[str, int, str] | None:
    """(state, parent pid, start time in clock ticks) of ``pid`` from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2:].split()
    if len(fields) < 20:
        return None
    return fields[0].decode(), int(fields[1]), fields[19].decode()


def is_running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    st = _stat(pid)
    return st is not None and st[0] not in "ZX"


def process_table() -> dict[int, tuple[str, int, str]]:
    """Every process: pid -> (state, parent pid, start ticks)."""
    out = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                out[int(name)] = st
    return out


def children_of(pid: int) -> set[int]:
    """Current child pids of ``pid``."""
    return {p for p, (_, ppid, _) in process_table().items() if ppid == pid}


class ProcessTree:
    """The processes below ``root`` (default: this process), remembered once seen."""

    def __init__(self, root: int | None = None, exclude: Iterable[int] = (), marker: str | None = None):
        self.root = os.getpid() if root is None else root
        self.exclude = set(exclude) | {self.root}
        """Pids whose subtrees are not ours (children the root had before, the watchdog)."""
        self.known: dict[int, str] = {}
        """pid -> start ticks of every descendant seen so far."""
        self.marker = marker or f"SHARDLAB_JOB_{os.getpid()}_{time.monotonic_ns()}"
        """Environment variable name set for the job (``env()``), looked for by ``sweep``."""

    def env(self, base: dict | None = None) -> dict:
        """The environment to start the job with: ``base`` (default: this process's) plus the marker."""
        return {**(os.environ if base is None else base), self.marker: "1"}

    def sweep(self) -> None:
        """Add every process whose environment carries the marker (escapees orphaned between scans)."""
        needle = f"\0{self.marker}=".encode()
        for pid, (state, _, start) in process_table().items():
            if pid in self.known or pid in self.exclude or state in "ZX":
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = b"\0" + f.read()
            except OSError:
                continue
            if needle in env:
                self.known[pid] = start

    def scan(self) -> set[int]:
        """Record the current descendants of the root and of every process already known; return the live ones."""
        table = process_table()
        kids: dict[int, list[int]] = {}
        for pid, (_, ppid, _) in table.items():
            kids.setdefault(ppid, []).append(pid)
        live = {p for p, start in self.known.items() if p in table and table[p][2] == start}
        todo = [self.root, *live]
        seen = set()
        while todo:
            for c in kids.get(todo.pop(), ()):
                if c in seen or c in self.exclude:
                    continue
                seen.add(c)
                self.known.setdefault(c, table[c][2])
                todo.append(c)
        return {p for p in self.known if p in table and table[p][2] == self.known[p] and table[p][0] not in "ZX"}

    def alive(self) -> set[int]:
        """Known descendants still running (not zombies, not replaced by another process with the same pid)."""
        out = set()
        for pid, start in self.known.items():
            st = _stat(pid)
            if st is not None and st[2] == start and st[0] not in "ZX":
                out.add(pid)
        return out

    def track(self, pid: int) -> None:
        """Remember ``pid`` (a child just started) and, from then on, everything below it."""
        st = _stat(pid)
        if st is not None:
            self.known.setdefault(pid, st[2])

    def signal(self, sig: int, groups: Iterable[int] = ()) -> int:
        """Send ``sig`` to every live descendant and to the process ``groups``; returns how many descendants."""
        for g in groups:
            signal_group(g, sig)
        n = 0
        for pid in self.scan():
            try:
                os.kill(pid, sig)
                n += 1
            except (ProcessLookupError, PermissionError):
                pass
        return n

    def stop(self, grace_s: float = 5.0, *, groups: Iterable[int] = (), skip_reap: Iterable[int] = ()) -> int:
        """SIGTERM every live descendant (and ``groups``), SIGKILL what is left after ``grace_s``; returns how
        many were running. Zombies re-parented to this process are reaped, except ``skip_reap`` (a Popen
        reaps its own child)."""
        groups = list(groups)
        self.sweep()
        running = len(self.scan())
        self.signal(signal.SIGTERM, groups)
        deadline = time.monotonic() + grace_s
        while self.scan() and time.monotonic() < deadline:
            self._reap(skip_reap)
            time.sleep(0.02)
        for _ in range(100):                      # SIGKILL cannot be ignored; wait for the kernel (≤ 2 s)
            if not self.signal(signal.SIGKILL, groups):
                break
            self._reap(skip_reap)
            time.sleep(0.02)
        self._reap(skip_reap)
        return running

    def _reap(self, skip: Iterable[int]) -> None:
        me, skip = os.getpid(), set(skip)
        for pid in list(self.known):
            if pid in skip:
                continue
            st = _stat(pid)
            if st is not None and st[1] == me and st[0] == "Z":
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass


def signal_group(pgid: int, sig: int) -> None:
    """``killpg`` that ignores a group already gone."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Watchdog:
    """A helper process that stops the root's descendants if the root dies before calling ``close()``.

    The helper reads a pipe from the root: a ``done`` line means the root cleaned up (the helper exits),
    end-of-file without it means the root died (the helper stops every descendant it has seen: SIGTERM,
    then SIGKILL after ``grace_s``). It ignores SIGINT and SIGHUP, and runs in its own session, so a
    Ctrl-C or a closed terminal that stops the root does not stop the helper first.
    """

    def __init__(self, marker: str, exclude: Iterable[int] = (), grace_s: float = 5.0):
        self.proc: subprocess.Popen | None = None
        if not LINUX:
            return
        env = dict(os.environ)
        pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        args = [sys.executable, "-m", "shardlab.proctree", str(os.getpid()), f"{grace_s:g}", marker, *map(str, exclude)]
        try:
            self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True, env=env)
        except OSError:
            self.proc = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _send(self, line: str) -> None:
        """One line to the helper (nothing when there is no helper or it is gone)."""
        if self.proc is None:
            return
        try:
            self.proc.stdin.write(f"{line}\n".encode())
            self.proc.stdin.flush()
        except OSError:
            pass

    def track(self, pid: int) -> None:
        """Tell the helper about a child just started (before its first scan could see it)."""
        self._send(f"track {pid}")

    def deadline(self, at_monotonic_s: float) -> None:
        """Stop every descendant (SIGTERM, then SIGKILL at once) if the job still runs at ``at_monotonic_s`` (``time.monotonic()``, one
        clock for every process of the machine): the root cannot enforce its limit while it is stopped (SIGSTOP)."""
        self._send(f"deadline {at_monotonic_s!r}")

    def remove_on_death(self, path: str | os.PathLike) -> None:
        """Ask the helper to delete ``path`` (a temporary ``shardlab-run-*`` folder of this job) if the root
        dies without calling ``close()``: nothing else would, since a SIGKILLed root runs no exit handler."""
        self._send(f"remove {os.fspath(path)}")

    def close(self) -> None:
        """Tell the helper the job is over; it exits without stopping anything."""
        if self.proc is None:
            return
        try:
            self.proc.stdin.write(b"done\n")
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def __enter__(self) -> Watchdog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _watch(root: int, grace_s: float, marker: str, exclude: set[int]) -> int:
    """The helper's loop: track the root's descendants until told 'done' or until the root's pipe closes."""
    import select

    for s in (signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    tree = ProcessTree(root, exclude | {os.getpid()}, marker=marker)
    fd, pending, remove, deadline = sys.stdin.fileno(), b"", [], None
    while True:
        tree.scan()
        if deadline is not None and time.monotonic() >= deadline:   # the root is stopped past its job's end
            tree.stop(0.0)
            deadline = None
        ready, _, _ = select.select([fd], [], [], SCAN_INTERVAL_S)
        if not ready:
            continue
        data = os.read(fd, 4096)
        if not data:                        # the root is gone without saying 'done'
            break
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip() == b"done":
                return 0
            if line.startswith(b"track "):
                tree.track(int(line.split()[1]))
            elif line.startswith(b"deadline "):
                deadline = float(line.split()[1])
            elif line.startswith(b"remove "):
                remove.append(os.fsdecode(line[len(b"remove "):]))
    tree.scan()
    tree.stop(grace_s)
    _remove_temp_dirs(remove)
    return 0


def _remove_temp_dirs(paths: Iterable[str]) -> None:
    """Delete the dead root's temporary run folders: only ``shardlab-run-*`` folders directly inside the
    temporary directory, never a folder the user named (``--run-dir``)."""
    import shutil
    import tempfile

    tmp = os.path.realpath(tempfile.gettempdir())
    for p in paths:
        real = os.path.realpath(p)
        if os.path.dirname(real) == tmp and os.path.basename(real).startswith("shardlab-run-"):
            shutil.rmtree(real, ignore_errors=True)


if __name__ == "__main__":
    _root, _grace, _marker, *_exclude = sys.argv[1:]
    raise SystemExit(_watch(int(_root), float(_grace), _marker, {int(x) for x in _exclude}))
