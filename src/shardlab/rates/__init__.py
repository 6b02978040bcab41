"""The rates layer: how fast one kernel runs on one accelerator, below every model that adds kernels up.

- ``hardware``: GEMM efficiency by shape (the matmul curve), attention, memory-bound and collective link rates;
- ``kernels``: the bytes of each block's memory-bound kernels (norms, activations, RoPE, residuals);
- ``compute``: one block's forward and backward times from those rates (training and serving share it);
- ``fp8``: the casts and FP8 GEMM times of FP8 training recipes.

``estimate``, ``serving``, ``comm`` and ``planner`` sit above it; it imports only ``specs`` and ``memory``
(docs/architecture.md draws the layers; tests/test_architecture.py keeps them a DAG).
"""
