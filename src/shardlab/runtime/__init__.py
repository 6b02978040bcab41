"""The runtime: real torch.distributed runs of the layouts the analytic core predicts.

Everything under ``shardlab.runtime`` may import torch; nothing outside it does. Commands that need the
runtime call :func:`require_torch` first so that a missing torch is a one-line error with the fix.

Modules:
- ``launch``: start ``torchrun`` (the real elastic launcher), enforce a timeout, summarise failures.
- ``dist``: process-group set-up (gloo on CPU, NCCL on CUDA), device choice, free ports.
- ``gpt``: a small GPT whose parameters match ``shardlab.specs.tensors.model_tensors`` name for name.
- ``parallel/``: DDP, FSDP2, DTensor TP (+SP), Megatron-style TP, pipeline, 2-D meshes.
- ``train``/``train_worker``, ``infer``/``infer_worker``: the ``shardlab run`` commands and their rank programs.
- ``metrics``, ``compare``: per-rank measurements and predicted-vs-measured tables.
"""

from __future__ import annotations

from shardlab.errors import ShardlabError

INSTALL_HINT = ("pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu (CPU) "
                "or pip install 'shardlab[runtime]'")
"""How to get torch, shown whenever a runtime command runs without it."""


def check_host_memory(spec, bytes_per_param: int, what: str, device: str | None = None) -> None:
    """Refuse, in one line, a CPU run whose model alone (``bytes_per_param`` per parameter: 16 for fp32 training
    with AdamW, 4 for fp32 weights) would not fit in the memory this machine has available, instead of letting the
    kernel kill it (or the machine) part way. GPU runs and machines without /proc/meminfo are not checked."""
    if device == "cuda":
        return
    avail = host_memory_available()
    if avail is None:
        return
    from shardlab.specs.tensors import param_counts

    params = param_counts(spec).total
    need = params * bytes_per_param
    if need > 0.8 * avail:
        raise ShardlabError(f"{what} {spec.name} on CPU: {params / 1e9:.2f}B parameters need about {need / 1e9:.1f} GB "
                            f"({bytes_per_param} B per parameter), more than the {avail / 1e9:.1f} GB available here; use "
                            f"--model tiny or small (the runtime checks the models, it does not train large ones), or "
                            f"`shardlab shard-check` for a large model's shards on the meta device")


def host_memory_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def check_host_bytes(need: float, what: str, fix: str, device: str | None = None) -> None:
    """Refuse, in one line, CPU work whose buffers (``need`` bytes) would not fit in the memory available here,
    before it starts, instead of letting the kernel kill a process part way."""
    avail = None if device == "cuda" else host_memory_available()
    if avail is not None and need > 0.8 * avail:
        raise ShardlabError(f"{what} needs about {need / 1e9:,.1f} GB of buffers on this machine, more than 80% of "
                            f"the {avail / 1e9:.1f} GB available; {fix}")


def require_torch(load: bool = True):
    """Import and return torch, or raise a one-line ShardlabError saying how to install it.

    ``load=False`` only checks that torch is installed (returns None): the process that starts a torchrun job
    does not compute with torch, and importing it (about 3 s on a 2-core CPU) would delay every rank's start.
    A broken install then surfaces as the ranks' own import error in the job's failure summary."""
    if not load:
        import importlib.util

        try:
            found = importlib.util.find_spec("torch") is not None
        except (ImportError, ValueError):   # a parent package missing, or a module without __spec__
            found = False
        if not found:
            raise ShardlabError(f"the runtime needs PyTorch, which is not installed: {INSTALL_HINT}")
        return None
    try:
        import torch
    except ImportError:  # ModuleNotFoundError, or a broken install
        raise ShardlabError(f"the runtime needs PyTorch, which is not installed: {INSTALL_HINT}") from None
    return torch
