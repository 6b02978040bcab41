"""Helpers of the benchmarks: pictures (``plots``) and the communication/compute overlap test (``overlap``)."""
