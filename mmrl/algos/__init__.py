"""Advantage estimators, policy losses and the objective: pure tensor functions, the extensible ones registered.

The trainer looks estimators and losses up in `ADVANTAGES` (or `STEP_ADVANTAGES` for step credit, or
`CRITIC_ADVANTAGES` with a value head) and
`POLICY_LOSSES` by the names the config gives, and calls `objective` once per micro-batch; it never branches on the
variant itself. Closed choices (aggregation, KL estimator) are `Literal`s, not registries.

* `base`: the registries, the call each registered function has, `LossOutput`.
* `advantages`: GRPO, Dr. GRPO, RLOO, REINFORCE++ (episode credit) and their step-credit forms.
* `critic`: GAE over turns from a value head (`CRITIC_ADVANTAGES`), the clipped value loss.
* `correction`: importance weights for the gap between the sampler's log-probs and the trainer's.
* `losses`: the clipped surrogates, KL estimators, entropy terms and aggregation.
* `papo`: PAPO's perception terms and image masking.
* `consistency`: TTRV's label-free vote rewards, GRPO-CARE's consistency bonus and its EMA reference step.
* `objective`: surrogate + KL + entropy + PAPO in one function -> loss and metrics.
* `data`: the data-side options (dynamic sampling, difficulty filtering, overlong handling, multi-turn returns).
"""

from __future__ import annotations

from .advantages import (
    dr_grpo_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    step_dr_grpo_advantages,
    step_group_advantages,
)
from .base import (
    ADVANTAGES,
    CRITIC_ADVANTAGES,
    POLICY_LOSSES,
    STEP_ADVANTAGES,
    AdvantageFn,
    Aggregation,
    KLEstimator,
    LossOutput,
    PolicyLossFn,
    StepAdvantageFn,
)
from .consistency import care_bonus, ema_update_, vote_rewards
from .critic import explained_variance, gae_advantages, value_loss
from .losses import (
    aggregate,
    dual_clip_loss,
    entropy_bonus_loss,
    entropy_from_logits,
    gspo_loss,
    kl_estimate,
    kl_penalized_rewards,
    ppo_clip_loss,
)
from .objective import objective

__all__ = [
    "ADVANTAGES",
    "CRITIC_ADVANTAGES",
    "explained_variance",
    "gae_advantages",
    "value_loss",
    "POLICY_LOSSES",
    "STEP_ADVANTAGES",
    "AdvantageFn",
    "Aggregation",
    "KLEstimator",
    "LossOutput",
    "PolicyLossFn",
    "StepAdvantageFn",
    "aggregate",
    "care_bonus",
    "dr_grpo_advantages",
    "dual_clip_loss",
    "ema_update_",
    "entropy_bonus_loss",
    "entropy_from_logits",
    "grpo_advantages",
    "gspo_loss",
    "kl_estimate",
    "kl_penalized_rewards",
    "objective",
    "ppo_clip_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "step_dr_grpo_advantages",
    "step_group_advantages",
    "vote_rewards",
]
