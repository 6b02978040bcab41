"""Planner speed: the full search for a 1T-parameter model on 3072 GPUs (target: under 1 s on one core).

The model is Megatron-LM's 1T configuration (Narayanan 2021 Table 1: h 25600, 128 layers, 160 heads) on
3072 A100-80GB. Prints the combinations generated, the configurations scored and rejected, the wall time
and the rate. Run with OMP_NUM_THREADS=1 (numpy here is single-threaded anyway).
Usage: OMP_NUM_THREADS=1 python benchmarks/bench_plan.py [repeats]
"""

import statistics
import sys
import time


def main(repeats: int = 3) -> None:
    from shardlab.catalog import get_catalog
    from shardlab.estimate.workload import Workload
    from shardlab.planner.search import plan_training
    from shardlab.specs.hardware import Cluster
    from shardlab.specs.model import ModelSpec

    cat = get_catalog()
    spec = ModelSpec(name="gpt-1t", family="gpt2", hidden_size=25600, num_layers=128, num_heads=160, num_kv_heads=160,
                     ffn_hidden_size=102400, vocab_size=51200, max_seq_len=2048, mlp="gelu", norm="layernorm",
                     position="learned", tied_embeddings=True, qkv_bias=True, out_bias=True, mlp_bias=True)
    acc = cat.accelerator("a100-80gb")
    cluster = Cluster(acc, 3072, 8, cat.link("nvlink3"), cat.link("ib-hdr"))
    wl = Workload(seq_len=2048, global_batch=3072)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        res = plan_training(spec, cluster, wl, top=5)
        times.append(time.perf_counter() - t)
    med = statistics.median(times)
    print(f"model: {spec.name} ({12 * 128 * 25600**2 / 1e12:.2f}T params), 3072 × a100-80gb")
    print(f"combinations generated: {res.total:,}; scored: {res.evaluated:,}; rejected before scoring: "
          f"{res.total - res.evaluated:,}; do not fit: {sum(v for k, v in res.rejected.items() if 'fit' in k):,}")
    print(f"search wall time: median {med:.3f} s, min {min(times):.3f} s over {repeats} runs "
          f"({res.total / med:,.0f} combinations/s, {res.evaluated / med:,.0f} scored/s)")
    best = res.plans[0]
    print(f"best: {best['layout']}, {best['hardware_tflops_per_gpu']:.0f} hardware TFLOP/s per GPU "
          f"(Megatron-LM measured 163 with tp 8, pp 64)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
