"""Check a checkpoint against its config, and fill one rank's parameters from it, reading only their blocks.

The runtime builds and shards its GPT first (every strategy: Megatron or DTensor TP, FSDP2, pipeline stages,
expert parallelism), then each local parameter's region in the full tensor (``runtime.parallel.region``) is read
from the checkpoint through the family's name map (``runtime.checkpoint.names``). So under TP = N each matrix
byte is read by one rank (replicated norms and biases by all), under PP a stage reads only its layers, under EP a
rank reads only its experts.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.errors import ShardlabError
from shardlab.runtime.checkpoint.names import Piece, pieces
from shardlab.runtime.checkpoint.reader import FLOAT_DTYPES, Checkpoint


@dataclass(frozen=True)
class LoadReport:
    """What one rank read."""

    tensors: int
    """Runtime parameters filled."""
    bytes_read: int
    """Checkpoint bytes read (its dtype)."""
    checkpoint_bytes: int
    """Bytes of the whole checkpoint."""
    dtypes: tuple[str, ...]
    """Checkpoint dtypes seen (safetensors codes)."""


def _expect(ckpt: Checkpoint, pc: Piece, shape: tuple[int, ...], name: str) -> None:
    """Raise naming the first way the source of ``pc`` does not fit runtime parameter ``name`` of ``shape``."""
    where = f"checkpoint {ckpt.folder}"
    if pc.tensor not in ckpt:
        raise ShardlabError(f"{where} has no tensor '{pc.tensor}' (needed for {name}); the weights do not match "
                            f"config.json: re-save the checkpoint with save_pretrained() or fix the config")
    src, dt = ckpt.info(pc.tensor)
    if dt not in FLOAT_DTYPES:
        raise ShardlabError(f"{where}: tensor '{pc.tensor}' is {dt}; the runtime reads fp32, fp16 and bf16 weights "
                            f"(quantized checkpoints are not loaded)")
    if pc.whole:
        ok, want = src == shape[1:], shape[1:]
    elif pc.transpose:
        ok = len(src) == 2 and src[0] == shape[1] and src[1] >= pc.start + pc.rows
        want = (shape[1], f">= {pc.start + pc.rows}")
    else:
        ok = len(src) == len(shape) and src[0] >= pc.start + pc.rows and src[1:] == shape[1:]
        want = (f">= {pc.start + pc.rows}", *shape[1:])
    if not ok:
        raise ShardlabError(f"{where}: tensor '{pc.tensor}' has shape {src}, config.json implies {tuple(want)} "
                            f"(for {name}); the weights do not match the config")


def check_checkpoint(spec, family: str, ckpt: Checkpoint) -> list[str]:
    """Every runtime parameter of ``spec`` (the checkpoint's own vocabulary) maps onto tensors of the right shape; a
    ShardlabError names the first that does not. Returns the checkpoint tensors no parameter uses."""
    from shardlab.specs.tensors import model_tensors

    used: set[str] = set()
    for t in model_tensors(spec):
        for pc in pieces(family, spec, t.name, t.shape, spec.vocab_size):
            if pc.tensor is not None:
                _expect(ckpt, pc, t.shape, t.name)
                used.add(pc.tensor)
    return sorted(n for n in ckpt.files if n not in used)


def read_region(ckpt: Checkpoint, pcs: list[Piece], offset: tuple[int, ...], local_shape: tuple[int, ...]):
    """The block [offset, offset + local_shape) of the runtime parameter made of ``pcs``."""
    import torch

    a, n = offset[0], local_shape[0]
    rest = tuple(slice(o, o + k) for o, k in zip(offset[1:], local_shape[1:]))
    parts, pos = [], 0
    for pc in pcs:
        lo, hi = max(a, pos), min(a + n, pos + pc.rows)
        if lo < hi:
            x, y = lo - pos, hi - pos
            if pc.tensor is None:
                parts.append(torch.zeros((y - x, *local_shape[1:])))
            elif pc.whole:
                parts += [ckpt.block(pc.tensor, rest).unsqueeze(0) for _ in range(x, y)]
            elif pc.transpose:
                parts.append(ckpt.block(pc.tensor, (rest[0], slice(pc.start + x, pc.start + y))).t())
            else:
                parts.append(ckpt.block(pc.tensor, (slice(pc.start + x, pc.start + y), *rest)))
        pos += pc.rows
    return torch.cat(parts, 0)


def load_into(modules, ckpt: Checkpoint, family: str, spec) -> LoadReport:
    """Fill every parameter of ``modules`` (this rank's, sharded or not) from ``ckpt``; ``spec`` has the checkpoint's
    own vocabulary (the model's may be padded)."""
    import torch

    from shardlab.runtime.parallel.region import region

    filled = 0
    with torch.no_grad():
        for m in modules:
            for raw, p in m.named_parameters():
                name = raw.removeprefix("module.")
                shape, offset, local = region(p)
                if local.numel() == 0:
                    continue
                block = read_region(ckpt, pieces(family, spec, name, shape, spec.vocab_size), offset, tuple(local.shape))
                local.copy_(block.to(local.dtype))
                filled += 1
    return LoadReport(filled, ckpt.bytes_read, ckpt.total_bytes(), tuple(sorted(ckpt.dtypes)))


def reads_doc(source, ranks: list[dict]) -> dict:
    """The checkpoint and what each rank read from it (``checkpoint_bytes_read`` of each rank's document, bytes in the
    checkpoint's dtype): the JSON of ``run infer`` and ``run train``."""
    ck = source.open()
    total = ck.total_bytes()
    reads = [d.get("checkpoint_bytes_read") or 0 for d in ranks]
    return {"path": str(source.folder), "ref": source.ref, "family": source.family, "dtypes": sorted(ck.dtypes),
            "checkpoint_bytes": total, "bytes_read_per_rank": reads, "bytes_read_total": sum(reads),
            "read_ratio": sum(reads) / total if total else None}
