"""Rewrite the command outputs and exported files that docs/launch.md shows, by running each command now.

docs/launch.md says "every example below is the output of the command shown with it": each ```console block
starts with `$ COMMAND`, and each fenced block after a line "`FILE`:" is that file as the command before it wrote
it. This script makes the plans the page names (PLANS, the commands its "Plans used" paragraph gives), runs every
console command with bash in one scratch directory, in page order, and puts the output and files back:
    python benchmarks/launch_docs.py            # rewrite docs/launch.md
    python benchmarks/launch_docs.py --check    # exit 1 and name the first stale block
tests/test_export.py fails when the page differs from a fresh rendering.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "launch.md"
PLANS = {
    "plan.json": "shardlab plan",
    "plan-3d.json": "shardlab plan llama-3.1-70b --gpus 256 --fix tp=4 --fix pp=4 --fix vpp=2 --fix zero=1",
    "plan-fsdp.json": "shardlab plan llama-3.1-8b --gpus 32 --fix tp=1 --fix pp=1 --fix cp=1 --fix zero=3",
    "plan-moe.json": "shardlab plan deepseek-v3 --gpus 512 --fix ep=8 --fix tp=1 --tokens 1e12",
    "plan-serve.json": "shardlab plan llama-3.1-70b --inference --gpus 8 --batch 32 --prompt-len 2048 --output-len 256",
}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
FILE_LABEL = re.compile(r"`([\w.-]+)`:\n\n$")


def _env(work: Path) -> dict:
    """The CLI as a user runs it: `shardlab` is this checkout's package under this interpreter (a wrapper first on
    PATH), with no SHARDLAB_* setting of the caller's (an extra catalog, progress lines) leaking into the page."""
    bin_dir = work / ".bin"
    if not bin_dir.is_dir():
        bin_dir.mkdir()
        (bin_dir / "shardlab").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m shardlab "$@"\n')
        (bin_dir / "shardlab").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDLAB_")}
    env.update(OMP_NUM_THREADS="1", COLUMNS="200", PYTHONPATH=str(ROOT / "src"), SHARDLAB_PROGRESS="0",
               PYTHONIOENCODING="utf-8", PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}")
    return env


def _sh(cmd: str, cwd: Path) -> str:
    """The command's output as a terminal shows it (stdout and stderr interleaved); a failure that the command does
    not report itself (`; echo "exit code $?"`) stops the rendering."""
    r = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=_env(cwd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, encoding="utf-8", timeout=300)
    if r.returncode and "exit code" not in cmd:
        raise SystemExit(f"`{cmd[:80]}` exited {r.returncode}:\n{r.stdout[-2000:]}")
    return r.stdout


def render(text: str, work: Path) -> str:
    """``text`` (the page) with every console block's output and every shown file taken from fresh runs in ``work``."""
    for name, cmd in PLANS.items():
        (work / name).write_text(_sh(f"{cmd} --json", work))
    out, pos = [], 0
    for m in FENCE.finditer(text):
        lang, body = m.group(1), m.group(2)
        before = text[pos:m.start()]
        out.append(before)
        label = FILE_LABEL.search(before)
        if lang == "console" and body.startswith("$ "):
            cmd = body.splitlines()[0][2:]
            body = f"$ {cmd}\n{_sh(cmd, work).rstrip()}\n"
        elif label and (work / label.group(1)).is_file():
            body = (work / label.group(1)).read_text().rstrip("\n") + "\n"
        out.append(f"```{lang}\n{body}```\n")
        pos = m.end()
    out.append(text[pos:])
    return "".join(out)


def main(argv: list[str]) -> int:
    text = PAGE.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="shardlab-launch-docs-") as tmp:
        fresh = render(text, Path(tmp))
    if "--check" in argv:
        if fresh == text:
            print(f"{PAGE.relative_to(ROOT)} is current")
            return 0
        old, new = text.splitlines(), fresh.splitlines()
        i = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
        print(f"{PAGE.relative_to(ROOT)}:{i + 1} is stale (run python benchmarks/launch_docs.py)")
        return 1
    PAGE.write_text(fresh, encoding="utf-8")
    print(f"rewrote the command outputs and files of {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
