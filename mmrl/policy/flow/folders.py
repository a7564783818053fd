"""A π0 folder on disk: what it holds, its image settings, and its normalisation statistics, ours or LeRobot's.

A folder `FlowPolicy.from_pretrained` loads is transformers' PI0 layout (config.json with `"model_type": "pi0"`,
the weights, PaliGemma's tokenizer, `preprocessor_config.json`). Its state/action statistics are read, in order, from

1. `processor_config.json`: `PI0Processor`'s fields `state_mean`, `state_std`, `actions_mean`, `actions_std` (what
   mmrl saves);
2. LeRobot's policy processors (LeRobot >= 0.4): `policy_preprocessor.json`, whose `normalizer_processor` step names
   its state file (`policy_preprocessor_step_<i>_normalizer_processor.safetensors`, keys `observation.state.mean`,
   `action.std`, ...), and `policy_postprocessor.json`'s `unnormalizer_processor` (the actions' statistics at
   inference, preferred for actions); each step's `norm_map` says how a feature type is normalised;
3. LeRobot's older checkpoints: the normalisation buffers inside `model.safetensors`
   (`normalize_inputs.buffer_observation_state.mean`, `unnormalize_outputs.buffer_action.std`, ...), with
   config.json's `normalization_mapping`.

LeRobot's modes are all affine per dimension, so each is one (mean, std) pair of `FlowStats`: MEAN_STD divides by
`std + eps` (LeRobot's eps, 1e-8: the std is stored so), MIN_MAX maps [min, max] to [-1, 1] (mean = (max + min) / 2,
std = (max - min) / 2), QUANTILES and QUANTILE10 likewise with q01/q99 and q10/q90, IDENTITY is mean 0, std 1.
"""

from __future__ import annotations

import json
from pathlib import Path

from sim.errors import InputError

from ..lora import base_state_dict, is_lora_model, load_lora
from .data import STATS_FILE, FlowStats
from .options import train_noise_head

# openpi's Gemma variants (`gemma.get_config`), in transformers' GemmaConfig names: π0's backbone is gemma_2b, its
# action expert gemma_300m; LeRobot's config.json names them (`paligemma_variant`, `action_expert_variant`).
NOISE_HEAD_FILE = "flow_noise_head.safetensors"  # the noise head's weights, beside the PI0 model's

GEMMA_VARIANTS = {
    "gemma_2b": {"hidden_size": 2048, "num_hidden_layers": 18, "intermediate_size": 16384, "num_attention_heads": 8,
                 "num_key_value_heads": 1, "head_dim": 256},
    "gemma_300m": {"hidden_size": 1024, "num_hidden_layers": 18, "intermediate_size": 4096, "num_attention_heads": 8,
                   "num_key_value_heads": 1, "head_dim": 256},
}  # fmt: skip
# PaliGemma-3B's vision tower: SigLIP so400m/14 at 224 px (256 tokens an image).
SIGLIP_SO400M = {"hidden_size": 1152, "num_hidden_layers": 27, "intermediate_size": 4304, "num_attention_heads": 16,
                 "patch_size": 14, "image_size": 224}  # fmt: skip

LEROBOT_PREPROCESSOR = "policy_preprocessor.json"
LEROBOT_POSTPROCESSOR = "policy_postprocessor.json"
LEROBOT_STATE, LEROBOT_ACTION = "observation.state", "action"  # LeRobot's feature keys
LEROBOT_EPS = 1e-8  # NormalizerProcessorStep's default eps
# LeRobot's normalisation modes -> the (low, high) statistics mapped to [-1, 1] (MEAN_STD and IDENTITY apart).
LEROBOT_RANGES = {"MIN_MAX": ("min", "max"), "QUANTILES": ("q01", "q99"), "QUANTILE10": ("q10", "q90")}
LEROBOT_DEFAULT_MODES = {"STATE": "MEAN_STD", "ACTION": "MEAN_STD"}  # LeRobot's PI0Config.normalization_mapping
# The buffers of LeRobot's checkpoints before its processors (migrate_policy_normalization.py's patterns).
LEROBOT_BUFFERS = {
    LEROBOT_STATE: ("normalize_inputs.buffer_observation_state.",),
    LEROBOT_ACTION: ("unnormalize_outputs.buffer_action.", "normalize_targets.buffer_action."),
}


# ---------------------------------------------------------------------------------------------- what a folder is


def read_image_settings(path: Path) -> dict:
    """The image processor's settings of a π0 folder (`preprocessor_config.json`), read as JSON: the class itself
    needs torchvision."""
    file = Path(path) / "preprocessor_config.json"
    if not file.exists():
        raise InputError(f"{path} has no preprocessor_config.json (a π0 folder carries the image "
                         "processor's settings)")  # fmt: skip
    settings = json.loads(file.read_text())
    size = settings.get("size") or {}
    side = size.get("height") or size.get("max_height") or size.get("shortest_edge")
    if side is None:
        raise InputError(f"{file}: size has no height")
    settings["size"] = {"height": int(side), "width": int(size.get("width") or size.get("max_width") or side)}
    settings.setdefault("image_mean", [0.5, 0.5, 0.5])
    settings.setdefault("image_std", [0.5, 0.5, 0.5])
    settings.setdefault("image_seq_length", 256)
    return settings


def _config(path: Path) -> dict | None:
    file = Path(path) / "config.json"
    if not file.exists():
        return None
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError:
        return None


def is_flow_folder(path: str | Path) -> bool:
    """Whether `path` holds a π0 checkpoint: transformers' (config.json's `"model_type": "pi0"`) or LeRobot's
    (`"type": "pi0"`, which `check_flow_folder` then refuses with what it lacks)."""
    config = _config(Path(path)) or {}
    return config.get("model_type") == "pi0" or config.get("type") == "pi0"


def check_flow_folder(path: Path) -> None:
    """Refuse a folder that is not a π0 checkpoint in transformers' layout, naming what it holds instead."""
    file = Path(path) / "config.json"
    if not file.exists():
        raise InputError(f"{path} is not a PI0 checkpoint: it has no config.json")
    config = _config(path)
    if config is None:
        raise InputError(f"{path} is not a PI0 checkpoint: its config.json is not JSON")
    if config.get("type") == "pi0" and config.get("model_type") != "pi0":
        raise InputError(
            f'{path} is a LeRobot π0 checkpoint (config.json has LeRobot\'s "type": "pi0"), not '
            'transformers\' PI0 layout: convert it first (a config.json with "model_type": "pi0" and the sizes '
            "of its paligemma_variant / action_expert_variant, PaliGemma's tokenizer files and a "
            "preprocessor_config.json; transformers' PI0ForConditionalGeneration.from_pretrained renames LeRobot's "
            "weight names itself). Its normalisation statistics (policy_preprocessor.json) are read as they are"
        )
    if config.get("model_type") != "pi0":
        raise InputError(f"{path} is not a PI0 checkpoint: its config.json has model_type "
                         f"{config.get('model_type')!r}")  # fmt: skip


def check_loaded_weights(path: Path, loading: dict) -> None:
    """Refuse a π0 folder whose weights left some of the model's unloaded (transformers would start them at random
    with a warning), naming a few; `loading` is `from_pretrained(..., output_loading_info=True)`'s."""
    missing = sorted(loading.get("missing_keys") or [])
    if not missing:
        return
    hint = ""
    if any(name.startswith("model.paligemma_with_expert.") for name in loading.get("unexpected_keys") or []):
        hint = (" Its weights carry LeRobot's names (model.paligemma_with_expert.*): transformers renames them at "
                "load from 5.2x on; with an older transformers rename them first (drop the leading 'model.', then "
                "paligemma_with_expert.paligemma.model -> model.vlm, paligemma_with_expert.gemma_expert.model -> "
                "model.dit, state_proj / action_in_proj / action_time_mlp_* -> embed_action_time.*)")  # fmt: skip
    raise InputError(f"{path}: {len(missing)} of the model's weights are not in the folder "
                     f"(e.g. {', '.join(missing[:4])}).{hint}")  # fmt: skip


# ---------------------------------------------------------------------------------------------- statistics


def read_folder_stats(folder: str | Path) -> FlowStats | None:
    """The normalisation statistics a π0 folder carries (see the module docstring for where), else None.

    Raises:
        ValueError: naming the file and the missing key, where a folder has LeRobot's processor files but they lack
            the state's or the actions' statistics, or use a normalisation this policy cannot express.
    """
    folder = Path(folder)
    ours = FlowStats.read(folder)
    if ours is not None:
        return ours
    if (folder / LEROBOT_PREPROCESSOR).exists():
        return read_lerobot_processor_stats(folder)
    return read_lerobot_buffer_stats(folder)


def _normalizer_step(folder: Path, name: str, registry_name: str) -> tuple[dict, dict] | None:
    """`(config, {feature: {stat: [values]}})` of a LeRobot pipeline file's step `registry_name`, or None without
    the file or the step."""
    file = folder / name
    if not file.exists():
        return None
    pipeline = json.loads(file.read_text())
    step = next((s for s in pipeline.get("steps", []) if s.get("registry_name") == registry_name), None)
    if step is None:
        return None
    state_file = step.get("state_file")
    if not state_file or not (folder / state_file).exists():
        raise InputError(f"{file}: its {registry_name} step's state file {state_file!r} is missing from the folder "
                         "(it holds the normalisation statistics)")  # fmt: skip
    from safetensors.torch import load_file

    stats: dict[str, dict[str, list[float]]] = {}
    for key, tensor in load_file(folder / state_file).items():
        feature, stat = key.rsplit(".", 1)
        stats.setdefault(feature, {})[stat] = [float(v) for v in tensor.flatten().tolist()]
    return step.get("config", {}), stats


def read_lerobot_processor_stats(folder: str | Path) -> FlowStats:
    """The statistics of LeRobot's policy processors (`policy_preprocessor.json` and, for the actions,
    `policy_postprocessor.json` where it has an `unnormalizer_processor` step)."""
    folder = Path(folder)
    pre = _normalizer_step(folder, LEROBOT_PREPROCESSOR, "normalizer_processor")
    if pre is None:
        raise InputError(f"{folder / LEROBOT_PREPROCESSOR} has no normalizer_processor step: the folder carries no "
                         "state/action normalisation statistics")  # fmt: skip
    post = _normalizer_step(folder, LEROBOT_POSTPROCESSOR, "unnormalizer_processor")
    _check_relative_actions(folder)
    actions = post if post is not None and LEROBOT_ACTION in post[1] else pre
    where = {LEROBOT_STATE: LEROBOT_PREPROCESSOR, LEROBOT_ACTION: LEROBOT_POSTPROCESSOR if actions is post else
             LEROBOT_PREPROCESSOR}  # fmt: skip
    state = _affine(pre, LEROBOT_STATE, "STATE", folder / where[LEROBOT_STATE])
    action = _affine(actions, LEROBOT_ACTION, "ACTION", folder / where[LEROBOT_ACTION])
    return FlowStats(*state, *action)


def read_lerobot_buffer_stats(folder: str | Path) -> FlowStats | None:
    """The statistics of an older LeRobot checkpoint (normalisation buffers in `model.safetensors`), else None."""
    folder = Path(folder)
    weights = folder / "model.safetensors"
    if not weights.exists():
        return None
    from safetensors import safe_open

    with safe_open(weights, framework="pt") as f:
        names = [k for k in f.keys() if any(k.startswith(p) for ps in LEROBOT_BUFFERS.values() for p in ps)]
        if not names:
            return None
        tensors = {k: f.get_tensor(k) for k in names}
    stats: dict[str, dict[str, list[float]]] = {}
    for feature, prefixes in LEROBOT_BUFFERS.items():
        for prefix in prefixes:  # the first prefix that holds the feature (unnormalize_outputs before targets)
            found = {k.removeprefix(prefix): v for k, v in tensors.items() if k.startswith(prefix)}
            if found:
                stats[feature] = {stat: [float(x) for x in v.flatten().tolist()] for stat, v in found.items()}
                break
    config = _config(folder) or {}
    _check_relative_actions(folder)
    step = {"norm_map": config.get("normalization_mapping") or LEROBOT_DEFAULT_MODES, "eps": LEROBOT_EPS}
    state = _affine((step, stats), LEROBOT_STATE, "STATE", weights)
    action = _affine((step, stats), LEROBOT_ACTION, "ACTION", weights)
    return FlowStats(*state, *action)


def _check_relative_actions(folder: Path) -> None:
    if (_config(folder) or {}).get("use_relative_actions"):
        raise InputError(f"{folder}: its LeRobot config.json has use_relative_actions: true (actions "
                         "relative to the state); a flow policy here acts in absolute actions")  # fmt: skip


def _affine(step: tuple[dict, dict], feature: str, kind: str, source: Path) -> tuple[tuple[float, ...], ...]:
    """`(mean, std)` of `feature` whose LeRobot normalisation is `step`'s `norm_map[kind]`."""
    config, stats = step
    mode = (config.get("norm_map") or LEROBOT_DEFAULT_MODES).get(kind, "IDENTITY")
    eps = float(config.get("eps", LEROBOT_EPS))
    have = stats.get(feature, {})
    if mode == "MEAN_STD":
        need = ("mean", "std")
    elif mode in LEROBOT_RANGES:
        need = LEROBOT_RANGES[mode]
    elif mode == "IDENTITY":
        # No statistics to read: the width comes from whichever the file has.
        width = len(next(iter(have.values()), []))
        if not width:
            raise InputError(f"{source}: {feature} is normalised IDENTITY and the file gives no width for it")
        return (0.0,) * width, (1.0,) * width
    else:
        raise InputError(f"{source}: {feature}'s normalisation {mode!r} is not one of MEAN_STD, MIN_MAX, QUANTILES, "
                         "QUANTILE10, IDENTITY")  # fmt: skip
    missing = [f"{feature}.{stat}" for stat in need if stat not in have]
    if missing:
        raise InputError(f"{source}: no {', '.join(missing)} (its {kind} features are normalised {mode}); the "
                         f"statistics found: {sorted(f'{k}.{s}' for k, v in stats.items() for s in v) or 'none'}")  # fmt: skip
    a, b = have[need[0]], have[need[1]]
    if len(a) != len(b):
        raise InputError(f"{source}: {feature}.{need[0]} has {len(a)} values and {feature}.{need[1]} {len(b)}")
    if mode == "MEAN_STD":
        return tuple(a), tuple(s + eps for s in b)  # LeRobot divides by std + eps
    low, high = a, b  # [low, high] -> [-1, 1]; where they are equal LeRobot divides by eps instead
    return tuple((h + lo) / 2 for lo, h in zip(low, high)), tuple((h - lo) / 2 if h > lo else eps / 2
                                                                  for lo, h in zip(low, high))  # fmt: skip


def read_flow_folder(cls, path: Path, dtype, device: str, **kwargs):
    """A `cls` (`FlowPolicy`) from a π0 folder: the model (every weight the folder must hold, checked), its tokenizer,
    image settings, statistics and sampler settings, Flow-Noise's head and LoRA adapters where the folder has them."""
    from transformers import AutoTokenizer, PI0ForConditionalGeneration

    check_flow_folder(path)
    model, loading = PI0ForConditionalGeneration.from_pretrained(path, dtype=dtype, output_loading_info=True)
    check_loaded_weights(path, loading)  # not a model with random weights where the folder's names did not match
    model = model.to(device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    saved = json.loads((path / STATS_FILE).read_text()) if (path / STATS_FILE).exists() else {}
    options = {k: saved[k] for k in ("noise_method", "noise_level", "num_steps") if k in saved}
    policy = cls(model, tokenizer, read_image_settings(path), read_folder_stats(path), **{**options, **kwargs})
    if (path / NOISE_HEAD_FILE).exists():
        from safetensors.torch import load_file

        policy.attach_noise_head()
        policy.net.noise_head.load_state_dict(load_file(path / NOISE_HEAD_FILE, device=str(policy.device)))
    if (path / "lora").is_dir():
        load_lora(policy, path / "lora")
        train_noise_head(policy)
    return policy


def write_flow_folder(policy, path: Path) -> None:
    """A π0 folder `read_flow_folder` (and transformers' `PI0ForConditionalGeneration`) loads back."""
    # From the model's state dict, so a checkpoint's stand-in (`mmrl.runtime.distributed.checkpoint_views`: the
    # weights gathered from FSDP's shards, or float32 master weights) saves what it holds. A LoRA model is
    # written as its unmerged base weights plus lora/ (as `mmrl.policy.lora.save_lora`).
    lora = is_lora_model(policy.model)
    weights = base_state_dict(policy.model) if lora else dict(policy.model.state_dict())
    head = {k.removeprefix("noise_head."): v for k, v in weights.items() if k.startswith("noise_head.")}
    weights = {k: v for k, v in weights.items() if not k.startswith("noise_head.")}  # a plain PI0 folder
    module = policy.net
    getattr(module, "_model", module).save_pretrained(path, state_dict=weights)  # the stand-in's module
    if lora:
        policy.model.save_pretrained(path / "lora", save_embedding_layers=False)
    if head:
        from safetensors.torch import save_file

        save_file({k: v.detach().cpu().contiguous() for k, v in head.items()}, path / NOISE_HEAD_FILE)
    policy.tokenizer.save_pretrained(path)
    (path / "preprocessor_config.json").write_text(json.dumps(policy.image_settings, indent=2, sort_keys=True))
    saved = {
        "processor_class": "PI0Processor", "chunk_size": policy.chunk, "max_state_dim": policy.config.max_state_dim,
        "noise_method": policy.noise_method, "noise_level": policy.noise_level, "num_steps": policy.num_steps,
        **(policy.stats.to_json() if policy.stats is not None else {}),
    }  # fmt: skip
    (path / STATS_FILE).write_text(json.dumps(saved, indent=2))
