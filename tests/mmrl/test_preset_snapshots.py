"""Every preset resolves to exactly the config it resolved to before the presets were trimmed to what differs from
the defaults (snapshots in preset_snapshots/, written from the untrimmed presets). A default that changes under a
preset shows up here, so moving a default is a deliberate act."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmrl.runtime.config import TrainConfig, load_config, to_dict

REPO = Path(__file__).resolve().parents[2]
SNAPSHOTS = Path(__file__).with_name("preset_snapshots")


@pytest.mark.parametrize("preset", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.stem)
def test_preset_resolves_to_its_snapshot(preset):
    snapshot = SNAPSHOTS / f"{preset.stem}.json"
    assert snapshot.exists(), f"no snapshot for {preset.name}: add one deliberately"
    assert to_dict(load_config(preset)) == json.loads(snapshot.read_text())


@pytest.mark.parametrize("preset", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.stem)
def test_preset_states_only_what_differs_from_the_defaults(preset):
    import yaml

    def restated(values: dict, defaults: dict, prefix: str) -> list[str]:  # nested sections too (algo.papo.gamma)
        found = []
        for key, value in values.items():
            default = defaults.get(key, object())
            if isinstance(value, dict) and isinstance(default, dict) and value and key != "options":
                found += restated(value, default, f"{prefix}{key}.")
            elif value == default:
                found.append(f"{prefix}{key}")
        return found

    found = restated(yaml.safe_load(preset.read_text()) or {}, to_dict(TrainConfig()), "")
    assert not found, f"{preset.name} restates defaults: {found}"
