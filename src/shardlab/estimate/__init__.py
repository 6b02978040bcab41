"""Step time, throughput, MFU and time to train (training); latency and throughput (inference)."""

from shardlab.estimate.training import TrainingEstimate, estimate_training

__all__ = ["TrainingEstimate", "estimate_training"]
