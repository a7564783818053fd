"""PAPO against plain GRPO on the grounding task, equal steps, several seeds: held-out IoU after training.

Each arm trains the demo preset (configs/grounding_tiny.yaml: the warm-started tiny Qwen3-VL, where the answer
depends on the image) for `--steps` GRPO steps; the PAPO arm adds the perception loss with the official settings
(patch masking at 0.6, no gradient through the masked pass, gamma 0.02) and the double-entropy regulariser. Both
arms see the same prompts and start from the same weights; only the seed of sampling changes between repeats.

    .venv/bin/python bench/papo_vs_grpo.py --steps 100 --seeds 0 1 2 [--results RESULTS.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mmrl.config import load_config  # noqa: E402
from mmrl.trainer import train  # noqa: E402

ARMS = {
    "grpo": [],
    "papo": ["algo.papo_gamma=0.02", "algo.papo_eta=0.03", "algo.papo_mask=patches", "algo.papo_mask_ratio=0.6"],
}


def run(arm: str, seed: int, steps: int, extra: list[str]) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as out:
        overrides = [
            f"output_dir={out}",
            f"trainer.total_steps={steps}",
            f"trainer.seed={seed}",
            "trainer.save_every=0",
            *ARMS[arm],
            *extra,
        ]
        train(load_config(ROOT / "configs/grounding_tiny.yaml", overrides))
        evals = json.loads((Path(out) / "eval.json").read_text())
        return evals["before"]["iou"], evals["after"]["iou"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--results", type=Path, default=None, help="append the table to this Markdown file")
    parser.add_argument("overrides", nargs="*", help="extra section.field=value overrides for both arms")
    args = parser.parse_args()
    scores: dict[str, list[float]] = {arm: [] for arm in ARMS}
    before = None
    for seed in args.seeds:
        for arm in ARMS:  # interleaved, so a slow phase of the machine falls on both arms
            before, after = run(arm, seed, args.steps, args.overrides)
            scores[arm].append(after)
            print(f"seed {seed} {arm}: held-out IoU {before:.3f} -> {after:.3f}", flush=True)
    lines = [
        f"| arm | held-out IoU after {args.steps} steps (seeds {', '.join(map(str, args.seeds))}) | mean | std |",
        "|---|---|---|---|",
    ]
    for arm, values in scores.items():
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        lines.append(
            f"| {arm} | {', '.join(f'{v:.3f}' for v in values)} | {statistics.mean(values):.3f} | {std:.3f} |"
        )
    header = (
        f"\n### PAPO vs GRPO, {datetime.date.today()} ({platform.machine()}, {os.cpu_count()} cores)\n\n"
        f"Held-out IoU before training: {before:.3f}. Command: "
        f"`python bench/papo_vs_grpo.py --steps {args.steps} --seeds {' '.join(map(str, args.seeds))}"
        f"{' ' + ' '.join(args.overrides) if args.overrides else ''}`\n\n"
    )
    table = header + "\n".join(lines) + "\n"
    print(table)
    if args.results:
        with open(args.results, "a") as f:
            f.write(table)


if __name__ == "__main__":
    main()
