"""``shardlab run precision``: the same small GPT trained in fp32, fp16 without loss scaling, fp16 with dynamic loss
scaling and bf16 (PyTorch autocast on the CPU), showing where fp16 gradients underflow (curriculum item 28).

Real models' gradients are small: the loss is a mean over millions of tokens and the weights number billions.
The tiny CPU model's gradients are not, so the run multiplies the loss by 2^-k ("gradients k binades smaller")
and measures, at each k, the share of gradient elements that are non-zero in fp32 but zero in each mode. The
prediction beside it comes from the format alone (``shardlab.numerics``: |g|·2^-k below half of fp16's smallest
subnormal rounds to 0); the measurement is larger because intermediate activation gradients underflow on the
way. Training then runs at one k: AdamW's update does not depend on the loss scale (its eps is scaled by the
same 2^-k), so fp32 trains exactly as unscaled, and any difference between the modes is the number format's.
Loss scaling follows Micikevicius et al. 2018 (arXiv 1710.03740 §3.2) with ``torch.amp.GradScaler``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

MODES = ("fp32", "fp16", "fp16+scaling", "bf16")
"""fp32 reference; fp16 autocast with no scaler; fp16 autocast with a dynamic GradScaler; bf16 autocast."""


@dataclass(frozen=True)
class PrecisionRequest:
    """What ``shardlab run precision`` was asked to run."""

    model: str = "tiny"
    """Preset or catalog model (small ones: this runs on a CPU)."""
    steps: int = 20
    """Optimizer steps per mode."""
    grad_scale_exp: int = 12
    """k: the loss is multiplied by 2^-k during training."""
    sweep: tuple[int, ...] = (0, 4, 8, 12, 16)
    """k values of the underflow sweep (at the initial weights)."""
    global_batch: int = 8
    """Sequences per step."""
    seq_len: int = 64
    """Tokens per sequence."""
    lr: float = 3e-3
    """AdamW learning rate."""
    seed: int = 0
    """Model seed (data seed 1234 + seed)."""


def _grads(model, x, y, dtype, factor: float, scale: float = 1.0, scaler=None):
    """Flat gradient (divided back by the loss scale) and loss of one forward/backward under autocast ``dtype``;
    with ``scaler`` the loss is scaled by the GradScaler (whose step unscales ``.grad`` itself)."""
    import torch
    import torch.nn.functional as F

    model.zero_grad(set_to_none=True)
    ctx = torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()
    with ctx:
        out = model(x)
    loss = F.cross_entropy(out.flatten(0, 1).float(), y.flatten())
    if scaler is not None:
        scale = scaler.get_scale()
        scaler.scale(loss * factor).backward()
    else:
        (loss * factor * scale).backward()
    g = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]) / scale
    return g, float(loss.detach())


def _dtype(mode: str):
    import torch

    return {"fp32": None, "fp16": torch.float16, "fp16+scaling": torch.float16, "bf16": torch.bfloat16}[mode]


def underflow_sweep(req: PrecisionRequest, spec, data) -> list[dict]:
    """At the initial weights, for each k: measured and predicted share of fp32-non-zero gradients that are 0."""
    import torch

    from shardlab.numerics import FORMATS
    from shardlab.runtime.gpt import build_model

    model = build_model(spec, seed=req.seed)
    x, y = data.batch(0)
    init_scale = torch.amp.GradScaler("cpu").get_scale()
    out = []
    for k in req.sweep:
        f = 2.0 ** -k
        ref, _ = _grads(model, x, y, None, f)
        nz = ref != 0
        row = {"k": k, "median_abs_grad": float(ref.abs().median()),
               "predicted_fp16_zero": float(((ref.abs() < FORMATS["fp16"].min_subnormal / 2) & nz).sum() / nz.sum())}
        for mode in MODES[1:]:
            scale = init_scale if mode == "fp16+scaling" else 1.0
            g, _ = _grads(model, x, y, _dtype(mode), f, scale)
            finite = bool(torch.isfinite(g).all())
            row[mode] = {"zero_share": float(((g == 0) & nz).sum() / nz.sum()),
                         "rel_error": float((g - ref).norm() / ref.norm()) if finite else None, "finite": finite}
        out.append(row)
    return out


def train_modes(req: PrecisionRequest, spec, data) -> dict:
    """Train each mode ``req.steps`` steps at loss × 2^-k: losses, zero-gradient share, the scaler's scale and skips."""
    import torch

    from shardlab.runtime.gpt import build_model

    f = 2.0 ** -req.grad_scale_exp
    out = {}
    for mode in MODES:
        model = build_model(spec, seed=req.seed)
        opt = torch.optim.AdamW(model.parameters(), lr=req.lr, eps=1e-8 * f, weight_decay=0.0, foreach=False)
        scaler = torch.amp.GradScaler("cpu", growth_interval=10) if mode == "fp16+scaling" else None
        losses, zeros, skipped = [], [], 0
        for step in range(req.steps):
            x, y = data.batch(step)
            g, loss = _grads(model, x, y, _dtype(mode), f, scaler=scaler)
            zeros.append(float((g == 0).sum() / g.numel()))
            losses.append(loss)
            if scaler:
                before = scaler.get_scale()
                scaler.step(opt)
                scaler.update()
                skipped += scaler.get_scale() < before
            else:
                opt.step()
        out[mode] = {"losses": losses, "zero_grad_share": zeros, "final_loss": losses[-1],
                     "loss_scale": scaler.get_scale() if scaler else None, "skipped_steps": int(skipped)}
    return out


def run_precision(req: PrecisionRequest) -> dict:
    """The whole experiment: the underflow sweep and the training comparison."""
    from shardlab.runtime import require_torch

    require_torch()
    import torch

    from shardlab.numerics import FORMATS
    from shardlab.runtime.data import SyntheticData
    from shardlab.runtime.train_worker import resolve_spec

    spec = resolve_spec(req.model)
    from shardlab.runtime import check_host_memory

    check_host_memory(spec, 16, "training")
    from shardlab.estimate.training import positions_notes

    positions_notes(spec, req.seq_len)          # a learned position table has no rows past its length
    torch.set_num_threads(1)
    data = SyntheticData(spec.vocab_size, req.seq_len, req.global_batch, seed=1234 + req.seed)
    sweep = underflow_sweep(req, spec, data)
    train = train_modes(req, spec, data)
    fp16 = FORMATS["fp16"]
    return {"model": spec.name, "steps": req.steps, "grad_scale_exp": req.grad_scale_exp, "global_batch": req.global_batch,
            "seq_len": req.seq_len, "sweep": sweep, "train": train, "loss_floor": data.loss_floor,
            "fp16": {"min_subnormal": fp16.min_subnormal, "min_normal": fp16.min_normal, "max": fp16.max_value},
            "device": "cpu (torch.autocast)"}


def render_precision(doc: dict) -> str:
    from shardlab.render.table import table

    pc = lambda x: "-" if x is None else f"{100 * x:.2f}%"  # noqa: E731
    rows = [[r["k"], f"{r['median_abs_grad']:.1e}", pc(r["predicted_fp16_zero"]), pc(r["fp16"]["zero_share"]),
             pc(r["fp16+scaling"]["zero_share"]), pc(r["bf16"]["zero_share"]),
             f"{r['fp16']['rel_error']:.1e}" if r["fp16"]["rel_error"] is not None else "inf",
             f"{r['fp16+scaling']['rel_error']:.1e}" if r["fp16+scaling"]["rel_error"] is not None else "inf",
             f"{r['bf16']['rel_error']:.1e}"] for r in doc["sweep"]]
    k = doc["grad_scale_exp"]
    t = doc["train"]
    trows = [[m, " ".join(f"{x:.2f}" for x in v["losses"][:: max(1, len(v["losses"]) // 6)]), f"{v['final_loss']:.3f}",
              pc(v["zero_grad_share"][-1]), "-" if v["loss_scale"] is None else f"{v['loss_scale']:g}", v["skipped_steps"]]
             for m, v in t.items()]
    fp32, fp16 = t["fp32"]["final_loss"], t["fp16"]["final_loss"]
    from shardlab.numerics import FORMATS

    frows = [[f.name, f.exponent_bits, f.mantissa_bits, f"{f.max_value:.4g}", f"{f.min_normal:.3g}", f"{f.min_subnormal:.3g}",
              f"{f.epsilon:.3g}"] for f in (FORMATS[n] for n in ("fp32", "fp16", "bf16"))]
    return "\n".join([
        f"shardlab run precision: {doc['model']}, {doc['global_batch']} × {doc['seq_len']} tokens, {doc['device']}",
        "",
        table(["format", "exponent bits", "mantissa bits", "max", "min normal", "min subnormal", "epsilon"], frows,
              title="0. range vs precision (shardlab.numerics; `shardlab explain bf16-vs-fp16` derives them): fp16 trades "
                    "range for precision, bf16 keeps fp32's range"),
        "",
        table(["k", "median |g|·2^-k", "fp16 zero (predicted)", "fp16 zero", "fp16+scaling zero", "bf16 zero",
               "fp16 error", "fp16+scaling error", "bf16 error"], rows,
              title="1. gradients 2^-k smaller (loss × 2^-k), initial weights: share of fp32-non-zero gradient elements "
                    f"that become 0, and the gradient's relative error (fp16's smallest subnormal: {doc['fp16']['min_subnormal']:.2e}; "
                    "predicted: from the format alone, final gradients only)"),
        "",
        table(["mode", "loss every few steps", "final loss", "zero grads", "loss scale", "skipped"], trows,
              title=f"2. training {doc['steps']} steps with the loss × 2^-{k} (AdamW; fp32 trains as unscaled; "
                    f"loss floor of the data {doc['loss_floor']:.3f})"),
        "",
        f"fp16 without scaling ends at loss {fp16:.3f} against fp32's {fp32:.3f}: "
        + ("its gradients underflowed and training stalled" if fp16 - fp32 > 0.1 else "no visible harm at this k")
        + f"; dynamic loss scaling ends at {t['fp16+scaling']['final_loss']:.3f}, bf16 at {t['bf16']['final_loss']:.3f} "
          "(fp32's range: nothing to scale)",
        "sources: Micikevicius et al. 2018, Mixed Precision Training, arXiv 1710.03740 (fp32 master weights §3.1, loss "
        "scaling §3.2); Kalamkar et al. 2019, A Study of BFLOAT16 for Deep Learning Training, arXiv 1905.12322 (bf16 "
        "keeps fp32's range: no loss scaling); IEEE 754-2008 (binary16 and binary32)",
    ])
