"""The machinery under `mmrl.runtime.config`: nested frozen dataclasses built from YAML and `section.field=value` overrides.

Nothing here knows mmrl's fields but `MOVED`, the keys that moved. `from_dict` checks every value against its
annotation (Literal choices, unions with None, lists, mappings, bools, ints, floats, strings; strings from the command
line are converted) and refuses unknown keys; every error is a `ConfigError` whose message names the key and, where it
helps, the valid ones (or, for a key in `MOVED`, its new place).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

# Keys that moved when the configuration was nested by feature: old dotted key -> new one. A preset or override that
# uses an old key is refused in one line naming the new place (`moved`), never taken silently.
MOVED: dict[str, str] = {
    "algo.papo_gamma": "algo.papo.gamma",
    "algo.papo_eta": "algo.papo.eta",
    "algo.papo_mask": "algo.papo.mask",
    "algo.papo_mask_ratio": "algo.papo.mask_ratio",
    "algo.papo_grad_through_masked": "algo.papo.grad_through_masked",
    "algo.papo_kl_bound": "algo.papo.kl_bound",
    "algo.papo_monitor": "algo.papo.monitor",
    "algo.critic_lr": "algo.critic.lr",
    "algo.critic_hidden": "algo.critic.hidden",
    "algo.critic_warmup_steps": "algo.critic.warmup_steps",
    "algo.critic_trunk_grad": "algo.critic.trunk_grad",
    "algo.critic_time": "algo.critic.time",
    "algo.gae_lambda": "algo.critic.gae_lambda",
    "algo.value_coef": "algo.critic.value_coef",
    "algo.value_clip": "algo.critic.value_clip",
    "algo.overlong_filter": "algo.overlong.filter",
    "algo.overlong_penalty": "algo.overlong.penalty",
    "algo.overlong_cache_len": "algo.overlong.cache_len",
    "algo.ttrv_entropy_coef": "algo.ttrv.entropy_coef",
    "algo.ttrv_answer": "algo.ttrv.answer",
    "algo.care_coef": "algo.care.coef",
    "algo.care_ema_decay": "algo.care.ema_decay",
    "model.lora_r": "model.lora.r",
    "model.lora_alpha": "model.lora.alpha",
    "model.lora_dropout": "model.lora.dropout",
    "model.lora_target_modules": "model.lora.target_modules",
    "model.lora_vision": "model.lora.vision",
    "model.flow_noise_level": "model.flow.noise_level",
    "model.flow_noise_method": "model.flow.noise_method",
    "model.flow_steps": "model.flow.steps",
}


class ConfigError(ValueError):
    """A config file or override that does not fit the schema; the message names the offending key."""


def require(ok: bool, field: str, message: str, sep: str = " ") -> None:
    """Raise a ConfigError naming `field` unless `ok`."""
    if not ok:
        raise ConfigError(f"{field}{sep}{message}")


def moved(key: str) -> None:
    """Refuse `key` (a dotted key not in the schema) naming its new place, if it is one that moved."""
    if key in MOVED:
        raise ConfigError(f"{key} moved to {MOVED[key]}")


def field_types(cls) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def coerce(value: Any, tp: Any, key: str) -> Any:
    """Check (and, for strings from the command line, convert) `value` against the annotation `tp`."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(repr, choices))}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None or (isinstance(value, str) and value.lower() in ("null", "none")):
            if type(None) in args:
                return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError("; ".join(errors))
    if origin is list or tp is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return list(value)
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        try:
            if isinstance(value, str):
                return int(float(value)) if "e" in value.lower() else int(value)
            if isinstance(value, float) and value.is_integer():
                return int(value)
            if isinstance(value, int):
                return value
        except ValueError:
            pass
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected a number, got {value!r}") from None
        if not math.isfinite(number):  # no field means anything by nan or inf (a rate of inf trains to garbage)
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
        return number
    if tp is str:
        if not isinstance(value, str | int | float):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return str(value)
    return value


def from_dict(cls, data: dict[str, Any], prefix: str = ""):
    """Build dataclass `cls` from nested plain data, refusing unknown keys."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {data!r}")
    types_ = field_types(cls)
    unknown = sorted(set(data) - set(types_))
    for name in unknown:
        moved(f"{prefix}{name}")
    if unknown:
        raise ConfigError(f"unknown key {prefix}{unknown[0]!r}; valid keys here: {', '.join(types_)}")
    kwargs = {}
    for name, value in data.items():
        tp = types_[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = from_dict(tp, value or {}, f"{prefix}{name}.")
        else:
            kwargs[name] = coerce(value, tp, f"{prefix}{name}")
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as e:  # a check of a dataclass that cannot import ConfigError (mmrl.types.Sampling)
        raise ConfigError(str(e)) from None


def to_dict(cfg) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def apply_overrides(data: dict[str, Any], overrides: list[str], cls) -> dict[str, Any]:
    """Apply `a.b.c=value` overrides to nested plain data for dataclass `cls` (values parsed as YAML scalars)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form section.field=value")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({_yaml_problem(e)})") from None
        parts = key.split(".")
        node, node_cls = data, cls
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            if node_cls is not None:
                types_ = field_types(node_cls)
                if part not in types_:
                    moved(".".join(parts[: depth + 1]))
                    where = ".".join(parts[:depth]) or "the top level"
                    raise ConfigError(
                        f"unknown key {key!r}: {part!r} is not a field of {where}; valid: {', '.join(types_)}"
                    )
                tp = types_[part]
                node_cls = tp if dataclasses.is_dataclass(tp) else None
                if not last and node_cls is None and dict not in (tp, typing.get_origin(tp)):
                    raise ConfigError(f"override {key!r}: {'.'.join(parts[: depth + 1])} is not a section")
            if last:
                node[part] = value
            else:
                node = node.setdefault(part, {})
                if not isinstance(node, dict):
                    raise ConfigError(f"override {key!r}: {'.'.join(parts[: depth + 1])} is not a section")
    return data


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader refusing a key given twice in one mapping (a preset with `trainer:` twice would otherwise
    drop the first block without a word)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load(cls, path: str | Path | None = None, overrides: list[str] | None = None):
    """Dataclass `cls` from a YAML file of nested sections plus `section.field=value` overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        text = Path(path).read_text()
        try:
            data = yaml.load(text, Loader=UniqueKeyLoader) or {}
        except yaml.YAMLError as e:  # one line naming the file, line and column, not a traceback
            raise ConfigError(f"{path}:{_yaml_problem(e)}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
    data = apply_overrides(data, list(overrides or []), cls)
    return from_dict(cls, data)


def _yaml_problem(error: yaml.YAMLError) -> str:
    """`line:column: problem` of a YAML parse error (1-based, where the parser stopped)."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    where = f"{mark.line + 1}:{mark.column + 1}: " if mark is not None else ""
    return f"{where}{problem}"
