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

* **Asynchronous collection** (`trainer.max_staleness` = k >= 1). A thread plays the steps ahead of the trainer with a
  copy of the policy (or, with `model.generation_backend=vllm_process`, through the engine process that copy's
  backend talks to), on a fixed schedule: step s is played by the weights of version `max(0, s - k)` (the weights
  after that many trainer steps), so its rows are `min(s, k)` updates stale, the same in every run whatever the
  machine's timing. When step s starts, steps s..s+k are queued; the one missing (s + k) is queued with a snapshot
  of the current weights. A checkpoint holds every queued step: the finished ones as their episodes, the others as
  their weight snapshot, re-queued on resume, so a killed run neither loses nor duplicates a group and the resumed
  one trains on what the uninterrupted one would. Rows are never more than k updates stale: a queued step older
  than that (only after resuming with a smaller k) is dropped whole and collected again with the current weights,
  since the bound is the promise about how off-policy an update may be, and the rollout correction (truncated
  importance weights on the recomputed old log-probs) is what corrects the staleness within it. Under torchrun each
  process's thread plays its own shards with a whole, unsharded copy (`policy_copy`); the snapshots are gathered
  from the shards by the trainer's thread when they are taken (`weights_snapshot`, the same point of the step in
  every process), so the thread runs no collective, and a checkpoint gathers every process's queued steps to rank 0
  (`checkpointed`), each process taking its own back on resume.

A curriculum step rebuilds the env at the new level (`rebuild`). A run whose every group is flat for `FLAT_STEPS`
steps in a row (zero advantage: the reward teaches nothing) says so once (`FlatGroupWatch`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import queue
import sys
import threading
from dataclasses import dataclass, field

import torch

from sim.seeds import sampling_seed, train_seeds
from sim.workers import make_vec_env

from .. import algos
from ..algos.data import difficulty_filter_keep, dynamic_sampling_keep
from ..methods.curriculum import Curriculum
from ..policy import Policy
from ..policy.lora import merged_named_weights, plain_model
from ..runtime import distributed
from ..runtime.config import AlgoConfig, ConfigError, TrainConfig
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
        raise ConfigError(
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


FLAT_STEPS = 20
"""Consecutive steps whose every group is flat before the run says so (once): a run that learns nothing says why."""


class FlatGroupWatch:
    """Says once when every group of `FLAT_STEPS` consecutive steps was flat (its G returns equal: zero advantage
    under every group baseline, so the policy gets no gradient from the reward, only from the KL and entropy terms).

    The commonest cause is a `model.path=tiny:<family>` model: random weights for plumbing, which score about 0 on
    every sample. It reads the groups as sampled, before any filter (`data/flat_groups` logs the same fraction each
    step); under torchrun each process watches its own groups and rank 0 prints. Estimators that do not compare
    within a group (a critic's, or step credit) are not watched.
    """

    def __init__(self, cfg: TrainConfig):
        ac = cfg.algo
        self.group_size, self.gamma, self.model_path = ac.group_size, ac.gamma, cfg.model.path
        self.watching = ac.group_size > 1 and ac.credit != "step" and ac.advantage not in algos.CRITIC_ADVANTAGES
        self.flat_steps = 0  # consecutive steps whose every group was flat, up to now

    def update(self, episodes: Episodes) -> str | None:
        """The warning, the first time a step ends `FLAT_STEPS` flat ones in a row; None otherwise."""
        if not self.watching:
            return None
        flat = not dynamic_sampling_keep(episodes.returns(self.gamma), self.group_size).any()
        self.flat_steps = self.flat_steps + 1 if flat else 0
        if self.flat_steps != FLAT_STEPS:
            return None
        self.watching = False
        why = (
            f"model.path={self.model_path} is random weights for plumbing: it scores about 0 and learns nothing; "
            "train a real checkpoint (model.path=<folder>)"
            if str(self.model_path).startswith("tiny:")
            else "the task is too hard or too easy for the model, or its samples too alike (sampling.temperature)"
        )
        return (
            f"warning: every group of the last {FLAT_STEPS} steps had equal rewards (data/flat_groups = 1), so every "
            f"advantage was 0 and the reward teaches nothing; {why}"
        )


@dataclass
class Queued:
    """One step queued for asynchronous collection: the weights that play it, then what they played.

    Attributes:
        step: the trainer step the episodes are for.
        version: the weights' version (trainer steps completed when they were snapshot).
        weights: the snapshot (`name -> tensor` of the policy's parameters) until the step is played; None after.
        result: the episodes (or the error) once played.
    """

    step: int
    version: int
    weights: dict[str, torch.Tensor] | None
    result: Collected | BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event, repr=False)


def weights_snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of every parameter of `model`, by name (what a queued step is played with).

    For a model FSDP2 shards (torchrun), the whole weights, LoRA merged, as `policy_copy`'s model names them:
    gathered here, a collective every process enters at the same point of the step (the trainer's thread, in
    lockstep), so that the collector thread never needs one.
    """
    if not distributed.is_sharded(model):
        return {name: p.detach().clone() for name, p in model.named_parameters()}
    with distributed.full_weights(model):
        return {name: p.detach().clone() for name, p in merged_named_weights(model)}


def policy_copy(policy: Policy) -> Policy:
    """The collector thread's copy of `policy` (weights written per queued step): a deep copy, or, for a policy whose
    model FSDP2 shards (which `deepcopy` refuses), a deep copy of the rest around a whole, adapter-free model of the
    same class (`distributed.unsharded_module`), which samples with no collective."""
    if not distributed.is_sharded(policy.model):
        clone = copy.deepcopy(policy)
    else:  # a kind whose copy cannot be built so (`sharded_async`) is refused when the run is built
        whole = distributed.unsharded_module(plain_model(policy.model), policy.device)
        clone = copy.deepcopy(policy, {id(policy.model): whole})
    clone.model.requires_grad_(False)
    return clone


def weight_senders(held: list[list[tuple[int, bool]]]) -> dict[int, int]:
    """Which process sends each version's weight snapshot into a torchrun checkpoint: the first that holds it.

    Args:
        held: per process, `(version, holds its weights)` of each queued step (a played step's are dropped).

    >>> weight_senders([[(0, False), (1, True)], [(0, True), (1, True)]])
    {1: 0, 0: 1}
    """
    senders: dict[int, int] = {}
    for rank, entries in enumerate(held):
        for version, has in entries:
            if has:
                senders.setdefault(version, rank)
    return senders


def merge_ranks(gathered: list[list[dict]]) -> dict:
    """A torchrun checkpoint's queued steps from every process's `in_flight()` entries, of which only the sender's
    (`weight_senders`) kept `weights`: `{"ranks": the entries without weights, "weights": {version: snapshot}}`."""
    ranks, snapshots = [], {}
    for entries in gathered:
        ranks.append([])
        for entry in entries:
            entry = dict(entry)
            if "weights" in entry:
                snapshots[entry["version"]] = entry.pop("weights")
            ranks[-1].append(entry)
    return {"ranks": ranks, "weights": snapshots}


def own_entries(pending: dict, rank: int) -> list[dict]:
    """Process `rank`'s queued steps of a torchrun checkpoint (`merge_ranks`), each unplayed one with its weights."""
    weights = pending["weights"]
    return [e if "collected" in e else {**e, "weights": weights[e["version"]]} for e in pending["ranks"][rank]]


def _entries(pending: list[dict] | dict) -> list[dict]:
    """Every queued step of a checkpoint's `checkpointed()`, all processes'."""
    return [e for entries in pending["ranks"] for e in entries] if isinstance(pending, dict) else pending


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
        self.cfg, self.world, self.curriculum, self.sampling, self.shaping = cfg, world, curriculum, sampling, shaping
        self.num_shards = generation_shards or tc.generation_shards or world.size
        self.my_shards = distributed.prompt_shards(tc.prompts_per_step, self.num_shards, world)
        self.shard_rows = tc.prompts_per_step // self.num_shards * cfg.algo.group_size  # worlds of one shard
        self.rows = len(self.my_shards) * self.shard_rows  # this process's R
        self.env = make_env(cfg, self.shard_rows, curriculum)  # the env holds one shard at a time
        self.workers: RolloutWorkers | None = None
        # Asynchronous collection (trainer.max_staleness = k >= 1, see the module docstring): steps queued in order
        # (`_queued`, by step), played one at a time by a thread with a copy of the policy (`_copy`).
        self.max_staleness = tc.max_staleness
        self.dropped_groups = 0  # groups of queued steps dropped as older than k (logged as pipeline/dropped_groups)
        self._copy: Policy | None = None
        self._queued: dict[int, Queued] = {}
        self._lock = threading.Lock()  # over `_queued` and each entry's weights/result (the thread writes them)
        self._jobs: queue.Queue[Queued | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._restored: list[dict] = []  # a checkpoint's unplayed steps, queued at the first `collect`
        self.flat_watch = FlatGroupWatch(cfg)

    # ------------------------------------------------------------------ asynchronous collection
    def queue_ahead(self, policy: Policy, step: int) -> None:
        """Queue steps `step`..`step + k` that are not queued yet (before the last step), with a snapshot of
        `policy`'s weights as they are now (version `step`): on the fixed schedule only `step + k` is missing."""
        last = min(step + self.max_staleness, self.cfg.trainer.total_steps - 1)
        missing = [s for s in range(step, last + 1) if s not in self._queued]
        if not missing:
            return
        if self._copy is None:
            self._copy = policy_copy(policy)
        weights = weights_snapshot(policy.model)  # shared by the steps queued now (one version)
        for s in missing:
            self._submit(Queued(s, step, weights))

    def _submit(self, job: Queued) -> None:
        with self._lock:
            self._queued[job.step] = job
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="collector", daemon=True)
            self._thread.start()
        self._jobs.put(job)

    def _serve(self) -> None:
        """The collector thread: plays queued steps in order, each with its own weights snapshot."""
        while (job := self._jobs.get()) is not None:
            try:
                with torch.no_grad():
                    for name, p in self._copy.model.named_parameters():
                        p.copy_(job.weights[name])
                # An engine process: its pushes carry the version, its samples return it.
                self._copy.expect_version(job.version)
                result: Collected | BaseException = self._collect(self._copy, self._copy.model, job.step)
                sampled = self._copy.sampled_version()  # None: sampled with the copy's own (current) weights
                if sampled is not None and sampled != job.version:
                    raise RuntimeError(f"step {job.step} was sampled by weights version {sampled}, "
                                       f"queued with version {job.version}")  # fmt: skip
                result = dataclasses.replace(result, version=job.version)
            except BaseException as error:  # noqa: BLE001  (re-raised in the trainer's thread by `collect`)
                result = error
            self._copy.expect_version(None)
            with self._lock:
                job.result, job.weights = result, (job.weights if isinstance(result, BaseException) else None)
            job.done.set()

    def wait(self) -> None:
        """Let every queued step finish (before the env is rebuilt, a held-out evaluation seeds torch's generator in
        this thread, or the run ends)."""
        for job in list(self._queued.values()):
            job.done.wait()

    def in_flight(self) -> list[dict]:
        """Every queued step as a checkpoint keeps it: `{"step", "version", "collected"}` once played, `{"step",
        "version", "weights"}` before (re-queued on resume). Does not wait for the thread."""
        with self._lock:
            kept = []
            for job in sorted(self._queued.values(), key=lambda j: j.step):
                entry = {"step": job.step, "version": job.version}
                if isinstance(job.result, Collected):
                    entry["collected"] = job.result
                else:  # not played yet, or failed (the resumed run plays it again)
                    entry["weights"] = job.weights
                kept.append(entry)
            return kept

    def checkpointed(self) -> list[dict] | dict | None:
        """What a checkpoint keeps of the queued steps: `in_flight()` in one process. Under torchrun every process
        must call it at the same point (it gathers): each process played its own shards, so rank 0 gets
        `{"ranks": [each process's in_flight(), without weights], "weights": {version: snapshot}}`, one snapshot
        per version (every process holds the same one), sent by one process (`weight_senders`); the others get
        None."""
        mine = self.in_flight()
        if self.world.size == 1:
            return mine
        senders = weight_senders(self.world.gather_objects([(e["version"], "weights" in e) for e in mine]))
        sent, stripped = set(), []
        for entry in mine:
            entry = dict(entry)
            weights = entry.pop("weights", None)
            version = entry["version"]
            if weights is not None and senders[version] == self.world.rank and version not in sent:
                entry["weights"] = weights
                sent.add(version)
            stripped.append(entry)
        gathered = self.world.gather_objects(stripped, everyone=False)
        return None if gathered is None else merge_ranks(gathered)

    def restore(self, pending: list[dict] | dict | tuple[int, Collected] | None) -> None:
        """Take back a checkpoint's queued steps (`checkpointed`): played ones as they are, the others re-queued
        with their weights, so that a resumed run trains on what the killed one would. Under torchrun each process
        takes its own; the number of processes must be the checkpoint's. (A checkpoint of the one-step pipeline
        before it was generalised holds `(step, episodes)`.)"""
        if pending is None:
            return
        if isinstance(pending, tuple):
            pending = [{"step": pending[0], "version": pending[0] - 1, "collected": pending[1]}]
        ranks = len(pending["ranks"]) if isinstance(pending, dict) else 1
        if ranks != self.world.size and any("collected" in e for e in _entries(pending)):
            raise ValueError(
                f"the checkpoint holds steps played ahead (trainer.max_staleness) by {ranks} process(es), each its "
                f"own share of the prompts; resume it with {ranks} process(es), not {self.world.size}"
            )
        if isinstance(pending, dict):  # unplayed steps only, if the number of processes changed: any rank's will do
            pending = own_entries(pending, self.world.rank if ranks == self.world.size else 0)
        for entry in pending:
            if "collected" in entry:
                job = Queued(entry["step"], entry["version"], None, entry["collected"])
                job.done.set()
                with self._lock:
                    self._queued[job.step] = job
            elif self._copy is None:  # the policy is not loaded yet: copied at the first `collect`
                self._restored.append(entry)
            else:
                self._submit(Queued(entry["step"], entry["version"], entry["weights"]))

    def start_workers(self, policy: Policy) -> None:
        """Start the rollout workers, copies of `policy` (with `trainer.rollout_workers > 0`; else nothing)."""
        tc = self.cfg.trainer
        if tc.rollout_workers > 0:
            self.workers = RolloutWorkers(
                policy, self.cfg.env.name, self.shard_rows, self.cfg.env.make_options(self.curriculum.options(self.cfg.env.options)),
                tc.rollout_workers, threads=max(tc.threads, 1), timeout_s=tc.rollout_timeout_s,
                keep_answered=self.shaping.keeps_answered,
            )  # fmt: skip

    @torch.no_grad()
    def collect(self, policy: Policy, model: torch.nn.Module, step: int) -> Collected:
        """Step `step`'s episodes, played by `policy` (whose possibly sharded module is `model`) now, or, with
        `trainer.max_staleness` = k >= 1, by the collector thread on the schedule of the module docstring
        (`Collected.stale` = the updates since its weights, at most k)."""
        if not self.max_staleness:
            return self._watched(self._collect(policy, model, step))
        if self._copy is None:
            self._copy = policy_copy(policy)
        for entry in self._restored:
            self._submit(Queued(entry["step"], entry["version"], entry["weights"]))
        self._restored = []
        job = self._queued.get(step)
        if job is not None and step - job.version > self.max_staleness:  # older than k: drop it, play it again
            job.done.wait()
            self.dropped_groups += self.cfg.trainer.prompts_per_step
            with self._lock:
                del self._queued[step]
        self.queue_ahead(policy, step)
        job = self._queued[step]
        job.done.wait()
        with self._lock:
            del self._queued[step]
        if isinstance(job.result, BaseException):
            raise job.result
        return self._watched(dataclasses.replace(job.result, stale=step - job.version))

    def _watched(self, collected: Collected) -> Collected:
        """`collected`, after the flat-group watch has seen it (and rank 0 printed its warning, the one time)."""
        warning = self.flat_watch.update(collected.sampled)
        if warning is not None and self.world.is_main:
            print(warning, file=sys.stderr)
        return collected

    def _collect(self, policy: Policy, model: torch.nn.Module, step: int) -> Collected:
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
        return Collected(episodes, cat_episodes(sampled, pad), kept_groups, len(sampled), version=step)

    def _play(self, policy: Policy, jobs: list) -> list[Episodes]:
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
        """Rebuild the env (and the rollout workers' envs) at the curriculum's current level (queued steps finish
        first, at the level they were queued with: which level plays a step does not depend on timing)."""
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
        if self._thread is not None:  # steps not started are dropped; the one in play finishes (it cannot be cut)
            with contextlib.suppress(queue.Empty):
                while True:
                    self._jobs.get_nowait()
            self._jobs.put(None)
            self._thread.join()
            self._thread = None
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
