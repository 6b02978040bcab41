"""Errors about a file's values name the file's own fields: while a command runs on a file (``from_file.with_from``)
the core's field names (``errors.field_name``) map the fields the file gave to its keys, the rest to flags."""

from __future__ import annotations

import contextlib
import os

FIELD_KEYS = {"serve.kv_cache_dtype": "kv_cache", "serve.max_num_seqs": "max_num_seqs", "moe.dispatcher": "moe_dispatcher"}
"""Core field names whose import key differs from the name's last part."""


def set_keys(sets: list[str] | None) -> set[str]:
    """The import keys that --set SECTION.KEY=VALUE arguments gave."""
    return {FIELD_KEYS.get(x, x.rsplit(".", 1)[-1]) for x in (s.split("=", 1)[0].strip() for s in sets or ())}


@contextlib.contextmanager
def file_names(path: str, imp, sets: list[str] | None = None):
    """While the command runs on a file's values, the core's errors name a value the file gave by the file's own
    field (``export.field_names``: ``[workload] quantize_base in job.toml``, ``--tensor-parallel-size in serve.sh``;
    ``(--set)`` for one --set gave) and the rest by their flags, as the command line does (``cli.fields``)."""
    from shardlab.errors import FIELD_NAMES
    from shardlab.export import field_names

    names, given, outer = field_names(imp.source, imp.framework), set(imp.fields), FIELD_NAMES.get()
    short = os.path.basename(path) or path
    setk = set_keys(sets)

    def namer(field: str) -> str:
        key = FIELD_KEYS.get(field, field.rsplit(".", 1)[-1])
        if key in given and key in names:
            return f"{names[key]} (--set)" if key in setk else f"{names[key]} in {short}"
        return outer(field) if outer is not None else field

    token = FIELD_NAMES.set(namer)
    try:
        yield
    finally:
        FIELD_NAMES.reset(token)
