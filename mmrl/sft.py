"""Supervised fine-tuning on (observation, target text) pairs: the cold start the RL papers run before RL."""

from __future__ import annotations

import torch

from sim.base import Observation

from .policy.vlm import Rollout, VLMPolicy


def supervised_batch(policy: VLMPolicy, obs: Observation, targets: list[str]) -> Rollout:
    """A `Rollout` whose completions are the given target texts (each followed by EOS), for teacher forcing."""
    inputs = policy.encode(obs)
    tok = policy.processor.tokenizer
    ids = [tok(t, add_special_tokens=False)["input_ids"] + [policy.eos_token_ids[0]] for t in targets]
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
        pixel_values=inputs["pixel_values"],
        image_grid_thw=inputs["image_grid_thw"],
        completion_ids=completion_ids.to(device),
        completion_mask=mask.to(device),
        logprobs=torch.zeros(completion_ids.shape, device=device),
        texts=list(targets),
        group_size=1,
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
DEMO_SEED_BASE = 900_000_000  # demonstration worlds: disjoint from training seeds (from 0) and held-out ones (1e9)


def action_batch(policy: VLMPolicy, obs: Observation, token_ids: torch.Tensor) -> Rollout:
    """A `Rollout` whose completions are given action tokens `[N, C*D]` (a VLA's teacher forcing)."""
    inputs = policy.encode(obs)
    device = policy.device
    return Rollout(
        prompt_ids=inputs["input_ids"],
        prompt_mask=inputs["attention_mask"].bool(),
        pixel_values=inputs["pixel_values"],
        image_grid_thw=inputs["image_grid_thw"],
        completion_ids=token_ids.to(device),
        completion_mask=torch.ones(token_ids.shape, dtype=torch.bool, device=device),
        logprobs=torch.zeros(token_ids.shape, device=device),
        texts=[""] * len(obs),
        group_size=1,
    )


@torch.no_grad()
def collect_demonstrations(env, codec, episodes: int, noise: float = 0.0, seed: int = 0):
    """(observation, expert action tokens) pairs from the env's scripted expert.

    The executed actions carry Gaussian noise of std `noise` (in action units) while the labels are the clean expert
    actions at the states actually reached (DART, https://arxiv.org/abs/1703.09327): the demonstrations then cover
    the states a slightly wrong policy visits, and show how to recover from them.

    Args:
        env: a continuous-action env with `expert_action()`; its N worlds run `episodes` episodes in batches of N.
        codec: the policy's `ActionCodec`; with chunks of C actions, a label is the expert's next C actions.
        episodes: how many demonstration episodes.
        noise: std of the execution noise.
        seed: seeds the noise; worlds use seeds from `DEMO_SEED_BASE + seed * episodes`.

    Returns:
        `(images [M, H, W, 3] uint8, instructions [M], token_ids [M, C*D], success_rate)`.
    """
    if not hasattr(env, "expert_action"):
        raise ValueError(f"{type(env).__name__} has no scripted expert (expert_action) to demonstrate with")
    generator = torch.Generator().manual_seed(seed)
    images, instructions, tokens, successes = [], [], [], []
    num, chunk = env.num_envs, codec.chunk
    for start in range(0, episodes, num):
        obs = env.reset(seed=DEMO_SEED_BASE + seed * episodes + start)
        running = torch.ones(num, dtype=torch.bool)
        success = torch.zeros(num, dtype=torch.bool)
        while running.any():
            ids = running.nonzero().squeeze(-1)
            images.append(obs.image[ids])
            instructions += [obs.instruction[i] for i in ids.tolist()]
            labels = []
            for _ in range(chunk):
                action = env.expert_action()  # [N, D]
                labels.append(action)
                noisy = action + noise * torch.randn(action.shape, generator=generator)
                result = env.step(torch.maximum(torch.minimum(noisy, codec.high), codec.low))
                success |= result.info.get("success", torch.zeros(num, dtype=torch.bool)).bool() & running
                running &= ~(result.terminated | result.truncated)
                obs = result.obs
            tokens.append(codec.encode(torch.stack(labels, dim=1)[ids]))  # [n, C*D]
        successes.append(success[: min(num, episodes - start)])
    rate = float(torch.cat(successes).float().mean())
    return torch.cat(images), instructions, torch.cat(tokens), rate


def train_on_demonstrations(
    policy: VLMPolicy,
    images: torch.Tensor,
    instructions: list[str],
    token_ids: torch.Tensor,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int = 0,
) -> list[float]:
    """Behaviour cloning: minimise the NLL of the expert's action tokens. Returns the loss of every step."""
    from tqdm.auto import tqdm

    generator = torch.Generator().manual_seed(seed)
    model = policy.model
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    bar = tqdm(range(steps), desc="sft on demos", dynamic_ncols=True)
    for _ in bar:
        idx = torch.randint(len(instructions), (min(batch_size, len(instructions)),), generator=generator)
        obs = Observation(image=images[idx], instruction=[instructions[i] for i in idx.tolist()])
        batch = action_batch(policy, obs, token_ids[idx])
        loss = sft_loss(policy.logprobs(batch), batch.completion_mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    bar.close()
    return losses
