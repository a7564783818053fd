"""A flow policy's (π0's) demonstrations: the env's scripted expert's action chunks, for the flow-matching loss.

The token path (`mmrl.policy.vlm.demonstrations`) teaches action tokens by their NLL; a flow policy learns the velocity field instead
(π0's own training loss): for an expert chunk `a` (normalised), noise `e` and a Beta-drawn time t, the expert regresses
`e - a` at `t e + (1 - t) a`. The demonstrations are collected as the token path's are (DART: executed with noise,
labelled with the expert's clean actions at the states reached; `sft.noise`), a label being the expert's next C
actions along the executed path; they also give the policy its normalisation statistics (`FlowStats`) when it has
none. With `every_step` (`sft.every_step`) a label is taken at every step an episode runs, not only where a chunk
starts (every C-th step, where the policy replans): about C times the labels from the same trajectories. Not the
default: on reach from the perception warm start both reach the same held-out success (RESULTS.md#pi0-on-reach).
"""

from __future__ import annotations

import torch

from sim.seeds import demo_seed_base

from ..demonstrations import episode_noise_seed, episode_normal


@torch.no_grad()
def collect_flow_demonstrations(
    env, chunk: int, episodes: int, noise: float = 0.0, seed: int = 0, every_step: bool = False
) -> tuple:
    """(observation, expert chunk) pairs from a continuous env's scripted expert.

    Each world plays its episode to its end (the expert's action plus noise, clamped); the label of step t is the
    expert's clean actions at steps t .. t + C - 1 of that path, past the episode's end the expert's action at the
    frozen world (the envs freeze an ended world until reset). The noise draws are the same in both modes (one per
    world and step), so the chunk-start rows are a subset of the every-step rows.

    Args:
        env: a continuous env with `expert_action()` `[N, D]` and a proprioceptive state (`obs.proprio`), whose ended
            worlds stay frozen until reset.
        chunk: C, the actions a label holds.
        episodes: how many demonstration episodes (in batches of the env's N worlds).
        noise: scale of the Gaussian noise of the executed actions (labels stay clean).
        seed: seeds the noise (one generator per episode, as the token path) and the worlds (`demo_seed_base`).
        every_step: a row at every step an episode runs (True) or only at steps 0, C, 2C, ... (False).

    Returns:
        `(images [M, (V,) H, W, 3] uint8, instructions [M], proprio [M, P], chunks [M, C, D], success_rate)`, rows
        episode by episode in step order.
    """
    if not hasattr(env, "expert_action"):
        raise ValueError(f"{type(env).__name__} has no scripted expert (expert_action) to demonstrate with")
    base = demo_seed_base(seed, episodes, env.num_envs)
    num = env.num_envs
    rows: list[tuple[int, int, torch.Tensor, str, torch.Tensor, torch.Tensor]] = []  # (episode, step, ...)
    successes = []
    for start in range(0, episodes, num):
        obs = env.reset(seed=base + start)
        if obs.proprio is None:
            raise ValueError(
                f"obs.proprio is None: {type(env).__name__} gives no proprioceptive state for a flow policy"
            )
        generators = [torch.Generator().manual_seed(episode_noise_seed(seed, start + i)) for i in range(num)]
        running = torch.arange(num) < episodes - start  # a last batch's spare worlds run unrecorded
        success = torch.zeros(num, dtype=torch.bool)
        shown, labels, live = [], [], []  # per step: the observation, the expert's clean action [N, D], running
        tail = 0  # steps played after every world ended: the last chunks' labels at the frozen worlds
        while tail < chunk - 1 or running.any():
            tail += 0 if running.any() else 1
            label = env.expert_action()  # [N, D]
            shown.append(obs)
            labels.append(label)
            live.append(running.clone())
            executed = (label + noise * episode_normal(generators, label)).clamp(env.action_low, env.action_high)
            result = env.step(executed)
            success |= result.info.get("success", torch.zeros(num, dtype=torch.bool)).bool() & running
            running &= ~(result.terminated | result.truncated)
            obs = result.obs
        for step in range(0, len(shown) - (chunk - 1), 1 if every_step else chunk):
            label = torch.stack(labels[step : step + chunk], 1).float()  # [N, C, D]
            for i in live[step].nonzero()[:, 0].tolist():
                rows.append((start + i, step, shown[step].image[i], shown[step].instruction[i],
                             shown[step].proprio[i], label[i]))  # fmt: skip
        successes.append(success[: min(num, episodes - start)])
    rows.sort(key=lambda row: (row[0], row[1]))
    rate = float(torch.cat(successes).float().mean())
    images = torch.stack([row[2] for row in rows])
    proprio = torch.stack([row[4] for row in rows]).float()
    chunks = torch.stack([row[5] for row in rows])
    return images, [row[3] for row in rows], proprio, chunks, rate
