"""What a rank measures: collectives (count, bytes, time by op and phase), model-state bytes, peak memory.

Collectives are seen by a TorchDispatchMode: DDP's reducer, FSDP2, DTensor, pipelining and our Megatron
operators all issue ``c10d::*`` or ``_c10d_functional::*`` ops through the dispatcher (on the calling
thread; CPU autograd runs backward on it too). An op's time runs from its issue until its work completes
(c10d: the Work's future; functional: the matching ``wait_tensor``), so it includes any compute it
overlapped with. The phase is 'backward' while autograd executes a node, else what the worker set
('forward', 'optimizer'; pipeline stages set it per action).

Model-state bytes are counted from storages (unique, so FSDP2 views into one buffer count once, and
padding counts as allocated): exact, to hold against ``shardlab.memory``. Peak memory by category comes
from torch's ``MemTracker`` (FSDP2 runs: ``FSDPMemTracker``), because process RSS is misleading on CPU.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

OP_NAMES = {
    "c10d.allreduce_": "all_reduce", "c10d.allreduce_coalesced_": "all_reduce",
    "c10d._allgather_base_": "all_gather", "c10d.allgather_": "all_gather",
    "c10d.allgather_into_tensor_coalesced_": "all_gather", "c10d.allgather_coalesced_": "all_gather",
    "c10d._reduce_scatter_base_": "reduce_scatter", "c10d.reduce_scatter_": "reduce_scatter",
    "c10d.reduce_scatter_tensor_coalesced_": "reduce_scatter", "c10d.broadcast_": "broadcast",
    "c10d.send": "send", "c10d.recv_": "recv", "c10d.recv_any_source_": "recv",
    "c10d.alltoall_": "all_to_all", "c10d.alltoall_base_": "all_to_all", "c10d.barrier": "barrier",
    "_c10d_functional.all_reduce": "all_reduce", "_c10d_functional.all_reduce_coalesced": "all_reduce",
    "_c10d_functional.all_gather_into_tensor": "all_gather",
    "_c10d_functional.all_gather_into_tensor_coalesced": "all_gather",
    "_c10d_functional.reduce_scatter_tensor": "reduce_scatter",
    "_c10d_functional.reduce_scatter_tensor_coalesced": "reduce_scatter",
    "_c10d_functional.all_to_all_single": "all_to_all", "_c10d_functional.broadcast": "broadcast",
}
"""Dispatcher op -> collective name used in reports."""


def tensor_bytes(obj) -> int:
    """Bytes of a tensor, or of the tensors in a (nested) list or tuple; 0 for anything else."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(o) for o in obj)
    return 0


class CollectiveRecorder(TorchDispatchMode):
    """Counts and times every collective issued on this thread while active, by (op, phase)."""

    def __init__(self):
        super().__init__()
        self.phase = "forward"
        self.enabled = True
        self.counts: dict[tuple[str, str], int] = defaultdict(int)
        self.bytes: dict[tuple[str, str], int] = defaultdict(int)
        self.time_s: dict[tuple[str, str], float] = defaultdict(float)
        self._pending: dict[int, tuple[tuple[str, str], float]] = {}
        self._lock = threading.Lock()
        self.p2p_phase: dict[int, str] = {}
        """Phase of a pending send/recv by its tensor's data pointer, set when the op is built: a pipeline
        schedule fires one phase's sends together with the other phase's receives (1F1B), so the phase current
        at dispatch can be the wrong one."""

    def reset(self) -> None:
        with self._lock:
            self.counts.clear(), self.bytes.clear(), self.time_s.clear(), self._pending.clear()
            self.p2p_phase.clear()

    def _add_time(self, key, dt: float) -> None:
        with self._lock:
            self.time_s[key] += dt

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func).rsplit(".", 1)[0]
        if not self.enabled:
            return func(*args, **kwargs)
        if name == "_c10d_functional.wait_tensor":
            out = func(*args, **kwargs)
            hit = self._pending.pop(id(args[0]), None)
            if hit is not None:
                self._add_time(hit[0], time.perf_counter() - hit[1])
            return out
        op = OP_NAMES.get(name)
        if op is None:
            return func(*args, **kwargs)
        phase = "backward" if torch._C._current_autograd_node() is not None else self.phase
        if op in ("send", "recv") and args and isinstance(args[0], (list, tuple)) and args[0]:
            phase = self.p2p_phase.pop(args[0][0].data_ptr(), phase)
        key = (op, phase)
        with self._lock:
            self.counts[key] += 1
            self.bytes[key] += tensor_bytes(args[0] if args else None)
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        if name.startswith("_c10d_functional"):
            self._pending[id(out)] = (key, t0)
            return out
        work = out[-1] if isinstance(out, (tuple, list)) else out
        try:
            fut = torch._C._distributed_c10d.Work.unbox(work).get_future()
            fut.then(lambda _f, key=key, t0=t0: self._add_time(key, time.perf_counter() - t0))
        except Exception:  # not a Work (e.g. a synchronous op): its call time is its time
            self._add_time(key, time.perf_counter() - t0)
        return out

    def summary(self) -> dict:
        """{op: {phase: {"count", "bytes", "time_s"}}} of everything recorded."""
        out: dict = {}
        with self._lock:
            for (op, phase), n in sorted(self.counts.items()):
                out.setdefault(op, {})[phase] = {"count": n, "bytes": self.bytes[(op, phase)],
                                                 "time_s": round(self.time_s[(op, phase)], 6)}
        return out


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (DTensors: their local shards; padding included)."""
    from torch.distributed.tensor import DTensor

    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        if isinstance(t, DTensor):
            t = t.to_local()
        if t.device.type == "meta":
            seen[id(t)] = t.numel() * t.element_size()
            continue
        st = t.untyped_storage()
        seen[st.data_ptr() or id(t)] = st.nbytes()
    return sum(seen.values())


def model_state_bytes(params: list, optimizer) -> dict[str, int]:
    """Measured bytes of weights, gradients and optimizer state held by this rank.

    ``optimizer`` counts the moment tensors (AdamW exp_avg/exp_avg_sq, SGD momentum_buffer);
    ``optimizer_step_counters`` the per-tensor scalar ``step`` counters AdamW keeps (4 bytes each).
    """
    moments, steps = [], []
    if optimizer is not None:
        for state in optimizer.state.values():
            for k, v in state.items():
                if isinstance(v, torch.Tensor):
                    (steps if k == "step" else moments).append(v)
    return {"weights": storage_bytes(params), "gradients": storage_bytes([p.grad for p in params]),
            "optimizer": storage_bytes(moments), "optimizer_step_counters": storage_bytes(steps)}


class SavedActivations:
    """Peak bytes of tensors saved for backward (the activations of Korthikanti et al. 2022 §4), while active.

    A ``saved_tensors_hooks`` pack hook sees every tensor autograd keeps; parameters are skipped, storages
    are counted once and released when freed (weakref on the storage). Works where MemTracker cannot
    (torch.distributed.pipelining runs backward through ``autograd.grad``).
    """

    def __init__(self, params=()):
        from torch.distributed.tensor import DTensor

        self._param_ptrs = {(p.to_local() if isinstance(p, DTensor) else p).untyped_storage().data_ptr()
                            for p in params if p.device.type != "meta"}
        self._live: dict[int, int] = {}
        self.current_bytes = 0
        self.peak_bytes = 0
        self._lock = threading.Lock()

    def _free(self, ptr: int) -> None:
        with self._lock:
            self.current_bytes -= self._live.pop(ptr, 0)

    def _pack(self, t):
        import weakref

        from torch.distributed.tensor import DTensor

        if isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter):
            return t  # a weight or a view of one (F.linear saves weight.t()): FSDP's gathered weights too
        local = t.to_local() if isinstance(t, DTensor) else t
        if getattr(local, "is_meta", False):
            return t
        try:
            st = local.untyped_storage()
            ptr = st.data_ptr()
        except Exception:  # tensor subclasses without a real storage (e.g. async collective wrappers)
            return t
        if ptr in self._param_ptrs:
            return t
        with self._lock:
            if ptr not in self._live:
                self._live[ptr] = st.nbytes()
                self.current_bytes += st.nbytes()
                self.peak_bytes = max(self.peak_bytes, self.current_bytes)
                weakref.finalize(st, self._free, ptr)
        return t

    def __enter__(self):
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


class PeakMemory:
    """Peak memory by category over a region, from torch's MemTracker (FSDPMemTracker for one FSDP2 model).

    ``MemTracker`` refuses a root module called twice (gradient accumulation, pipeline micro-batches), so
    before each further call of a root its module statistics are harvested and reset; tensor tracking
    (and the global peak) carries on.
    """

    def __init__(self, modules: list, optimizer, fsdp: bool = False):
        from torch.distributed._tools.mem_tracker import MemTracker

        self.roots = {id(m) for m in modules}
        self.maxima: dict[str, int] = defaultdict(int)
        self.tracker = None
        if fsdp and len(modules) == 1:
            try:
                from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

                self.tracker = FSDPMemTracker(modules[0], optimizer)
            except Exception:  # fall back to the generic tracker
                self.tracker = None
        if self.tracker is None:
            self.tracker = MemTracker()
            self.tracker.track_external(*modules, *([optimizer] if optimizer is not None else []))

    def _harvest(self) -> None:
        # the current snapshot too: optimizer state appears after the last module snapshot (end of the step)
        for dev_snap in self.tracker.get_tracker_snapshot("current").values():
            for k, v in dev_snap.items():
                key = _category(k)
                self.maxima[key] = max(self.maxima[key], int(v))
        for stats in list(self.tracker.memory_tracking.values()):
            for snaps in stats.snapshots.values():
                for snap in snaps:
                    for dev_snap in snap.values():
                        for k, v in dev_snap.items():
                            key = _category(k)
                            self.maxima[key] = max(self.maxima[key], int(v))

    def _pre_forward(self, module, args) -> None:
        t = self.tracker
        if id(module) in self.roots and module in t.memory_tracking and not t._mod_tracker.is_bw:
            self._harvest()
            t.reset_mod_stats()

    def __enter__(self):
        from torch.nn.modules.module import register_module_forward_pre_hook

        self._hook = register_module_forward_pre_hook(self._pre_forward)  # runs before the tracker's own hooks
        self.tracker.__enter__()
        return self

    def __exit__(self, *exc):
        out = self.tracker.__exit__(*exc)
        self._hook.remove()
        self._harvest()
        return out

    def peak_by_category(self) -> dict[str, int]:
        """{category: its own maximum over the region} ('Total' is the overall peak)."""
        out = dict(self.maxima)
        for dev_snap in self.tracker.get_tracker_snapshot("peak").values():
            for k, v in dev_snap.items():
                key = _category(k)
                out[key] = max(out.get(key, 0), int(v))
        return out

    def at_peak(self) -> dict[str, int]:
        """{category: bytes} at the moment of the overall peak."""
        out: dict[str, int] = defaultdict(int)
        for dev_snap in self.tracker.get_tracker_snapshot("peak").values():
            for k, v in dev_snap.items():
                out[_category(k)] += int(v)
        return dict(out)


def _category(k) -> str:
    """'PARAM', 'GRAD', 'ACT', 'TEMP', 'OPT', ... (FSDPMemTracker adds 'SHARDED_PARAM', 'ALL_GATHER', ...)."""
    name = getattr(k, "name", None)
    return name if name else str(k)
