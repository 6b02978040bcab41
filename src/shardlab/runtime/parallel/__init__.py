"""How the runtime GPT is split across ranks; each module applies one parallelism in place.

- ``ddp``: PyTorch DistributedDataParallel (replicas, gradient all-reduce).
- ``fsdp``: FSDP2 ``fully_shard`` per block then the root (ZeRO-3: per-tensor dim-0 shards).
- ``tensor``: DTensor ``parallelize_module`` plan (Megatron column/row splits, vocabulary-parallel
  embedding and head), optionally with sequence parallelism.
- ``megatron``: our own column/row-parallel layers built from the f/g autograd operators of
  Shoeybi et al. 2019 (arXiv 1909.08053 §3), with a collective counter.
- ``pipeline``: ``torch.distributed.pipelining`` stages and schedules (GPipe, 1F1B, interleaved 1F1B).
- ``mesh``: device meshes for 1-D and 2-D layouts.
Process groups and meshes are always passed in; nothing is kept in module globals.
"""
