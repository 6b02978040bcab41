"""The vocabulary under tensor parallelism: padded, as Megatron-LM does, so every rank holds an equal slice.

Megatron-LM (``megatron/training/tokenizer/tokenizer.py`` ``_vocab_size_with_padding``): the embedding and the
output head get ``ceil(V / (d · tp)) · d · tp`` rows, d = ``--make-vocab-size-divisible-by`` (Megatron's default
128; ours 1, so that a vocabulary tp divides is not padded). The extra rows are zeros; the runtime cuts the logits
back to V before the argmax and the loss (``Numerics.vocab_size``), so the padding changes no token and no loss,
only the bytes each rank holds, which the memory model then counts with the padded vocabulary.
GPT-2's 50,257 tokens under TP 2: 50,258 rows, 25,129 per rank.
"""

from __future__ import annotations

from dataclasses import replace

from shardlab.errors import ShardlabError

MAX_DIVISIBLE_BY = 1 << 16
"""Largest --make-vocab-size-divisible-by accepted (Megatron's configs use 64 to 1,024)."""


def padded_vocab_size(vocab: int, tp: int, divisible_by: int = 1) -> int:
    """ceil(vocab / (divisible_by · tp)) · divisible_by · tp."""
    if not (1 <= divisible_by <= MAX_DIVISIBLE_BY):
        raise ShardlabError(f"--make-vocab-size-divisible-by must be 1 to {MAX_DIVISIBLE_BY:,}, got {divisible_by}")
    m = divisible_by * max(1, tp)
    return -(-vocab // m) * m


def pad_spec(spec, tp: int, divisible_by: int = 1):
    """(the spec with its padded vocabulary, the checkpoint's vocabulary or 0 when nothing is padded)."""
    v = padded_vocab_size(spec.vocab_size, tp, divisible_by)
    if v == spec.vocab_size:
        return spec, 0
    return replace(spec, vocab_size=v), spec.vocab_size


def padding_report(vocab: int, tp: int, divisible_by: int = 1) -> dict:
    """What the JSON reports about the padding."""
    v = padded_vocab_size(vocab, tp, divisible_by)
    return {"vocab_size": vocab, "padded_vocab_size": v, "padding_rows": v - vocab, "divisible_by": divisible_by,
            "rows_per_rank": v // max(1, tp),
            "rule": "ceil(V / (divisible_by x tp)) x divisible_by x tp (Megatron-LM _vocab_size_with_padding)"}
