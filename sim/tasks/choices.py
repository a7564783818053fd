"""The dataset env's second question: a multiple-choice question re-asked with shuffled options (ACRE).

ACRE (answer-consistency verification, https://arxiv.org/abs/2510.10104): after the policy reasons and answers, the
options are shuffled and the question is asked again with the same reasoning; the two answers should pick the same
option. `ReAsk` keeps, per world, the shuffle and the first answer, writes the second question and scores the second
answer. `sim.tasks.dataset.DatasetEnv` uses it with `consistency="measure"` or `"acre"`:

* turn 1: the question as usual. Its reward is the record's (`measure`) or 0 (`acre`); `success` and the reward
  component (`multiple_choice`) are the first answer's correctness, so accuracy reads as always.
* turn 2: the same image; the question with its options in another order (a shuffle other than the identity, drawn
  from the world's seed), then the first completion's reasoning (`rewards.consistency.reasoning_of`) and the
  answer hint. The component `consistent` is 1 where the second answer picks the same option (by content) as the
  first. The reward is 0 (`measure`) or `consistency_verified_reward` (`acre`): 1 when the first answer is right and
  the re-ask agrees, `partial` when it is right and the re-ask disagrees, 0 when it is wrong.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch

from rewards.consistency import LETTERS, consistency_verified_reward, reasoning_of, shuffled_question, split_options
from rewards.parse import parse_choice

ConsistencyMode = Literal["off", "measure", "acre"]
MAX_REASONING_CHARS = 1000  # of the first completion's reasoning, quoted in the second question


def shuffle_order(seed: int, shuffle_seed: int, count: int) -> list[int]:
    """The option order of a re-ask, from the world's seed: a permutation of `range(count)` that moves the first
    option (so the re-ask never shows the question unchanged when there are two or more options)."""
    order = np.random.default_rng([shuffle_seed % 2**63, seed % 2**63, 0xAC4E]).permutation(count).tolist()
    if count > 1 and order == list(range(count)):
        order = order[1:] + order[:1]
    return order


class ReAsk:
    """Per-world state of the re-asked questions (see the module docstring).

    Args:
        num_envs: N.
        mode: `"measure"` (the first answer's reward; consistency only logged) or `"acre"` (ACRE's reward).
        partial: ACRE's reward for a right first answer that the re-ask overturns.
        shuffle_seed: seeds the option shuffles (with each world's seed).
        hint: the sentence appended to each question (how to answer).
    """

    def __init__(self, num_envs: int, mode: ConsistencyMode, partial: float, shuffle_seed: int, hint: str):
        if mode not in ("measure", "acre"):
            raise ValueError(f"consistency must be 'off', 'measure' or 'acre', got {mode!r}")
        if not 0.0 <= partial <= 1.0:
            raise ValueError(f"acre_partial must be in [0, 1], got {partial}")
        self.mode, self.partial, self.shuffle_seed, self.hint = mode, float(partial), shuffle_seed, hint
        self.turn = torch.zeros(num_envs, dtype=torch.long)  # [N] 0: first question, 1: re-asked
        self.seeds = [0] * num_envs
        self.first: list[int | None] = [None] * num_envs  # option index the first answer picked
        self.order: list[list[int]] = [[] for _ in range(num_envs)]

    def start(self, k: int, seed: int) -> None:
        """World `k` was reset with `seed`: its first question comes next."""
        self.turn[k], self.seeds[k], self.first[k], self.order[k] = 0, seed, None, []

    def step(
        self, texts: list[str], questions: list[str], answers: list[str], reward: torch.Tensor, info: dict
    ) -> tuple[torch.Tensor, torch.Tensor, dict, dict[int, str]]:
        """One step over all N worlds.

        Args:
            texts: N answers.
            questions: N record questions (options inline).
            answers: N record answer letters.
            reward: `[N]` the env's score of `texts` against the record (meaningful for first answers only).
            info: the env's info of that score.

        Returns:
            `(reward [N], terminated [N] bool, info, re-asked)`: `re-asked` maps each world now at its second question
            to that question's text.
        """
        n = len(texts)
        first = self.turn == 0  # [N]
        out = torch.zeros(n)
        consistent = torch.zeros(n)
        reasks: dict[int, str] = {}
        success = info.get("success", torch.zeros(n, dtype=torch.bool)).bool() & first
        for k in range(n):
            stem, options = split_options(questions[k])
            letters = LETTERS[: len(options)]
            if first[k]:
                picked = parse_choice(texts[k], letters).letter
                self.first[k] = None if picked is None else letters.index(picked)
                self.order[k] = shuffle_order(self.seeds[k], self.shuffle_seed, len(options))
                reasoning = reasoning_of(texts[k])[:MAX_REASONING_CHARS] or "(none)"
                asked = shuffled_question(stem, options, self.order[k])
                reasks[k] = f"{asked} Your reasoning: {reasoning} Given it, {self.hint[0].lower()}{self.hint[1:]}"
                out[k] = reward[k] if self.mode == "measure" else 0.0
            else:
                picked = parse_choice(texts[k], letters).letter
                option = None if picked is None else self.order[k][letters.index(picked)]
                consistent[k] = float(option is not None and option == self.first[k])
                if self.mode == "acre":
                    right = self.first[k] is not None and letters[self.first[k]] == parse_choice(answers[k]).letter
                    out[k] = consistency_verified_reward(
                        torch.tensor([right]), consistent[k : k + 1].bool(), partial=self.partial
                    )[0]
        components = {name: torch.where(first, value, 0.0) for name, value in info["reward_components"].items()}
        components["consistent"] = consistent
        reasons = [
            why if first[k] else ("" if consistent[k] else "the re-ask with shuffled options picked another option")
            for k, why in enumerate(info["reasons"])
        ]
        info = {**info, "reward_components": components, "reasons": reasons, "success": success}
        self.turn = torch.where(first, 1, self.turn)
        return out, ~first, info, reasks

    def expert(self, k: int, answer_letter: str) -> str | None:
        """World `k`'s expert answer at its second question: the option its first answer picked (the right one where
        that answer was unreadable), in the shuffled lettering; None at the first question."""
        if self.turn[k] == 0:
            return None
        option = self.first[k] if self.first[k] is not None else LETTERS.index(parse_choice(answer_letter).letter)
        return f"<answer>{LETTERS[self.order[k].index(option)]}</answer>"
