"""Teaching: ``shardlab explain`` (a concept derived with the learner's numbers, its sources and where it lives
in Megatron-LM / PyTorch) and ``shardlab quiz`` (questions generated from the model with random numbers).

Every number comes from the analytic core's own functions (memory, comm, pipeline, estimate, cost,
numerics): this package only chooses inputs, calls them and words the result. It imports no torch.
"""
