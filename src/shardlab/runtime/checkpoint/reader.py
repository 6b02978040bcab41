"""safetensors files, read lazily: a rank asks for a block of a tensor and only that block's bytes are read.

One ``model.safetensors``, or shards listed by ``model.safetensors.index.json`` (its ``weight_map``: tensor ->
file). ``safe_open(...).get_slice(name)[rows, cols]`` reads the block from the memory-mapped file without
materialising the tensor (safetensors' documented lazy loading), so a TP rank reads 1/tp of each split matrix.
Every block read is counted (``bytes_read``), in the checkpoint's own dtype.
"""

from __future__ import annotations

import json
from pathlib import Path

from shardlab.errors import ShardlabError

DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
               "F8_E4M3": 1, "F8_E5M2": 1}
"""Bytes per element of the safetensors dtype codes."""
FLOAT_DTYPES = ("F32", "F16", "BF16")
"""Weight dtypes the runtime reads (fp32, fp16, bf16)."""
MAX_INDEX_BYTES = 64 << 20
"""A model.safetensors.index.json larger than this is refused."""


class Checkpoint:
    """The tensors of a checkpoint folder: names, shapes, dtypes, and lazily read blocks."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.files: dict[str, Path] = {}      # tensor -> file
        self._open: dict[Path, object] = {}
        self.bytes_read = 0
        index = self.folder / "model.safetensors.index.json"
        if index.is_file():
            if index.stat().st_size > MAX_INDEX_BYTES:
                raise ShardlabError(f"{index} is larger than {MAX_INDEX_BYTES >> 20} MiB; it is not a checkpoint index")
            try:
                wmap = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
            except (OSError, ValueError, AttributeError, RecursionError):
                wmap = None
            if not isinstance(wmap, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wmap.items()):
                raise ShardlabError(f"{index} has no valid weight_map (tensor name -> file); re-save the checkpoint")
            for name, fname in wmap.items():
                path = (self.folder / fname)
                if Path(fname).name != fname or not path.is_file():
                    raise ShardlabError(f"{index}: tensor {name} is in {fname!r}, which is not a file of the folder")
                self.files[name] = path
        else:
            path = self.folder / "model.safetensors"
            for name in self._handle(path).keys():
                self.files[name] = path
        self._meta: dict[str, tuple[tuple[int, ...], str]] = {}
        self._asked: set[str] = set()
        self._asked_short: dict[str, str] = {}

    def _handle(self, path: Path):
        h = self._open.get(path)
        if h is None:
            from safetensors import safe_open

            try:
                h = safe_open(str(path), framework="pt")
            except Exception as e:  # a truncated or tampered file: safetensors raises its own errors
                raise ShardlabError(f"{path} is not a readable safetensors file ({type(e).__name__}: {str(e)[:120]}); "
                                    f"re-save the checkpoint") from None
            self._open[path] = h
        return h

    def stored(self, name: str) -> str:
        """The name ``name`` has in the files: as asked (the CausalLM names, 'model.layers.0...'), or without its first
        component when the checkpoint was saved from the base model ('layers.0...', GPT-2's 'h.0...'), as
        transformers accepts both."""
        if name in self.files:
            return name
        short = name.split(".", 1)[1] if "." in name else name
        return short if short in self.files else name

    def canonical(self, stored: str) -> str:
        """The CausalLM name of a stored tensor name (inverse of ``stored`` for the names the maps ask for)."""
        return stored if stored in self._asked else self._asked_short.get(stored, stored)

    def __contains__(self, name: str) -> bool:
        self._asked.add(name)
        if "." in name:
            self._asked_short[name.split(".", 1)[1]] = name
        return self.stored(name) in self.files

    def _slice(self, name: str):
        key = self.stored(name)
        if key not in self.files:
            raise ShardlabError(f"checkpoint {self.folder} has no tensor '{name}'; the weights do not match config.json")
        try:
            return self._handle(self.files[key]).get_slice(key)
        except Exception as e:   # an index naming a shard that lacks the tensor, a damaged file
            raise ShardlabError(f"{self.files[key]}: cannot read tensor '{key}' ({type(e).__name__}: {str(e)[:100]}); "
                                f"the index and the shards disagree: re-save the checkpoint") from None

    def info(self, name: str) -> tuple[tuple[int, ...], str]:
        """(shape, safetensors dtype code) from the file header; nothing is read."""
        if name not in self._meta:
            sl = self._slice(name)
            self._meta[name] = (tuple(int(d) for d in sl.get_shape()), str(sl.get_dtype()))
        return self._meta[name]

    def block(self, name: str, index: tuple):
        """The block ``index`` (a tuple of slices, one per dim) of tensor ``name``, read lazily and counted."""
        t = self._slice(name)[index]
        self.bytes_read += t.numel() * t.element_size()
        return t

    @property
    def dtypes(self) -> set[str]:
        return {self.info(n)[1] for n in self.files}

    def close(self) -> None:
        """Drop the open files (safetensors maps them; the maps go with the handles)."""
        self._open.clear()

    def total_bytes(self) -> int:
        """Bytes of every tensor in the checkpoint (from the headers)."""
        total = 0
        for n in self.files:
            shape, dt = self.info(n)
            count = 1
            for d in shape:
                count *= d
            total += count * DTYPE_BYTES.get(dt, 4)
        return total
