"""A π0 folder whose normalisation statistics are LeRobot's: its policy processors (`policy_preprocessor.json` +
`policy_postprocessor.json` and their safetensors, as LeRobot >= 0.4 writes them) or its older normalisation buffers
inside `model.safetensors`; each mode read into `FlowStats` and checked against LeRobot's formulas by hand, and what
is missing named."""

import json

import pytest
import torch
from safetensors.torch import save_file

from mmrl.policy.flow import FlowPolicy, FlowStats, build_tiny_flow
from mmrl.policy.flow.folders import check_flow_folder, read_folder_stats

# Values float32 holds exactly (the safetensors are float32), so the statistics read compare equal.
STATE_MEAN, STATE_STD = [0.125, -0.25, 0.375, 0.0], [0.5, 0.25, 2.0, 1.0]
ACTION_MEAN, ACTION_STD = [0.0625, -0.0625], [0.375, 0.75]
PRE = "policy_preprocessor_step_5_normalizer_processor.safetensors"
POST = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
NORM_MAP = {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"}  # LeRobot's PI0Config default


def _normalizer(registry_name: str, state_file: str, norm_map: dict) -> dict:
    features = {
        "observation.images.image": {"type": "VISUAL", "shape": [3, 224, 224]},
        "observation.state": {"type": "STATE", "shape": [4]},
        "action": {"type": "ACTION", "shape": [2]},
    }
    return {"registry_name": registry_name, "config": {"eps": 1e-8, "features": features, "norm_map": norm_map},
            "state_file": state_file}  # fmt: skip


def _write_processors(folder, pre_stats: dict, post_stats: dict | None = None, norm_map=NORM_MAP) -> None:
    """LeRobot's pipeline files as `DataProcessorPipeline.save_pretrained` lays them out (π0's steps)."""
    steps = [
        {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
        {"registry_name": "to_batch_processor", "config": {}},
        {"registry_name": "pi0_new_line_processor", "config": {}},
        {"registry_name": "tokenizer_processor", "config": {"max_length": 48, "padding_side": "right"}},
        {"registry_name": "device_processor", "config": {"device": "cpu"}},
        _normalizer("normalizer_processor", PRE, norm_map),
    ]
    (folder / "policy_preprocessor.json").write_text(json.dumps({"name": "policy_preprocessor", "steps": steps}))
    save_file({k: torch.tensor(v) for k, v in pre_stats.items()}, folder / PRE)
    if post_stats is not None:
        steps = [_normalizer("unnormalizer_processor", POST, norm_map), {"registry_name": "device_processor",
                                                                          "config": {"device": "cpu"}}]  # fmt: skip
        (folder / "policy_postprocessor.json").write_text(json.dumps({"name": "policy_postprocessor", "steps": steps}))
        save_file({k: torch.tensor(v) for k, v in post_stats.items()}, folder / POST)


def _mean_std(state=(STATE_MEAN, STATE_STD), action=(ACTION_MEAN, ACTION_STD)) -> dict:
    return {"observation.state.mean": state[0], "observation.state.std": state[1], "action.mean": action[0],
            "action.std": action[1], "observation.images.image.mean": [0.5, 0.5, 0.5]}  # fmt: skip


@pytest.fixture
def pi0_folder(tmp_path):
    """A tiny PI0 folder in transformers' layout with no statistics of its own (processor_config.json has none)."""
    folder = tmp_path / "pi0"
    build_tiny_flow(seed=0).save_pretrained(folder)
    assert FlowStats.read(folder) is None
    return folder


def test_model_path_reads_lerobots_processor_statistics(pi0_folder):
    post_action_std = [0.4375, 0.8125]  # the postprocessor's (what LeRobot unnormalises actions with) win for actions
    _write_processors(pi0_folder, _mean_std(), _mean_std(action=(ACTION_MEAN, post_action_std)))
    policy = FlowPolicy.from_pretrained(pi0_folder)
    eps = 1e-8
    assert policy.stats == FlowStats(
        tuple(STATE_MEAN),
        tuple(s + eps for s in STATE_STD),
        tuple(ACTION_MEAN),
        tuple(s + eps for s in post_action_std),
    )
    # LeRobot's MEAN_STD by hand: (x - mean) / (std + eps) for the state, x * std + mean back for actions.
    state = torch.tensor([[0.6, 0.05, -1.7, 2.0]])
    expected = [(x - m) / (s + eps) for x, m, s in zip(state[0].tolist(), STATE_MEAN, STATE_STD)]
    got = policy._normalise(state, policy.stats.state_mean, policy.stats.state_std)
    torch.testing.assert_close(got[0], torch.tensor(expected))
    chunk = torch.zeros(1, policy.chunk, policy.config.max_action_dim)
    chunk[..., 0], chunk[..., 1] = 1.0, -2.0
    actions = policy.unnormalise_actions(chunk)  # [1, C, 2]
    torch.testing.assert_close(actions[0, 0], torch.tensor([1.0 * 0.4375 + 0.0625, -2.0 * 0.8125 - 0.0625]))


def test_min_max_and_quantile_normalisations_map_onto_mean_and_std(pi0_folder):
    stats = {"observation.state.min": [-1.0, 0.0, 2.0, 5.0], "observation.state.max": [1.0, 4.0, 3.0, 5.0],
             "action.q01": [-0.5, 0.0], "action.q99": [0.5, 2.0], "action.mean": [9.0, 9.0]}  # fmt: skip
    _write_processors(pi0_folder, stats, norm_map={"STATE": "MIN_MAX", "ACTION": "QUANTILES"})
    got = read_folder_stats(pi0_folder)
    # [min, max] -> [-1, 1]: mean (max + min) / 2, std (max - min) / 2; a constant dimension divides by eps.
    assert got.state_mean == (0.0, 2.0, 2.5, 5.0) and got.state_std == (1.0, 2.0, 0.5, 0.5e-8)
    assert got.actions_mean == (0.0, 1.0) and got.actions_std == (0.5, 1.0)
    low, high = torch.tensor([[-1.0, 0.0, 2.0]]), torch.tensor([[1.0, 4.0, 3.0]])  # the state's first three
    mean, std = torch.tensor(got.state_mean[:3]), torch.tensor(got.state_std[:3])
    torch.testing.assert_close((low - mean) / std, -torch.ones(1, 3))
    torch.testing.assert_close((high - mean) / std, torch.ones(1, 3))


def test_older_lerobot_checkpoints_normalisation_buffers(tmp_path):
    folder = tmp_path / "old"
    folder.mkdir()
    buffers = {
        "normalize_inputs.buffer_observation_state.mean": STATE_MEAN,
        "normalize_inputs.buffer_observation_state.std": STATE_STD,
        "normalize_targets.buffer_action.mean": [7.0, 7.0],  # the unnormaliser's (below) come first
        "normalize_targets.buffer_action.std": [7.0, 7.0],
        "unnormalize_outputs.buffer_action.mean": ACTION_MEAN,
        "unnormalize_outputs.buffer_action.std": ACTION_STD,
        "model.action_out_proj.weight": [[0.0]],
    }
    save_file({k: torch.tensor(v) for k, v in buffers.items()}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"type": "pi0", "normalization_mapping": NORM_MAP}))
    got = read_folder_stats(folder)
    assert got.state_mean == tuple(STATE_MEAN) and got.actions_mean == tuple(ACTION_MEAN)
    assert got.actions_std == tuple(s + 1e-8 for s in ACTION_STD)


def test_what_is_missing_is_named(pi0_folder, tmp_path):
    stats = _mean_std()
    del stats["observation.state.std"]
    _write_processors(pi0_folder, stats)
    with pytest.raises(ValueError, match=r"no observation.state.std \(its STATE features are normalised MEAN_STD\)"):
        FlowPolicy.from_pretrained(pi0_folder)
    (pi0_folder / PRE).unlink()
    with pytest.raises(ValueError, match=f"state file '{PRE}' is missing"):
        read_folder_stats(pi0_folder)
    _write_processors(pi0_folder, _mean_std(), norm_map={"STATE": "MEAN_STD", "ACTION": "LOG"})
    with pytest.raises(ValueError, match="action's normalisation 'LOG' is not one of"):
        read_folder_stats(pi0_folder)
    lerobot = tmp_path / "lerobot_native"
    lerobot.mkdir()
    (lerobot / "config.json").write_text(json.dumps({"type": "pi0", "paligemma_variant": "gemma_2b"}))
    with pytest.raises(ValueError, match="is a LeRobot π0 checkpoint"):
        check_flow_folder(lerobot)
    (lerobot / "config.json").write_text(json.dumps({"type": "pi0", "use_relative_actions": True}))
    _write_processors(lerobot, _mean_std())
    with pytest.raises(ValueError, match="use_relative_actions: true"):
        read_folder_stats(lerobot)


def _lerobot_name(name: str) -> str:
    """A PI0 weight's name in LeRobot's `PI0Policy` (openpi's PyTorch layout)."""
    for ours, theirs in (
        ("embed_action_time.", "model."), ("model.vlm.", "model.paligemma_with_expert.paligemma.model."),
        ("model.dit.", "model.paligemma_with_expert.gemma_expert.model."), ("action_out_proj.", "model.action_out_proj."),
    ):  # fmt: skip
        if name.startswith(ours):
            return theirs + name.removeprefix(ours)
    return name


def test_weights_under_lerobots_names_load_or_are_refused_never_left_random(pi0_folder):
    from safetensors.torch import load_file

    _write_processors(pi0_folder, _mean_std())
    weights = load_file(pi0_folder / "model.safetensors")
    expected = FlowPolicy.from_pretrained(pi0_folder).net.state_dict()
    # A weight the folder lacks: refused, naming it (transformers alone would start it at random, with a warning).
    save_file({k: v for k, v in weights.items() if k != "action_out_proj.weight"}, pi0_folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"1 of the model's weights are not in the folder \(e.g. action_out_proj"):
        FlowPolicy.from_pretrained(pi0_folder)
    # LeRobot's names: transformers renames them (5.2x) and every weight is the folder's; or refused with the renaming.
    save_file({_lerobot_name(k): v for k, v in weights.items()}, pi0_folder / "model.safetensors")
    try:
        policy = FlowPolicy.from_pretrained(pi0_folder)
    except ValueError as e:
        assert "LeRobot's names" in str(e) and "model.vlm" in str(e)
        return
    got = policy.net.state_dict()
    assert got.keys() == expected.keys() and all(torch.equal(got[k], v) for k, v in expected.items())
    assert policy.stats.state_mean == tuple(STATE_MEAN)
