"""Config: presets load, overrides convert their values, and every mistake is an error that names the key."""

from __future__ import annotations

from pathlib import Path

import pytest

import sim
from mmrl import algos
from mmrl.config import ConfigError, TrainConfig, TrainerConfig, load_config

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted((REPO / "configs").glob("*.yaml"))


def test_there_are_presets():
    assert PRESETS, "configs/ holds no YAML preset"


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_preset_loads_and_names_registered_components(preset):
    cfg = load_config(preset)
    assert isinstance(cfg, TrainConfig)
    assert cfg.env.name in sim.ENVS
    assert cfg.algo.advantage in algos.ADVANTAGES
    assert cfg.algo.loss in algos.POLICY_LOSSES
    assert "{instruction}" in cfg.model.prompt_template


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_preset_model_exists(preset):
    """A CPU preset's model is a random tiny one or a folder in the repository (they must run offline). GPU presets
    (`model.device: cuda`) start from a real checkpoint the user downloads: they name its hub id."""
    cfg = load_config(preset)
    path = cfg.model.path
    if path.startswith("tiny:"):
        return
    if cfg.model.device.startswith("cuda"):
        assert "/" in path, f"{preset.name}: a GPU preset names a checkpoint (hub id or folder), got {path!r}"
        return
    assert (REPO / path).is_dir() or Path(path).is_dir(), f"{preset.name} names model {path!r}, which does not exist"


def test_overrides_convert_values_to_the_field_types(tmp_path):
    cfg = load_config(
        None,
        [
            "trainer.lr=1e-5",  # YAML 1.1 reads this as a string; the float field converts it
            "trainer.total_steps=1e3",
            "trainer.save_every=7",
            "sampling.temperature=1",  # an int where a float is due
            "resume=true",
            "checkpoint=null",
            "model.prompt_template='{instruction} Box?'",
            f"output_dir={tmp_path}",
        ],
    )
    assert cfg.trainer.lr == 1e-5 and type(cfg.trainer.lr) is float
    assert cfg.trainer.total_steps == 1000 and type(cfg.trainer.total_steps) is int
    assert cfg.trainer.save_every == 7
    assert cfg.sampling.temperature == 1.0 and type(cfg.sampling.temperature) is float
    assert cfg.resume is True
    assert cfg.checkpoint is None
    assert cfg.model.prompt_template == "{instruction} Box?"
    assert cfg.output_dir == str(tmp_path)


def test_overrides_win_over_the_preset_and_leave_the_rest():
    preset = load_config(REPO / "configs" / "grounding_tiny.yaml")
    cfg = load_config(REPO / "configs" / "grounding_tiny.yaml", ["trainer.total_steps=3"])
    assert cfg.trainer.total_steps == 3
    assert cfg.trainer.lr == preset.trainer.lr and cfg.algo == preset.algo and cfg.env == preset.env


def test_env_options_override_goes_into_the_dict():
    cfg = load_config(REPO / "configs" / "grounding_tiny.yaml", ["env.options.x=1", "env.options.max_shapes=3"])
    assert cfg.env.options["x"] == 1 and cfg.env.options["max_shapes"] == 3
    assert cfg.env.options["image_size"] == 128  # the preset's own option stays


def test_unknown_key_in_an_override_names_it_and_the_valid_ones():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["trainer.totl_steps=3"])
    message = str(err.value)
    assert "totl_steps" in message
    for field in ("total_steps", "prompts_per_step", "lr", "save_every"):
        assert field in message


def test_unknown_section_in_an_override_names_it_and_the_valid_ones():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["trainr.lr=1"])
    message = str(err.value)
    assert "trainr" in message and "trainer" in message and "sampling" in message


def test_unknown_key_in_a_yaml_file_names_it_and_the_valid_ones(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("trainer:\n  total_steps: 3\n  learning_rate: 0.1\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert "learning_rate" in message and "lr" in message and "total_steps" in message


def test_unknown_top_level_key_in_a_yaml_file_is_refused(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("trainer: {total_steps: 3}\noutput: runs/x\n")
    with pytest.raises(ConfigError, match="output"):
        load_config(path)


def test_yaml_file_must_be_a_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- trainer\n- model\n")
    with pytest.raises(ConfigError):
        load_config(path)


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("algo.aggregation=token_sum", "algo.aggregation"),  # not one of the Literal's choices
        ("algo.kl_estimator=k4", "algo.kl_estimator"),
        ("model.dtype=float64", "model.dtype"),
    ],
)
def test_literal_violation_names_the_key_and_the_choices(override, named):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert named in str(err.value)
    if named == "algo.aggregation":
        assert "token_mean" in str(err.value)


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("trainer.total_steps=abc", "trainer.total_steps"),
        ("trainer.total_steps=1.5", "trainer.total_steps"),  # no silent truncation
        ("trainer.total_steps=true", "trainer.total_steps"),
        ("trainer.lr=fast", "trainer.lr"),
        ("resume=maybe", "resume"),
        ("env.options=3", "env.options"),
        ("trainer=3", "trainer"),
        ("output_dir=[a, b]", "output_dir"),
    ],
)
def test_wrong_type_names_the_key(override, named):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert named in str(err.value)


def test_malformed_overrides_are_refused():
    with pytest.raises(ConfigError, match="section.field=value"):
        load_config(None, ["trainer.lr"])
    with pytest.raises(ConfigError, match="not a section"):
        load_config(REPO / "configs" / "grounding_tiny.yaml", ["trainer.lr.x=1"])


def test_defaults_need_no_file():
    cfg = load_config()
    assert cfg == TrainConfig()
    assert cfg.trainer == TrainerConfig()
