"""Save a Hugging Face checkpoint with a published config's shapes and transformers' own random init (no download).

    python examples/make_checkpoint.py CONFIG.json OUT_DIR [--dtype bf16] [--seed 0]

For trying `shardlab run infer --model OUT_DIR` and `run train --model OUT_DIR` where the Hub cannot be reached; with a
connection, `--model hf:ORG/NAME` loads the trained weights the same way. Needs transformers (the test extra).
"""

import argparse
import json

import torch
import transformers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", help="a Hugging Face config.json")
    ap.add_argument("out", help="folder to write (config.json, model.safetensors)")
    ap.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    with open(a.config, encoding="utf-8") as f:
        d = json.load(f)
    d = {k: v for k, v in d.items() if k not in ("architectures", "transformers_version", "torch_dtype")}
    cfg = transformers.AutoConfig.for_model(**d)
    torch.manual_seed(a.seed)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    transformers.logging.set_verbosity_error()
    transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype).save_pretrained(a.out)
    print(f"wrote {a.out}: {cfg.model_type}, {a.dtype}, seed {a.seed} (random weights)")


if __name__ == "__main__":
    main()
