"""Arms of one preset side by side over seeds: the held-out score before and after, and the training diagnostics.

Each arm is the preset plus its overrides; every arm sees the same prompts and starts from the same weights for a
given seed (the seed is `trainer.seed`), and arms are interleaved per seed so that a slow phase of the machine falls
on all of them. Reported per arm: the held-out `env.eval_metric` after training per seed, its mean and standard
deviation, RL's own share (after RL minus before RL, i.e. after the cold start when there is one), and the means
over training steps of the clip fraction, the optimiser steps per rollout, and the seconds per step (of which
waiting for the step's episodes: `perf/generate_s`); and, where the preset evaluates mid-run
(`trainer.eval_every`), each arm's curve on the validation split (mean over seeds per evaluated step): the one to
choose an arm by, where the score after training is the test split's, to report.

    .venv/bin/python bench/arms.py configs/grounding_tiny.yaml --steps 100 --seeds 0 1 2 \\
        --arm one_epoch= --arm two_epochs=algo.ppo_epochs=2 [--results RESULTS.md] [trainer.threads=1 ...]

`--curve KEY` (repeatable) adds, per arm, a logged metric's mean over the first and the last five RL steps (for
instance `papo/kl`, how much the policy's answers change when part of the image is hidden), and `--plot PNG` draws
those metrics by RL step, each seed thin and the mean over seeds bold.

An arm is `name=override[,override...]` (empty after `=` for the preset as it is); trailing `key=value` arguments
apply to every arm. With a cold start (`sft.episodes > 0`) the first arm of each seed makes it and the other arms of
that seed start from a copy (`<output_dir>/cold_start`), so the arms differ only in what they compare, and the
demonstration phase runs once per seed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mmrl.runtime.config import load_config  # noqa: E402
from mmrl.runtime.metrics import read_metrics  # noqa: E402
from mmrl.trainer import train  # noqa: E402


def run(
    preset: Path, overrides: list[str], seed: int, steps: int, out: Path, cold_start: Path | None, keys: list[str]
) -> dict:
    if cold_start is not None and cold_start.is_dir():
        shutil.copytree(cold_start, out / "cold_start")
    cfg = load_config(
        preset,
        [f"output_dir={out}", f"trainer.total_steps={steps}", f"trainer.seed={seed}", "trainer.save_every=0",
         *overrides],
    )  # fmt: skip
    start = time.perf_counter()
    train(cfg)
    elapsed = time.perf_counter() - start
    evals = json.loads((out / "eval.json").read_text())
    history = read_metrics(out / "metrics.jsonl")
    rows = [m for m in history if "loss/policy" in m]
    metric = cfg.env.eval_metric
    curve = {m["step"]: m[f"val/{metric}"] for m in history if f"val/{metric}" in m}
    return {
        "initial": evals.get("initial", {}).get(metric),  # before the cold start (None without one)
        "before": evals["before"][metric],
        "after": evals["after"][metric],
        "clip_fraction": statistics.mean(m.get("clip_fraction", 0.0) for m in rows),
        "optimizer_steps": statistics.mean(m.get("optimizer_steps", 1.0) for m in rows),
        "minutes": elapsed / 60,
        "step_s": statistics.mean(m.get("perf/step_s", 0.0) for m in rows),
        "collect_s": statistics.mean(m.get("perf/generate_s", 0.0) for m in rows),
        "metric": metric,
        "curve": curve,  # the validation split's metric by step (trainer.eval_every)
        "logged": {key: [m.get(key, math.nan) for m in rows] for key in keys},  # --curve keys, one per RL step
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("preset", type=Path)
    parser.add_argument("--arm", action="append", required=True, help="name=override[,override...]")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--results", type=Path, default=None, help="append the table to this Markdown file")
    parser.add_argument(
        "--curve",
        action="append",
        default=[],
        metavar="KEY",
        help="a logged metric (e.g. papo/kl) to report per arm at the start and end of RL, and plot",
    )
    parser.add_argument("--plot", type=Path, default=None, help="a PNG of the --curve metrics by RL step, per arm")
    parser.add_argument("overrides", nargs="*", help="section.field=value overrides for every arm")
    args = parser.parse_intermixed_args()
    arms = {}
    for spec in args.arm:
        name, _, rest = spec.partition("=")
        arms[name] = [o for o in rest.split(",") if o]
    results: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
    root = Path(tempfile.mkdtemp(prefix="arms_"))
    for seed in args.seeds:
        first = None
        for name, overrides in arms.items():
            out = root / f"seed{seed}" / name
            out.mkdir(parents=True)
            got = run(args.preset, [*overrides, *args.overrides], seed, args.steps, out, first, args.curve)
            first = first or out / "cold_start"
            results[name].append(got)
            print(
                f"seed {seed} {name}: held-out {got['metric']} {got['before']:.3f} -> {got['after']:.3f}, "
                f"clip fraction {got['clip_fraction']:.4f}, {got['optimizer_steps']:.0f} optimiser steps a rollout, "
                f"{got['minutes']:.1f} min",
                flush=True,
            )
    metric = next(iter(results.values()))[0]["metric"]
    before = next(iter(results.values()))[0]["before"]
    lines = [
        f"| arm | overrides | held-out {metric} after {args.steps} steps (seeds {', '.join(map(str, args.seeds))}) "
        "| mean | std | RL's own share (after - before RL) | clip fraction | optimiser steps / rollout | s / step "
        "(collecting) | min / run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        after = [r["after"] for r in runs]
        std = statistics.stdev(after) if len(after) > 1 else 0.0
        lines.append(
            f"| {name} | `{' '.join(arms[name]) or '(preset)'}` | {', '.join(f'{v:.3f}' for v in after)} | "
            f"{statistics.mean(after):.3f} | {std:.3f} | {statistics.mean(r['after'] - r['before'] for r in runs):+.3f} | "
            f"{statistics.mean(r['clip_fraction'] for r in runs):.4f} | "
            f"{statistics.mean(r['optimizer_steps'] for r in runs):.0f} | "
            f"{statistics.mean(r['step_s'] for r in runs):.2f} ({statistics.mean(r['collect_s'] for r in runs):.2f}) | "
            f"{statistics.mean(r['minutes'] for r in runs):.1f} |"
        )
    command = " ".join(["python bench/arms.py", str(args.preset), f"--steps {args.steps}",
                        f"--seeds {' '.join(map(str, args.seeds))}", *(f"--arm {a}" for a in args.arm),
                        *(f"--curve {k}" for k in args.curve), *([f"--plot {args.plot}"] if args.plot else []),
                        *args.overrides])  # fmt: skip
    header = (
        f"\n### {args.preset.stem}: {', '.join(arms)}, {datetime.date.today()} "
        f"({platform.machine()}, {os.cpu_count()} cores)\n\n"
        f"Held-out {metric} before RL (after the cold start, if any; seed {args.seeds[0]}): {before:.3f}. "
        f"Command: `{command}`\n\n"
    )
    # The validation curve of each arm (mean over seeds at each evaluated step), when evaluated mid-run.
    steps = sorted(set.intersection(*(set(r["curve"]) for runs in results.values() for r in runs)))
    if steps:
        lines += ["", f"Validation {metric} by RL step (mean over seeds):", "",
                  "| arm | " + " | ".join(str(s) for s in steps) + " |", "|---|" + "---|" * len(steps)]  # fmt: skip
        for name, runs in results.items():
            means = [statistics.mean(r["curve"][s] for r in runs) for s in steps]
            lines.append(f"| {name} | " + " | ".join(f"{v:.3f}" for v in means) + " |")
    # Each --curve metric: its mean over the first and the last five RL steps, mean over seeds.
    for key in args.curve:
        lines += [
            "",
            f"`{key}` over RL (mean over seeds):",
            "",
            "| arm | first 5 steps | last 5 steps |",
            "|---|---|---|",
        ]
        for name, runs in results.items():
            head = statistics.mean(_nanmean(r["logged"][key][:5]) for r in runs)
            tail = statistics.mean(_nanmean(r["logged"][key][-5:]) for r in runs)
            lines.append(f"| {name} | {head:.4f} | {tail:.4f} |")
    if args.plot and args.curve:
        plot(results, args.curve, args.plot, metric, steps)
        lines += ["", f"![{args.preset.stem} arms]({args.plot})"]
    table = header + "\n".join(lines) + "\n"
    shutil.rmtree(root, ignore_errors=True)
    print(table)
    if args.results:
        with open(args.results, "a") as f:
            f.write(table)


def _nanmean(values: list[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return statistics.mean(kept) if kept else math.nan


def plot(results: dict[str, list[dict]], keys: list[str], path: Path, metric: str, steps: list[int]) -> None:
    """One panel per --curve metric (each seed thin, the mean over seeds bold, one colour per arm), and the held-out
    curve when the preset evaluates mid-run."""
    import matplotlib.pyplot as plt

    panels = [*keys, *([f"held-out {metric}"] if len(steps) > 2 else [])]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.2), squeeze=False)
    for (name, runs), colour in zip(results.items(), plt.rcParams["axes.prop_cycle"].by_key()["color"]):
        for ax, key in zip(axes[0], keys):
            series = [r["logged"][key] for r in runs]
            for values in series:
                ax.plot(range(1, len(values) + 1), values, color=colour, alpha=0.25, linewidth=0.8)
            mean = [_nanmean(list(column)) for column in zip(*series)]
            ax.plot(range(1, len(mean) + 1), mean, color=colour, linewidth=2, label=name)
            ax.set_title(key)
            ax.set_xlabel("RL step")
        if len(steps) > 2:
            ax = axes[0][-1]
            ax.plot(steps, [statistics.mean(r["curve"][s] for r in runs) for s in steps], color=colour, marker="o",
                    linewidth=2, label=name)  # fmt: skip
            ax.set_title(f"held-out {metric}")
            ax.set_xlabel("RL step")
    axes[0][0].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
