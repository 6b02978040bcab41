"""Parameters and catalog look-ups shared by the topic modules."""

from __future__ import annotations

from shardlab.teach.params import Param

PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed", "bf16")
OPTIMIZERS = ("adamw", "sgd", "adam-8bit")


RUN_TRAIN_STEPS_NOTE = (
    "which steps `run train` times: it counts steps from 0; step 0 carries the memory tracker and the f/g counter, "
    "step 1 the collective recorder, and the step time is the median of steps 2 and later. `--steps 1` runs step 0 "
    "alone: its counts are complete, but its time is an instrumented step's, not a timing (the output says so); "
    "give --steps 3 or more to time. Leaving the first, instrumented or warming-up, steps out of a timing is the "
    "usual practice: PyTorch's benchmark Timer runs warm-up iterations before the ones it measures "
    "(torch/utils/benchmark/utils/timer.py: Timer.timeit)")
"""The note beside a suggested `run train --steps 1` (docs/runtime.md, runtime/train_worker.py)."""


def serving_precision(spec, accelerator):
    """What `estimate --inference` serves ``spec`` in without --weights: its checkpoint's weight type
    (``ModelSpec.checkpoint_weights``: DeepSeek-V3's FP8, GPT-OSS's MXFP4), else bf16; KV bf16. On a GPU without a
    bf16 peak (V100, T4) the 16-bit model runs in fp16, as `--activations fp16` has it."""
    from shardlab.serving.precision import checkpoint_precision

    fp16 = not accelerator.peak_tflops.get("bf16") and accelerator.peak_tflops.get("fp16")
    return checkpoint_precision(spec, accelerator.peak_tflops, kv_cache="fp16" if fp16 else "bf16",
                                activations="fp16" if fp16 else None)


def model(default: str) -> Param:
    return Param("model", "str", default, "a catalog model id (`shardlab models`)")


def gpu(default: str) -> Param:
    return Param("gpu", "str", default, "an accelerator id (`shardlab gpus`)")


def link(default: str, name: str = "link") -> Param:
    return Param(name, "str", default, "a link id (`shardlab links`)")


def precision(default: str = "bf16-mixed") -> Param:
    return Param("precision", "str", default, "training precision", PRECISIONS)


def optimizer(default: str = "adamw") -> Param:
    return Param("optimizer", "str", default, "optimizer", OPTIMIZERS)


def catalog():
    from shardlab.catalog import get_catalog

    return get_catalog()


def cluster(gpu_id: str, num_gpus: int):
    """A cluster of ``num_gpus`` × ``gpu_id`` in the GPU's usual servers (the catalog's system entry)."""
    from shardlab.specs.hardware import Cluster

    cat = catalog()
    acc = cat.accelerator(gpu_id)
    return Cluster(acc, num_gpus, acc.system["gpus_per_node"], cat.link(acc.system["intra_link"]),
                   cat.link(acc.system["inter_link"]))


def gib(n: float) -> str:
    return f"{n / 2**30:,.2f} GiB"


def gb(n: float) -> str:
    return f"{n / 1e9:,.2f} GB"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def num(x: float) -> str:
    """A number as a command-line word: 7e9, 2e12, 0.35, 64."""
    if float(x).is_integer() and abs(x) < 1e6:
        return str(int(x))
    return f"{x:.6g}".replace("e+0", "e").replace("e+", "e")
