"""What a run tells its user: each step's metrics, the held-out lines, plots and episode media.

The trainer calls `step_metrics` once per step and `report` once at the end; the CLI takes `METRIC_LABELS` from here.
Pictures need the `plot` extra (matplotlib); without it they are skipped with a message, the numbers stay.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from . import plots
from .algos.data import dynamic_sampling_keep
from .methods.curriculum import Curriculum
from .runtime.config import TrainConfig
from .runtime.distributed import World
from .runtime.metrics import EXTREMES, read_metrics
from .stages.evaluate import EvalResult, SampledResult
from .types import Collected

METRIC_LABELS = {"iou": "mean IoU", "reward": "mean reward", "success": "success"}


def metric_label(cfg: TrainConfig) -> str:
    """How the held-out score of `cfg`'s env is named in the printed lines."""
    return METRIC_LABELS.get(cfg.env.eval_metric, cfg.env.eval_metric)


def step_metrics(
    cfg: TrainConfig,
    collected: Collected,
    losses: dict[str, torch.Tensor | float],
    extra: dict[str, Any],
    curriculum: Curriculum,
    world: World,
) -> dict[str, Any]:
    """The step's metrics over every episode sampled (before any filter), alike in every process.

    Args:
        cfg: the run's config.
        collected: what the step collected.
        losses: the objective's metrics, each already this process's share of the batch's value (summed here).
        extra: `grad_norm`, `lr` and the `perf/` timings and throughput (maxed or summed over processes).
        curriculum: the env's difficulty schedule.
        world: this process's place among the run's processes.
    """
    stats, ac = collected.sampled, cfg.algo
    metrics = {
        "reward/total": stats.step_rewards.sum(-1).mean(),
        **{f"reward/{k}": v.mean() for k, v in stats.components.items()},
        **losses,
        "grad_norm": extra["grad_norm"],
        "lr": extra["lr"],
        "completion_len": stats.rollout.completion_mask.sum(-1).float().mean(),  # as generated
        **{k: v for k, v in extra.items() if k.startswith(("perf/", "critic/"))},
    }
    if stats.step_rewards.shape[1] > 1:
        metrics["env/episode_steps"] = stats.env_steps.float().mean()
    if ac.group_size > 1:
        # Groups whose G returns are all equal: a group baseline gives them zero advantage, so they teach nothing.
        # Near 1 means the samples do not differ enough for RL to learn from (too easy, too hard, or a policy sampled
        # too greedily); near 0, every group carries a signal. (Groups of one have no group baseline: not logged.)
        flat = 1.0 - dynamic_sampling_keep(stats.returns(ac.gamma), ac.group_size).float().mean()
        metrics["data/flat_groups"] = flat
    if ac.dynamic_sampling or ac.difficulty_low is not None or ac.difficulty_high is not None:
        metrics["data/kept_groups"] = collected.kept_groups
        metrics["data/sampled_batches"] = collected.sampled_batches
    if stats.success is not None:
        metrics["env/success_rate"] = stats.success.float().mean()
    if curriculum.enabled:
        metrics["curriculum/level"] = curriculum.level
    if cfg.trainer.max_staleness:
        metrics["pipeline/stale"] = collected.stale  # 1: played by the weights before the last update
    # Alike in every process already: counts of optimiser steps, the critic's figures (from gathered rows, or of its
    # gradient averaged over processes).
    alike = [k for k in metrics if k == "optimizer_steps" or k.startswith("critic/")]
    return world.reduce_metrics(  # the whole batch's, alike in every process (the curriculum reads them)
        metrics, weight=stats.num_worlds, weights={"completion_len": len(stats.rollout)},
        summed=(*(k for k in losses if k not in alike and not k.endswith(EXTREMES)), "data/kept_groups",
                "perf/tokens_per_s"),
        maxed=(
            "grad_norm", "lr", "perf/step_s", "perf/generate_s", "data/sampled_batches", "curriculum/level", *alike,
            *(k for k in losses if k.endswith(("_max", "/max"))),
        ),
        minned=tuple(k for k in losses if k.endswith(("_min", "/min"))),
    )  # fmt: skip


def write_episode_media(result: EvalResult, stem: Path) -> None:
    """An animated GIF and a frame strip of the held-out episodes that `result` recorded (multi-step tasks)."""
    if result.frames is None:
        return
    try:
        plots.episode_gif(result.frames, stem.with_suffix(".gif"), success=result.success)
        plots.frame_strip(result.frames[0], stem.with_name(stem.name + "_strip.png"), title=result.instructions[0])
    except ImportError as e:
        print(f"skipped episode pictures: {e}", file=sys.stderr)


def report_before(cfg: TrainConfig, before: EvalResult, out: Path) -> None:
    """Print the held-out score before training and keep its episode media (rank 0)."""
    print(f"held-out {metric_label(cfg)} before training: {before.metrics[cfg.env.eval_metric]:.3f}", file=sys.stderr)
    write_episode_media(before, out / "episodes_before")


def report(cfg: TrainConfig, before: dict, after: EvalResult, out: Path) -> None:
    """Print the held-out line, write `eval.json` and draw the run's pictures (rank 0, at the end of a run)."""
    write_episode_media(after, out / "episodes_after")
    metric, label = cfg.env.eval_metric, metric_label(cfg)
    metrics = read_metrics(out / "metrics.jsonl")
    keys = tuple(dict.fromkeys(k for m in metrics for k in m if k.startswith("reward/")))  # every component, in order
    try:
        plots.reward_curve(metrics, out / "reward_curve.png", keys=keys or ("reward/total",))
        if "target_box" in after.info and "pred_box" in after.info:
            plots.box_grid(
                after.images,
                after.info["target_box"],
                after.info["pred_box"],
                after.instructions,
                out / "predictions.png",
            )
    except ImportError as e:  # matplotlib is an extra; the run's numbers matter more than its pictures
        print(f"skipped plots: {e}", file=sys.stderr)
    scores = {"before": before, "after": after.metrics}
    initial_file = out / "cold_start" / "initial_eval.json"
    if cfg.sft.episodes > 0 and initial_file.exists():  # a cold start ran: "before" is the model before the demos
        scores["initial"] = json.loads(initial_file.read_text())
    if after.protocol:  # how the env played the held-out episodes (LIBERO's), above the scores: they end the output
        print(f"protocol: {after.protocol}")
        (out / "eval_protocol.txt").write_text(after.protocol + "\n")
    for line in breakdown_lines(cfg, scores):  # each level and task first, the summary lines last
        print(line)
    if "initial" in scores:
        print(f"held-out {label} (initial model -> after demonstrations -> after RL): {scores['initial'][metric]:.3f}"
              f" -> {before[metric]:.3f} -> {after.metrics[metric]:.3f}")  # fmt: skip
        before = scores["initial"]
    (out / "eval.json").write_text(json.dumps(scores, indent=2))
    print(f"held-out {label}: {before[metric]:.3f} -> {after.metrics[metric]:.3f}")


def breakdown_lines(cfg: TrainConfig, scores: dict[str, dict[str, float]]) -> list[str]:
    """One line per curriculum level (`curriculum.eval_levels`) and per task (envs of several tasks): its held-out
    metric at each point of the run, e.g. `held-out success at grid=2 (initial -> ... -> after RL): ...`."""
    metric = cfg.env.eval_metric
    points = [p for p in ("initial", "before", "after") if p in scores]
    names = {
        "initial": "initial",
        "before": "after demonstrations" if "initial" in scores else "before",
        "after": "after RL",
    }
    keys = [k for k in scores[points[-1]] if k.startswith(f"{metric}@") and all(k in scores[p] for p in points)]
    return [
        f"held-out {metric_label(cfg)} at {key.split('@', 1)[1]} ({' -> '.join(names[p] for p in points)}): "
        + " -> ".join(f"{scores[p][key]:.3f}" for p in points)
        for key in keys
    ]


def write_eval_report(cfg: TrainConfig, result: EvalResult, folder: Path, videos: int = 3) -> Path:
    """`mmrl eval`'s report of the greedy held-out play: `eval.md` (the metrics, and a table of success and reward
    per task where the env names its tasks, e.g. a LIBERO suite), `eval.json`, and episode videos of up to `videos`
    successes and `videos` failures among the recorded episodes (multi-step envs: `videos/success_<k>.gif`,
    `videos/failure_<k>.gif`). Returns the Markdown file."""
    folder.mkdir(parents=True, exist_ok=True)
    metrics = result.metrics
    metric = cfg.env.eval_metric
    tasks = sorted(k.split("=", 1)[1] for k in metrics if k.startswith("episodes@task="))
    lines = [
        f"# Held-out evaluation: {cfg.env.name}, {result.split} split",
        "",
        f"checkpoint `{cfg.checkpoint}`, {cfg.trainer.eval_episodes} held-out episodes of the {result.split} split, "
        "greedy actions",
        "",
        f"**{metric_label(cfg)}: {metrics[metric]:.3f}**",
        "",
        *([f"Protocol: {result.protocol}", ""] if result.protocol else []),  # how the env played them (LIBERO)
    ]
    if tasks:
        has_success = any(f"success@task={t}" in metrics for t in tasks)
        lines += ["| task | episodes | " + ("success | " if has_success else "") + "mean reward |", "|---|---|---|"
                  + ("---|" if has_success else "")]  # fmt: skip
        for task in tasks:
            row = f"| {task} | {int(metrics[f'episodes@task={task}'])} | "
            if has_success:
                row += f"{metrics.get(f'success@task={task}', float('nan')):.3f} | "
            lines.append(row + f"{metrics.get(f'reward@task={task}', float('nan')):.3f} |")
        mean = "" if not has_success else f"{metrics.get('success', float('nan')):.3f} | "
        lines += [f"| **all** | {cfg.trainer.eval_episodes} | {mean}{metrics['reward']:.3f} |", ""]
    lines += ["| metric | value |", "|---|---|", *(f"| {k} | {v:.4f} |" for k, v in sorted(metrics.items())), ""]
    if result.frames is not None and result.success is not None:
        picked = {"success": result.success.nonzero().flatten()[:videos].tolist(),
                  "failure": (~result.success).nonzero().flatten()[:videos].tolist()}  # fmt: skip
        try:
            for kind, rows in picked.items():
                for k, row in enumerate(rows):
                    name = f"videos/{kind}_{k}.gif"
                    (folder / "videos").mkdir(exist_ok=True)
                    plots.episode_gif(
                        result.frames[row : row + 1], folder / name, success=result.success[row : row + 1]
                    )
                    lines.append(f"- {kind}: [{name}]({name}), {result.instructions[row]!r}")
        except ImportError as e:
            lines.append(f"(no videos: {e})")
    (folder / "eval.json").write_text(json.dumps({"checkpoint": cfg.checkpoint, "env": cfg.env.name, "split": result.split,
                                                  "protocol": result.protocol, "metrics": metrics}, indent=1))  # fmt: skip
    path = folder / "eval.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_sampled_report(cfg: TrainConfig, greedy: dict[str, float], sampled: SampledResult, folder: Path) -> Path:
    """`mmrl eval`'s report of k samples per item: `report.json` (every item), `report.md` (the summary and the
    best and worst items, their images in `items/`). Returns the Markdown file."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "items").mkdir(exist_ok=True)
    summary = sampled.summary()
    means = sampled.values.mean(1)  # [N]
    items = [
        {
            "seed": seed,
            "instruction": sampled.instructions[i],
            f"mean_{sampled.metric}": float(means[i]),
            f"best_{sampled.metric}": float(sampled.values[i].max()),
            "correct": None if sampled.correct is None else int(sampled.correct[i].sum()),
            "task": None if sampled.tasks is None else sampled.tasks[i],
            "answers": sampled.texts[i],
        }
        for i, seed in enumerate(sampled.seeds)
    ]
    payload = {
        "checkpoint": cfg.checkpoint,
        "env": cfg.env.name,
        "metric": sampled.metric,
        "k": sampled.k,
        "temperature": cfg.eval.temperature,
        "items": len(items),
        "greedy": greedy,
        "sampled": summary,
        "per_task": sampled.by_task(),
        "per_item": items,
    }
    (folder / "report.json").write_text(json.dumps(payload, indent=2))
    order = torch.argsort(means, descending=True, stable=True).tolist()
    shown = cfg.eval.report_items
    lines = [
        f"# {cfg.env.name}: {len(items)} held-out items, {sampled.k} samples each at temperature {cfg.eval.temperature}",
        "",
        f"Checkpoint: `{cfg.checkpoint}`. Metric: `{sampled.metric}`.",
        "",
        "| measure | value |",
        "|---|---|",
        f"| greedy {sampled.metric} | {greedy.get(sampled.metric, float('nan')):.4f} |",
        *(f"| {key} | {value:.4f} |" for key, value in summary.items()),
    ]
    if sampled.correct is None:
        lines += ["", f"No pass@k: the {cfg.env.name} env reports no success per episode."]
    per_task = sampled.by_task()
    if per_task:
        keys = list(summary)
        lines += [
            "",
            "## By task",
            "",
            "| task | items | " + " | ".join(keys) + " |",
            "|---|---|" + "---|" * len(keys),
        ]
        for task, row in per_task.items():
            lines.append(f"| {task} | {int(row['items'])} | " + " | ".join(f"{row[k]:.4f}" for k in keys) + " |")
    for title, picked in (("Best items", order[:shown]), ("Worst items", order[::-1][:shown])):
        lines += ["", f"## {title}", "", f"| image | instruction | mean {sampled.metric} | correct | first answer |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for i in picked:
            name = f"items/{sampled.seeds[i]}.png"
            Image.fromarray(sampled.images[i].cpu().numpy()).save(folder / name)
            answer = sampled.texts[i][0].replace("|", "\\|").replace("\n", " ")[:80]
            instruction = sampled.instructions[i].replace("|", "\\|")[:80]
            correct = "-" if sampled.correct is None else f"{int(sampled.correct[i].sum())}/{sampled.k}"
            lines.append(f"| ![]({name}) | {instruction} | {float(means[i]):.3f} | {correct} | `{answer}` |")
    markdown = folder / "report.md"
    markdown.write_text("\n".join(lines) + "\n")
    return markdown
