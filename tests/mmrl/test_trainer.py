"""The GRPO loop end to end on a random tiny Qwen2-VL: it learns something, logs everything, writes its report.

`grounding_letters` (conftest) adds a dense reward to the grounding task, so an untrained model's samples differ
in reward and GRPO has a gradient; on plain grounding every reward of a random model is 0.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re

import pytest
import torch
from PIL import Image

from mmrl.runtime.metrics import read_metrics
from mmrl.trainer import train

TRAIN_KEYS = ("loss/policy", "loss/kl", "grad_norm", "clip_fraction", "approx_kl", "lr", "completion_len")


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory, tiny_run_config, tiny_policy, letters_env):
    """Two GRPO steps with a KL term: (parameters before, policy after, returned history, output dir, stdout)."""
    out = tmp_path_factory.mktemp("two_steps")
    cfg = tiny_run_config(out, f"env.name={letters_env}", "trainer.total_steps=2", "algo.kl_coef=0.1")
    policy = tiny_policy("qwen2_vl", seed=0, prompt_template=cfg.model.prompt_template)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        history = train(cfg, policy=policy)
    return before, policy, history, out, stdout.getvalue()


def step_rows(history: list[dict]) -> list[dict]:
    return [m for m in history if "reward/total" in m]


def test_two_grpo_steps_move_the_tiny_vlm_with_finite_losses(two_steps):
    before, policy, history, _, _ = two_steps
    rows = step_rows(history)
    assert [m["step"] for m in rows] == [1, 2]
    for m in rows:
        for key in TRAIN_KEYS:
            assert m[key] is not None and math.isfinite(m[key]), f"step {m['step']}: {key} = {m[key]}"
        assert m["grad_norm"] > 0
    moved = [n for n, p in policy.model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert moved, "no parameter changed"
    assert any("visual" in n for n in moved) and any("language_model" in n for n in moved)


def test_no_gradient_is_held_after_a_step(two_steps):
    """The optimiser step frees the gradients, so the next rollout runs without them: on the 3B architecture they
    are 7.5 GB in bfloat16 (15 GB as float32 masters) that generation would otherwise hold."""
    _, policy, *_ = two_steps
    trainable = [p for p in policy.model.parameters() if p.requires_grad]
    assert trainable and all(p.grad is None for p in trainable)


def test_kl_term_is_logged_finite_and_grows_from_zero(two_steps):
    _, _, history, _, _ = two_steps
    kl = [m["loss/kl"] for m in step_rows(history)]
    assert kl[0] == pytest.approx(0.0, abs=1e-6)  # step 1: the policy is still its own reference
    assert kl[1] > 0 and math.isfinite(kl[1])


def test_every_reward_component_is_logged(two_steps):
    _, _, history, _, _ = two_steps
    for m in step_rows(history):
        for name in ("iou", "format", "letters"):
            assert math.isfinite(m[f"reward/{name}"])
        # The env's reward is iou_weight * iou + format_weight * format (+ letters here): the means add up too.
        assert m["reward/total"] == pytest.approx(m["reward/iou"] + 0.1 * m["reward/format"] + m["reward/letters"])
        assert 0.0 <= m["env/success_rate"] <= 1.0
    assert len({m["reward/letters"] for m in step_rows(history)}) == 2  # fresh prompts and samples each step


def test_flat_groups_counts_whole_groups(two_steps):
    _, _, history, out, _ = two_steps
    groups = json.loads((out / "config.json").read_text())["trainer"]["prompts_per_step"]
    for m in step_rows(history):
        flat = m["data/flat_groups"] * groups  # groups of this step whose returns were all equal
        assert 0 <= round(flat) <= groups and flat == pytest.approx(round(flat), abs=1e-5)


def test_history_is_the_metrics_file_with_held_out_rows_first_and_last(two_steps):
    _, _, history, out, _ = two_steps
    assert history == read_metrics(out / "metrics.jsonl")
    assert history[0]["step"] == 0 and "eval/iou" in history[0]
    assert history[-1]["step"] == 2 and "eval/iou" in history[-1]


def test_run_writes_its_report(two_steps):
    _, _, _, out, stdout = two_steps
    for name in ("metrics.jsonl", "reward_curve.png", "predictions.png", "eval.json", "config.json"):
        assert (out / name).is_file(), f"{name} missing"
    for name in ("reward_curve.png", "predictions.png"):
        with Image.open(out / name) as image:
            assert image.format == "PNG" and image.width > 0
    report = json.loads((out / "eval.json").read_text())
    assert set(report) == {"before", "after"} and "iou" in report["before"] and "iou" in report["after"]
    assert json.loads((out / "config.json").read_text())["trainer"]["total_steps"] == 2
    before, after = report["before"]["iou"], report["after"]["iou"]
    assert f"held-out mean IoU: {before:.3f} -> {after:.3f}" in stdout


def test_run_prints_the_held_out_line(tmp_path, tiny_run_config, capsys):
    train(tiny_run_config(tmp_path, "trainer.total_steps=1", "trainer.eval_episodes=2"))
    captured = capsys.readouterr()
    assert re.search(r"^held-out mean IoU: \d+\.\d{3} -> \d+\.\d{3}$", captured.out, re.MULTILINE), captured.out
    assert "held-out mean IoU before training:" in captured.err


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_micro_batches_accumulate_to_the_full_batch_gradient(
    aggregation, tmp_path, tiny_run_config, tiny_policy, letters_env
):
    """Splitting the R rows into micro-batches changes nothing but memory: same loss, same gradient.

    EOS is made likely so that completions differ in length; with equal lengths every weighting agrees.
    """
    logged = {}
    for micro in (4, 1, 3):  # R = 4: one batch, four single rows, and an uneven 3 + 1 split
        cfg = tiny_run_config(
            tmp_path / f"micro{micro}",
            f"env.name={letters_env}",
            "trainer.total_steps=1",
            "trainer.eval_episodes=1",
            f"trainer.micro_batch_size={micro}",
            f"algo.aggregation={aggregation}",
            "algo.kl_coef=0.1",
            "sampling.temperature=0.7",
        )
        policy = tiny_policy("qwen2_vl", seed=0, prompt_template=cfg.model.prompt_template)
        bias = torch.zeros(policy.model.config.text_config.vocab_size)
        bias[policy.eos_token_ids] = 5.0
        policy.model.lm_head.register_forward_hook(lambda module, args, out, bias=bias: out + bias)
        (row,) = step_rows(train(cfg, policy=policy, stop_after=1))
        logged[micro] = row
    full = logged[4]
    assert full["completion_len"] < 6, "every completion ran to the limit: lengths do not differ"
    for micro in (1, 3):
        for key in ("loss/policy", "grad_norm", "approx_kl"):
            assert logged[micro][key] == pytest.approx(full[key], rel=1e-4, abs=1e-7), f"micro={micro}: {key}"


def test_overlong_filter_leaves_truncated_completions_out_of_the_loss(
    tmp_path, tiny_run_config, tiny_policy, letters_env
):
    # A random tiny model never emits EOS within 6 tokens: every completion is truncated, so with the filter nothing
    # is left to train on (zero gradient, unchanged weights), while without it the same step moves the weights.
    moved = {}
    for flag in ("false", "true"):
        cfg = tiny_run_config(
            tmp_path / flag, f"env.name={letters_env}", "trainer.total_steps=1", f"algo.overlong.filter={flag}"
        )
        policy = tiny_policy("qwen2_vl", seed=0, prompt_template=cfg.model.prompt_template)
        before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
        with contextlib.redirect_stdout(io.StringIO()):
            row = step_rows(train(cfg, policy=policy))[0]
        assert row["completion_len"] == 6  # truncated at max_new_tokens
        moved[flag] = any(not torch.equal(before[n], p.detach()) for n, p in policy.model.named_parameters())
        if flag == "true":
            assert row["grad_norm"] == 0.0 and row["loss/policy"] == 0.0
    assert moved == {"false": True, "true": False}


def test_soft_overlong_penalty_is_a_logged_reward_component(tmp_path, tiny_run_config, tiny_policy, letters_env):
    cfg = tiny_run_config(
        tmp_path, f"env.name={letters_env}", "trainer.total_steps=1", "algo.overlong.penalty=0.5",
        "algo.overlong.cache_len=2",
    )  # fmt: skip
    policy = tiny_policy("qwen2_vl", seed=0, prompt_template=cfg.model.prompt_template)
    with contextlib.redirect_stdout(io.StringIO()):
        row = step_rows(train(cfg, policy=policy))[0]
    # Every completion is 6 = max_new_tokens long: the ramp has reached its end, -0.5.
    assert row["reward/overlong"] == pytest.approx(-0.5)
    parts = sum(v for k, v in row.items() if k.startswith("reward/") and k != "reward/total")
    assert row["reward/total"] == pytest.approx(parts, abs=1e-5)


def test_a_run_lets_go_of_its_generation_backend_when_it_ends(tmp_path, tiny_run_config, tiny_policy, letters_env):
    """A vLLM engine must shut down before torchrun's process group ends; the trainer closes the policy's backend
    when the run ends, also when it fails."""
    cfg = tiny_run_config(tmp_path, f"env.name={letters_env}", "trainer.total_steps=1")
    policy = tiny_policy("qwen2_vl", seed=0, prompt_template=cfg.model.prompt_template)
    closed = []
    policy.backend.close = lambda: closed.append(True)  # the lean loop holds nothing; record the call
    with contextlib.redirect_stdout(io.StringIO()):
        train(cfg, policy=policy)
    assert closed == [True]
