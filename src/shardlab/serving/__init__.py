"""Serving: precision per tensor class, engine profiles, the step-time model, continuous batching in steady
state and in simulation (docs/inference.md)."""
