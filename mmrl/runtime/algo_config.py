"""The `algo` section of the configuration (`mmrl.runtime.config`) and its sub-sections, one per method that plugs
into the stages: `algo.papo.*`, `algo.critic.*`, `algo.overlong.*`, `algo.ttrv.*`, `algo.care.*`. Each section
checks its own fields when it is built; `AlgoConfig` checks what reads more than one of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..algos import ADVANTAGES, CRITIC_ADVANTAGES, POLICY_LOSSES, STEP_ADVANTAGES, Aggregation
from .schema import require

# Each policy loss's own clip range and aggregation: what algo.clip_low, algo.clip_high and algo.aggregation left at
# null resolve to (a loss not listed takes ppo_clip's). PPO's token ratio: DAPO's clip-higher range
# (https://arxiv.org/abs/2503.14476), room for unlikely tokens to rise, averaged over tokens. GSPO's sequence ratio, the
# geometric mean of its token ratios, stays far closer to 1: the paper clips it at 3e-4 / 4e-4 and averages per
# sequence (https://arxiv.org/abs/2507.18071, section 5.1), as gspo_loss's own defaults do.
LOSS_DEFAULTS: dict[str, dict[str, Any]] = {
    "ppo_clip": {"clip_low": 0.2, "clip_high": 0.28, "aggregation": "token_mean"},
    "dual_clip": {"clip_low": 0.2, "clip_high": 0.28, "aggregation": "token_mean"},
    "gspo": {"clip_low": 3e-4, "clip_high": 4e-4, "aggregation": "seq_mean_token_mean"},
}
# GSPO refuses a range wider than this, 25 times the paper's: one that wide is a token ratio's (PPO's 0.2 / 0.28 left
# in place), under which GSPO's sequence ratios would seldom clip.
GSPO_MAX_CLIP = 0.01


@dataclass(frozen=True)
class PAPOConfig:
    """Perception-aware policy optimisation (PAPO, https://arxiv.org/abs/2507.06448): a second pass on a masked copy
    of each image; the KL between the two passes is pushed up with weight `gamma` (0 turns PAPO off)."""

    gamma: float = 0.0
    eta: float = 0.0  # double-entropy regulariser weight (entropy of both passes), against loss hacking
    mask: Literal["patches", "pixels"] = "patches"  # blacken whole vision patches, or pixel-tensor entries
    mask_ratio: float = 0.6  # official: patches at 0.6; TRL's version: pixels at 0.3
    grad_through_masked: bool = False  # official: no gradient through the masked pass
    kl_bound: float | None = None  # clamp the per-token KL to [0, bound] (TRL used 0.2)
    # With gamma 0: still run the masked pass (no gradient) and log papo/*, to measure how much a baseline policy
    # looks at its images (the same KL PAPO pushes up), at the cost of one more forward pass.
    monitor: bool = False

    def __post_init__(self):
        for name in ("gamma", "eta"):
            require(getattr(self, name) >= 0, f"algo.papo.{name}", f"must be >= 0, got {getattr(self, name)}")
        require(0 <= self.mask_ratio <= 1, "algo.papo.mask_ratio", "must be in [0, 1]")
        require(self.kl_bound is None or self.kl_bound > 0, "algo.papo.kl_bound", "must be > 0 or null")

    @property
    def masked_pass(self) -> bool:
        """Whether the update runs the masked pass: for PAPO's loss, or to monitor its KL."""
        return self.gamma > 0 or self.monitor


@dataclass(frozen=True)
class CriticConfig:
    """A critic (algo.advantage gae): a value head on the policy's last prompt hidden state (mmrl/methods/critic.py),
    GAE over turns with algo.gamma and `gae_lambda`, the clipped value loss; the head alone trains for
    `warmup_steps`."""

    gae_lambda: float = 0.95
    value_coef: float = 0.5
    value_clip: float = 0.2  # 0: no clip
    lr: float = 1e-3
    hidden: int = 256  # units of the head's hidden layer; 0: a linear head
    warmup_steps: int = 0
    trunk_grad: bool = False  # let the value loss train the policy's trunk too (a shared actor-critic)
    time: bool = False  # the head also reads the share of the episode's turns left (time-aware values)

    def __post_init__(self):
        require(0 <= self.gae_lambda <= 1, "algo.critic.gae_lambda", "must be in [0, 1]")
        for name in ("value_coef", "value_clip", "hidden", "warmup_steps"):
            require(getattr(self, name) >= 0, f"algo.critic.{name}", f"must be >= 0, got {getattr(self, name)}")
        require(self.lr > 0, "algo.critic.lr", "must be > 0")


@dataclass(frozen=True)
class OverlongConfig:
    """DAPO's overlong handling: leave completions cut off at max_new_tokens (no EOS) out of the loss (`filter`),
    and/or add a length penalty ramping from 0 to -`penalty` over the last `cache_len` tokens (0 turns it off)."""

    filter: bool = False
    penalty: float = 0.0
    cache_len: int = 8

    def __post_init__(self):
        require(self.penalty >= 0, "algo.overlong.penalty", f"must be >= 0, got {self.penalty}")
        require(self.cache_len >= 1, "algo.overlong.cache_len", "must be >= 1")


@dataclass(frozen=True)
class TTRVConfig:
    """TTRV's votes (algo.label_free ttrv, https://arxiv.org/abs/2510.06783): each sample's reward is the share of
    its group giving the same parsed answer plus `entropy_coef` x its part in a low entropy of the group's answer
    distribution."""

    entropy_coef: float = 0.5
    answer: Literal["choice", "text"] = "choice"  # answers compared by letter (parse_choice) or normalised text

    def __post_init__(self):
        require(self.entropy_coef >= 0, "algo.ttrv.entropy_coef", f"must be >= 0, got {self.entropy_coef}")


@dataclass(frozen=True)
class CareConfig:
    """GRPO-CARE (https://arxiv.org/abs/2506.16141): `coef` > 0 adds this bonus to correct answers whose likelihood
    given their reasoning, under an EMA copy of the policy, beats the mean of the group's correct samples; it
    replaces the KL term."""

    coef: float = 0.0
    ema_decay: float = 0.995  # the EMA reference's decay per update (1: frozen, 0: the policy itself)

    def __post_init__(self):
        require(self.coef >= 0, "algo.care.coef", f"must be >= 0 (0: off), got {self.coef}")
        require(0 <= self.ema_decay <= 1, "algo.care.ema_decay", f"must be in [0, 1], got {self.ema_decay}")


@dataclass(frozen=True)
class AlgoConfig:
    group_size: int = 8  # G completions per prompt
    advantage: str = "grpo"  # mmrl.algos.ADVANTAGES (grpo, dr_grpo, rloo, reinforce_pp) or CRITIC_ADVANTAGES (gae)
    scale_by_std: bool = True
    loss: str = "ppo_clip"  # a name in mmrl.algos.POLICY_LOSSES: ppo_clip, dual_clip, gspo
    # The ratio's clip range [1 - clip_low, 1 + clip_high] and how per-token terms become one number; null: the loss's
    # own (LOSS_DEFAULTS: ppo_clip and dual_clip 0.2 / 0.28 / token_mean, gspo 3e-4 / 4e-4 / seq_mean_token_mean),
    # resolved when the config is built, so every reader sees the values in force.
    clip_low: float | None = None
    clip_high: float | None = None
    aggregation: Aggregation | None = None
    kl_coef: float = 0.0  # > 0 loads a frozen reference copy of the initial policy
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    entropy_coef: float = 0.0  # entropy bonus weight
    # Drop groups whose rewards are all equal (they carry no GRPO signal) before the update (DAPO).
    dynamic_sampling: bool = False
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    papo: PAPOConfig = field(default_factory=PAPOConfig)
    # Refill: with dynamic_sampling or a difficulty filter, sample up to this many batches of B prompts per step
    # until B groups pass (DAPO's max_num_gen_batches); 1 trains on whatever passed the first batch.
    max_sample_batches: int = 1
    # Online difficulty filtering: keep prompts whose group success rate (mean reward where the env has no
    # success) lies strictly inside (difficulty_low, difficulty_high); None on both turns it off.
    difficulty_low: float | None = None
    difficulty_high: float | None = None
    # Multi-turn credit: "episode" gives every turn the GRPO advantage of the episode's discounted return;
    # "step" compares each turn's return-to-go with the same turn of the other group members.
    # ("gigpo" with step credit: GiGPO, the episode's GRPO advantage plus gigpo_step_weight x the turn's return
    # normalised among the group's turns that saw the same observation, its anchor state.)
    # "branch": policy-iteration rollouts. Each group plays greedily except at one turn, drawn uniformly per group,
    # where its G worlds sample; only that turn's rows train, with the group advantage of the episode returns. The
    # greedy prefix is the same in every world of the group (same seed, same answers), so the returns differ only
    # through the sampled answer and the greedy play after it: each answer is scored by what the greedy policy,
    # the one evaluated, makes of it.
    credit: Literal["episode", "step", "branch"] = "episode"
    gamma: float = 1.0  # discount over turns
    gigpo_step_weight: float = 1.0
    # PPO epochs and mini-batches (verl's ppo_epochs / ppo_mini_batch_size): each rollout feeds ppo_epochs passes,
    # each pass split into mini-batches of mini_batch_groups prompt groups (0: the whole rollout) in a fresh order,
    # one optimiser step per mini-batch. With more than one step per rollout the ratio leaves 1 and the clips bind.
    ppo_epochs: int = 1
    mini_batch_groups: int = 0
    # The "old" log-probs of the ratio: the sampler's ("sampling"), or the trainer's own, recomputed before the
    # step's first update ("recompute"; the sampler's are then compared with them, `mismatch/*`). "auto": recompute
    # where the sampler is another computation (model.generation_backend vllm) or older weights
    # (trainer.max_staleness 1), or a correction is asked for.
    old_logprobs: Literal["auto", "sampling", "recompute"] = "auto"
    # Truncated (TIS) or masked (MIS) importance weights pi_old / pi_rollout, per token or per sequence, on the
    # surrogate (`mmrl.algos.correction`); "auto": token_truncate wherever the old log-probs are recomputed.
    rollout_correction: Literal[
        "auto", "none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"
    ] = "auto"
    rollout_correction_cap: float = 2.0  # truncate at it; mask outside [1/cap, cap]
    critic: CriticConfig = field(default_factory=CriticConfig)  # read with algo.advantage gae
    # Label-free rewards (mmrl/methods/consistency.py): "ttrv", TTRV's votes (algo.ttrv) replace the env's reward,
    # which (its labels) is then only logged, never trained on.
    label_free: Literal["off", "ttrv"] = "off"
    ttrv: TTRVConfig = field(default_factory=TTRVConfig)
    care: CareConfig = field(default_factory=CareConfig)
    # SRPO (https://arxiv.org/abs/2511.15605): > 0 gives each failed episode up to this much reward for how close it
    # came to its group's successes, in the policy's own vision features (mmrl/methods/progress.py).
    progress_coef: float = 0.0

    def __post_init__(self):
        own = LOSS_DEFAULTS.get(self.loss, LOSS_DEFAULTS["ppo_clip"])
        for name, value in own.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)  # frozen: resolved once, here, before any check reads it
        require(self.group_size >= 1, "algo.group_size", "must be >= 1")
        known = list(dict.fromkeys([*ADVANTAGES.names(), *CRITIC_ADVANTAGES.names(), *STEP_ADVANTAGES.names()]))
        require(self.advantage in known, "algo.advantage", f"{self.advantage!r} is not one of {known}")
        require(
            self.credit == "step" or self.advantage in ADVANTAGES or self.advantage in CRITIC_ADVANTAGES,
            "algo.advantage",
            f"{self.advantage!r} gives each turn its own advantage: it needs algo.credit step, not {self.credit!r}",
        )
        require(self.gigpo_step_weight >= 0, "algo.gigpo_step_weight", "must be >= 0")
        with_critic = self.advantage in CRITIC_ADVANTAGES
        require(self.loss in POLICY_LOSSES, "algo.loss", f"{self.loss!r} is not one of {POLICY_LOSSES.names()}")
        require(
            not (with_critic and self.credit == "step"),
            "algo.credit",
            f"'step' cannot be combined with algo.advantage {self.advantage!r}: its advantages are per turn already "
            "(leave algo.credit at episode)",
        )
        require(
            with_critic or self.credit != "step" or self.advantage in STEP_ADVANTAGES,
            "algo.credit",
            f"'step' works with algo.advantage {' or '.join(STEP_ADVANTAGES.names())}, not {self.advantage!r} (use "
            "algo.credit=episode with it)",
        )
        require(
            self.credit != "branch" or self.advantage in ADVANTAGES,
            "algo.credit",
            f"'branch' compares the group's episode returns: it needs an episode estimator "
            f"({' or '.join(ADVANTAGES.names())}), not {self.advantage!r}",
        )
        require(
            self.credit != "branch" or self.group_size >= 2,
            "algo.credit",
            "'branch' compares the G answers sampled at the branch turn: it needs algo.group_size >= 2",
        )
        require(self.advantage != "rloo" or self.group_size >= 2, "algo.advantage", "rloo needs algo.group_size >= 2")
        require(  # a group of one answer is its own mean: every advantage 0, nothing trains
            self.advantage not in ("grpo", "dr_grpo") or self.group_size >= 2,
            "algo.group_size",
            f"is 1, under which every {self.advantage} advantage is 0 (each answer is its group's mean) and nothing "
            "trains: sample algo.group_size >= 2 answers per prompt, or use algo.advantage reinforce_pp or gae",
        )
        for name in ("clip_low", "clip_high", "kl_coef", "entropy_coef"):
            require(getattr(self, name) >= 0, f"algo.{name}", f"must be >= 0, got {getattr(self, name)}")
        require(
            self.loss != "gspo" or max(self.clip_low, self.clip_high) <= GSPO_MAX_CLIP,
            "algo.clip_low and algo.clip_high",
            f"({self.clip_low} / {self.clip_high}) are a token ratio's range, but algo.loss gspo clips the sequence "
            f"ratio, which stays far closer to 1: set both <= {GSPO_MAX_CLIP}, or null for GSPO's own 3e-4 / 4e-4",
        )
        require(self.max_sample_batches >= 1, "algo.max_sample_batches", "must be >= 1")
        low, high = self.difficulty_low, self.difficulty_high
        require(
            low is None or high is None or low < high,
            "algo.difficulty_low",
            f"must be below algo.difficulty_high, got {low} and {high}",
        )
        require(0 <= self.gamma <= 1, "algo.gamma", "must be in [0, 1]")
        require(self.ppo_epochs >= 1, "algo.ppo_epochs", f"must be >= 1, got {self.ppo_epochs}")
        require(self.mini_batch_groups >= 0, "algo.mini_batch_groups", "must be >= 0 (0: the whole rollout)")
        require(self.rollout_correction_cap > 1, "algo.rollout_correction_cap", "must be > 1")
        for name in ("warmup_steps", "trunk_grad", "time"):
            require(
                with_critic or not getattr(self.critic, name),
                f"algo.critic.{name}",
                f"needs a critic: algo.advantage {' or '.join(CRITIC_ADVANTAGES.names())}, not {self.advantage!r}",
            )
        require(
            self.label_free == "off" or (self.difficulty_low is None and self.difficulty_high is None),
            "algo.label_free",
            f"{self.label_free!r} trains without labels; algo.difficulty_low/high filter groups by their labelled success "
            "(leave them null, or use algo.dynamic_sampling)",
        )
        require(self.progress_coef >= 0, "algo.progress_coef", f"must be >= 0 (0: off), got {self.progress_coef}")
        require(
            self.care.coef == 0 or self.kl_coef == 0,
            "algo.care.coef",
            f"> 0 (GRPO-CARE) replaces the KL penalty: set algo.kl_coef to 0, not {self.kl_coef}",
        )
        require(
            self.care.coef == 0 or self.label_free == "off",
            "algo.care.coef",
            "> 0 (GRPO-CARE) rewards correct answers; it needs labels, not algo.label_free " + repr(self.label_free),
        )
        require(
            self.old_logprobs != "sampling" or self.rollout_correction in ("auto", "none"),
            "algo.rollout_correction",
            f"{self.rollout_correction!r} compares the trainer's log-probs with the sampler's: it needs "
            "algo.old_logprobs recompute (or auto), not 'sampling'",
        )
