"""Collecting episodes: the policy acts in R worlds until every episode ends.

One collector serves every task. A single-step task (grounding, image-to-SVG) is one turn: the rows are the R
completions, exactly what the policy's `generate` returns. A multi-step task (a robot, a GUI, render-and-correct) runs
more turns; each turn the worlds still running generate one completion (text, or C*D action tokens for a VLA),
the env steps, and the turn's rows join the batch. A flow policy (π0) acts the same way: each turn it samples a chunk
of C actions, executed open-loop, and its rows' "tokens" are its K denoising steps. The collector asks nothing of
which kind of policy it drives: the policy checks the env (`check_env`), says how many actions a generation executes
(`chunk`) and reads them out of its rows (`actions`). The update later
trains on all rows at once, in micro-batches, so memory grows with the token count of the episodes, never with
activations kept across turns.

GRPO groups are G consecutive worlds reset with the same seed. At the first turn they see the same observation,
so each group's prompt is encoded once and sampled G times; later turns differ per world.

Branching (`algo.credit: branch`): each group draws one turn; its worlds answer greedily at every other turn and
sample at that one, so they share the greedy prefix and part at the branch. Every row is returned, but only the
branch turn's rows keep their completion mask: the others are played, never trained on.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import replace
from typing import Any

import torch

from sim.base import Observation, VecEnv

from ..policy import Policy
from ..types import Episodes, Rollout, Sampling, Turn


@torch.no_grad()
def collect_episodes(
    policy: Policy,
    env: VecEnv,
    seeds: list[int],
    group_size: int,
    sampling: Sampling,
    *,
    max_turns: int | None = None,
    record_frames: int = 0,
    keep_answered: bool = False,
    branch: bool = False,
) -> Episodes:
    """Run R = len(seeds) episodes to their end and return every generation as a row.

    Args:
        policy: the policy; with an action codec (a VLA) it acts in continuous envs, otherwise it writes text.
        env: an env with R worlds; `env.action_kind` must match the policy (text, or continuous with a codec).
        seeds: `[R]` per-world seeds, G equal ones per group, groups contiguous.
        group_size: G.
        sampling: how completions are drawn (temperature 0: greedy, for evaluation).
        max_turns: stop after this many generations even if worlds still run (default: as many as the env's
            `max_episode_steps` needs, given the chunk size).
        record_frames: keep every observation of the first K worlds (for episode videos).
        keep_answered: keep each row's observation (images and instruction) in the episodes, for a judge model
            that scores the answers after collection (`mmrl.stages.shaping`).
        branch: play greedily except at one turn per group, drawn uniformly from the global torch generator, where
            the G worlds sample with `sampling`; rows of the other turns come back with an empty completion mask
            (see the module docstring).

    Returns:
        The episodes.

    With `policy.history_turns` K > 0 (`model.history_turns`), each later turn's prompt is a conversation: the
    world's last K turns (their images, instructions and the exact tokens sampled as answers), then the current
    observation. The rows train on their own completions as always; the earlier answers are prompt tokens.
    """
    policy.check_env(env)
    if keep_answered and env.action_kind != "text":
        raise ValueError("judge.model scores text answers; this env takes continuous actions")
    num = len(seeds)
    if num != env.num_envs:
        raise ValueError(f"{num} seeds for an env of {env.num_envs} worlds")
    chunk = policy.chunk
    # An env may fix how much of each chunk runs open-loop before the policy acts again (LIBERO's `replan_steps`).
    chunk = min(chunk, getattr(env, "replan_steps", None) or chunk)
    turns = max_turns or max(1, math.ceil(env.max_episode_steps / chunk))
    branch_turn = None  # [R] the turn each world samples at (branching)
    if branch:
        if group_size < 2 or num % group_size:
            raise ValueError(f"branching needs groups of G >= 2 worlds; got {num} worlds in groups of {group_size}")
        branch_turn = torch.randint(turns, (num // group_size,)).repeat_interleave(group_size)

    obs = start = env.reset(seed=seeds)
    # Earlier turns each prompt keeps (0: the current observation); a kind without conversations keeps none.
    keep = policy.history_turns if "history" in policy.features else 0
    history: list[list[Turn]] = [[] for _ in range(num)]
    running = torch.ones(num, dtype=torch.bool)  # [R]
    step_rewards = torch.zeros(num, turns)
    active = torch.zeros(num, turns, dtype=torch.bool)
    state_keys = torch.zeros(num, turns, dtype=torch.long)  # what each turn saw, hashed (GiGPO's anchor states)
    env_steps = torch.zeros(num, dtype=torch.long)
    success = None
    components: dict[str, torch.Tensor] = {}
    first_info: dict[str, Any] = {}
    parts, worlds, turn_ids = [], [], []
    answered_images, answered_instructions = [], []
    frames = [obs.first_view[:record_frames].clone()] if record_frames else []  # videos show the first view

    for t in range(turns):
        ids = running.nonzero().squeeze(-1)  # [n] worlds still running
        if len(ids) == 0:
            break
        active[ids, t] = True
        state_keys[ids, t] = observation_keys(obs.select(ids) if len(ids) < num else obs)
        if t == 0 and group_size > 1 and branch_turn is None:
            rollout = policy.generate(obs, group_size=group_size, sampling=sampling)
        else:
            shown = obs.select(ids) if len(ids) < num else obs
            past = [history[i] for i in ids.tolist()] if keep else None
            if branch_turn is not None:
                sampled = branch_turn[ids] == t  # [n]
                rollout = _branched(policy, shown, past, sampled, sampling)
            else:
                rollout = policy.generate(shown, group_size=1, sampling=sampling, history=past)
            rollout = replace(rollout, group_size=group_size)
        if keep:  # this turn joins each world's conversation: its images, instruction and sampled tokens
            views = obs.views
            for row, i in enumerate(ids.tolist()):
                answer = rollout.completion_ids[row][rollout.completion_mask[row]].tolist()
                turn = Turn(views[i].clone(), obs.instruction[i], answer)
                history[i] = [*history[i], turn][-keep:]
        if branch_turn is not None:  # the greedy turns are played, not trained on
            trained = rollout.completion_mask & sampled[:, None]
            rollout = replace(rollout, completion_mask=trained, logprobs=torch.where(trained, rollout.logprobs, 0.0))
        parts.append(rollout)
        if keep_answered:
            answered_images.append(obs.image[ids].clone())
            answered_instructions.extend(obs.instruction[i] for i in ids.tolist())
        worlds.append(ids)
        turn_ids.append(torch.full((len(ids),), t, dtype=torch.long))

        if env.action_kind == "continuous":
            chunk_actions = policy.actions(rollout)  # [n, C, D]
            step_actions = [_scatter(chunk_actions[:, c], ids, num, env.action_dim) for c in range(chunk)]
        else:
            texts = [""] * num
            for i, text in zip(ids.tolist(), rollout.texts):
                texts[i] = text
            step_actions = [texts]
        for actions in step_actions:
            if not running.any():
                break
            result = env.step(actions)
            live = running.clone()  # the worlds this step counts for
            reward = result.reward.float().cpu()
            step_rewards[:, t] += torch.where(live, reward, 0.0)
            env_steps += live.long()
            for name, value in result.info.get("reward_components", {}).items():
                components.setdefault(name, torch.zeros(num))
                components[name] += torch.where(live, value.float().cpu(), 0.0)
            if "success" in result.info:
                hit = result.info["success"].bool().cpu() & live
                success = hit if success is None else success | hit
            if not first_info:
                first_info = dict(result.info)
            running &= ~(result.terminated.bool().cpu() | result.truncated.bool().cpu())
            obs = result.obs
            if record_frames:
                frames.append(obs.first_view[:record_frames].clone())
        if env.max_episode_steps <= env_steps.max():
            running[:] = False

    world = torch.cat(worlds)
    return Episodes(
        rollout=type(parts[0]).cat_rows(parts, policy.pad_token_id or 0),
        world=world,
        turn=torch.cat(turn_ids),
        step_rewards=step_rewards,
        active=active,
        state_keys=state_keys,
        success=success,
        components=components,
        env_steps=env_steps,
        info=first_info,
        start=start,
        frames=torch.stack(frames, dim=1) if record_frames else None,
        answered_images=torch.cat(answered_images) if keep_answered else None,
        answered_instructions=answered_instructions if keep_answered else None,
    )


def _branched(
    policy: Policy, shown: Observation, past: list[list[Turn]] | None, sampled: torch.Tensor, sampling: Sampling
) -> Rollout:
    """One turn of branching: `[n]` rows, the worlds `sampled` (`[n]` bool) drawn with `sampling`, the rest greedy."""
    greedy = replace(sampling, temperature=0.0)
    if sampled.all() or not sampled.any():
        return policy.generate(shown, group_size=1, sampling=sampling if sampled.all() else greedy, history=past)
    picks = ((sampled.nonzero().squeeze(-1), sampling), ((~sampled).nonzero().squeeze(-1), greedy))
    parts = []
    for rows, how in picks:
        subset = [past[i] for i in rows.tolist()] if past is not None else None
        parts.append(policy.generate(shown.select(rows), group_size=1, sampling=how, history=subset))
    order = torch.cat([rows for rows, _ in picks])  # [n] the world of each concatenated row
    return type(parts[0]).cat_rows(parts, policy.pad_token_id or 0).select(torch.argsort(order))


def _scatter(actions: torch.Tensor, ids: torch.Tensor, num: int, dim: int) -> torch.Tensor:
    """`[n, D]` actions of worlds `ids` into an `[N, D]` batch (zeros for worlds that ended: envs ignore them)."""
    full = torch.zeros(num, dim, dtype=torch.float32)
    full[ids] = actions.float()
    return full


def observation_keys(obs: Observation) -> torch.Tensor:
    """`[N]` long, one 64-bit hash per world of what it shows the policy (image bytes and instruction): equal keys
    are the same state to the policy (a hash collision, at 2^-64, would merge two states)."""
    keys = []
    images = obs.image.contiguous().cpu().numpy()
    for image, text in zip(images, obs.instruction):
        digest = hashlib.blake2b(image.tobytes(), digest_size=8)
        digest.update(text.encode())
        keys.append(int.from_bytes(digest.digest(), "little", signed=True))
    return torch.tensor(keys, dtype=torch.long)
