"""Consistency methods on a step's episodes: TTRV's label-free rewards and GRPO-CARE's consistency bonus.

The math is in `mmrl.algos.consistency` (pure tensor functions over groups); this module reads what it needs from the
episodes and hands them back reshaped. (ACRE, the third consistency method, is an option of the dataset env:
`consistency: acre` in `sim.tasks.dataset`, since it asks the question a second time.)

* **TTRV** (`algo.label_free: ttrv`, https://arxiv.org/abs/2510.06783): `with_vote_rewards` replaces each episode's
  reward by the vote of its group: the share of the group giving the same parsed answer plus a bonus for a low entropy
  of the group's answer distribution. The env's labels then only reach the logs (`reward/<env component>`,
  `env/success_rate`), never the advantages; the held-out evaluation scores with labels as always.
* **GRPO-CARE** (`algo.care.coef > 0`, https://arxiv.org/abs/2506.16141): `CareReference` is an EMA copy of the
  policy; its likelihood of each answer given the completion's reasoning is the answer's consistency, and correct
  answers more consistent than their group's correct peers on average gain `algo.care.coef` (`care_bonus`). The bonus
  replaces the KL penalty (`algo.kl_coef` stays 0), and the EMA follows the policy after every update.
"""

from __future__ import annotations

import copy
import re
from dataclasses import replace

import torch

from rewards.consistency import answer_keys

from ..algos.consistency import care_bonus, ema_update_, vote_rewards
from ..policy import Policy
from ..runtime.config import AlgoConfig, TrainConfig
from ..types import Episodes, Rollout

_ANSWER_OPEN, _ANSWER_CLOSE = re.compile(r"<answer>", re.IGNORECASE), re.compile(r"</answer>", re.IGNORECASE)


def _first_answers(episodes: Episodes, method: str) -> torch.Tensor:
    """`[R]` long, the row holding each episode's (only) answer; refuses episodes of several turns."""
    if episodes.active[:, 1:].any():
        raise ValueError(f"{method} scores one answer per episode; this env's episodes run several turns")
    rows = torch.full((episodes.num_worlds,), -1, dtype=torch.long)
    first = (episodes.turn == 0).nonzero().squeeze(-1)
    rows[episodes.world[first]] = first
    return rows


# ---------------------------------------------------------------------------------------------------------------------
# TTRV
# ---------------------------------------------------------------------------------------------------------------------


def with_vote_rewards(episodes: Episodes, ac: AlgoConfig) -> Episodes:
    """The episodes with TTRV's vote rewards in place of the env's (with `algo.label_free: ttrv`; else unchanged).

    Each world's answer is read by `rewards.consistency.answer_keys` (`algo.ttrv.answer`); the vote and certainty
    terms join the components as `ttrv_vote` and `ttrv_certainty` (the env's own components stay, for the logs).
    """
    if ac.label_free != "ttrv":
        return episodes
    rows = _first_answers(episodes, "algo.label_free ttrv")
    keys = answer_keys([episodes.rollout.texts[m] if m >= 0 else "" for m in rows.tolist()], ac.ttrv.answer)
    index: dict[str, int] = {}
    answers = torch.tensor([-1 if k is None else index.setdefault(k, len(index)) for k in keys], dtype=torch.long)
    rewards, vote, certainty = vote_rewards(answers, group_size=ac.group_size, entropy_coef=ac.ttrv.entropy_coef)
    step_rewards = torch.zeros_like(episodes.step_rewards)
    step_rewards[:, 0] = rewards
    components = {**episodes.components, "ttrv_vote": vote, "ttrv_certainty": certainty}
    return replace(episodes, step_rewards=step_rewards, components=components)


# ---------------------------------------------------------------------------------------------------------------------
# GRPO-CARE
# ---------------------------------------------------------------------------------------------------------------------


def answer_token_mask(rollout: Rollout, tokenizer) -> torch.Tensor:
    """`[R, L]` bool, the completion tokens inside each row's last `<answer>...</answer>` pair (none without one).

    A token belongs to the answer when the characters it decodes to overlap the tag's content; offsets come from
    decoding growing prefixes of the row, so multi-token tags and answers are found whatever the tokenizer.
    """
    mask = torch.zeros_like(rollout.completion_mask)
    for r in range(len(rollout)):
        ids = rollout.completion_ids[r][rollout.completion_mask[r]].tolist()
        text = tokenizer.decode(ids, skip_special_tokens=True)
        opens = list(_ANSWER_OPEN.finditer(text))
        close = _ANSWER_CLOSE.search(text, opens[-1].end()) if opens else None
        if close is None:
            continue
        start, end = opens[-1].end(), close.start()
        before = 0
        for k in range(len(ids)):
            after = len(tokenizer.decode(ids[: k + 1], skip_special_tokens=True))
            if before < end and after > start and after > before:  # the token's characters overlap the content
                mask[r, k] = True
            before = after
    return mask


class CareReference:
    """GRPO-CARE's slowly evolving reference: an EMA copy of the policy that scores answers given their reasoning.

    Args:
        policy: the policy it starts as (copied).
        decay: the EMA's decay per update, `ref <- decay * ref + (1 - decay) * policy` (`algo.care.ema_decay`).
        coef: the bonus (`algo.care.coef`).
        group_size: G.
        micro_batch_size: rows per scoring forward.
    """

    def __init__(self, policy: Policy, decay: float, coef: float, group_size: int, micro_batch_size: int):
        self.policy = copy.deepcopy(policy)
        self.policy.model.requires_grad_(False).eval()
        self.decay, self.coef, self.group_size, self.micro_batch_size = decay, coef, group_size, micro_batch_size

    @torch.no_grad()
    def consistency(self, rollout: Rollout, temperature: float = 1.0) -> torch.Tensor:
        """`[R]` the reference's mean per-token probability of each row's answer tokens given the prompt and the
        reasoning before them (the geometric mean, `exp` of the mean log-prob); 0 for a row without an answer."""
        mask = answer_token_mask(rollout, self.policy.processor.tokenizer)  # [R, L]
        total = torch.zeros(len(rollout))
        for start in range(0, len(rollout), self.micro_batch_size):
            stop = min(start + self.micro_batch_size, len(rollout))
            logprobs = self.policy.logprobs(rollout.rows(start, stop), temperature=temperature).float().cpu()
            part = mask[start:stop, : logprobs.shape[1]]
            total[start:stop] = torch.where(part, logprobs, 0.0).sum(-1)
        count = mask.sum(-1)
        return torch.where(count > 0, (total / count.clamp_min(1)).exp(), 0.0)

    def shape(self, episodes: Episodes, temperature: float = 1.0) -> tuple[Episodes, dict[str, torch.Tensor]]:
        """The episodes with the consistency bonus added to each episode's reward, and the step's `care/*` metrics
        (the step's `reward/*` are logged before shaping): mean consistency (over all samples and over the correct
        ones), the mean bonus and the share of samples given it."""
        if episodes.success is None:
            raise ValueError("GRPO-CARE (algo.care.coef > 0) needs an env that reports success (correct answers)")
        rows = _first_answers(episodes, "GRPO-CARE (algo.care.coef > 0)")
        scores = self.consistency(episodes.rollout, temperature)  # [M]
        consistency = torch.where(rows >= 0, scores[rows.clamp_min(0)], 0.0)  # [R]
        bonus = care_bonus(consistency, episodes.success, group_size=self.group_size, coef=self.coef)  # [R]
        step_rewards = episodes.step_rewards.clone()
        step_rewards[:, 0] += bonus
        shaped = replace(episodes, step_rewards=step_rewards)
        correct = episodes.success.bool()
        metrics = {
            "care/consistency": consistency.mean(),
            "care/consistency_correct": consistency[correct].mean() if correct.any() else torch.zeros(()),
            "care/bonus": bonus.mean(),
            "care/bonus_rate": (bonus > 0).float().mean(),
        }
        return shaped, metrics

    def follow(self, policy: Policy) -> None:
        """One EMA step towards `policy`'s current weights (after each update)."""
        ema_update_(self.policy.model.parameters(), policy.model.parameters(), decay=self.decay)


def make_care(cfg: TrainConfig, policy: Policy, world_size: int = 1) -> CareReference | None:
    """The run's GRPO-CARE reference (with `algo.care.coef > 0`; else None)."""
    ac = cfg.algo
    if ac.care.coef <= 0:
        return None
    if world_size > 1:
        raise ValueError("algo.care.coef > 0 (GRPO-CARE) under torchrun is not supported yet: use one process")
    return CareReference(policy, ac.care.ema_decay, ac.care.coef, ac.group_size, cfg.trainer.micro_batch_size)
