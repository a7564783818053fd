"""A judge model as a reward: a VLM reads the image, the task and the policy's answer, and scores the answer.

    judge:
      model: /models/Qwen2.5-VL-7B-Instruct   # any AutoModelForImageTextToText folder with its processor
      weight: 0.5                             # the step's reward: env reward + 0.5 * score
      mode: expected                          # or generate

This is the generative reward model of RRVF-style visual feedback and of rubric judging: the rubric
(`judge.rubric`, with `{image}`, `{instruction}` and `{answer}`) asks for one digit 0..`max_score`, and

* `mode: expected` reads the judge's next-token distribution after the prompt (and `answer_prefix`) over the digit
  tokens and takes its mean: `score = sum_d p(d) * d / (max_score * sum_d p(d))` (G-Eval,
  https://arxiv.org/abs/2303.16634). One forward per prompt, no sampling, so equal inputs score equally; a judge
  that puts little mass on digits still gives a graded score, and the mass is reported (`digit_mass`).
* `mode: generate` lets it reply greedily (`max_new_tokens`) and reads the first whole number in the reply; a reply
  with no number in 0..max_score scores 0 with the reply quoted as the reason.

Scores are in [0, 1]. Prompts run in batches of `batch_size`; a score is cached per (image, instruction, answer)
(least recently used out past `cache_size`), so the G answers of a group that agree, and answers seen again, cost
nothing. A failure never stops training: a prompt longer than `max_prompt_tokens` or a batch that raises (out of
memory, a broken image) scores 0 with the reason, and is not cached. `remote: true` puts the judge in one Ray actor
(`RemoteJudge`) that every trainer process calls, so one copy of the weights serves them all.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from dataclasses import dataclass

import torch

from sim.ray_workers import init_ray

from ..policy import VLMPolicy
from ..policy.vision import to_pil
from ..runtime.config import JudgeConfig

_NUMBER = re.compile(r"(?<![\d.])\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Judged:
    """Scores of N answers."""

    scores: torch.Tensor  # [N] float32 in [0, 1]
    reasons: list[str]  # N strings, "" where the judge scored normally
    digit_mass: torch.Tensor  # [N] the probability the judge put on the digits ("expected"; NaN for "generate")


def read_score(reply: str, max_score: int) -> tuple[float, str]:
    """The score a judge's reply gives, in [0, 1]: its first whole number over `max_score`; else 0 and the reason.

    >>> read_score("Score: 7. The box is close.", 9)
    (0.7777777777777778, '')
    >>> read_score("It is wrong", 9)
    (0.0, "judge wrote no score in 0..9: 'It is wrong'")
    """
    found = _NUMBER.search(reply)
    value = float(found.group()) if found else None
    if value is None or not 0 <= value <= max_score:
        return 0.0, f"judge wrote no score in 0..{max_score}: {reply.strip()[:80]!r}"
    return value / max_score, ""


class Judge:
    """A judge model in this process (see the module docstring).

    Args:
        cfg: the `judge` config section (`cfg.model` a model folder).
        policy: an already loaded model to judge with instead of loading `cfg.model` (tests, self-judging).
    """

    def __init__(self, cfg: JudgeConfig, policy: VLMPolicy | None = None):
        if not cfg.enabled and policy is None:
            raise ValueError("judge.model is empty: name the judge's model folder")
        self.cfg = cfg
        if policy is None:
            try:
                policy = VLMPolicy.from_pretrained(cfg.model, dtype=getattr(torch, cfg.dtype), device=cfg.device)
            except OSError as error:
                raise ValueError(f"judge.model: cannot load {cfg.model!r}: {error}") from None
        self.policy = policy
        self.policy.model.eval()
        tokenizer = policy.processor.tokenizer
        digits = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(cfg.max_score + 1)]
        if any(i is None or i == tokenizer.unk_token_id for i in digits):
            raise ValueError(f"judge.model: its tokenizer has no single token for every digit 0..{cfg.max_score}")
        self.digit_ids = torch.tensor(digits)
        self.cache: OrderedDict[tuple[str, str, str], tuple[float, float]] = OrderedDict()
        self.forwards = 0  # batches the model ran (a cache hit runs none)

    # ------------------------------------------------------------------------------------------------ prompts
    def prompt(self, instruction: str, answer: str, num_images: int = 1) -> str:
        """The chat-formatted prompt for one answer (the image placeholders where the rubric says `{image}`)."""
        rubric = self.cfg.rubric
        before, after = rubric.split("{image}", 1) if "{image}" in rubric else ("", rubric)

        def fill(text: str) -> str:  # by replacement: an answer full of braces (SVG, code) stays as written
            return text.replace("{instruction}", instruction).replace("{answer}", answer)

        escaped = fill(before).replace("{", "{{").replace("}", "}}")
        text = self.policy.processor.prompt_text(
            fill(after), num_images=num_images, template=escaped + "{image}{instruction}"
        )
        return text + self.cfg.answer_prefix

    # ------------------------------------------------------------------------------------------------ scoring
    @torch.no_grad()
    def score(self, images: torch.Tensor, instructions: list[str], answers: list[str]) -> Judged:
        """Score N answers, each against its image(s) (`[N, H, W, 3]` or `[N, V, H, W, 3]` uint8) and instruction."""
        n = len(answers)
        views = images if images.dim() == 5 else images.unsqueeze(1)  # [N, V, H, W, 3]
        if images.shape[0] != n or len(instructions) != n:
            raise ValueError(f"{images.shape[0]} images, {len(instructions)} instructions, {n} answers")
        scores, mass = torch.zeros(n), torch.full((n,), float("nan"))
        reasons = [""] * n
        keys = [self._key(images[i], instructions[i], answers[i]) for i in range(n)]
        todo: dict[tuple[str, str, str], list[int]] = {}
        for i, key in enumerate(keys):
            if key in self.cache:
                self.cache.move_to_end(key)
                scores[i], mass[i] = self.cache[key]
            else:
                todo.setdefault(key, []).append(i)
        firsts = [rows[0] for rows in todo.values()]  # one prompt per distinct (image, instruction, answer)
        prompts = {i: self.prompt(instructions[i], answers[i], views.shape[1]) for i in firsts}
        runnable = []
        for i in firsts:
            length = len(self.policy.processor.tokenizer(prompts[i], add_special_tokens=False)["input_ids"])
            if length > self.cfg.max_prompt_tokens:
                reasons[i] = (
                    f"judge: prompt of {length} tokens is over judge.max_prompt_tokens={self.cfg.max_prompt_tokens}"
                )
            else:
                runnable.append(i)
        size = self.cfg.batch_size
        for start in range(0, len(runnable), size):
            batch = runnable[start : start + size]
            try:
                got, got_mass, got_reasons = self._run(views[batch], [prompts[i] for i in batch])
            except Exception as error:  # noqa: BLE001  (a failed judge is a zero reward with the reason, not a crash)
                for i in batch:
                    reasons[i] = f"judge failed: {type(error).__name__}: {error}"[:300]
                continue
            for k, i in enumerate(batch):
                scores[i], mass[i], reasons[i] = got[k], got_mass[k], got_reasons[k]
                if not reasons[i]:
                    self._remember(keys[i], float(scores[i]), float(mass[i]))
        for rows in todo.values():  # the duplicates of a prompt share its result
            for i in rows[1:]:
                scores[i], mass[i], reasons[i] = scores[rows[0]], mass[rows[0]], reasons[rows[0]]
        return Judged(scores, reasons, mass)

    def _run(self, views: torch.Tensor, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
        """One batch through the model (`views` `[B, V, H, W, 3]`): scores `[B]`, digit mass `[B]` and reasons."""
        policy = self.policy
        inputs = policy.processor(prompts, [to_pil(image) for row in views for image in row])
        inputs = policy._with_token_types({k: v.to(policy.device) for k, v in inputs.items()})
        positions = policy.positions(inputs["attention_mask"])  # 1-D families: each row's own, whatever its padding
        if positions is not None and self.cfg.mode == "expected":
            inputs["position_ids"] = positions
        self.forwards += 1
        b = len(prompts)
        if self.cfg.mode == "expected":
            # Left padded, so the last position is each prompt's end; only its logits are computed ([B, V]).
            logits = policy.model(**inputs, logits_to_keep=1).logits[:, -1].float()
            probs = torch.softmax(logits, dim=-1)[:, self.digit_ids.to(logits.device)].cpu()  # [B, D+1]
            total = probs.sum(-1)  # [B]
            values = torch.arange(self.cfg.max_score + 1, dtype=torch.float32)
            scores = (probs * values).sum(-1) / total.clamp_min(1e-30) / self.cfg.max_score  # [B]
            return scores, total, [""] * b
        out = policy.model.generate(
            **inputs, max_new_tokens=self.cfg.max_new_tokens, do_sample=False, pad_token_id=policy.pad_token_id
        )
        replies = policy.processor.tokenizer.batch_decode(
            out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True
        )
        read = [read_score(reply, self.cfg.max_score) for reply in replies]
        scores = torch.tensor([score for score, _ in read], dtype=torch.float32)
        return scores, torch.full((b,), float("nan")), [reason for _, reason in read]

    def _key(self, image: torch.Tensor, instruction: str, answer: str) -> tuple[str, str, str]:
        array = image.detach().to("cpu").contiguous()
        digest = hashlib.sha1(array.numpy().tobytes(), usedforsecurity=False)
        digest.update(str(tuple(array.shape)).encode())
        return digest.hexdigest(), instruction, answer

    def _remember(self, key: tuple[str, str, str], score: float, mass: float) -> None:
        self.cache[key] = (score, mass)
        self.cache.move_to_end(key)
        while len(self.cache) > self.cfg.cache_size:
            self.cache.popitem(last=False)

    def close(self) -> None:
        pass


class RemoteJudge:
    """The judge in one named Ray actor, shared by every process that asks for the same config.

    The first `RemoteJudge` of a config starts the actor (`get_if_exists`); the others attach to it. `score` is
    `Judge.score` run there.
    """

    def __init__(self, cfg: JudgeConfig):
        self.cfg = cfg
        ray = init_ray(None, 1, user="judge.remote")
        name = "mmrl-judge-" + hashlib.sha1(repr(cfg).encode(), usedforsecurity=False).hexdigest()[:12]
        gpus = 1 if cfg.device.startswith("cuda") else 0
        actor = ray.remote(num_cpus=1, num_gpus=gpus)(Judge)
        self.actor = actor.options(name=name, get_if_exists=True, lifetime=None).remote(cfg)
        self._ray = ray

    def score(self, images: torch.Tensor, instructions: list[str], answers: list[str]) -> Judged:
        return self._ray.get(self.actor.score.remote(images.cpu(), list(instructions), list(answers)))

    def close(self) -> None:
        pass  # the actor is shared; it ends with the Ray session


def make_judge(cfg: JudgeConfig) -> Judge | RemoteJudge | None:
    """The judge the config asks for: None when `judge.model` is empty."""
    if not cfg.enabled:
        return None
    return RemoteJudge(cfg) if cfg.remote else Judge(cfg)
