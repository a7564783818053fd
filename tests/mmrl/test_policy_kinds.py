"""The policy interface: a kind is one module and one registration, and what a kind lacks is refused by field name.

`GaussianPolicy` below is a third kind, test-sized: a linear Gaussian policy over an image's mean colour. It is
defined and registered here and nowhere else, and the real trainer runs it through every stage (collection, old
scores, GRPO advantages, the PPO update, held-out evaluation, checkpoints, the cold start).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
from torch import nn

from mmrl.policy import FEATURES, POLICY_KINDS, FlowPolicy, Policy, VLMPolicy, check_run, kind_of, load_policy
from mmrl.runtime.config import ConfigError, ModelConfig, TrainConfig, load_config
from mmrl.types import Demonstrations, Sampling
from sim.base import Observation


# ---------------------------------------------------------------------------------------------- a third kind
@dataclass(frozen=True)
class GaussianRollout:
    """R rows of one action chunk each (C = 1), one "token" per row: the chunk's log-density."""

    features: torch.Tensor  # [R, 3] the image's mean colour, what the policy reads
    actions: torch.Tensor  # [R, 1, D]
    completion_ids: torch.Tensor  # [R, 1] long zeros
    completion_mask: torch.Tensor  # [R, 1] bool, False for greedy rows
    logprobs: torch.Tensor  # [R, 1]
    group_size: int
    texts: list[str]

    def __len__(self) -> int:
        return self.features.shape[0]

    def select(self, rows: torch.Tensor) -> GaussianRollout:
        rows = rows.long()
        return replace(
            self, **{k: getattr(self, k)[rows] for k in TENSORS}, texts=[self.texts[i] for i in rows.tolist()]
        )

    __getitem__ = select

    def rows(self, start: int, stop: int) -> GaussianRollout:
        return self.select(torch.arange(start, stop))

    @staticmethod
    def cat_rows(parts: list[GaussianRollout], pad_token_id: int = 0) -> GaussianRollout:
        joined = {k: torch.cat([getattr(p, k) for p in parts]) for k in TENSORS}
        return replace(parts[0], **joined, texts=[t for p in parts for t in p.texts])


TENSORS = ("features", "actions", "completion_ids", "completion_mask", "logprobs")


class GaussianNet(nn.Module):
    def __init__(self, action_dim: int):
        super().__init__()
        self.mean = nn.Linear(3, action_dim)
        self.log_std = nn.Parameter(torch.full((action_dim,), -1.0))


@POLICY_KINDS.register("gaussian")
class GaussianPolicy(Policy):
    features = frozenset()
    label = "Gaussian policies"
    model_types = frozenset({"gaussian"})
    tiny_names = ("gaussian",)
    pad_token_id = 0
    chunk = 1

    def __init__(self, model: GaussianNet):
        self.model = model

    @classmethod
    def load(cls, folder, cfg: ModelConfig, dtype) -> GaussianPolicy:
        from safetensors.torch import load_file

        config = json.loads((Path(folder) / "config.json").read_text())
        policy = cls(GaussianNet(config["action_dim"]))
        policy.model.load_state_dict(load_file(Path(folder) / "model.safetensors"))
        return policy

    @classmethod
    def tiny(cls, name: str, cfg: ModelConfig, action_dim: int | None = None) -> GaussianPolicy:
        with torch.random.fork_rng():
            torch.manual_seed(cfg.seed)
            return cls(GaussianNet(action_dim))

    def save_pretrained(self, path) -> None:
        from safetensors.torch import save_file

        Path(path).mkdir(parents=True, exist_ok=True)
        action_dim = self.model.log_std.shape[0]
        (Path(path) / "config.json").write_text(json.dumps({"model_type": "gaussian", "action_dim": action_dim}))
        save_file(
            {k: v.detach().contiguous() for k, v in self.model.state_dict().items()}, Path(path) / "model.safetensors"
        )

    def apply_options(self, cfg: ModelConfig) -> GaussianPolicy:
        return self

    def fit(self, cfg: TrainConfig, env) -> GaussianPolicy:
        self.check_env(env)
        return self

    def check_env(self, env) -> None:
        if env.action_kind != "continuous" or env.action_dim != self.model.log_std.shape[0]:
            raise ValueError("a Gaussian policy acts in continuous envs of its action_dim")

    def row_sampling(self, sampling: Sampling) -> Sampling:
        return replace(sampling, max_new_tokens=1)

    def _features(self, obs: Observation) -> torch.Tensor:
        return obs.first_view.float().mean(dim=(1, 2)) / 255.0  # [R, 3]

    def _density(self, features, actions, with_entropy=False):
        mean, log_std = self.model.mean(features), self.model.log_std
        dist = torch.distributions.Normal(mean, log_std.exp())
        logprobs = dist.log_prob(actions[:, 0]).sum(-1, keepdim=True)  # [R, 1]
        return (logprobs, dist.entropy().sum(-1, keepdim=True)) if with_entropy else logprobs

    @torch.no_grad()
    def generate(self, obs, group_size=1, sampling=Sampling(), history=None) -> GaussianRollout:  # noqa: B008
        features = self._features(obs)
        mean = self.model.mean(features)
        greedy = sampling.temperature == 0
        actions = mean if greedy else mean + self.model.log_std.exp() * torch.randn(mean.shape)
        actions = actions.unsqueeze(1)  # [R, 1, D]
        r = len(obs)
        return GaussianRollout(
            features, actions, torch.zeros(r, 1, dtype=torch.long), torch.full((r, 1), not greedy),
            self._density(features, actions), group_size, [""] * r,
        )  # fmt: skip

    def actions(self, rollout: GaussianRollout) -> torch.Tensor:
        return rollout.actions

    def logprobs(self, batch: GaussianRollout, temperature: float = 1.0, with_entropy: bool = False):
        return self._density(batch.features, batch.actions, with_entropy)

    def value_input(self, model: nn.Module) -> nn.Module:
        return model.mean

    def demonstrations(self, env, cfg: TrainConfig) -> Demonstrations:
        obs = env.reset(seed=list(range(env.num_envs)))
        actions = env.expert_action()  # [N, D]
        return Demonstrations(obs.image, list(obs.instruction), actions, 1.0, env.num_envs, {})

    def demonstration_loss(self, demonstrations, rows, generator) -> torch.Tensor:
        obs = Observation(image=demonstrations.images[rows], instruction=[""] * len(rows))
        actions = demonstrations.labels[rows].unsqueeze(1)
        return -self._density(self._features(obs), actions).mean()


def test_a_kind_defined_in_one_module_trains_through_every_stage(tiny_run_config, point_env, tmp_path):
    from mmrl.trainer import train

    cfg = tiny_run_config(
        tmp_path, "model.path=tiny:gaussian", f"env.name={point_env}", "env.options={}", "env.eval_metric=success",
        "algo.group_size=4", "trainer.total_steps=2", "trainer.lr=1e-2", "sft.episodes=4", "sft.steps=3",
    )  # fmt: skip
    assert kind_of(cfg.model.path) is GaussianPolicy and check_run(cfg) is GaussianPolicy
    before = load_policy(cfg.model, action_dim=2).model.state_dict()
    history = train(cfg)
    assert [row["step"] for row in history if "loss/policy" in row] == [1, 2]
    assert all(math.isfinite(row["loss/policy"]) for row in history if "loss/policy" in row)
    assert (tmp_path / "cold_start" / "model.safetensors").is_file()  # the cold start stage ran its loop on it
    saved = load_policy(ModelConfig(), checkpoint=tmp_path / "checkpoints" / "step_00000002")
    assert isinstance(saved, GaussianPolicy)  # a checkpoint's kind read off its config.json
    assert any(not torch.equal(before[k], v) for k, v in saved.model.state_dict().items())


def test_what_a_kind_lacks_is_refused_by_field_before_anything_loads():
    cfg = load_config(None, ["model.path=tiny:gaussian", "algo.papo.gamma=0.1", "model.history_turns=2"])
    with pytest.raises(ConfigError, match=r"algo.papo.gamma: not built for Gaussian policies; model.history_turns"):
        check_run(cfg)


# ---------------------------------------------------------------------------------------------- refusals
# A config asking for each feature (an entry per feature: a new feature needs one here, and so a test).
ASKS = {
    "papo": ["algo.papo.gamma=0.1"],
    "branching": ["algo.credit=branch"],
    "judge": ["judge.model=assets/tiny_models/qwen2_vl"],
    "history": ["model.history_turns=1"],
    "rollout_workers": ["trainer.rollout_workers=1"],
    "sharded_async": ["trainer.max_staleness=1"],  # under torchrun (two processes here)
    "text_answers": ["algo.overlong.filter=true"],
    "progress": ["algo.progress_coef=0.1"],
    "engines": ["model.generation_backend=hf"],
    "system_prompt": ["model.system_prompt=Be brief."],
    "pixel_range": ["model.min_pixels=3136"],
    "action_tokens": ["model.action_bins=8"],
    "flow_sampler": ["model.flow.steps=3"],
    "chunk_labels": ["sft.every_step=true", "sft.episodes=4"],
    "untied_expert": ["model.freeze=[vision,projector,language]"],
}
PATHS = {VLMPolicy: "tiny:qwen2_vl", FlowPolicy: "tiny:pi0"}
LACKING = [(kind, name) for kind in PATHS for name in FEATURES if name not in kind.features]


def test_every_feature_has_a_config_that_asks_for_it():
    assert set(ASKS) == set(FEATURES)
    for name, overrides in ASKS.items():
        assert FEATURES[name].asked(load_config(None, overrides), 2), name


@pytest.mark.parametrize(("kind", "name"), LACKING, ids=[f"{k.__name__}-{n}" for k, n in LACKING])
def test_a_feature_a_kind_lacks_is_one_error_naming_the_field(kind, name):
    cfg = load_config(None, [f"model.path={PATHS[kind]}", *ASKS[name]])
    field = ASKS[name][0].split("=")[0]
    with pytest.raises(
        ConfigError, match=rf"{field}.*: not built for {kind.label}".replace("(", r"\(").replace(")", r"\)")
    ):
        kind.check_config(cfg, world_size=2)


@pytest.mark.parametrize("kind", list(PATHS))
def test_a_kind_takes_what_it_declares(kind):
    for name in kind.features:
        kind.check_config(load_config(None, [f"model.path={PATHS[kind]}", *ASKS[name]]), world_size=2)
