"""Hugging Face checkpoints in the runtime: find the folder, read its numerics, map its tensors onto the runtime
GPT's names, and let each rank read only the slices it holds (safetensors' lazy slicing).

- ``config``: the folder (local, or ``hf:ORG/NAME`` through the hub extra), the families loaded, ``Numerics``;
- ``names``: for each runtime parameter, the checkpoint rows it is made of (fused QKV, Conv1D, stacked experts);
- ``reader``: safetensors files, single or sharded with an index, bytes read counted;
- ``load``: check a checkpoint against its config, and fill a rank's (sharded) parameters from it.
"""
