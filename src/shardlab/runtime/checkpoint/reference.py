"""The peer the runtime is held against: transformers itself on the same checkpoint, in the driver process (fp32).

- ``hf_generate``: ``model.generate`` greedy (``do_sample=False``), exactly ``max_new`` tokens: the generation
  config's EOS is unset, as the runtime does not stop at EOS either;
- ``hf_loss``: mean token cross-entropy of ``model(x).logits`` against y, the runtime's loss on the same batch;
- ``hf_tokenize``: the checkpoint's own tokenizer (``AutoTokenizer``), for ``--prompt`` text.

transformers is the test extra's (CPU); without it these raise a one-line error naming the extra.
"""

from __future__ import annotations

from pathlib import Path

from shardlab.errors import ShardlabError


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ShardlabError("comparing with transformers needs it installed: pip install 'transformers>=4.52,<5' "
                            "(after torch==2.13.0 on a CPU-only machine)") from None
    return transformers


def load_hf(folder: Path):
    """The checkpoint as transformers builds it, fp32, eval mode."""
    import torch

    tf = _transformers()
    tf.logging.set_verbosity_error()
    try:
        model = tf.AutoModelForCausalLM.from_pretrained(str(folder), torch_dtype=torch.float32)
    except Exception as e:   # transformers' own refusal (a size mismatch, an unknown architecture): one line
        raise ShardlabError(f"transformers could not load {folder} for the comparison ({type(e).__name__}: "
                            f"{str(e).strip().splitlines()[0][:160] if str(e).strip() else ''})") from None
    return model.eval()


def hf_generate(folder: Path, prompt: list[int], max_new: int, model=None) -> list[int]:
    """transformers' greedy ``generate``: the ``max_new`` new token ids."""
    import torch

    model = model or load_hf(folder)
    tf = _transformers()
    # a fresh config: the checkpoint's generation_config.json may ask for repetition penalties, banned n-grams or
    # suppressed tokens, which are not greedy argmax decoding
    pad = model.generation_config.pad_token_id
    cfg = tf.GenerationConfig(do_sample=False, num_beams=1, eos_token_id=None, pad_token_id=pad if pad is not None else 0)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), generation_config=cfg, max_new_tokens=max_new, min_new_tokens=None,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return [int(t) for t in out[0, len(prompt):]]


def hf_loss(folder: Path, x, y, model=None) -> float:
    """Mean token cross-entropy of transformers' logits for tokens x (b, s) against targets y (b, s)."""
    import torch
    import torch.nn.functional as F

    model = model or load_hf(folder)
    with torch.no_grad():
        logits = model(x).logits
    return float(F.cross_entropy(logits.flatten(0, 1).float(), y.flatten()))


def hf_tokenize(folder: Path, text: str) -> list[int]:
    """Token ids of ``text`` with the checkpoint's tokenizer (no special tokens added)."""
    tf = _transformers()
    try:
        tok = tf.AutoTokenizer.from_pretrained(str(folder))
    except Exception as e:  # missing or broken tokenizer files: one line
        raise ShardlabError(f"checkpoint {folder}: its tokenizer could not be loaded ({type(e).__name__}); pass "
                            f"--prompt-ids instead") from None
    ids = tok(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ShardlabError("--prompt gives no tokens with the checkpoint's tokenizer; give some text or --prompt-ids")
    return [int(i) for i in ids]
