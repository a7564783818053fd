"""One step's training episodes: seeds, shards, filters and refill, rollout workers.

`Collector.collect(policy, model, step)` is the trainer's one call for data. Behind it:

* **Seeds and shards.** Each step samples B prompts (seeds from `sim.seeds.train_seeds`), each reset G times (a
  group). They are split into S separately seeded shards (`trainer.generation_shards`, default one per process), and
  each process collects whole groups of its shards with whole weights (`distributed.full_weights`): generation runs
  no collective, so processes may make different numbers of forward passes, and the samples depend on S, never on
  the number of processes.
* **Where episodes are played.** In this process (`mmrl.stages.rollout.collect_episodes` on the env, whose worlds may live
  in Ray env workers, `env.workers`), or by K rollout workers, Ray actors holding policy copies synced every step
  (`trainer.rollout_workers`).
* **Filters and refill.** Dynamic sampling and difficulty filtering drop groups; more batches of B prompts are
  sampled until B groups pass or `algo.max_sample_batches` is spent. Nothing passing trains on the first batch
  (zero advantages; only the KL and entropy terms act).
* **Rewards the filters read.** Each sampled batch passes through the shaping that must come before the filters (a
  judge model's scores, TTRV's votes: `mmrl.stages.shaping.Shaping.sampled`); the rest of the shaping is the loop's next
  stage.

A curriculum step rebuilds the env at the new level (`rebuild`).
"""

from __future__ import annotations

import copy
import sys
import threading

import torch

from sim.seeds import sampling_seed, train_seeds
from sim.workers import make_vec_env

from ..algos.data import difficulty_filter_keep, dynamic_sampling_keep
from ..methods.curriculum import Curriculum
from ..policy.vlm import VLMPolicy
from ..run import distributed
from ..run.config import AlgoConfig, TrainConfig
from ..types import Collected, Episodes, Sampling, cat_episodes
from .rollout import collect_episodes
from .rollout_workers import RolloutWorkers
from .shaping import Shaping


def make_env(cfg: TrainConfig, num_envs: int, curriculum: Curriculum):
    """The training env at the curriculum's level: in this process, or its worlds spread over `env.workers` Ray
    actors."""
    options = cfg.env.make_options(curriculum.options(cfg.env.options))
    return make_vec_env(cfg.env.name, num_envs, cfg.env.workers, cfg.env.worker_timeout_s, **options)


def check_generation_shards(cfg: TrainConfig, generation_shards: int | None) -> None:
    """Refuse a shard count the rollout workers cannot share. The config checks the rest of `trainer.rollout_workers`
    at load; this one also depends on `train`'s `generation_shards` argument."""
    k = cfg.trainer.rollout_workers
    shards = generation_shards or cfg.trainer.generation_shards or 1  # 0: one shard per process, and there is one
    if k and shards % k:
        raise ValueError(
            f"trainer.rollout_workers={k} needs trainer.generation_shards set to a multiple of {k} (a step's shards "
            f"are what the workers share); got {generation_shards or cfg.trainer.generation_shards}"
        )


def keep_groups(episodes: Episodes, ac: AlgoConfig) -> torch.Tensor:
    """`[B]` bool: the groups the data-side filters keep (all, when none is on); they read the unshaped returns."""
    returns = episodes.returns(ac.gamma)
    keep = torch.ones(returns.numel() // ac.group_size, dtype=torch.bool)
    if ac.dynamic_sampling:
        # Groups whose returns are all equal have zero advantage everywhere: no signal, only noise.
        keep &= dynamic_sampling_keep(returns, ac.group_size)
    if ac.difficulty_low is not None or ac.difficulty_high is not None:
        accuracy = episodes.success.float() if episodes.success is not None else returns
        low = ac.difficulty_low if ac.difficulty_low is not None else float("-inf")
        high = ac.difficulty_high if ac.difficulty_high is not None else float("inf")
        keep &= difficulty_filter_keep(accuracy, ac.group_size, low, high)
    return keep


class Collector:
    """Collects each step's episodes (see the module docstring).

    Args:
        cfg: the run's config.
        world: this process's place among the run's processes.
        curriculum: the env's difficulty schedule (its level decides the env's options).
        policy: the policy rollout workers copy (only read when `trainer.rollout_workers > 0`).
        sampling: how completions are drawn during training.
        shaping: the run's reward shaping (its `sampled` part runs on each batch, before the filters).
        generation_shards: S, overriding `trainer.generation_shards` (see `mmrl.trainer.train`).
    """

    def __init__(
        self,
        cfg: TrainConfig,
        world: distributed.World,
        curriculum: Curriculum,
        sampling: Sampling,
        shaping: Shaping,
        generation_shards: int | None = None,
    ):
        tc = cfg.trainer
        if tc.rollout_workers and world.size > 1:
            raise ValueError("trainer.rollout_workers > 0 under torchrun is not supported: use one trainer process")
        if tc.max_staleness and world.size > 1:
            raise ValueError("trainer.max_staleness > 0 under torchrun is not supported yet: use one trainer process")
        self.cfg, self.world, self.curriculum, self.sampling, self.shaping = cfg, world, curriculum, sampling, shaping
        self.num_shards = generation_shards or tc.generation_shards or world.size
        self.my_shards = distributed.prompt_shards(tc.prompts_per_step, self.num_shards, world)
        self.shard_rows = tc.prompts_per_step // self.num_shards * cfg.algo.group_size  # worlds of one shard
        self.rows = len(self.my_shards) * self.shard_rows  # this process's R
        self.env = make_env(cfg, self.shard_rows, curriculum)  # the env holds one shard at a time
        self.workers: RolloutWorkers | None = None
        # Pipelined collection (trainer.max_staleness = 1): the next step's episodes, played by a copy of the policy
        # in a thread while this step updates.
        self._copy: VLMPolicy | None = None
        self._thread: threading.Thread | None = None
        self._pending: tuple[int, Collected | BaseException] | None = None

    def prefetch(self, policy: VLMPolicy, step: int) -> None:
        """Start collecting step `step`'s episodes now, in a thread, with a copy of `policy`'s current weights (its
        rows are then one update stale when step `step` trains on them)."""
        self.wait()
        if self._copy is None:
            self._copy = copy.deepcopy(policy)
            self._copy.model.requires_grad_(False)
        else:
            with torch.no_grad():
                for mine, theirs in zip(self._copy.model.parameters(), policy.model.parameters(), strict=True):
                    mine.copy_(theirs)

        def play() -> None:
            try:
                self._pending = (step, self._collect(self._copy, self._copy.model, step))
            except BaseException as error:  # noqa: BLE001  (re-raised in the trainer's thread by `collect`)
                self._pending = (step, error)

        self._thread = threading.Thread(target=play, name=f"prefetch-step-{step}", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Let a running prefetch finish (before the env is rebuilt, a checkpoint is written, or the run ends)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def pending(self) -> tuple[int, Collected] | None:
        """The finished prefetch (its step and episodes), for a checkpoint; None when there is none."""
        self.wait()
        return self._pending if self._pending is None or isinstance(self._pending[1], Collected) else None

    def restore(self, pending: tuple[int, Collected] | None) -> None:
        """Take back a checkpoint's prefetched episodes, so that a resumed run trains on what the killed one would."""
        self._pending = pending

    def start_workers(self, policy: VLMPolicy) -> None:
        """Start the rollout workers, copies of `policy` (with `trainer.rollout_workers > 0`; else nothing)."""
        tc = self.cfg.trainer
        if tc.rollout_workers > 0:
            self.workers = RolloutWorkers(
                policy, self.cfg.env.name, self.shard_rows, self.cfg.env.make_options(self.curriculum.options(self.cfg.env.options)),
                tc.rollout_workers, threads=max(tc.threads, 1), timeout_s=tc.rollout_timeout_s,
                keep_answered=self.shaping.keeps_answered,
            )  # fmt: skip

    @torch.no_grad()
    def collect(self, policy: VLMPolicy, model: torch.nn.Module, step: int) -> Collected:
        """Step `step`'s episodes, played by `policy` (whose possibly sharded module is `model`), or the ones a
        `prefetch` of this step played (`Collected.stale` = 1)."""
        self.wait()
        if self._pending is not None:
            (ready, got), self._pending = self._pending, None
            if isinstance(got, BaseException):
                raise got
            if ready == step:
                return got
        return self._collect(policy, model, step)

    def _collect(self, policy: VLMPolicy, model: torch.nn.Module, step: int) -> Collected:
        tc, ac, group_size = self.cfg.trainer, self.cfg.algo, self.cfg.algo.group_size
        pad = policy.pad_token_id or 0
        sampled, kept, kept_groups = [], [], 0
        with distributed.full_weights(model):
            if self.workers is not None:
                self.workers.sync(policy)
            for attempt in range(max(ac.max_sample_batches, 1)):
                seeds = train_seeds(step + attempt * tc.total_steps, tc.prompts_per_step, group_size, seed=tc.seed)
                jobs = [
                    (seeds[shard * self.shard_rows : (shard + 1) * self.shard_rows], group_size, self.sampling,
                     sampling_seed(tc.seed, step, shard, attempt))
                    for shard in self.my_shards
                ]  # fmt: skip
                episodes = cat_episodes(self._play(policy, jobs), pad)
                episodes = self.shaping.sampled(episodes)  # a judge's scores, TTRV's votes: what the filters read
                keep = keep_groups(episodes, ac)  # [B/K]
                sampled.append(episodes)
                if keep.any():
                    kept.append(episodes.select_worlds(keep.repeat_interleave(group_size).nonzero().squeeze(-1)))
                    kept_groups += int(keep.sum())
                if kept_groups >= tc.prompts_per_step // self.world.size:
                    break
        episodes = cat_episodes(kept, pad) if kept else sampled[0]
        if episodes.num_worlds > self.rows:
            episodes = episodes.select_worlds(torch.arange(self.rows))
        return Collected(episodes, cat_episodes(sampled, pad), kept_groups, len(sampled), int(policy is self._copy))

    def _play(self, policy: VLMPolicy, jobs: list) -> list[Episodes]:
        """Each job's episodes: by the rollout workers, or here, one seeded shard at a time."""
        if self.workers is not None:
            return self.workers.collect(jobs)
        parts = []
        branch = self.cfg.algo.credit == "branch"
        for shard_seeds, group_size, sampling, torch_seed in jobs:
            torch.manual_seed(torch_seed)
            parts.append(
                collect_episodes(
                    policy, self.env, shard_seeds, group_size, sampling, keep_answered=self.shaping.keeps_answered,
                    branch=branch,
                )  # fmt: skip
            )
        return parts

    def rebuild(self) -> None:
        """Rebuild the env (and the rollout workers' envs) at the curriculum's current level (a prefetch running
        finishes first, at the level it started with)."""
        self.wait()
        self.env.close()
        self.env = make_env(self.cfg, self.shard_rows, self.curriculum)
        if self.workers is not None:
            self.workers.set_env(self.cfg.env.make_options(self.curriculum.options(self.cfg.env.options)))
        if self.world.is_main:
            level = self.cfg.curriculum.levels[self.curriculum.level]
            print(f"curriculum: {self.cfg.curriculum.option} = {level}", file=sys.stderr)

    def close(self) -> None:
        """Close the env and stop the rollout workers (idempotent). Errors are printed, not raised: the run's own
        error, if any, is the one to see."""
        self.wait()
        for name in ("env", "workers"):
            thing = getattr(self, name, None)
            setattr(self, name, None)
            if thing is None:
                continue
            try:
                thing.close()
            except Exception as error:  # noqa: BLE001
                print(f"closing the {'rollout workers' if name == 'workers' else name} failed: {error!r}",
                      file=sys.stderr)  # fmt: skip
