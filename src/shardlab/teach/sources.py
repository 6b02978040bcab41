"""Reading notes: the papers and documents behind shardlab's formulas (curriculum item 9).

Each entry names the work, where to find it, and what shardlab takes from it. Topics cite entries by id;
``shardlab explain reading-notes`` lists them grouped by topic, so every formula can be traced to its source.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.errors import ShardlabError


@dataclass(frozen=True)
class Paper:
    """One source."""

    citation: str
    """Authors, year, title, where (arXiv id, venue or repository file)."""
    used_for: str
    """The formula or fact shardlab takes from it."""


PAPERS = {
    "zero": Paper("Rajbhandari et al. 2019, \"ZeRO: Memory Optimizations Toward Training Trillion Parameter Models\", "
                  "arXiv 1910.02054", "16 bytes per parameter for mixed-precision Adam (§3.1, K = 12); what stages 1/2/3 "
                  "shard (§5, Figure 1); communication 2Ψ vs 3Ψ (§7)"),
    "megatron": Paper("Shoeybi et al. 2019, \"Megatron-LM: Training Multi-Billion Parameter Language Models Using Model "
                      "Parallelism\", arXiv 1909.08053", "column- then row-parallel linears and the f/g operators: one "
                      "all-reduce per attention and per MLP in forward, one each in backward (§3, Figure 3)"),
    "narayanan": Paper("Narayanan et al. 2021, \"Efficient Large-Scale Language Model Training on GPU Clusters Using "
                       "Megatron-LM\", arXiv 2104.04473", "1F1B and interleaved schedules, bubble (p−1)/m and (1/v)(p−1)/m "
                       "(§2.2); TP inside a node, PP across (§3); FLOPs per step (Eq. 3)"),
    "korthikanti": Paper("Korthikanti et al. 2022, \"Reducing Activation Recomputation in Large Transformer Models\", "
                         "arXiv 2205.05198", "activation bytes per layer (Table 2); sequence parallelism (§4.2.2); selective "
                         "recomputation (§5); first-stage memory of interleaved pipelines (§4.3); model FLOPs (Eq. 7)"),
    "gpipe": Paper("Huang et al. 2019, \"GPipe: Efficient Training of Giant Neural Networks using Pipeline Parallelism\", "
                   "arXiv 1811.06965", "micro-batched pipelines; the fill-and-drain bubble; GPipe holds every micro-batch's "
                   "activations"),
    "pipedream": Paper("Narayanan et al. 2019, \"PipeDream: Generalized Pipeline Parallelism for DNN Training\", SOSP 2019",
                       "one-forward-one-backward scheduling, which bounds activations in flight by the stage count"),
    "zb": Paper("Qi et al. 2024, \"Zero Bubble Pipeline Parallelism\", arXiv 2401.10241", "splitting backward into input and "
                "weight gradients to fill the bubble (ZB-H1, §3.1)"),
    "fsdp": Paper("Zhao et al. 2023, \"PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel\", arXiv 2304.11277",
                  "FSDP units: all-gather a unit's parameters before its forward and backward, reduce-scatter its gradients; "
                  "wrapping policy trades peak memory against communication overlap (§3.1-3.2)"),
    "ddp": Paper("Li et al. 2020, \"PyTorch Distributed: Experiences on Accelerating Data Parallel Training\", arXiv "
                 "2006.15704", "DDP gradient buckets (25 MiB) all-reduced while backward still runs (§3.2.3, §4)"),
    "ring": Paper("Patarasuk & Yuan 2009, \"Bandwidth Optimal All-reduce Algorithms for Clusters of Workstations\", JPDC 69(2)",
                  "ring all-reduce: 2(n−1) steps of S/n, bandwidth term 2(n−1)/n·S/β, optimal in bandwidth"),
    "thakur": Paper("Thakur, Rabenseifner & Gropp 2005, \"Optimization of Collective Communication Operations in MPICH\", "
                    "IJHPCA 19(1)", "the α–β cost of ring, recursive-halving/doubling and tree collectives"),
    "nccl-tree": Paper("Jeaugey 2019, \"Massively Scale Your Deep Learning Training with NCCL 2.4\", NVIDIA technical blog",
                       "NCCL's double binary trees: about 2·log₂n latency steps instead of 2(n−1)"),
    "nccl-tests": Paper("NVIDIA nccl-tests, doc/PERFORMANCE.md", "algbw = S/t and busbw = algbw × 2(n−1)/n for all-reduce: "
                        "the bandwidth to compare with the link"),
    "mixed-precision": Paper("Micikevicius et al. 2018, \"Mixed Precision Training\", arXiv 1710.03740",
                             "fp16 training with an fp32 master copy of the weights (§3.1); loss scaling so that small "
                             "gradients survive fp16 (§3.2); fp16 products accumulated in fp32 (§3.3)"),
    "bf16": Paper("Kalamkar et al. 2019, \"A Study of BFLOAT16 for Deep Learning Training\", arXiv 1905.12322",
                  "bfloat16 keeps fp32's exponent range, so training needs no loss scaling (abstract)"),
    "ieee754": Paper("IEEE 754-2008, Standard for Floating-Point Arithmetic", "binary16 and binary32: exponent and mantissa "
                     "widths, normal and subnormal ranges"),
    "chen-checkpoint": Paper("Chen et al. 2016, \"Training Deep Nets with Sublinear Memory Cost\", arXiv 1604.06174",
                             "activation checkpointing: keep some activations, recompute the rest in backward"),
    "kaplan": Paper("Kaplan et al. 2020, \"Scaling Laws for Neural Language Models\", arXiv 2001.08361",
                    "training compute C ≈ 6ΨD; a forward pass costs 2 FLOPs per parameter per token"),
    "eleuther-math": Paper("Anthony, Biderman & Schoelkopf 2023, \"Transformer Math 101\", EleutherAI blog",
                           "memory accounting per parameter for training and inference; KV cache size"),
    "vllm": Paper("Kwon et al. 2023, \"Efficient Memory Management for Large Language Model Serving with PagedAttention\", "
                  "arXiv 2309.06180", "KV cache in blocks of 16 tokens; gpu_memory_utilization (vLLM)"),
    "databricks-inference": Paper("Databricks 2023, \"LLM Inference Performance Engineering: Best Practices\"",
                                  "decode is memory-bandwidth-bound; 60-70% of HBM bandwidth achieved (MBU)"),
    "hockney": Paper("Hockney 1994, \"The communication challenge for MPP: Intel Paragon and Meiko CS-2\", Parallel "
                     "Computing 20(3)", "the α–β (latency–bandwidth) model of one message"),
    "nvlink": Paper("NVIDIA H100 Tensor Core GPU datasheet (2022) and A100 datasheet (2020)",
                    "NVLink 900 GB/s (H100) and 600 GB/s (A100) are both directions added: 450 and 300 GB/s each way"),
    "infiniband": Paper("NVIDIA ConnectX-7 / Quantum-2 (NDR 400 Gb/s) and ConnectX-6 (HDR 200 Gb/s) product briefs",
                        "InfiniBand rates are per port per direction in gigabits: 200 Gb/s = 25 GB/s each way"),
    "llama3": Paper("Llama Team 2024, \"The Llama 3 Herd of Models\", arXiv 2407.21783",
                    "4D parallelism at 16k GPUs: TP 8 inside a node, PP and FSDP across; fewer layers on the first and "
                    "last pipeline stage (§3.3.2)"),
    "tail-at-scale": Paper("Dean & Barroso 2013, \"The Tail at Scale\", Communications of the ACM 56(2)",
                           "a fan-out waits for its slowest member: rare slowness on one part sets the p99 of the whole"),
    "sync-sgd": Paper("Chen et al. 2016, \"Revisiting Distributed Synchronous SGD\", arXiv 1604.00981",
                      "synchronous data parallelism runs at the pace of its slowest worker (stragglers, §2)"),
    "lora": Paper("Hu et al. 2021, \"LoRA: Low-Rank Adaptation of Large Language Models\", arXiv 2106.09685",
                  "frozen base weights; trainable r-rank adapters A (r × in) and B (out × r): only they have gradients "
                  "and optimizer state (§4)"),
    "qlora": Paper("Dettmers et al. 2023, \"QLoRA: Efficient Finetuning of Quantized LLMs\", arXiv 2305.14314",
                   "4-bit NormalFloat base weights in blocks of 64 with double-quantized scales (about 4.127 bits per "
                   "weight), bf16 adapters; a 65B model fine-tuned on one 48 GB GPU (§3)"),
    "distserve": Paper("Zhong et al. 2024, \"DistServe: Disaggregating Prefill and Decoding for Goodput-optimized Large "
                       "Language Model Serving\", OSDI 2024, arXiv 2401.09670", "prefill and decode on separate GPU "
                       "pools; the prefill pool as an M/D/1 queue; goodput per GPU under TTFT and TPOT targets"),
    "shardlab-runtime": Paper("shardlab's own measurements (docs/runtime.md, docs/teach.md)",
                              "real torch.distributed runs on CPU: collective counts, bytes per rank, step times"),
}
"""Every source a topic may cite, by id."""


def lookup(table: dict, ids: list[str], what: str) -> list[dict]:
    """[{id, **fields}] of the dataclass entries of ``table`` named by ``ids`` (an unknown id is a programming error)."""
    from dataclasses import asdict

    missing = [i for i in ids if i not in table]
    if missing:
        raise ShardlabError(f"internal: unknown {what} '{missing[0]}'")
    return [{"id": i, **asdict(table[i])} for i in ids]


def citations(ids: list[str]) -> list[dict]:
    """[{id, citation, used_for}] for ``ids``."""
    return lookup(PAPERS, ids, "source id")
