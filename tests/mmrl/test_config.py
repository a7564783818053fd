"""Config: presets load, overrides convert their values, and every mistake is an error that names the key."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import sim
from mmrl import algos
from mmrl.runtime.config import AlgoConfig, ConfigError, TrainConfig, TrainerConfig, load_config, to_dict
from mmrl.runtime.schema import MOVED

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted((REPO / "configs").glob("*.yaml"))


def test_there_are_presets():
    assert PRESETS, "configs/ holds no YAML preset"


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_preset_loads_and_names_registered_components(preset):
    cfg = load_config(preset)
    assert isinstance(cfg, TrainConfig)
    assert cfg.env.name in sim.ENVS
    assert cfg.algo.advantage in algos.ADVANTAGES or cfg.algo.advantage in algos.CRITIC_ADVANTAGES
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
    cfg = load_config(REPO / "configs" / "grounding_tiny.yaml", ["env.options.device=cpu", "env.options.max_shapes=3"])
    assert cfg.env.options["device"] == "cpu" and cfg.env.options["max_shapes"] == 3
    assert cfg.env.options["image_size"] == 128  # the preset's own option stays


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["env.options.image_size=big"],
            r"^env.options.image_size: expected an integer, got 'big' \(an option of env 'grounding'\)",
        ),
        (["env.options.max_shapes=3.5"], r"^env.options.max_shapes: expected an integer, got 3.5"),
        (["env.options.imag_size=64"], r"^env.options.imag_size: unknown option; valid: .*image_size"),
        (["env.name=dataset", "env.options.split=eval"], r"^env.options.split: expected one of 'auto', 'train'"),
        (["env.name=dataset", "env.options={shuffle: maybe}"], r"^env.options.shuffle: expected true or false"),
        (
            ["curriculum.option=max_shapes", "curriculum.levels=[1, two]", "curriculum.steps_per_level=2"],
            r"^curriculum.levels\[1\]: expected an integer, got 'two' \(values of env option 'max_shapes'\)",
        ),
    ],
)
def test_env_options_are_checked_against_the_constructor_at_load(overrides, message):
    """A wrong type is a ConfigError naming env.options.<key> and the expected type, not a TypeError in the env."""
    with pytest.raises(ConfigError, match=message):
        load_config(REPO / "configs" / "grounding_tiny.yaml", overrides)


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


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_a_moved_key_is_refused_in_one_line_naming_its_new_place(tmp_path, old, new):
    """Every key the nested sections replaced, on the command line and in a YAML preset; the new key takes the same
    value."""
    default = _get(TrainConfig(), new)
    value = {"algo.ttrv_answer": "text", "algo.papo_mask": "pixels", "model.lora_target_modules": "q_proj",
             "model.flow_noise_method": "flow_sde"}.get(old, "true" if isinstance(default, bool) else "1")  # fmt: skip
    with pytest.raises(ConfigError, match=rf"^{re.escape(old)} moved to {re.escape(new)}$"):
        load_config(None, [f"{old}={value}"])
    section, key = old.split(".")
    path = tmp_path / "old.yaml"
    path.write_text(f"{section}:\n  {key}: {value}\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(old)} moved to {re.escape(new)}$"):
        load_config(path)
    extra = ["model.lora.r=1"] if new == "model.lora.vision" else []
    extra += ["algo.advantage=gae"] if new.startswith("algo.critic.") else []
    assert _get(load_config(None, [f"{new}={value}", *extra]), new) != default  # its new place takes it


def test_every_moved_key_points_at_a_field_and_no_longer_exists():
    fields = _flat_keys(to_dict(TrainConfig()))
    for old, new in MOVED.items():
        assert new in fields and old not in fields, (old, new)


def _get(cfg, key: str):
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _flat_keys(data: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in data.items():
        keys.add(f"{prefix}{key}")
        if isinstance(value, dict):
            keys |= _flat_keys(value, f"{prefix}{key}.")
    return keys


def test_unknown_top_level_key_in_a_yaml_file_is_refused(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("trainer: {total_steps: 3}\noutput: runs/x\n")
    with pytest.raises(ConfigError, match="output"):
        load_config(path)


@pytest.mark.parametrize("seed", ["-1", "50", "1234"])
def test_a_run_seed_outside_the_training_ranges_names_the_field(seed):
    with pytest.raises(ConfigError, match="trainer.seed"):
        load_config(None, [f"trainer.seed={seed}"])


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


# ---------------------------------------------------------------------------------------------- cross-field checks
@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algo.group_size=0"], "algo.group_size must be >= 1"),
        (["algo.advantage=ppo"], "algo.advantage 'ppo' is not one of"),
        (["algo.loss=clip"], "algo.loss 'clip' is not one of"),
        (["algo.credit=step", "algo.advantage=rloo"], r"algo.credit 'step' works with algo.advantage .*not 'rloo'"),
        (["algo.advantage=rloo", "algo.group_size=1"], "algo.advantage rloo needs algo.group_size >= 2"),
        (["algo.clip_high=-0.1"], "algo.clip_high must be >= 0"),
        (["algo.kl_coef=-1"], "algo.kl_coef must be >= 0"),
        (["algo.entropy_coef=-0.01"], "algo.entropy_coef must be >= 0"),
        (["algo.papo.mask_ratio=1.5"], r"algo.papo.mask_ratio must be in \[0, 1\]"),
        (["algo.difficulty_low=0.8", "algo.difficulty_high=0.2"], "algo.difficulty_low must be below"),
        (["algo.max_sample_batches=0"], "algo.max_sample_batches must be >= 1"),
        (["trainer.prompts_per_step=0"], "trainer.prompts_per_step must be >= 1"),
        (["trainer.micro_batch_size=0"], "trainer.micro_batch_size must be >= 1"),
        (["trainer.rollout_workers=-1"], "trainer.rollout_workers must be >= 0"),
        (["trainer.rollout_workers=1", "env.workers=1"], "trainer.rollout_workers and env.workers"),
        (["trainer.rollout_workers=1", "model.generation_backend=vllm"], "trainer.rollout_workers runs CPU copies"),
        (["trainer.master_weights=float32"], "trainer.master_weights='float32' needs model.dtype"),
        (["trainer.master_weights=float32", "model.dtype=bfloat16", "model.lora.r=8"], "model.lora.r > 0"),
        (["model.action_bins=1"], "model.action_bins must be 0"),
        (["env.workers=-2"], "env.workers must be >= 0"),
        (["sft.steps=0"], "sft.steps must be >= 1"),
        (["sampling.max_new_tokens=0"], "sampling.max_new_tokens must be >= 1"),
        (["sampling.top_p=0"], r"sampling.top_p must be in \(0, 1\]"),
        (["curriculum.option=max_shapes"], "curriculum.levels is empty"),
        (["curriculum.option=max_shapes", "curriculum.levels=[1, 2]"], "curriculum.promote_at or"),
    ],
)
def test_cross_field_mistakes_are_refused_at_load_naming_the_fields(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_configs_built_in_python_are_checked_too():
    from dataclasses import replace

    cfg = TrainConfig()
    with pytest.raises(ConfigError, match="algo.credit"):
        replace(cfg, algo=replace(cfg.algo, credit="step", advantage="reinforce_pp"))
    with pytest.raises(ConfigError, match="trainer.master_weights"):
        replace(cfg, trainer=replace(cfg.trainer, master_weights="float32"))


def test_step_credit_takes_each_estimator_it_has():
    for name in algos.STEP_ADVANTAGES.names():
        assert load_config(None, ["algo.credit=step", f"algo.advantage={name}"]).algo.advantage == name


def test_malformed_yaml_is_one_line_naming_file_line_and_column(tmp_path, capsys):
    from mmrl.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  path: x\nenv: {name: grounding, options: [1, 2\ntrainer:\n  lr: 1\n")
    with pytest.raises(ConfigError, match=rf"^{bad}:4:8: expected ',' or '\]'"):
        load_config(bad)
    assert main(["train", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"mmrl: config error: {bad}:4:8:") and "\n" not in err and "Traceback" not in err
    with pytest.raises(ConfigError, match=r"override 'env.options=\{a: \[1,': the value is not valid YAML \(1:"):
        load_config(None, ["env.options={a: [1,"])


# ---------------------------------------------------------------------------------------------- each loss's own range
def _clip(cfg) -> tuple:
    return cfg.algo.clip_low, cfg.algo.clip_high, cfg.algo.aggregation


@pytest.mark.parametrize("loss", ["ppo_clip", "dual_clip"])
def test_ppo_losses_keep_the_dapo_range_and_token_mean(loss):
    assert _clip(load_config(None, [f"algo.loss={loss}"])) == (0.2, 0.28, "token_mean")
    assert _clip(TrainConfig(algo=AlgoConfig(loss=loss))) == (0.2, 0.28, "token_mean")
    # null asks for the loss's own value, which every reader then sees as a number
    resolved = load_config(None, [f"algo.loss={loss}", "algo.clip_low=null", "algo.aggregation=null"])
    assert _clip(resolved) == (0.2, 0.28, "token_mean") and type(resolved.algo.clip_low) is float


def test_gspo_defaults_to_the_papers_sequence_range_and_sequence_mean():
    assert _clip(load_config(None, ["algo.loss=gspo"])) == (3e-4, 4e-4, "seq_mean_token_mean")
    assert _clip(TrainConfig(algo=AlgoConfig(loss="gspo"))) == (3e-4, 4e-4, "seq_mean_token_mean")
    # the config's defaults are the ones gspo_loss itself states
    params = inspect.signature(algos.gspo_loss).parameters
    assert _clip(load_config(None, ["algo.loss=gspo"])) == tuple(
        params[name].default for name in ("clip_low", "clip_high", "aggregation")
    )
    chosen = ["algo.loss=gspo", "algo.clip_low=1e-3", "algo.clip_high=0.01", "algo.aggregation=token_mean"]
    assert _clip(load_config(None, chosen)) == (1e-3, 0.01, "token_mean")  # a sequence-sized range is taken as given


@pytest.mark.parametrize(
    "overrides", [["algo.clip_low=0.2"], ["algo.clip_high=0.28"], ["algo.clip_low=0.2", "algo.clip_high=0.2"]]
)
def test_a_token_sized_clip_range_with_gspo_is_refused_naming_the_fields(overrides):
    with pytest.raises(ConfigError, match=r"^algo.clip_low and algo.clip_high \(.*\) .* algo.loss gspo .* 0.01"):
        load_config(None, ["algo.loss=gspo", *overrides])
    with pytest.raises(ConfigError, match="algo.clip_low and algo.clip_high"):
        AlgoConfig(loss="gspo", clip_low=0.2, clip_high=0.28)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["trainer.lr=inf"], "trainer.lr: expected a finite number, got 'inf'"),
        (["trainer.lr=.inf"], "trainer.lr: expected a finite number, got inf"),
        (["sampling.temperature=nan"], "sampling.temperature: expected a finite number, got 'nan'"),
        (["algo.papo.gamma=.nan"], "algo.papo.gamma: expected a finite number, got nan"),
        (["trainer.weight_decay=-0.1"], "trainer.weight_decay must be >= 0, got -0.1"),
        (["algo.group_size=1"], "algo.group_size is 1, under which every grpo advantage is 0"),
        (["algo.advantage=dr_grpo", "algo.group_size=1"], "algo.group_size is 1, under which every dr_grpo advantage"),
    ],
)
def test_values_are_checked_as_numbers_naming_the_field(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, overrides)


def test_group_size_one_is_fine_where_a_baseline_is_not_the_group():
    assert load_config(None, ["algo.advantage=reinforce_pp", "algo.group_size=1"]).algo.group_size == 1


def test_a_key_given_twice_in_a_preset_is_refused_naming_it_and_the_line(tmp_path):
    preset = tmp_path / "twice.yaml"
    preset.write_text("trainer:\n  lr: 0.001\nenv:\n  name: grounding\ntrainer:\n  total_steps: 3\n")
    with pytest.raises(ConfigError, match=r"twice.yaml:5:1: key 'trainer' is given twice in one mapping"):
        load_config(preset)
