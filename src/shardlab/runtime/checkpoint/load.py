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


UNUSED_OK = ("rotary_emb.inv_freq", "attn.bias", "attn.masked_bias", "attention.bias", "attention.masked_bias")
"""Buffers some checkpoints store beside the weights (rotary tables, GPT-2's causal masks): not parameters."""


def check_checkpoint(spec, family: str, ckpt: Checkpoint) -> list[str]:
    """Every runtime parameter of ``spec`` (the checkpoint's own vocabulary) maps onto tensors of the right shape, each
    source tensor is covered exactly (a config with fewer KV heads, a smaller vocabulary or fewer experts than the
    weights is refused, as transformers refuses it), and no weight is left over; a ShardlabError names the first
    mismatch. Returns the tensors left unused (known buffers only)."""
    from shardlab.specs.tensors import model_tensors

    used: dict[str, int] = {}                 # tensor -> rows (columns when transposed) the pieces reach
    for t in model_tensors(spec):
        for pc in pieces(family, spec, t.name, t.shape, spec.vocab_size):
            if pc.tensor is not None:
                _expect(ckpt, pc, t.shape, t.name)
                reach = -1 if pc.whole else pc.start + pc.rows       # a whole tensor: its shape is checked exactly
                used[pc.tensor] = max(used.get(pc.tensor, -1), reach)
    where = f"checkpoint {ckpt.folder}"
    for name, reach in used.items():
        shape, _ = ckpt.info(name)
        extent = shape[1] if _transposed(family, spec, name) else shape[0]
        if 0 <= reach < extent:
            raise ShardlabError(f"{where}: tensor '{ckpt.stored(name)}' has shape {shape}, but config.json uses only "
                                f"{reach} of its {extent} rows; the weights do not match the config (heads, KV heads, "
                                f"vocabulary or widths): fix config.json")
    extra = [n for n in ckpt.files if ckpt.canonical(n) not in used]
    bad = [n for n in extra if not n.endswith(UNUSED_OK) and not (spec.tied_embeddings and n.endswith("lm_head.weight"))]
    if bad:
        raise ShardlabError(f"{where}: tensor '{bad[0]}' (and {len(bad) - 1} more) is not used by the model config.json "
                            f"describes (more layers or experts than it says?); fix config.json" if len(bad) > 1 else
                            f"{where}: tensor '{bad[0]}' is not used by the model config.json describes (more layers or "
                            f"experts than it says?); fix config.json")
    return sorted(extra)


def _transposed(family: str, spec, name: str) -> bool:
    """GPT-2's Conv1D matrices are stored (in, out): their rows for us are the stored columns."""
    return family == "gpt2" and name.endswith(".weight") and any(k in name for k in ("c_attn", "c_proj", "c_fc"))


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

    filled, seen = 0, set()
    with torch.no_grad():
        for m in modules:
            for prefix, mod in m.named_modules():
                kept = getattr(mod, "_shardlab_regions", {})
                for pname, p in mod.named_parameters(recurse=False):
                    if id(p) in seen:            # a parameter two modules share is filled once
                        continue
                    seen.add(id(p))
                    name = (f"{prefix}.{pname}" if prefix else pname).removeprefix("module.")
                    filled += _fill(ckpt, family, spec, name, p, kept.get(pname))
    return LoadReport(filled, ckpt.bytes_read, ckpt.total_bytes(), tuple(sorted(ckpt.dtypes)))


def _fill(ckpt: Checkpoint, family: str, spec, name: str, p, kept) -> int:
    from shardlab.runtime.parallel.region import region

    shape, offset, local = region(p, kept)
    if local.numel() == 0:
        return 0
    block = read_region(ckpt, pieces(family, spec, name, shape, spec.vocab_size), offset, tuple(local.shape))
    local.copy_(block.to(local.dtype))
    return 1


def reads_doc(source, ranks: list[dict]) -> dict:
    """The checkpoint and what each rank read from it (``checkpoint_bytes_read`` of each rank's document, bytes in the
    checkpoint's dtype): the JSON of ``run infer`` and ``run train``."""
    ck = source.open()
    total = ck.total_bytes()
    reads = [d.get("checkpoint_bytes_read") or 0 for d in ranks]
    return {"path": str(source.folder), "ref": source.ref, "family": source.family, "dtypes": sorted(ck.dtypes),
            "checkpoint_bytes": total, "bytes_read_per_rank": reads, "bytes_read_total": sum(reads),
            "read_ratio": sum(reads) / total if total else None}
