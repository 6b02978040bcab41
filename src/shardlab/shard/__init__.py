"""Tensor-parallel sharding report: per-rank shapes and bytes (``rules``), the Mermaid diagram of a sharded
block (``diagram``) and the terminal text (``render``)."""

from shardlab.shard.diagram import block_mermaid
from shardlab.shard.render import render_shard
from shardlab.shard.rules import (Constraint, ShardRow, block_collectives, check_tp, constraints, shard_report, shard_rows,
                                  split_kind, valid_tp)

__all__ = ["Constraint", "ShardRow", "block_collectives", "block_mermaid", "check_tp", "constraints", "render_shard",
           "shard_report", "shard_rows", "split_kind", "valid_tp"]
