"""RL's own share on each family's tiny preset over seeds: initial -> after demonstrations -> after RL, held out.

Each preset runs as it is (its cold start, then its GRPO/PPO steps), once per seed (`trainer.seed`, which also seeds
the demonstrations and the cold start's batches). Reported per preset: the three held-out points (mean over seeds),
RL's own share (after RL minus after demonstrations) per seed, its mean and standard deviation, and whether it
meets the efficacy bar: mean >= +0.05 and mean - 2 sd > 0.

    .venv/bin/python bench/efficacy.py configs/gui_click_tiny.yaml configs/dataset_tiny.yaml --seeds 0 1 2 \\
        [--steps N] [--results RESULTS.md] [trainer.threads=1 ...]

`--steps` replaces every preset's `trainer.total_steps` (default: each preset's own); trailing `key=value`
arguments apply to every preset. Runs of one seed go through the presets in turn, so a slow phase of the machine
falls on all of them.
"""

from __future__ import annotations

import argparse
import datetime
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
sys.path.insert(0, str(ROOT / "bench"))

from arms import run  # noqa: E402

from mmrl.runtime.config import load_config  # noqa: E402

BAR = 0.05  # the share RL must add on its own (issue "Efficacy")


def verdict(shares: list[float]) -> tuple[float, float, bool]:
    """Mean and standard deviation of RL's share over seeds, and whether it clears the bar."""
    mean = statistics.mean(shares)
    std = statistics.stdev(shares) if len(shares) > 1 else float("inf")
    return mean, std, mean >= BAR and mean - 2 * std > 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("presets", type=Path, nargs="+")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="RL steps for every preset (default: its own)")
    parser.add_argument("--results", type=Path, default=None, help="append the table to this Markdown file")
    # `key=value` overrides may come anywhere, even right after `--seeds 0 1 2`, whose list would swallow them.
    overrides = [a for a in sys.argv[1:] if "=" in a and not a.startswith("-")]
    args = parser.parse_args([a for a in sys.argv[1:] if a not in overrides])
    results: dict[Path, list[dict]] = {preset: [] for preset in args.presets}
    root = Path(tempfile.mkdtemp(prefix="efficacy_"))
    for seed in args.seeds:
        for preset in args.presets:
            steps = args.steps or load_config(preset, overrides).trainer.total_steps
            out = root / f"seed{seed}" / preset.stem
            out.mkdir(parents=True)
            got = run(preset, overrides, seed, steps, out, None, [])
            got["steps"] = steps
            results[preset].append(got)
            initial = "-" if got["initial"] is None else f"{got['initial']:.3f}"
            print(
                f"seed {seed} {preset.stem}: held-out {got['metric']} {initial} -> {got['before']:.3f} -> "
                f"{got['after']:.3f} (RL's share {got['after'] - got['before']:+.3f}), {got['minutes']:.1f} min",
                flush=True,
            )
    lines = [
        f"| preset | held-out metric | initial | after demonstrations | after RL | RL's own share per seed "
        f"({', '.join(map(str, args.seeds))}) | mean +- sd | mean - 2 sd | >= +{BAR} and mean - 2 sd > 0 | "
        "min / run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for preset, runs in results.items():
        shares = [r["after"] - r["before"] for r in runs]
        mean, std, ok = verdict(shares)
        initials = [r["initial"] for r in runs if r["initial"] is not None]
        initial = f"{statistics.mean(initials):.3f}" if initials else "-"
        lines.append(
            f"| `{preset}` ({runs[0]['steps']} steps) | {runs[0]['metric']} | {initial} | "
            f"{statistics.mean(r['before'] for r in runs):.3f} | {statistics.mean(r['after'] for r in runs):.3f} | "
            f"{', '.join(f'{v:+.3f}' for v in shares)} | {mean:+.3f} +- {std:.3f} | {mean - 2 * std:+.3f} | "
            f"{'yes' if ok else 'no'} | {statistics.mean(r['minutes'] for r in runs):.1f} |"
        )
    command = " ".join(["python bench/efficacy.py", *map(str, args.presets), f"--seeds {' '.join(map(str, args.seeds))}",
                        *([f"--steps {args.steps}"] if args.steps else []), *overrides])  # fmt: skip
    header = (
        f"\n### Efficacy, {datetime.date.today()} ({platform.machine()}, {os.cpu_count()} cores)\n\n"
        f"Command: `{command}`\n\n"
    )
    table = header + "\n".join(lines) + "\n"
    print(table)
    if args.results:
        with open(args.results, "a") as f:
            f.write(table)


if __name__ == "__main__":
    main()
