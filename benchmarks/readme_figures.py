"""Make the two README figures (docs/figures/*.png) from real cases with `paraplan whatif`.

    python benchmarks/readme_figures.py

runs, and copies one figure of each report into docs/figures/:

    paraplan whatif --model gpt3-175b --cluster dgx-a100-80g --seq-len 2048 --global-batch 1536 \\
        --sweep gpus=64..4096 --price-per-gpu-hour 2 --train-tokens 300e9 --out build/whatif-gpt3
        -> docs/figures/gpt3-175b-a100-scaling.png   (figures/scaling.png)
    paraplan whatif --model llama3-70b --cluster dgx-h100 --gpus 64 --global-batch 512 \\
        --sweep cluster=dgx-h100,dgx-h200 --sweep seq_len=4k..32k --out build/whatif-h100-h200
        -> docs/figures/llama3-70b-h100-vs-h200-memory.png   (figures/memory.png)
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from paraplan.cli import main as paraplan  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CASES = (
    (["--model", "gpt3-175b", "--cluster", "dgx-a100-80g", "--seq-len", "2048", "--global-batch", "1536",
      "--sweep", "gpus=64..4096", "--price-per-gpu-hour", "2", "--train-tokens", "300e9"],
     "whatif-gpt3", "scaling", "gpt3-175b-a100-scaling.png"),
    (["--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "64", "--global-batch", "512",
      "--sweep", "cluster=dgx-h100,dgx-h200", "--sweep", "seq_len=4k..32k"],
     "whatif-h100-h200", "memory", "llama3-70b-h100-vs-h200-memory.png"),
)


def main() -> int:
    dest = ROOT / "docs" / "figures"
    dest.mkdir(parents=True, exist_ok=True)
    for args, folder, figure, name in CASES:
        out = ROOT / "build" / folder
        rc = paraplan(["whatif", *args, "--quiet", "--out", str(out)])
        if rc:
            return rc
        shutil.copyfile(out / "figures" / f"{figure}.png", dest / name)
        print(f"-> {dest / name} ({(dest / name).stat().st_size // 1024} KiB); full report {out / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
