"""Count and time every collective a rank issues, cheaply enough to stay on for every step.

The dispatch-mode recorder of ``shardlab.runtime.metrics`` sees every operator (it slows a step ~1.8× on
the tiny CPU models), so it only runs on steps 0 and 1. This tap wraps the Python entry points of
``torch.distributed`` instead (``all_reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``,
``isend``/``irecv``, ... and the functional collectives DTensor uses), so only the collectives pay a few
microseconds each. What calls them: FSDP2 (``dist.all_gather_single`` / ``reduce_scatter_single``), our
Megatron f/g operators (``dist.all_reduce``), pipelining (``isend``/``irecv``), DTensor
(``_functional_collectives``) and DDP once its gradient buckets go through the stock
``allreduce_hook`` (:func:`use_python_ddp_hook`).

Per (op, group) it keeps:
- calls, and bytes = the largest tensor argument (nccl-tests' S: the gathered output of an all-gather,
  the input of a reduce-scatter);
- seconds: from issue until the work completes (for async ops, the Work's future), like the recorder;
- blocked seconds: time the rank's thread sat inside the call or in ``Work.wait()``. Waiting for a slow
  peer shows up here. Not seen: waits inside C++ (DDP's reducer, DTensor's ``wait_tensor``).

Slow-link injection (``SlowLink``): on the chosen rank every collective sleeps ``delay_s`` inside the
timed call, so the delay counts as that rank's collective time and its peers wait for it in theirs.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections import defaultdict
from contextlib import contextmanager

from shardlab.runtime.metrics import tensor_bytes

C10D_OPS = {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "all_gather": "all_gather", "all_gather_into_tensor": "all_gather", "all_gather_single": "all_gather",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter", "broadcast": "broadcast", "barrier": "barrier",
    "send": "send", "isend": "send", "recv": "recv", "irecv": "recv",
    "all_to_all": "all_to_all", "all_to_all_single": "all_to_all",
}
"""``torch.distributed`` function -> collective name (the names of ``shardlab.runtime.metrics.OP_NAMES``)."""

FUNCOL_OPS = {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce", "all_gather_tensor": "all_gather",
    "all_gather_single": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter", "all_to_all_single": "all_to_all", "broadcast": "broadcast",
}
"""``torch.distributed._functional_collectives`` function -> collective name (DTensor's redistributions)."""

WORLD = "world"
"""Group label of the default process group."""


class CollectiveTap:
    """Wraps the collectives of this process while installed; totals and per-step deltas by (op, group)."""

    def __init__(self, rank: int = 0, slow_link=None):
        self.rank = rank
        self.delay_s = slow_link.delay_s if slow_link is not None and slow_link.rank == rank else 0.0
        self.calls: dict[tuple[str, str], int] = defaultdict(int)
        self.bytes: dict[tuple[str, str], int] = defaultdict(int)
        self.seconds: dict[tuple[str, str], float] = defaultdict(float)
        self.blocked: dict[tuple[str, str], float] = defaultdict(float)
        self.injected_s = 0.0
        self.group_names: dict[str, str] = {}
        self._pending: dict[int, tuple[str, str]] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        self._paused = 0
        self._saved: list[tuple[object, str, object]] = []
        self._mark: dict = {}

    # ---- naming ------------------------------------------------------------------------------------
    def name_groups(self, mesh=None) -> None:
        """Label groups by the mesh dimension they belong to (pp, dp, tp); the default group is 'world'."""
        import torch.distributed as dist

        if dist.is_initialized():
            self.group_names[dist.group.WORLD.group_name] = WORLD
        if mesh is not None:
            for dim in mesh.mesh_dim_names or ():
                self.group_names[mesh[dim].get_group().group_name] = dim

    def _label(self, group) -> str:
        import torch.distributed as dist

        try:
            if group is None:
                return WORLD
            if isinstance(group, str):
                name = group
            elif isinstance(group, dist.ProcessGroup):
                name = group.group_name
            else:  # funcol accepts (mesh, dim), a mesh, rank lists
                from torch.distributed._functional_collectives import _resolve_group_name

                name = _resolve_group_name(group)
            return self.group_names.get(name, name)
        except Exception:  # never let bookkeeping break a collective
            return "other"

    # ---- recording ---------------------------------------------------------------------------------
    def _add(self, table: dict, key, value) -> None:
        with self._lock:
            table[key] += value

    def _delay(self) -> None:
        if self.delay_s > 0:
            time.sleep(self.delay_s)
            with self._lock:
                self.injected_s += self.delay_s

    def _wrap(self, fn, op: str, record):
        """``fn`` wrapped: outside paused or nested calls, bind its arguments, time the call (with any injected
        delay) and hand ``(key, bound arguments, result, t0, seconds)`` to ``record``."""
        sig = inspect.signature(fn)
        tap = self

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if tap._paused or getattr(tap._local, "depth", 0):
                return fn(*args, **kwargs)
            try:
                bound = sig.bind_partial(*args, **kwargs).arguments
            except TypeError:
                bound = {}
            key = (op, tap._label(bound.get("group")))
            tap._local.depth = 1
            t0 = time.perf_counter()
            try:
                tap._delay()
                out = fn(*args, **kwargs)
            finally:
                tap._local.depth = 0
            record(key, bound, out, t0, time.perf_counter() - t0)
            return out

        return wrapper

    def _wrap_c10d(self, fn, op: str):
        def record(key, bound, out, t0, dt):
            with self._lock:
                self.calls[key] += 1
                self.bytes[key] += max((tensor_bytes(v) for v in bound.values()), default=0)
                self.blocked[key] += dt
            if hasattr(out, "get_future"):  # async_op=True, isend, irecv: a Work
                self._track(out, key, t0)
            else:
                self._add(self.seconds, key, dt)
        return self._wrap(fn, op, record)

    def _track(self, work, key, t0: float) -> None:
        """An async op: seconds end when its future completes; a later ``wait()`` adds blocked time."""
        with self._lock:
            self._pending[id(work)] = key
        try:
            work.get_future().then(lambda _f: self._add(self.seconds, key, time.perf_counter() - t0))
        except Exception:  # works without futures: their issue time is their time
            self._add(self.seconds, key, time.perf_counter() - t0)

    def _wrap_funcol(self, fn, op: str):
        def record(key, bound, out, t0, dt):
            n = _group_size(bound.get("group")) if op == "all_gather" else 1
            with self._lock:
                self.calls[key] += 1
                self.bytes[key] += n * tensor_bytes(bound.get("self", bound.get("tensors")))
                self.blocked[key] += dt
                self.seconds[key] += dt
        return self._wrap(fn, op, record)

    def _wrap_wait(self, wait):
        tap = self

        @functools.wraps(wait)
        def timed_wait(work, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return wait(work, *args, **kwargs)
            finally:
                with tap._lock:
                    key = tap._pending.pop(id(work), None)
                    if key is not None:
                        tap.blocked[key] += time.perf_counter() - t0

        return timed_wait

    # ---- install -----------------------------------------------------------------------------------
    def install(self) -> CollectiveTap:
        """Patch ``torch.distributed`` (module and its ``distributed_c10d`` home), the functional collectives
        and ``Work.wait``. Undone by :meth:`uninstall`."""
        import torch.distributed as dist
        import torch.distributed._functional_collectives as funcol
        import torch.distributed.distributed_c10d as c10d

        for name, op in C10D_OPS.items():
            orig = getattr(c10d, name, None)
            if orig is None:
                continue
            wrapped = self._wrap_c10d(orig, op)
            for mod in (c10d, dist):
                if getattr(mod, name, None) is orig:
                    self._patch(mod, name, wrapped)
        for name, op in FUNCOL_OPS.items():
            orig = getattr(funcol, name, None)
            if orig is not None:
                self._patch(funcol, name, self._wrap_funcol(orig, op))
        self._patch(dist.Work, "wait", self._wrap_wait(dist.Work.wait))
        return self

    def _patch(self, owner, name: str, value) -> None:
        self._saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def uninstall(self) -> None:
        for owner, name, orig in reversed(self._saved):
            setattr(owner, name, orig)
        self._saved.clear()

    @contextmanager
    def paused(self):
        """Collectives issued inside are neither counted nor delayed (the observer's own bookkeeping)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    # ---- reading -----------------------------------------------------------------------------------
    def totals(self) -> list[dict]:
        """[{op, group, calls, bytes, seconds, blocked_s}] since installation."""
        with self._lock:
            return [{"op": k[0], "group": k[1], "calls": n, "bytes": self.bytes[k], "seconds": self.seconds[k],
                     "blocked_s": self.blocked[k]} for k, n in sorted(self.calls.items())]

    def _now(self) -> dict:
        with self._lock:
            return {"calls": sum(self.calls.values()), "bytes": sum(self.bytes.values()),
                    "seconds": sum(self.seconds.values()), "blocked_s": sum(self.blocked.values()),
                    "injected_s": self.injected_s}

    def mark(self) -> None:
        """Start a step: :meth:`since_mark` counts from here."""
        with self._lock:
            self._pending.clear()  # works nobody waited for from Python (DDP's, pipelining's) are done by now
        self._mark = self._now()

    def since_mark(self) -> dict:
        """Calls, bytes, seconds, blocked seconds and injected link delay since :meth:`mark`."""
        now = self._now()
        return {k: v - self._mark.get(k, 0) for k, v in now.items()}


def _group_size(group) -> int:
    try:
        from torch.distributed._functional_collectives import _resolve_group_name
        from torch.distributed.distributed_c10d import _resolve_process_group

        return _resolve_process_group(_resolve_group_name(group)).size()
    except Exception:
        return 1


def use_python_ddp_hook(modules, group) -> int:
    """Route DDP's gradient buckets through PyTorch's stock ``allreduce_hook`` (divide by the group size, then
    ``dist.all_reduce``), so the tap sees them. Same sum as DDP's built-in path; returns the modules hooked."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    n = 0
    for m in modules:
        if isinstance(m, DistributedDataParallel):
            m.register_comm_hook(group, allreduce_hook)
            n += 1
    return n
