"""A token policy's cold start: the env expert's demonstrations as (observation, target) rows, and their loss.

The rows are taught by teacher forcing, the NLL of the expert's answer (text and EOS, or a VLA's action tokens); the
loop that runs it is the cold start stage's (`mmrl.stages.cold_start`), shared with every kind."""

from __future__ import annotations

import torch

import sim
from sim.base import Observation
from sim.seeds import demo_seed_base

from ...runtime.config import TrainConfig
from ...runtime.schema import require
from ...types import Demonstrations, Rollout, Turn
from ..demonstrations import episode_noise_seed, episode_normal
from ..tokens import GenerationTarget


def target_ids(policy: GenerationTarget, target: str) -> list[int]:
    """The tokens a text target is taught as: its tokens, then EOS."""
    return policy.processor.tokenizer(target, add_special_tokens=False)["input_ids"] + [policy.eos_token_ids[0]]


def longest_target(policy: GenerationTarget, targets: list[str]) -> tuple[str, int]:
    """The text target with the most tokens as taught (`target_ids`, EOS included), and that count."""
    lengths = {t: len(target_ids(policy, t)) for t in set(targets)}
    longest = max(lengths, key=lambda t: (lengths[t], t))
    return longest, lengths[longest]


def supervised_batch(
    policy: GenerationTarget, obs: Observation, targets: list[str], history: list[list[Turn]] | None = None
) -> Rollout:
    """A `Rollout` whose completions are the given target texts (each followed by EOS), for teacher forcing; with
    `history`, each prompt is the world's conversation so far (`VLMPolicy.encode_conversations`)."""
    inputs, per_row = policy.prompt_inputs(obs, history)
    ids = [target_ids(policy, t) for t in targets]
    length = max(map(len, ids))
    completion_ids = torch.full((len(ids), length), policy.pad_token_id, dtype=torch.long)
    for i, row in enumerate(ids):
        completion_ids[i, : len(row)] = torch.tensor(row)
    # Lengths, not token values, decide the mask: some real configs use the EOS id as the pad id.
    lengths = torch.tensor([len(row) for row in ids])
    mask = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
    device = policy.device
    return Rollout(
        prompt_ids=inputs["input_ids"],
        prompt_mask=inputs["attention_mask"].bool(),
        **policy.image_fields(inputs),
        completion_ids=completion_ids.to(device),
        completion_mask=mask.to(device),
        logprobs=torch.zeros(completion_ids.shape, device=device),
        texts=list(targets),
        group_size=1,
        images_per_row=per_row,
    )


def sft_loss(logprobs: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood over the target tokens.

    Args:
        logprobs: `[R, L]` per token.
        completion_mask: `[R, L]` bool.
    """
    mask = completion_mask.to(logprobs.dtype)
    return -(logprobs * mask).sum() / mask.sum().clamp(min=1)


# ---------------------------------------------------------------------------------------------- demonstrations


def action_batch(
    policy: GenerationTarget, obs: Observation, token_ids: torch.Tensor, history: list[list[Turn]] | None = None
) -> Rollout:
    """A `Rollout` whose completions are given action tokens `[N, C*D]` (a VLA's teacher forcing)."""
    inputs, per_row = policy.prompt_inputs(obs, history)
    device = policy.device
    return Rollout(
        prompt_ids=inputs["input_ids"],
        prompt_mask=inputs["attention_mask"].bool(),
        **policy.image_fields(inputs),
        completion_ids=token_ids.to(device),
        completion_mask=torch.ones(token_ids.shape, dtype=torch.bool, device=device),
        logprobs=torch.zeros(token_ids.shape, device=device),
        texts=[""] * len(obs),
        group_size=1,
        images_per_row=per_row,
    )


@torch.no_grad()
def collect_demonstrations(env, codec, episodes: int, noise: float = 0.0, seed: int = 0, label_noise: float = 0.0):
    """(observation, expert answer) pairs from the env's scripted expert, for continuous and text envs alike.

    The executed actions carry noise of scale `noise` while the labels are the expert's actions at the states
    actually reached (DART, https://arxiv.org/abs/1703.09327): the demonstrations then cover the states a slightly
    wrong policy visits, and show how to recover from them. With `label_noise > 0` the labels themselves are the
    expert's noisy actions: a sloppy demonstrator, whose systematic error is what RL then learns to correct (the
    grounding demo's recipe).

    Args:
        env: an env with `expert_action(noise=0.0, generator=None)` (`[N, D]` for continuous envs, N strings for
            text ones); its N worlds run `episodes` episodes in batches of N.
        codec: the policy's `ActionCodec` for a continuous env (with chunks of C actions, a label is the expert's
            next C actions), None for a text env.
        episodes: how many demonstration episodes.
        noise: scale of the execution noise (action units for continuous envs; the env's own notion for text envs).
        seed: seeds the noise; worlds use seeds from `sim.seeds.demo_seed_base`.
        label_noise: scale of the noise of the labels (0: clean labels).

    With a continuous env, each episode draws its noise from a generator of its own (`episode_noise_seed`), so the
    demonstrations are the same whatever the env's world count (the trainer sizes it prompts x group), and their rows
    come episode by episode. A text env's noise is the env's own notion (`expert_action(noise, generator)`) and comes
    from one generator in world order, and its rows stay world-interleaved, step by step (so text presets' cold
    starts are what they were).

    Returns:
        `(images [M, H, W, 3] uint8, instructions [M], labels, success_rate, previous)` where labels are token ids
        `[M, C*D]` for a continuous env and M strings for a text env, and `previous[m]` is the index of the same
        episode's step before step m (-1 at an episode's first step), from which conversations are rebuilt.
    """
    if not hasattr(env, "expert_action"):
        raise ValueError(f"{type(env).__name__} has no scripted expert (expert_action) to demonstrate with")
    text = env.action_kind == "text"
    if not text and codec is None:
        raise ValueError("a continuous-action env needs the policy's action codec to label demonstrations")
    base = demo_seed_base(seed, episodes, env.num_envs)
    generator = torch.Generator().manual_seed(seed)
    images, instructions, labels, successes, previous, episode_of = [], [], [], [], [], []
    num = env.num_envs
    chunk = 1 if text else codec.chunk
    for start in range(0, episodes, num):
        obs = env.reset(seed=base + start)
        running = torch.arange(num) < episodes - start  # a last batch's spare worlds run unrecorded
        if not text:
            episode_generators = [
                torch.Generator().manual_seed(episode_noise_seed(seed, start + i)) for i in range(num)
            ]
        success = torch.zeros(num, dtype=torch.bool)
        last = [-1] * num  # each world's latest demonstration step
        while running.any():
            ids = running.nonzero().squeeze(-1)
            images.append(obs.image[ids])
            for i in ids.tolist():
                previous.append(last[i])
                last[i] = len(instructions)
                instructions.append(obs.instruction[i])
                episode_of.append(start + i)
            step_labels = []
            for _ in range(chunk):
                if text:
                    label = (
                        env.expert_action(noise=label_noise, generator=generator)
                        if label_noise
                        else env.expert_action()
                    )
                    executed = env.expert_action(noise=noise, generator=generator) if noise else label
                else:
                    label = env.expert_action()  # [N, D]
                    if label_noise:
                        label = (label + label_noise * episode_normal(episode_generators, label)).clamp(
                            codec.low, codec.high
                        )
                    executed = (label + noise * episode_normal(episode_generators, label)).clamp(codec.low, codec.high)
                step_labels.append(label)
                result = env.step(executed)
                success |= result.info.get("success", torch.zeros(num, dtype=torch.bool)).bool() & running
                running &= ~(result.terminated | result.truncated)
                obs = result.obs
            if text:
                labels += [step_labels[0][i] for i in ids.tolist()]
            else:
                labels.append(codec.encode(torch.stack(step_labels, dim=1)[ids]))  # [n, C*D]
        successes.append(success[: min(num, episodes - start)])
    rate = float(torch.cat(successes).float().mean())
    if text:
        return torch.cat(images), instructions, labels, rate, previous
    # Episode by episode, each in step order (rows come world-interleaved, an order that depends on the world count).
    order = sorted(range(len(previous)), key=lambda m: episode_of[m])  # stable: steps stay in order
    position = {m: n for n, m in enumerate(order)}
    previous = [-1 if previous[m] == -1 else position[previous[m]] for m in order]
    index = torch.tensor(order)
    return torch.cat(images)[index], [instructions[m] for m in order], torch.cat(labels)[index], rate, previous


def merge_demonstrations(parts: list[tuple]) -> tuple:
    """Several `collect_demonstrations` results as one: rows concatenated, `previous` indices shifted to match, the
    demonstrator's success rate averaged over all their episodes.

    Args:
        parts: `(result, episodes)` pairs, each result as `collect_demonstrations` returns it.
    """
    images, instructions, labels, previous = [], [], [], []
    succeeded = total = 0.0
    for (part_images, part_instructions, part_labels, rate, part_previous), episodes in parts:
        offset = len(instructions)
        images.append(part_images)
        instructions += part_instructions
        labels.append(part_labels)
        previous += [p + offset if p >= 0 else -1 for p in part_previous]
        succeeded, total = succeeded + rate * episodes, total + episodes
    text = isinstance(labels[0], list)
    merged = [x for part in labels for x in part] if text else torch.cat(labels)
    return torch.cat(images), instructions, merged, succeeded / max(total, 1), previous


def demonstrations(policy: GenerationTarget, env, cfg: TrainConfig) -> Demonstrations:
    """The cold start's demonstrations (`VLMPolicy.demonstrations`): from `env` (the curriculum's first level), or
    with `sft.all_levels` an even share of `sft.episodes` at every level of the curriculum, each level in an env of
    its own. A text env's answers must fit `sampling.max_new_tokens`, or the policy could never finish them.

    Raises:
        ConfigError: naming `sampling.max_new_tokens` when it cuts the expert's longest answer.
    """
    sft, cur = cfg.sft, cfg.curriculum
    if not (sft.all_levels and cur.option is not None):
        result = collect_demonstrations(
            env, policy.action_codec, sft.episodes, noise=sft.noise, seed=cfg.trainer.seed, label_noise=sft.label_noise
        )
    else:
        parts = []
        for index, level in enumerate(cur.levels):
            episodes = sft.episodes // len(cur.levels) + (index < sft.episodes % len(cur.levels))
            level_env = sim.make(cfg.env.name, num_envs=env.num_envs, **{**cfg.env.make_options(), cur.option: level})
            try:
                part = collect_demonstrations(
                    level_env, policy.action_codec, episodes, noise=sft.noise, seed=cfg.trainer.seed + index,
                    label_noise=sft.label_noise,
                )  # fmt: skip
            finally:
                level_env.close()
            parts.append((part, episodes))
        result = merge_demonstrations(parts)
    images, instructions, labels, rate, previous = result
    if env.action_kind == "text":
        answer, need = longest_target(policy, labels)
        require(
            need <= cfg.sampling.max_new_tokens,
            "sampling.max_new_tokens",
            f"={cfg.sampling.max_new_tokens} cuts the expert's answers: {answer!r} is {need} tokens with EOS, so the "
            f"policy could never finish what the cold start teaches it; set sampling.max_new_tokens >= {need}",
            sep="",
        )
    return Demonstrations(images, instructions, labels, rate, sft.episodes, {"previous": previous})


def demonstration_loss(policy: GenerationTarget, demos: Demonstrations, rows: torch.Tensor) -> torch.Tensor:
    """Behaviour cloning's loss on demonstration rows `rows`: the NLL of the expert's answers (action tokens
    `[b, C*D]` for a VLA, b strings for a text policy).

    With `policy.history_turns` K > 0, each row is taught in the conversation it is played in: its episode's K steps
    before it, their images and the expert's answers, as the prompt (the same format as the RL episodes).
    """
    images, instructions, labels, previous = demos.images, demos.instructions, demos.labels, demos.extra["previous"]
    obs = Observation(image=images[rows], instruction=[instructions[i] for i in rows.tolist()])
    keep = policy.history_turns
    history = None
    if keep:
        history = [_demonstrated_turns(policy, images, instructions, labels, previous, i, keep) for i in rows.tolist()]
    if isinstance(labels, torch.Tensor):
        batch = action_batch(policy, obs, labels[rows], history)
    else:
        batch = supervised_batch(policy, obs, [labels[i] for i in rows.tolist()], history)
    return sft_loss(policy.logprobs(batch), batch.completion_mask)


def _demonstrated_turns(
    policy: GenerationTarget,
    images: torch.Tensor,
    instructions: list[str],
    labels: torch.Tensor | list[str],
    previous: list[int],
    index: int,
    keep: int,
) -> list[Turn]:
    """The (at most `keep`) demonstration steps of the episode before step `index`, oldest first, as `Turn`s."""
    turns: list[Turn] = []
    j = previous[index]
    while j >= 0 and len(turns) < keep:
        views = images[j] if images[j].dim() == 4 else images[j].unsqueeze(0)  # [V, H, W, 3]
        answer = labels[j].tolist() if isinstance(labels, torch.Tensor) else target_ids(policy, labels[j])
        turns.append(Turn(views, instructions[j], answer))
        j = previous[j]
    return turns[::-1]
