"""The policy's learning-rate schedule: each schedule's lr at each update against values worked out by hand, the
config's refusals naming the field, and the schedule a training run follows (its resume is in
test_checkpoint_resume.py)."""

from __future__ import annotations

import math

import pytest
import torch

from mmrl.runtime.config import ConfigError, load_config
from mmrl.runtime.lr_schedule import lr_multiplier, lr_scheduler
from mmrl.runtime.metrics import read_metrics
from mmrl.trainer import train

# Warm-up over 2 updates, then 4 more to a floor of 0.1: update u decays by p = (u - 2) / 4.
HAND = {
    "constant": [0.5, 1.0, 1.0, 1.0, 1.0, 1.0],
    "linear": [0.5, 1.0, 0.1 + 0.9 * 0.75, 0.1 + 0.9 * 0.5, 0.1 + 0.9 * 0.25, 0.1],
    "cosine": [
        0.5, 1.0, 0.1 + 0.9 * (1 + math.sqrt(0.5)) / 2, 0.1 + 0.9 * 0.5, 0.1 + 0.9 * (1 - math.sqrt(0.5)) / 2, 0.1,
    ],
}  # fmt: skip


@pytest.mark.parametrize("schedule", sorted(HAND))
def test_each_update_gets_the_hand_computed_lr(schedule):
    want = HAND[schedule]
    got = [lr_multiplier(u, schedule, warmup_steps=2, total_updates=6, min_lr_ratio=0.1) for u in range(1, 7)]
    assert got == pytest.approx(want, abs=1e-12)
    # Past the run's updates (a finished run resumed with more steps) the lr stays on the floor.
    assert lr_multiplier(9, schedule, 2, 6, 0.1) == pytest.approx(want[-1])


def test_without_warmup_the_first_update_decays_already_and_the_last_is_the_floor():
    assert [lr_multiplier(u, "linear", 0, 4, 0.0) for u in (1, 2, 3, 4)] == pytest.approx([0.75, 0.5, 0.25, 0.0])
    assert lr_multiplier(1, "constant", 0, 4, 0.5) == 1.0  # the floor is for the decays only


@pytest.mark.parametrize("schedule", sorted(HAND))
def test_the_torch_scheduler_steps_the_same_values_and_restores_from_its_state(schedule):
    def make():
        optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=2e-3)
        return optimizer, lr_scheduler(optimizer, schedule, 2, 6, 0.1)

    optimizer, scheduler = make()
    seen = []
    for _ in range(6):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
        if len(seen) == 3:
            state = optimizer.state_dict(), scheduler.state_dict()  # what a checkpoint after update 3 holds
    assert seen == pytest.approx([2e-3 * m for m in HAND[schedule]])
    resumed_optimizer, resumed = make()
    resumed_optimizer.load_state_dict(state[0])
    resumed.load_state_dict(state[1])
    for update in range(3, 6):
        assert resumed_optimizer.param_groups[0]["lr"] == pytest.approx(2e-3 * HAND[schedule][update])
        resumed_optimizer.step()
        resumed.step()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.lr_schedule=step"], r"^trainer.lr_schedule: .*'constant'.*'linear'.*'cosine'"),
        (["trainer.min_lr_ratio=1.5"], r"^trainer.min_lr_ratio must be in \[0, 1\], got 1.5"),
        (["trainer.min_lr_ratio=-0.1"], r"^trainer.min_lr_ratio must be in \[0, 1\]"),
        (
            ["trainer.lr_schedule=cosine", "trainer.total_steps=4", "trainer.warmup_steps=4"],
            r"^trainer.warmup_steps must be below the policy's 4 updates",
        ),
        (
            ["trainer.lr_schedule=linear", "trainer.total_steps=6", "trainer.warmup_steps=2", "algo.advantage=gae",
             "algo.critic.warmup_steps=4"],
            r"^trainer.warmup_steps must be below the policy's 2 updates \(trainer.total_steps less algo.critic",
        ),
    ],
)  # fmt: skip
def test_a_wrong_schedule_is_a_config_error_naming_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_a_constant_schedule_may_warm_up_for_the_whole_run():
    assert load_config(None, ["trainer.total_steps=3", "trainer.warmup_steps=5"]).trainer.warmup_steps == 5


def test_the_critic_warmup_is_not_part_of_the_decay():
    cfg = load_config(None, ["trainer.total_steps=6", "algo.advantage=gae", "algo.critic.warmup_steps=2"])
    assert cfg.policy_updates == 4
    assert load_config(None, ["trainer.total_steps=6"]).policy_updates == 6


def test_a_training_run_logs_the_lr_each_update_used(tmp_path, tiny_run_config):
    cfg = tiny_run_config(
        tmp_path, "trainer.total_steps=3", "trainer.lr_schedule=cosine", "trainer.min_lr_ratio=0.2",
        "trainer.save_every=0", "trainer.eval_episodes=1", "trainer.eval_batch_size=1",
    )  # fmt: skip
    train(cfg)
    lrs = [m["lr"] for m in read_metrics(tmp_path / "metrics.jsonl") if "lr" in m]
    # No warm-up, 3 updates: p = 1/3, 2/3, 1.
    want = [1e-3 * (0.2 + 0.8 * (1 + math.cos(math.pi * k / 3)) / 2) for k in (1, 2, 3)]
    assert lrs == pytest.approx(want, rel=1e-9)
