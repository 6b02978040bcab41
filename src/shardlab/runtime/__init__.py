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


def require_torch():
    """Import and return torch, or raise a one-line ShardlabError saying how to install it."""
    try:
        import torch
    except ImportError:  # ModuleNotFoundError, or a broken install
        raise ShardlabError(f"the runtime needs PyTorch, which is not installed: {INSTALL_HINT}") from None
    return torch
