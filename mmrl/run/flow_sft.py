"""The cold start of a flow policy (π0): the flow-matching loss on the env's scripted expert's action chunks.

The token path (`mmrl.run.sft`) teaches action tokens by their NLL; a flow policy learns the velocity field instead
(π0's own training loss): for an expert chunk `a` (normalised), noise `e` and a Beta-drawn time t, the expert regresses
`e - a` at `t e + (1 - t) a`. The demonstrations are collected as the token path's are (DART: executed with noise,
labelled with the expert's clean actions at the states reached; `sft.noise`), a label being the expert's next C
actions; they also give the policy its normalisation statistics (`FlowStats`) when it has none.
"""

from __future__ import annotations

import torch

from sim.base import Observation
from sim.seeds import demo_seed_base

from ..policy.flow import FlowPolicy
from .sft import episode_noise_seed


def check_flow_run(cfg) -> None:
    """Refuse, naming the field, the run options a flow policy does not support yet: PAPO (a masked-image pass),
    rollout workers, branching and a judge. (A critic reads the flow policy's `value_tap`; refill and generation
    shards join flow rollouts through `FlowRollout.cat_rows`.)"""
    ac, tc = cfg.algo, cfg.trainer
    refused = {
        "trainer.rollout_workers": tc.rollout_workers > 0,
        "algo.papo_gamma": ac.papo_gamma > 0 or ac.papo_monitor,
        "algo.credit": ac.credit == "branch",
        "judge.model": bool(getattr(cfg.judge, "model", None)),
    }
    bad = [name for name, hit in refused.items() if hit]
    if bad:
        raise ValueError(f"{', '.join(bad)}: not built for flow policies (π0) yet")


@torch.no_grad()
def collect_flow_demonstrations(env, chunk: int, episodes: int, noise: float = 0.0, seed: int = 0) -> tuple:
    """(observation, expert chunk) pairs from a continuous env's scripted expert.

    Args:
        env: a continuous env with `expert_action()` `[N, D]` and a proprioceptive state (`obs.proprio`).
        chunk: C, the actions a label holds (the expert's next C actions, executed one by one).
        episodes: how many demonstration episodes (in batches of the env's N worlds).
        noise: scale of the Gaussian noise of the executed actions (labels stay clean).
        seed: seeds the noise (one generator per episode, as the token path) and the worlds (`demo_seed_base`).

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
        step = 0
        while running.any():
            ids = running.nonzero().squeeze(-1).tolist()
            shown = obs
            labels = []
            for _ in range(chunk):
                label = env.expert_action()  # [N, D]
                labels.append(label)
                executed = (label + noise * _normal(generators, label)).clamp(env.action_low, env.action_high)
                result = env.step(executed)
                success |= result.info.get("success", torch.zeros(num, dtype=torch.bool)).bool() & running
                running &= ~(result.terminated | result.truncated)
                obs = result.obs
            labels = torch.stack(labels, 1).float()  # [N, C, D]
            for i in ids:
                rows.append((start + i, step, shown.image[i], shown.instruction[i], shown.proprio[i], labels[i]))
            step += 1
        successes.append(success[: min(num, episodes - start)])
    rows.sort(key=lambda row: (row[0], row[1]))
    rate = float(torch.cat(successes).float().mean())
    images = torch.stack([row[2] for row in rows])
    proprio = torch.stack([row[4] for row in rows]).float()
    chunks = torch.stack([row[5] for row in rows])
    return images, [row[3] for row in rows], proprio, chunks, rate


def _normal(generators: list[torch.Generator], like: torch.Tensor) -> torch.Tensor:
    """Standard normal draws shaped like `like` (`[N, D]`), row n from world n's own generator (as the token path)."""
    return torch.stack([torch.randn(like.shape[1], generator=g) for g in generators]).to(like.device)


def train_flow_on_demonstrations(
    policy: FlowPolicy,
    images: torch.Tensor,
    instructions: list[str],
    proprio: torch.Tensor,
    chunks: torch.Tensor,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int = 0,
) -> list[float]:
    """Minimise the flow-matching loss on the demonstrations (batches, times and noise drawn from `seed`); returns
    the loss of every step."""
    from tqdm.auto import tqdm

    generator = torch.Generator().manual_seed(seed)
    model = policy.model
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses = []
    bar = tqdm(range(steps), desc="flow matching on demos", dynamic_ncols=True)
    for _ in bar:
        idx = torch.randint(len(instructions), (min(batch_size, len(instructions)),), generator=generator)
        obs = Observation(image=images[idx], instruction=[instructions[i] for i in idx.tolist()], proprio=proprio[idx])
        loss = policy.flow_matching_loss(obs, chunks[idx], generator=generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    bar.close()
    return losses
