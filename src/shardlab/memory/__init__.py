"""Per-GPU memory: model states, activations and the overheads estimators usually forget."""

from shardlab.memory.overheads import Overheads, load_overheads
from shardlab.memory.precision import state_bytes
from shardlab.memory.training import MemoryReport, StageMemory, training_memory

__all__ = ["MemoryReport", "Overheads", "StageMemory", "load_overheads", "state_bytes", "training_memory"]
