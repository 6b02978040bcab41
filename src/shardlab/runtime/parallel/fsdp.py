"""FSDP2 (``torch.distributed.fsdp.fully_shard``): ZeRO-3 sharding of weights, gradients and optimizer state.

Each block is its own FSDP unit (all-gathered just before its forward/backward, resharded after), then
the root wraps what is left (embeddings, final norm, head). Every parameter becomes a DTensor sharded on
dim 0 across the mesh, padded to ceil(d0 / N) rows (Zhao et al. 2023, "PyTorch FSDP", §3.2 for the
flat-parameter ancestor; FSDP2 shards per tensor), except stacked experts (E, ·, ·) with fewer experts than
ranks, which shard on dim 1 (torchtitan's MoE ``shard_placement_fn``). ``shardlab.memory.states``
(``fsdp_shard_numel``, ``expert_shard_dim``) is the same rule, so measured bytes equal predicted bytes.
"""

from __future__ import annotations

import warnings

import torch.nn as nn


def apply_fsdp(model: nn.Module, mesh, *, reshard_after_forward: bool = True, mp_policy=None) -> nn.Module:
    """Shard ``model`` in place with FSDP2 over ``mesh`` (1-D DeviceMesh, e.g. the 'dp' dim of a 2-D mesh).

    Works on the meta device with a fake process group (shapes only). Returns the model.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from torch.distributed.tensor import Shard

    # FSDP2 warns when a wrapped module returns a view (the TP head's gathered logits are one): an in-place op
    # on it would skip the pre-backward hook. shardlab's losses only read the logits
    # (``F.cross_entropy(logits.float())``, runtime/parallel/build.py and runtime/precision.py): nothing to warn of.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(.*\) returned a view tensor", category=UserWarning)
    size = mesh.size()

    def placement(param):  # stacked experts (E, out, in): split dim 1 when each rank cannot get an expert
        return Shard(1) if param.dim() == 3 and param.shape[0] < size else None

    kw = {"mesh": mesh, "reshard_after_forward": reshard_after_forward,
          "mp_policy": mp_policy or MixedPrecisionPolicy(), "shard_placement_fn": placement}
    layers = getattr(model, "layers", None)
    blocks = list(layers.values()) if isinstance(layers, nn.ModuleDict) else list(layers or [])
    for i, block in enumerate(blocks):
        # the last block's parameters are needed again first in backward: keep them gathered (torchtitan)
        fully_shard(block, **{**kw, "reshard_after_forward": reshard_after_forward and i < len(blocks) - 1})
    fully_shard(model, **kw)
    return model
