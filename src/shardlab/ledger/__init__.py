"""The budget ledger: an SQLite file recording every guarded run (``store``), its records (``model``)
and its reports (``report``). Default path: ``$SHARDLAB_LEDGER``, else
``$XDG_DATA_HOME/shardlab/ledger.sqlite``, else ``~/.local/share/shardlab/ledger.sqlite``."""

from __future__ import annotations

import os
from pathlib import Path

from shardlab.ledger.model import STATUSES, BudgetSummary, LedgerError, Refusal, RunRecord, RunRequest
from shardlab.ledger.store import Ledger


def default_ledger_path() -> Path:
    """$SHARDLAB_LEDGER, else $XDG_DATA_HOME/shardlab/ledger.sqlite, else ~/.local/share/shardlab/ledger.sqlite."""
    from shardlab.safeio import expand_user

    if os.environ.get("SHARDLAB_LEDGER"):
        return expand_user(os.environ["SHARDLAB_LEDGER"], "$SHARDLAB_LEDGER")
    if os.environ.get("XDG_DATA_HOME"):
        return expand_user(os.environ["XDG_DATA_HOME"], "$XDG_DATA_HOME") / "shardlab" / "ledger.sqlite"
    return expand_user("~/.local/share/shardlab/ledger.sqlite", "the default ledger path (set $SHARDLAB_LEDGER)")


__all__ = ["STATUSES", "BudgetSummary", "Ledger", "LedgerError", "Refusal", "RunRecord", "RunRequest",
           "default_ledger_path"]
