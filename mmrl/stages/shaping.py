"""Reward shaping: every transform between the env's reward and the advantages, in the order they apply.

1. **Judge** (`judge.model`): a judge model scores each text answer against the observation it answered; the turn's
   reward gains `judge.weight` times the score (component `judge`; a reason joins the first step's `reasons`).
2. **Label-free votes** (`algo.label_free: ttrv`): the group's votes replace the env's reward (TTRV,
   `mmrl.methods.consistency.with_vote_rewards`; components `ttrv_vote`, `ttrv_certainty`).

   1 and 2 apply to every batch the collector samples (`Shaping.sampled`, called by `mmrl.stages.collect`), because the
   data-side filters (dynamic sampling, difficulty) and their refill read the rewards these give.
3. **Overlong penalty** (`algo.overlong.penalty`): DAPO's soft penalty joins each turn's reward (component
   `overlong`); the step's `reward/*` metrics see it.
4. **Overlong filter** (`algo.overlong.filter`): truncated rows (no EOS) stay in the group statistics but leave the
   loss (their completion mask is emptied; after 3, which reads their lengths).
5. **GRPO-CARE** (`algo.care.coef`): a correct answer more consistent under an EMA reference than its group's peers
   gains a bonus (`care/*` metrics).
6. **SRPO progress** (`algo.progress_coef`): a failed episode whose group has a success gains a reward by its
   latent distance to the successes (component `srpo`, `srpo/*` metrics).

   3 to 6 apply once to the step's collection (`Shaping.collected`, the trainer's call right after `collect`); 4 to
   6 touch only the episodes that train, so the step's `reward/*` metrics are the env's (and judge's) rewards with
   3 applied.

After the update, `Shaping.follow(policy)` moves GRPO-CARE's EMA reference (the trainer's call right after `update`).
Which groups train (dynamic sampling, difficulty, refill) is collection's choice (`mmrl.stages.collect`); the advantages
read the shaped rewards (`mmrl.stages.advantages`).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..algos.data import overlong_mask, soft_overlong_penalty
from ..methods.consistency import CareReference, make_care, with_vote_rewards
from ..methods.judge import Judge, RemoteJudge, make_judge
from ..methods.progress import with_progress_rewards
from ..policy import Policy
from ..runtime import distributed
from ..runtime.config import AlgoConfig, TrainConfig
from ..types import Collected, Episodes, Sampling


class Shaping:
    """The run's reward shaping (see the module docstring): holds the judge model and GRPO-CARE's reference.

    Args:
        cfg: the run's config.
        world: this process's place among the run's processes.
    """

    def __init__(self, cfg: TrainConfig, world: distributed.World):
        self.cfg, self.world = cfg, world
        self.judge: Judge | RemoteJudge | None = make_judge(cfg.judge)  # None without judge.model
        self.care: CareReference | None = None  # made from the policy at the first step (algo.care.coef > 0)

    @property
    def keeps_answered(self) -> bool:
        """Whether collection must keep each row's observation (the judge reads them)."""
        return self.judge is not None

    def sampled(self, episodes: Episodes) -> Episodes:
        """Transforms 1-2 on one sampled batch, before the data-side filters read it."""
        episodes = with_judge_rewards(episodes, self.judge, self.cfg.judge.weight)
        return with_vote_rewards(episodes, self.cfg.algo)

    def collected(
        self, collected: Collected, policy: Policy, sampling: Sampling
    ) -> tuple[Collected, dict[str, torch.Tensor | float]]:
        """Transforms 3-6 on the step's collection; returns it shaped, and the metrics of 5 and 6."""
        ac = self.cfg.algo
        episodes = with_overlong_penalty(collected.episodes, ac, sampling.max_new_tokens)
        sampled = with_overlong_penalty(collected.sampled, ac, sampling.max_new_tokens)
        if ac.overlong.filter:
            episodes = without_truncated(episodes, policy.eos_token_ids)
        metrics: dict[str, torch.Tensor | float] = {}
        if ac.care.coef > 0:
            if self.care is None:  # the policy the run starts its updates from (a resumed run's, after a resume)
                self.care = make_care(self.cfg, policy, self.world.size)
            episodes, care_metrics = self.care.shape(episodes, sampling.temperature)
            metrics.update(care_metrics)
        episodes, progress_metrics = with_progress_rewards(policy, episodes, ac)
        metrics.update(progress_metrics)
        return replace(collected, episodes=episodes, sampled=sampled), metrics

    def follow(self, policy: Policy) -> None:
        """After an update: GRPO-CARE's EMA reference takes one step towards `policy`."""
        if self.care is not None:
            self.care.follow(policy)

    def close(self) -> None:
        """Let go of the judge model (idempotent)."""
        judge, self.judge = self.judge, None
        if judge is not None:
            judge.close()


def with_judge_rewards(episodes: Episodes, judge: Judge | RemoteJudge | None, weight: float) -> Episodes:
    """The episodes with each row's answer scored by `judge` against the observation it answered: its turn's reward
    gains `weight` times the score, the scores summed per episode are the component `judge`, and the judge's reasons
    join the first step's `info["reasons"]`. Unchanged without a judge."""
    if judge is None:
        return episodes
    if episodes.answered_images is None or episodes.answered_instructions is None:
        raise ValueError("a judge needs each row's observation: collect with keep_answered=True")
    judged = judge.score(episodes.answered_images, episodes.answered_instructions, episodes.rollout.texts)
    scores = judged.scores.float().cpu()  # [M]
    step_rewards = episodes.step_rewards.index_put((episodes.world, episodes.turn), weight * scores, accumulate=True)
    per_world = torch.zeros(episodes.num_worlds).index_add(0, episodes.world, scores)  # [R]
    info = dict(episodes.info)
    first = (episodes.turn == 0).nonzero().squeeze(-1).tolist()  # the rows whose step `info` holds
    if any(judged.reasons[m] for m in first):
        reasons = list(info.get("reasons", [""] * episodes.num_worlds))
        for m in first:
            i, why = int(episodes.world[m]), judged.reasons[m]
            if why:
                reasons[i] = f"{reasons[i]}; {why}" if reasons[i] else why
        info["reasons"] = reasons
    components = {**episodes.components, "judge": per_world}
    return replace(episodes, step_rewards=step_rewards, components=components, info=info)


def with_overlong_penalty(episodes: Episodes, ac: AlgoConfig, max_new_tokens: int) -> Episodes:
    """The episodes with DAPO's soft overlong penalty added to each turn's reward and kept as component `overlong`."""
    if ac.overlong.penalty <= 0:
        return episodes
    lengths = episodes.rollout.completion_mask.sum(-1)  # [M] generated tokens
    penalty = soft_overlong_penalty(lengths, max_new_tokens, ac.overlong.cache_len, ac.overlong.penalty)  # [M]
    step_rewards = episodes.step_rewards.index_put((episodes.world, episodes.turn), penalty, accumulate=True)
    per_world = torch.zeros(episodes.num_worlds).index_add(0, episodes.world, penalty)  # [R]
    return replace(episodes, step_rewards=step_rewards, components={**episodes.components, "overlong": per_world})


def without_truncated(episodes: Episodes, eos_token_ids: list[int]) -> Episodes:
    """The episodes with the completion mask of every truncated row (no EOS generated) emptied: such rows stay in
    the group statistics but leave the loss."""
    rollout = episodes.rollout
    truncated = ~torch.isin(rollout.completion_ids, torch.tensor(eos_token_ids)).any(-1)  # [M]
    mask = overlong_mask(rollout.completion_mask, 0, truncated=truncated)
    return replace(episodes, rollout=replace(rollout, completion_mask=mask))
