"""PPO epochs and mini-batches, recomputed old log-probs and the rollout correction, in the real trainer.

The runs train a random tiny Qwen2-VL on `grounding_letters` (conftest), whose dense reward gives GRPO a gradient.
"""

from __future__ import annotations

import contextlib
import copy
import io

import pytest
import torch
from transformers import CompileConfig

from mmrl.runtime.config import ConfigError
from mmrl.runtime.metrics import read_metrics
from mmrl.stages.batching import mini_batch_rows
from mmrl.trainer import train


def _rows(cfg, **kw) -> list[dict]:
    with contextlib.redirect_stdout(io.StringIO()):
        train(cfg, **kw)
    return [m for m in read_metrics(cfg.output_dir + "/metrics.jsonl") if "loss/policy" in m]


def _cfg(tiny_run_config, path, letters_env, *overrides):
    return tiny_run_config(
        str(path), f"env.name={letters_env}", "trainer.total_steps=2", "trainer.eval_episodes=1",
        "algo.group_size=4", "trainer.prompts_per_step=2", "trainer.lr=0.05", *overrides,
    )  # fmt: skip


def test_one_update_per_rollout_is_on_policy_and_no_clip_binds(tmp_path, tiny_run_config, letters_env):
    rows = _rows(_cfg(tiny_run_config, tmp_path, letters_env))
    for row in rows:
        assert row["optimizer_steps"] == 1
        assert row["clip_fraction"] == 0
        assert row["ratio/min"] == pytest.approx(1, abs=1e-3) and row["ratio/max"] == pytest.approx(1, abs=1e-3)
        assert not any(k.startswith(("mismatch/", "correction/")) for k in row)  # nothing recomputed by default


def test_epochs_and_mini_batches_take_several_steps_and_the_clip_binds(tmp_path, tiny_run_config, letters_env):
    rows = _rows(_cfg(tiny_run_config, tmp_path, letters_env, "algo.ppo_epochs=2", "algo.mini_batch_groups=1"))
    assert all(row["optimizer_steps"] == 4 for row in rows)  # 2 epochs x 2 mini-batches of one group
    assert any(row["clip_fraction"] > 0 for row in rows), rows
    assert all(
        row["clip_fraction"] == pytest.approx(row["clip_fraction_low"] + row["clip_fraction_high"]) for row in rows
    )
    assert any(row["ratio/max"] > 1.01 or row["ratio/min"] < 0.99 for row in rows)
    assert all(row["ratio/min"] <= row["ratio/mean"] <= row["ratio/max"] for row in rows)
    assert all(row["approx_kl"] > 0 for row in rows)


def test_recomputed_old_logprobs_measure_the_mismatch_with_the_sampler(tmp_path, tiny_run_config, letters_env):
    # One update (the detached forward is the old policy) and several (a separate pass before the first update).
    for name, extra in (("one", ()), ("many", ("algo.ppo_epochs=2",))):
        rows = _rows(_cfg(tiny_run_config, tmp_path / name, letters_env, "algo.old_logprobs=recompute", *extra))
        for row in rows:
            # transformers' generate and the trainer's forward compute the same policy: they agree to float noise.
            assert 0 <= row["mismatch/kl"] < 1e-4 and row["mismatch/abs_logprob_diff"] < 1e-2
            assert row["correction/weight_mean"] == pytest.approx(1, abs=1e-2)  # token_truncate by default
            assert row["correction/cut_fraction"] == 0


def test_resume_is_exact_with_epochs_mini_batches_and_recompute(tmp_path, tiny_run_config, letters_env):
    options = ("algo.ppo_epochs=2", "algo.mini_batch_groups=1", "algo.old_logprobs=recompute")
    whole = _rows(_cfg(tiny_run_config, tmp_path / "whole", letters_env, *options))
    parts = tmp_path / "parts"
    _rows(_cfg(tiny_run_config, parts, letters_env, *options), stop_after=1)
    resumed = _rows(_cfg(tiny_run_config, parts, letters_env, *options, "resume=true"))
    assert len(resumed) == len(whole) == 2
    for got, want in zip(resumed, whole):
        for key in ("reward/total", "loss/policy", "grad_norm", "clip_fraction", "ratio/max", "mismatch/kl"):
            assert got[key] == pytest.approx(want[key], abs=1e-6), key


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("algo.ppo_epochs=0",), "algo.ppo_epochs must be >= 1"),
        (("algo.mini_batch_groups=-1",), "algo.mini_batch_groups must be >= 0"),
        (("algo.rollout_correction_cap=1",), "algo.rollout_correction_cap must be > 1"),
        (
            ("algo.old_logprobs=sampling", "algo.rollout_correction=token_mask"),
            "algo.rollout_correction 'token_mask' compares .* needs algo.old_logprobs recompute",
        ),
        (("algo.rollout_correction=tis",), "algo.rollout_correction: 'tis' is not one of"),
    ],
)
def test_bad_ppo_settings_name_the_field(tmp_path, tiny_run_config, overrides, message):
    with pytest.raises(ConfigError, match=message):
        tiny_run_config(tmp_path, *overrides)


def test_a_correction_asked_for_turns_recompute_on(tmp_path, tiny_run_config):
    cfg = tiny_run_config(tmp_path, "algo.rollout_correction=sequence_mask")
    assert cfg.recompute_old_logprobs and cfg.correction == "sequence_mask"
    plain = tiny_run_config(tmp_path)
    assert not plain.recompute_old_logprobs and plain.correction is None
    vllm = tiny_run_config(tmp_path, "model.generation_backend=vllm")
    assert vllm.recompute_old_logprobs and vllm.correction == "token_truncate"  # on by default where they differ
    off = tiny_run_config(tmp_path, "model.generation_backend=vllm", "algo.rollout_correction=none")
    assert off.recompute_old_logprobs and off.correction is None  # measured, not corrected


def test_mini_batch_rows_cover_every_group_once_per_pass_whole():
    row_groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 2])  # a multi-turn row of group 2 at the end
    parts = mini_batch_rows(row_groups, 0, 5, 2, torch.Generator().manual_seed(0))
    assert len(parts) == 3  # ceil(5 / 2)
    assert sorted(torch.cat(parts).tolist()) == list(range(11))  # every row once
    for part in parts:
        groups = row_groups[part].unique()
        assert len(groups) <= 2
        assert torch.equal(torch.isin(row_groups, groups).nonzero().squeeze(-1), part)  # whole groups, in order
    assert mini_batch_rows(row_groups, 0, 5, 0, torch.Generator()) == [None]  # one batch: no draw
    assert mini_batch_rows(row_groups, 0, 5, 5, torch.Generator()) == [None]
    other = mini_batch_rows(row_groups, 0, 5, 2, torch.Generator().manual_seed(1))
    assert any(not torch.equal(a, b) for a, b in zip(parts, other))  # a fresh order per draw


def test_mini_batches_of_two_processes_are_those_of_one():
    """Process 0 holding groups 0-2 and process 1 groups 3-4 take between them the rows one process takes."""
    one = mini_batch_rows(torch.arange(5).repeat_interleave(2), 0, 5, 2, torch.Generator().manual_seed(3))
    rank0 = mini_batch_rows(torch.arange(3).repeat_interleave(2), 0, 5, 2, torch.Generator().manual_seed(3))
    rank1 = mini_batch_rows(torch.arange(2).repeat_interleave(2), 3, 5, 2, torch.Generator().manual_seed(3))
    assert len(rank0) == len(rank1) == len(one)
    for whole, a, b in zip(one, rank0, rank1):
        assert torch.equal(whole, torch.cat([a, b + 6]))  # process 1's rows follow process 0's six


# ---------------------------------------------------------------------------------------------- pipelined collection


def test_pipelined_collection_trains_on_rows_one_update_stale_and_corrects_them(
    tmp_path, tiny_run_config, letters_env
):
    rows = _rows(_cfg(tiny_run_config, tmp_path, letters_env, "trainer.total_steps=3", "trainer.max_staleness=1"))
    assert [r["pipeline/stale"] for r in rows] == [0, 1, 1]  # step 1 is collected before any update
    assert all("mismatch/kl" in r and "correction/weight_mean" in r for r in rows)
    assert rows[0]["mismatch/kl"] < 1e-4  # the same weights sampled and scored
    assert rows[2]["mismatch/kl"] > rows[0]["mismatch/kl"]  # a step behind (lr 0.05 moves the tiny model)


def test_pipelined_rows_are_the_synchronous_ones_when_the_weights_do_not_move(tmp_path, tiny_run_config, letters_env):
    """With lr 0 the copy's weights are the policy's: the prefetching thread must draw exactly the same episodes."""
    common = ("trainer.total_steps=3", "trainer.lr=0")
    sync = _rows(_cfg(tiny_run_config, tmp_path / "sync", letters_env, *common))
    piped = _rows(_cfg(tiny_run_config, tmp_path / "piped", letters_env, *common, "trainer.max_staleness=1"))
    for a, b in zip(sync, piped):
        for key in ("reward/total", "completion_len", "loss/policy"):
            assert a[key] == pytest.approx(b[key], abs=1e-6), (a["step"], key)


def test_resume_is_exact_with_pipelined_collection(tmp_path, tiny_run_config, letters_env):
    options = ("trainer.total_steps=3", "trainer.max_staleness=1")
    whole = _rows(_cfg(tiny_run_config, tmp_path / "whole", letters_env, *options))
    parts = tmp_path / "parts"
    _rows(_cfg(tiny_run_config, parts, letters_env, *options), stop_after=2)
    resumed = _rows(_cfg(tiny_run_config, parts, letters_env, *options, "resume=true"))
    assert [r["step"] for r in resumed] == [1, 2, 3] and resumed[2]["pipeline/stale"] == 1
    for got, want in zip(resumed, whole):
        for key in ("reward/total", "loss/policy", "grad_norm", "mismatch/kl"):
            assert got[key] == pytest.approx(want[key], abs=1e-6), (got["step"], key)


def test_a_copy_of_the_policy_decodes_with_its_own_weights_not_through_the_originals_compiled_forward(tiny_policy):
    """transformers caches a compiled forward on a model the first time a compiled backend generates with it, and
    `copy.deepcopy` copies functions by reference: a plain deep copy would keep the ORIGINAL's compiled forward, so
    the pipelined copy would sample with the weights being updated. `VLMPolicy.__deepcopy__` drops it."""
    policy = tiny_policy("qwen2_vl", seed=0)
    mine = policy.model.get_compiled_call(CompileConfig())  # what the static backend's first CUDA call leaves
    assert copy.deepcopy(policy.model)._compiled_call is mine  # the hazard: a model copied as it comes
    clone = copy.deepcopy(policy)
    assert not any(hasattr(m, "_compiled_call") for m in clone.model.modules())
    assert clone.model.get_compiled_call(CompileConfig()) is not mine
    assert policy.model._compiled_call is mine  # the original keeps its own
    assert clone.action_codec is None and clone.prompt_template == policy.prompt_template
    assert clone.generation_backend == policy.generation_backend


def test_a_negative_staleness_is_refused(tmp_path, tiny_run_config):
    with pytest.raises(ConfigError, match=r"trainer.max_staleness must be >= 0"):
        tiny_run_config(tmp_path, "trainer.max_staleness=-1")
    assert tiny_run_config(tmp_path, "trainer.max_staleness=2").correction == "token_truncate"


# ---------------------------------------------------------------------------------------------- GiGPO in the trainer


def test_gigpo_trains_vla_episodes_with_anchor_states(tmp_path, tiny_run_config, point_env):
    from tests.mmrl.test_vla import VLA_RUN

    cfg = tiny_run_config(
        str(tmp_path), *VLA_RUN, f"env.name={point_env}", "trainer.total_steps=2", "algo.advantage=gigpo",
        "algo.credit=step", "sft.episodes=0", "algo.entropy_coef=0.01",
    )  # fmt: skip
    rows = _rows(cfg)
    assert len(rows) == 2 and all(r["env/episode_steps"] >= 1 for r in rows)
    with pytest.raises(
        ConfigError, match="algo.advantage 'gigpo' gives each turn its own advantage: it needs algo.credit step"
    ):
        tiny_run_config(str(tmp_path), "algo.advantage=gigpo")


def test_every_turn_records_what_it_saw(tiny_policy, point_env):
    import sim
    from mmrl.policy import add_action_tokens
    from mmrl.stages.rollout import collect_episodes, observation_keys
    from mmrl.types import Sampling

    policy = tiny_policy("qwen3_vl", prompt_template="{image} {instruction}")
    env = sim.make(point_env, num_envs=4)
    add_action_tokens(policy, env.action_low, env.action_high, bins=16)
    torch.manual_seed(0)
    episodes = collect_episodes(policy, env, [5, 5, 6, 6], 2, Sampling(temperature=1.0))
    keys = episodes.state_keys
    assert keys.shape == episodes.active.shape
    assert keys[0, 0] == keys[1, 0] and keys[2, 0] == keys[3, 0] and keys[0, 0] != keys[2, 0]  # reset from one seed
    obs = env.reset(seed=[5, 6, 6, 5])
    assert observation_keys(obs).tolist() == keys[[0, 2, 3, 1], 0].tolist()
