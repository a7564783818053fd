"""Group-level consistency rewards: TTRV's vote rewards and GRPO-CARE's consistency bonus, with CARE's EMA step.

Pure tensor functions over contiguous groups (rows [g*G, (g+1)*G) are one group), like the advantage estimators; the
trainer's glue (which answers, which likelihoods) is `mmrl.methods.consistency`.

* `vote_rewards`: TTRV (https://arxiv.org/abs/2510.06783) rewards without labels. Each sample scores the share of
  its group that gives the same answer (the empirical probability of its answer, the paper's frequency reward), plus
  a bonus for a low entropy of the group's empirical answer distribution.
* `care_bonus`: GRPO-CARE (https://arxiv.org/abs/2506.16141), the adaptive consistency bonus: a correct sample whose
  answer is more likely given its reasoning (under a slowly updated reference) than its group's correct peers' on
  average gains a bonus; the bonus replaces the KL penalty.
* `ema_update_`: the slowly updated reference, `ref <- decay * ref + (1 - decay) * policy`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch


def _grouped(x: torch.Tensor, group_size: int) -> torch.Tensor:
    if group_size < 1 or x.ndim != 1 or x.numel() % group_size:
        raise ValueError(f"a tensor of shape {tuple(x.shape)} does not split into groups of {group_size}")
    return x.view(-1, group_size)  # [B, G]


def vote_rewards(
    answers: torch.Tensor, *, group_size: int, entropy_coef: float = 0.5
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TTRV's label-free rewards (https://arxiv.org/abs/2510.06783): `vote + entropy_coef * certainty`.

    With `p_i` the share of sample i's group giving sample i's answer (answers read from the G samples, no label):

    * `vote_i = p_i`, the frequency reward: the majority answer scores most, a lone answer `1/G`.
    * `certainty_i = 1 + log(p_i) / log(G)`, in [0, 1]. Its mean over a group whose samples all answer is
      `1 - H(p) / log(G)`, one minus the normalised entropy of the group's empirical answer distribution: the paper's
      bonus for low entropy, split into each sample's part, since a term equal for the whole group would cancel in
      group-relative advantages. 1 when the whole group agrees, 0 for a lone answer.

    Samples without a readable answer (`answers < 0`) score 0 on both and do not count as anyone's agreement; they still
    count in G.

    Args:
        answers: `[R]` long, R = B*G, groups contiguous: equal ids are equal answers within a group, < 0 for none.
        group_size: G.
        entropy_coef: weight of the certainty term (>= 0; 0 leaves the frequency reward alone).

    Returns:
        `(rewards, vote, certainty)`, each `[R]` float32.
    """
    if entropy_coef < 0:
        raise ValueError(f"entropy_coef must be >= 0, got {entropy_coef}")
    grouped = _grouped(answers, group_size)  # [B, G]
    valid = grouped >= 0  # [B, G]
    same = (grouped.unsqueeze(2) == grouped.unsqueeze(1)) & valid.unsqueeze(2) & valid.unsqueeze(1)  # [B, G, G]
    share = same.sum(-1).float() / group_size  # [B, G], 0 where there is no answer
    if group_size > 1:
        certainty = torch.where(valid, 1.0 + share.clamp_min(1e-12).log() / math.log(group_size), 0.0)
    else:
        certainty = valid.float()  # one sample always agrees with itself
    vote, certainty = share.reshape(-1), certainty.reshape(-1)
    return vote + entropy_coef * certainty, vote, certainty


def care_bonus(
    consistency: torch.Tensor, correct: torch.Tensor, *, group_size: int, coef: float = 0.5, tol: float = 1e-4
) -> torch.Tensor:
    """GRPO-CARE's adaptive consistency bonus (https://arxiv.org/abs/2506.16141).

    `bonus_i = coef` where sample i is correct and its consistency is above the mean consistency of its group's correct
    samples by more than `tol`, else 0. (Identical completions score the same up to float noise, which batching and
    padding put in the last bits: without `tol` the bonus would go to whichever of them the noise favours.) The comparison within the group makes the bonus adaptive: it asks for more consistency than the
    peers reach, not for a fixed likelihood, so it neither saturates as the reference improves nor rewards a consistent
    wrong answer.

    Args:
        consistency: `[R]` each sample's consistency score, e.g. the reference's likelihood of its answer given its
            reasoning (any monotone score works: only the comparison within the group matters).
        correct: `[R]` bool, the sample's answer is correct.
        group_size: G.
        coef: the bonus (>= 0).
        tol: how far above the mean a consistency must be to count as above it (>= 0).

    Returns:
        `[R]` float32 bonus, 0 for wrong samples and for groups with fewer than two correct samples.
    """
    if coef < 0 or tol < 0:
        raise ValueError(f"coef and tol must be >= 0, got {coef} and {tol}")
    score = _grouped(consistency.float(), group_size)  # [B, G]
    right = _grouped(correct.bool(), group_size)  # [B, G]
    count = right.sum(-1, keepdim=True)  # [B, 1]
    mean = torch.where(right, score, 0.0).sum(-1, keepdim=True) / count.clamp_min(1)  # [B, 1] over correct samples
    above = right & (score > mean + tol) & (count >= 2)
    return (coef * above.float()).reshape(-1)


@torch.no_grad()
def ema_update_(target: Iterable[torch.Tensor], source: Iterable[torch.Tensor], *, decay: float) -> None:
    """`target <- decay * target + (1 - decay) * source`, in place, tensor by tensor (GRPO-CARE's slowly evolving
    reference; `decay` 1 keeps the target, 0 copies the source)."""
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"decay must be in [0, 1], got {decay}")
    for mine, theirs in zip(target, source, strict=True):
        mine.lerp_(theirs.to(mine.dtype), 1.0 - decay)
