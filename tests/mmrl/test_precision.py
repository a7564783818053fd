"""float32 master weights (`trainer.master_weights: float32`, `mmrl.runtime.precision`): in bfloat16 an AdamW step of lr 1e-6
rounds away; with float32 masters it lands, close to the step a float32 model takes, and checkpoints keep it.

The reference for "close" is the same model in float32, started from the same (bfloat16-representable) weights and
stepped on the same rollout. Its Adam step is about lr * sign(gradient) per element; the bfloat16 gradient has the
sign of the float32 one almost everywhere, so the two steps agree but for the few elements whose gradient is ~0.
"""

from __future__ import annotations

import contextlib
import copy
import io

import pytest
import torch

from mmrl.policy import Sampling, VLMPolicy, load_policy
from mmrl.runtime.config import ConfigError
from mmrl.runtime.precision import MasterWeights, cast_parameters
from mmrl.trainer import train

LR = 1e-6


def nll(policy: VLMPolicy, rollout) -> torch.Tensor:
    mask = rollout.completion_mask
    return -(policy.logprobs(rollout) * mask).sum() / mask.sum()


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().float().clone() for n, p in model.named_parameters()}


def deltas(after: dict[str, torch.Tensor], before: dict[str, torch.Tensor], large: bool = False) -> torch.Tensor:
    """All elements' changes, flattened (`large`: only those of weights with |w| > 1e-2, whose bfloat16 neighbours
    are more than 2 * lr away, so that a step of lr can only round back)."""
    parts = [(after[n] - before[n])[before[n].abs() > 1e-2 if large else slice(None)].flatten() for n in before]
    return torch.cat(parts)


@pytest.fixture(scope="module")
def start(tiny_policy, grounding_obs):
    """(float32 policy whose weights are bfloat16 values, a rollout of it): the common start of every variant."""
    policy = tiny_policy("qwen2_vl", seed=0)
    cast_parameters(policy.model, torch.bfloat16)
    cast_parameters(policy.model, torch.float32)
    torch.manual_seed(0)
    rollout = policy.generate(grounding_obs("qwen2_vl", [0, 0, 1, 1]), group_size=2, sampling=Sampling(6))
    return policy, rollout


def one_step(policy: VLMPolicy, rollout, params, after_step=lambda: None) -> None:
    """Two micro-batches of two rows (gradients accumulate), clipping, one AdamW step at LR."""
    optimizer = torch.optim.AdamW(params, lr=LR)
    policy.model.train()
    for a in (0, 2):
        (nll(policy, rollout.rows(a, a + 2)) / 2).backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    after_step()


def test_bfloat16_weights_do_not_move_at_lr_1e6_and_their_float32_masters_do(start):
    policy, rollout = start
    before = weights(policy.model)
    reference = copy.deepcopy(policy)  # float32 throughout
    one_step(reference, rollout, list(reference.model.parameters()))
    want = deltas(weights(reference.model), before)
    assert (want.abs() > 0.5 * LR).float().mean() > 0.95  # the float32 step moves nearly every element by ~lr

    plain = copy.deepcopy(policy)
    cast_parameters(plain.model, torch.bfloat16)
    one_step(plain, rollout, list(plain.model.parameters()))
    assert not deltas(weights(plain.model), before, large=True).any()  # every such update rounded away

    low = copy.deepcopy(policy)
    master = MasterWeights(low.model, torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in low.model.parameters())
    assert all(b.dtype == torch.float32 for n, b in low.model.named_buffers() if "inv_freq" in n)  # left as loaded

    def check_gradients_then_copy():
        # The hooks moved each micro-batch's gradient to the masters (float32) and left the model none.
        assert all(p.grad is None for p in low.model.parameters())
        assert all(m.grad is not None and m.grad.dtype == torch.float32 for m in master.params)
        master.copy_to_model()

    one_step(low, rollout, master.params, check_gradients_then_copy)
    names = [n for n, p in low.model.named_parameters() if p.requires_grad]
    stepped = {n: m.detach() for n, m in zip(names, master.params)}
    assert (deltas(stepped, before, large=True) != 0).float().mean() > 0.95
    got = deltas(stepped, before)
    assert (got.sign() == want.sign()).float().mean() > 0.98  # the float32 model's step, elementwise
    assert (got - want).norm() < 0.2 * want.norm()
    for p, m in zip(low.model.parameters(), master.params):  # the model holds the masters, rounded
        assert torch.equal(p, m.detach().to(torch.bfloat16))


def _run(cfg) -> list[dict]:
    with contextlib.redirect_stdout(io.StringIO()):
        return train(cfg)


@pytest.fixture(scope="module")
def bf16_runs(tmp_path_factory, tiny_run_config, letters_env):
    """One step at lr 1e-6 in bfloat16 without masters; two with them, and the same two stopped after one and
    resumed: (start weights, plain dir, masters dir, resumed dir)."""
    root = tmp_path_factory.mktemp("master_weights")
    common = (f"env.name={letters_env}", "model.dtype=bfloat16", f"trainer.lr={LR}", "algo.group_size=4")
    masters = (*common, "trainer.master_weights=float32", "trainer.total_steps=2")
    _run(tiny_run_config(root / "plain", *common, "trainer.total_steps=1"))
    _run(tiny_run_config(root / "masters", *masters))
    with contextlib.redirect_stdout(io.StringIO()):
        train(tiny_run_config(root / "resumed", *masters), stop_after=1)
    _run(tiny_run_config(root / "resumed", *masters, "resume=true"))
    start = load_policy(tiny_run_config(root / "unused").model)  # "tiny:" in float32: the masters' start
    return weights(start.model), root / "plain", root / "masters", root / "resumed"


def checkpoint_weights(output_dir, step: int) -> dict[str, torch.Tensor]:
    return weights(VLMPolicy.from_pretrained(output_dir / "checkpoints" / f"step_{step:08d}").model)


def test_trainer_with_float32_masters_moves_bfloat16_weights_at_lr_1e6(bf16_runs):
    from safetensors.torch import load_file

    start, plain, masters, _ = bf16_runs
    rounded = {n: w.to(torch.bfloat16).float() for n, w in start.items()}  # the plain run's start
    assert not deltas(checkpoint_weights(plain, 1), rounded, large=True).any()
    saved = load_file(masters / "checkpoints" / "step_00000001" / "model.safetensors")
    assert {w.dtype for w in saved.values()} == {torch.float32}  # the masters, not their bfloat16 rounding
    moved = deltas(checkpoint_weights(masters, 1), start, large=True)
    assert (moved != 0).float().mean() > 0.95
    assert moved[moved != 0].abs().median() == pytest.approx(LR, rel=0.1)  # Adam's first step: ~lr per element


def test_resumed_run_with_float32_masters_matches_the_uninterrupted_one(bf16_runs):
    from mmrl.runtime.metrics import read_metrics

    _, _, masters, resumed = bf16_runs
    got, want = checkpoint_weights(resumed, 2), checkpoint_weights(masters, 2)
    assert got.keys() == want.keys()
    for name in want:  # the masters came back from the float32 checkpoint: nothing lost to bfloat16 in between
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")
    rows = [[m for m in read_metrics(d / "metrics.jsonl") if "loss/policy" in m] for d in (resumed, masters)]
    assert [m["loss/policy"] for m in rows[0]] == pytest.approx([m["loss/policy"] for m in rows[1]], abs=1e-7)


def test_master_weights_refuse_what_they_cannot_do(tmp_path, tiny_run_config):
    with pytest.raises(ValueError, match=r"trainer.master_weights='float32' needs model.dtype bfloat16"):
        train(tiny_run_config(tmp_path, "trainer.master_weights=float32"))  # float32 already
    with pytest.raises(ValueError, match=r"trainer.master_weights='float32' is for full fine-tuning.*model.lora.r"):
        train(tiny_run_config(tmp_path, "trainer.master_weights=float32", "model.dtype=bfloat16", "model.lora.r=4"))
    with pytest.raises(ConfigError, match=r"trainer.master_weights: 'fp32' is not one of 'model', 'float32'"):
        tiny_run_config(tmp_path, "trainer.master_weights=fp32")
    assert not (tmp_path / "config.json").exists()  # refused before anything ran
