"""Held-out evaluation: greedy answers on seeds that training never sees, of the test split (the score reported) or
the validation split (`trainer.eval_every`'s evaluations during a run, tuning); `sim.seeds` holds both ranges."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from tqdm.auto import tqdm

import sim
from sim.seeds import split_seeds

from ..policy import Policy
from ..runtime import distributed
from ..runtime.config import TrainConfig, require
from ..runtime.distributed import World, eval_shard
from ..types import Episodes, Sampling
from .rollout import collect_episodes


@dataclass(frozen=True)
class EvalResult:
    """Held-out metrics and samples of the first K episodes. Under torchrun the metrics are alike in every process
    and the samples are rank 0's (another process holds those of its own share of the K, if any)."""

    metrics: dict[str, float]  # "reward", "success" (if any), "episode_steps" and every reward component, averaged
    images: torch.Tensor  # [K, H, W, 3] the first K held-out observations
    instructions: list[str]  # K
    texts: list[str]  # K greedy completions (the first turn's)
    info: dict  # the first step's info for the first K worlds (target_box, pred_box, ...)
    frames: torch.Tensor | None = None  # [K, S+1, H, W, 3] every observation of the first K episodes (multi-step)
    success: torch.Tensor | None = None  # [K] bool, whether each of those episodes succeeded
    protocol: str | None = None  # how the env plays its held-out episodes, where it says (`env.protocol`: LIBERO)
    split: str = "test"  # the seeds played: "test" or "validation" (`sim.seeds.split_seeds`)


@torch.no_grad()
def evaluate(
    policy: Policy,
    env_name: str,
    env_options: dict,
    episodes: int = 200,
    batch_size: int = 100,
    max_new_tokens: int = 32,
    keep: int = 16,
    world: World | None = None,
    split: str = "test",
) -> EvalResult:
    """Mean episode return, success and reward components of greedy play over `episodes` held-out episodes, the
    first seeds of `split` (`"test"` or `"validation"`).

    Where the env names each world's task (`info["task"]`: `gui_task`, `miniwob`), each task's mean reward and
    success join as `reward@task=<name>`, `success@task=<name>`, with its episode count `episodes@task=<name>`.

    Single-step tasks are one greedy answer per seed; multi-step ones run each episode to its end. Episodes run
    `batch_size` at a time; the per-episode sums of reward components are averaged over episodes. The first
    `keep` episodes of the first batch are kept as samples (observations, answers, frames of multi-step tasks).

    With a `world` of K processes (torchrun) each process plays its contiguous 1/K of the seeds (`eval_shard`), and
    every process must call this: the sums are added up over processes, so every process gets the metrics of one
    process playing every seed (greedy answers depend on the seed, not on the process; batches cut differently
    may round differently), and rank 0 gets the samples one process would keep. A multi-step sample's frames run
    to the end of the longest episode recorded (in one process: of the first batch), the last one repeated.
    """
    if episodes < 1 or batch_size < 1:
        raise ValueError(f"evaluation needs episodes >= 1 and batch_size >= 1, got {episodes} and {batch_size}")
    world = world or World()
    shard = eval_shard(episodes, world)
    seeds = split_seeds(split, episodes)[shard.start : shard.stop]
    kept = min(keep, batch_size, episodes)  # samples one process keeps: the first batch's first `keep` episodes
    mine = max(0, min(kept - shard.start, len(shard)))  # of which this process plays this many
    sums: dict[str, float] = {}
    first = None
    env = None
    protocol = None
    greedy = Sampling(max_new_tokens=max_new_tokens, temperature=0.0)
    # A held-out evaluation of thousands of episodes runs a minute or more, several times a run: a bar (rank 0's),
    # cleared when done, so that the training bar stays one line. It redraws at every batch (`mininterval=0`: a few
    # dozen redraws), so the last state is drawn however fast the batches go.
    bar = tqdm(total=len(seeds), desc="eval", unit="ep", leave=False, dynamic_ncols=True, mininterval=0,
               disable=world.rank != 0)  # fmt: skip
    for start in range(0, len(seeds), batch_size):
        chunk = seeds[start : start + batch_size]
        if env is None or env.num_envs != len(chunk):
            if env is not None:
                env.close()
            env = sim.make(env_name, num_envs=len(chunk), **env_options)
            protocol = getattr(env, "protocol", None)
        record = mine if first is None and env.max_episode_steps > 1 else 0
        # Greedy play draws no randomness from a VLM, but a flow policy's ODE starts from noise: it is seeded by the
        # batch's first seed, so a folder scores the same every time, and the training's random stream is left as
        # evaluation found it (it is forked).
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(chunk[0])
            eps = collect_episodes(policy, env, chunk, 1, greedy, record_frames=record)
        parts = {"reward": eps.returns(), **eps.components, "episode_steps": eps.env_steps}
        if eps.success is not None:
            parts["success"] = eps.success
        for k, v in parts.items():
            sums[k] = sums.get(k, 0.0) + float(v.float().sum())
        tasks = eps.info.get("task") if isinstance(eps.info, dict) else None
        if isinstance(tasks, list) and len(tasks) == len(chunk):  # envs of several tasks: each task's share too
            for i, name in enumerate(tasks):
                for k in ("reward", "success"):
                    if k in parts:
                        sums[f"{k}@task={name}"] = sums.get(f"{k}@task={name}", 0.0) + float(parts[k][i])
                sums[f"episodes@task={name}"] = sums.get(f"episodes@task={name}", 0.0) + 1.0
        if first is None:
            first = eps
        bar.update(len(chunk))
    bar.close()
    if env is not None:
        env.close()
    samples = _samples(first, mine) if mine else None
    if world.size > 1:
        totals: dict[str, float] = {}
        for part in world.gather_objects(sums):  # in rank order, so keys come in one process's order
            for k, v in part.items():
                totals[k] = totals.get(k, 0.0) + v
        sums = totals
        gathered = world.gather_objects(_to_cpu(samples), everyone=False)
        if gathered is not None:  # rank 0: every process's share of the kept episodes, in seed order
            samples = _cat_samples([g for g in gathered if g is not None])
    metrics = {key: v / episodes for key, v in sums.items() if "@task=" not in key}
    for key, v in sums.items():  # per task: its mean over its own episodes, and how many it had
        if "@task=" in key:
            task = key.split("@", 1)[1]
            metrics[key] = v if key.startswith("episodes@") else v / sums[f"episodes@{task}"]
    return EvalResult(metrics=metrics, **(samples or _no_samples()), protocol=protocol, split=split)


def _samples(first: Episodes, k: int) -> dict[str, Any]:
    """The `EvalResult` fields of the first `k` episodes of a batch."""
    turn0 = (first.turn == 0).nonzero().squeeze(-1)[:k]  # rows of the first turn, in world order
    return {
        "images": first.start.first_view[:k],
        "instructions": first.start.instruction[:k],
        "texts": [first.rollout.texts[i] for i in turn0.tolist()],
        "info": {key: v[:k] for key, v in first.info.items() if isinstance(v, torch.Tensor | list)},
        "frames": None if first.frames is None else first.frames[:k],
        "success": None if first.success is None else first.success[:k],
    }


def _no_samples() -> dict[str, Any]:
    """Empty samples, for a process that played none of the kept episodes."""
    return {"images": torch.zeros(0, 0, 0, 3, dtype=torch.uint8), "instructions": [], "texts": [], "info": {}}


def _to_cpu(samples: dict[str, Any] | None) -> dict[str, Any] | None:
    """`samples` with every tensor on the CPU (pickled CUDA tensors would unpickle on the sender's GPU)."""
    if samples is None:
        return None
    cpu = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in samples.items()}
    cpu["info"] = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in samples["info"].items()}
    return cpu


def _cat_samples(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Several processes' samples as one process's: concatenated, frames padded by repeating their last."""

    def cat(values: list):
        return torch.cat(values) if isinstance(values[0], torch.Tensor) else [x for v in values for x in v]

    out = {key: cat([p[key] for p in parts]) for key in ("images", "instructions", "texts")}
    out["info"] = {key: cat([p["info"][key] for p in parts]) for key in parts[0]["info"]}
    out["success"] = None if parts[0]["success"] is None else torch.cat([p["success"] for p in parts])
    frames = [p["frames"] for p in parts]
    if frames[0] is None:
        out["frames"] = None
    else:
        length = max(f.shape[1] for f in frames)  # [k, S+1, H, W, 3] each; S differs between processes
        out["frames"] = torch.cat([torch.cat([f, f[:, -1:].expand(-1, length - f.shape[1], -1, -1, -1)], 1)
                                   for f in frames])  # fmt: skip
    return out


def held_out(policy: Policy, cfg: TrainConfig, world: World | None = None, split: str = "test") -> EvalResult:
    """Greedy play on the held-out seeds of `cfg`'s env, of `split` (`"test"`, or `"validation"` during a run);
    under torchrun every process plays its 1/K of them (rank 0 gets the samples) and must call this.

    With `curriculum.eval_levels`, the same seeds are also played at every level of the curriculum, and each level's
    metrics join as `<name>@<option>=<level>` (e.g. `success@grid=2`); the plain names stay the config's own
    difficulty, which the curriculum ends on."""
    options = cfg.env.make_options()
    with distributed.full_weights(policy.model):  # under FSDP: whole weights, so processes may play unevenly
        result = evaluate(
            policy,
            cfg.env.name,
            options,
            episodes=cfg.trainer.eval_episodes,
            batch_size=cfg.trainer.eval_batch_size,
            max_new_tokens=cfg.sampling.max_new_tokens,
            world=world,
            split=split,
        )
        metric = cfg.env.eval_metric
        require(metric in result.metrics or "@task=" in metric, "env.eval_metric", f"{metric!r} is not a metric env "
                f"{cfg.env.name!r} reports; it reports {', '.join(result.metrics)}", sep=": ")  # fmt: skip
        cur = cfg.curriculum
        if not (cur.eval_levels and cur.option is not None):
            return result
        metrics = dict(result.metrics)
        for level in cur.levels:
            at_level = evaluate(
                policy,
                cfg.env.name,
                {**options, cur.option: level},
                episodes=cfg.trainer.eval_episodes,
                batch_size=cfg.trainer.eval_batch_size,
                max_new_tokens=cfg.sampling.max_new_tokens,
                keep=0,
                world=world,
                split=split,
            )
            metrics.update({f"{k}@{cur.option}={level}": v for k, v in at_level.metrics.items()})
    return replace(result, metrics=metrics)


# ------------------------------------------------------------------------------------------------ k samples per item
def pass_at_k(n: int, correct: int, k: int) -> float:
    """The unbiased estimate of pass@k from `n` samples of which `correct` are correct: 1 - C(n-c, k) / C(n, k).

    Computed as a product (Chen et al. 2021, the Codex paper), which stays exact where the binomials overflow.
    """
    if not 0 < k <= n or not 0 <= correct <= n:
        raise ValueError(f"pass@k needs 0 < k <= n and 0 <= correct <= n, got n={n}, correct={correct}, k={k}")
    if n - correct < k:
        return 1.0
    value = 1.0
    for i in range(n - correct + 1, n + 1):
        value *= 1.0 - k / i
    return 1.0 - value


@dataclass(frozen=True)
class SampledResult:
    """`evaluate_k`'s result: per held-out item, the metric of each of its k sampled episodes."""

    metric: str
    k: int
    seeds: list[int]  # [N] held-out seeds
    values: torch.Tensor  # [N, k] the metric of each sampled episode
    correct: torch.Tensor | None  # [N, k] bool, the episode succeeded (None: the env has no success)
    instructions: list[str]  # [N]
    texts: list[list[str]]  # [N][k] each sample's first answer
    images: torch.Tensor  # [N, H, W, 3] each item's first observation
    tasks: list[str] | None = None  # [N] the kind of task of each item, where the env reports one (info["task"])

    def summary(self, items: list[int] | None = None) -> dict[str, float]:
        """avg@k (the metric's mean over items and samples), best@k (its per-item maximum, averaged), and where the
        env has success, pass@j for j = 1, 2, 4, ..., k (unbiased, averaged over items); over `items` (default
        all)."""
        rows = torch.arange(len(self.seeds)) if items is None else torch.tensor(items, dtype=torch.long)
        values = self.values[rows]
        out = {f"avg@{self.k}": float(values.mean()), f"best@{self.k}": float(values.max(1).values.mean())}
        if self.correct is not None:
            counts = self.correct[rows].sum(1).tolist()
            ks = sorted({1, self.k, *(2**i for i in range(1, self.k.bit_length()) if 2**i < self.k)})
            for j in ks:
                out[f"pass@{j}"] = sum(pass_at_k(self.k, c, j) for c in counts) / len(counts)
        return out

    def by_task(self) -> dict[str, dict[str, float]]:
        """`summary` per kind of task (`items`: how many held-out items of it), sorted by kind; {} without kinds."""
        if not self.tasks:
            return {}
        groups: dict[str, list[int]] = {}
        for i, task in enumerate(self.tasks):
            groups.setdefault(task, []).append(i)
        return {task: {"items": float(len(rows)), **self.summary(rows)} for task, rows in sorted(groups.items())}


@torch.no_grad()
def evaluate_k(policy: Policy, cfg: TrainConfig, split: str = "test") -> SampledResult:
    """`cfg.eval.k` sampled episodes (temperature `cfg.eval.temperature`) of each of the held-out items.

    The items are the first `cfg.eval.episodes` (default `trainer.eval_episodes`) seeds of `split`, the same ones the
    greedy evaluation plays; each is played k times as one group (the G = k copies of a GRPO group), in batches of
    `eval.batch_size` episodes. One process (not under torchrun).
    """
    ec, tc = cfg.eval, cfg.trainer
    if ec.k < 1:
        raise ValueError("eval.k must be >= 1 for sampled evaluation")
    seeds = split_seeds(split, ec.episodes or tc.eval_episodes)
    per_batch = max(1, (ec.batch_size or tc.eval_batch_size) // ec.k)
    sampling = Sampling(max_new_tokens=cfg.sampling.max_new_tokens, temperature=ec.temperature,
                        top_p=cfg.sampling.top_p, top_k=cfg.sampling.top_k)  # fmt: skip
    metric = cfg.env.eval_metric
    values, correct, texts, instructions, images, tasks = [], [], [], [], [], []
    env = None
    bar = tqdm(total=len(seeds), desc=f"eval k={ec.k}", unit="item", leave=False, dynamic_ncols=True, mininterval=0)
    try:
        for start in range(0, len(seeds), per_batch):
            chunk = seeds[start : start + per_batch]
            if env is None or env.num_envs != len(chunk) * ec.k:
                if env is not None:
                    env.close()
                env = sim.make(cfg.env.name, num_envs=len(chunk) * ec.k, **cfg.env.make_options())
            eps = collect_episodes(policy, env, [s for s in chunk for _ in range(ec.k)], ec.k, sampling)
            parts = {"reward": eps.returns(), **eps.components, "episode_steps": eps.env_steps}
            if eps.success is not None:
                parts["success"] = eps.success
            require(metric in parts, "env.eval_metric", f"{metric!r} is not a metric env {cfg.env.name!r} reports; "
                    f"it reports {', '.join(parts)}", sep=": ")  # fmt: skip
            values.append(parts[metric].float().view(len(chunk), ec.k))
            correct.append(None if eps.success is None else eps.success.view(len(chunk), ec.k))
            turn0 = (eps.turn == 0).nonzero().squeeze(-1).tolist()  # each world's first generation, in world order
            answers = [eps.rollout.texts[i] for i in turn0]
            texts += [answers[i * ec.k : (i + 1) * ec.k] for i in range(len(chunk))]
            instructions += eps.start.instruction[:: ec.k]
            images.append(eps.start.first_view[:: ec.k])
            kinds = eps.info.get("task")  # the first step's, per world
            tasks += [str(t) for t in kinds[:: ec.k]] if isinstance(kinds, list) else [""] * len(chunk)
            bar.update(len(chunk))
    finally:
        bar.close()
        if env is not None:
            env.close()
    return SampledResult(
        metric=metric,
        k=ec.k,
        seeds=list(seeds),
        values=torch.cat(values),
        correct=None if any(c is None for c in correct) else torch.cat(correct),
        instructions=instructions,
        texts=texts,
        images=torch.cat(images),
        tasks=tasks if any(tasks) else None,
    )
