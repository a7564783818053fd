"""A flow-matching VLA (π0) behind the policy verbs, with exact per-step log-probabilities for RL (πRL's Flow-SDE).

`FlowPolicy` wraps transformers' `PI0ForConditionalGeneration` (a PaliGemma backbone reads the images of every view,
the instruction and, through the action expert, the robot's proprioceptive state; the expert denoises a chunk of C
actions in K steps). Where `VLMPolicy` samples tokens, this policy samples a denoising chain:

    x_K ~ N(0, I)  ->  x_{K-1}  ->  ...  ->  x_0 = the (normalised) action chunk `[C, D]`

**Flow-SDE** (πRL, arXiv 2510.25889; Flow-GRPO, arXiv 2505.05470). With π0's convention `x_t = t * noise +
(1 - t) * action`, velocity `v = noise - action`, denoising from t = 1 to t = 0 in K steps of `dt = -1/K`, the ODE
step `x + v dt` becomes a Gaussian transition

    mean = x + [v + sigma_t^2 / (2t) * (x + (1 - t) v)] dt,    std = sigma_t * sqrt(|dt|),
    sigma_t = a * sqrt(t / (1 - t))     (t = 1 uses the next step's t, where the formula is infinite),

whose marginals match the ODE's; `a` is the noise level (`noise_level`). Each step's log-density is exact, so a
row's "tokens" are its K denoising steps: `logprobs` `[R, K]`, each the log-density of one transition summed over
the C x D executed action dimensions. (K, not K x C: the C x D dimensions of a step are independent given the step's
input, so one number per step is the exact density and keeps the surrogate's token count at K.) At `a = 0`, or at
temperature 0, the transition is the ODE step: greedy evaluation uses the deterministic sampler.

The padded action dimensions (π0 pads actions to `max_action_dim`) are sampled with the same transition but never
executed; they are not scored, so a row's density is that of what the robot does.

**Flow-Noise** (πRL's other method, `noise_method="flow_noise"`): the transition's mean is the ODE step `x + v dt`
and its std is learned: a small head (`NoiseHead`, attached to the model as `noise_head`, so the policy's optimiser
trains it) reads the expert's last hidden state of each action position and gives a std per position and action
dimension within `NOISE_STD_RANGE` (RLinf's default [0.08, 0.16]). The K steps' densities are exact as Flow-SDE's,
and the entropy is the head's: it has a gradient, so an entropy bonus moves the noise. The head's weights are saved
beside the model (`flow_noise_head.safetensors`), so the model folder stays a plain PI0 one.

**Values** (a critic with GAE, `mmrl.methods.critic`): the model carries a parameter-free `value_tap` that each
scoring pass feeds with the row's state features: the backbone's last hidden state averaged over the prompt (the
images and the instruction) joined with the normalised proprioceptive state, which π0 gives the expert only. The
critic's head hooks the tap (as it hooks a VLM's language-model head), so its value is that of the state the chunk
starts from, independent of the sampled chain (πRL's π0.5 variant, a value "after the VLM", plus the state).

**LoRA** (`model.lora.r > 0`, `mmrl.policy.flow.options` with the other real-size options): PEFT adapters on the
linear layers of the parts `model.lora.target_modules` names, `backbone` (PaliGemma's language model), `expert` (the
action expert), or both (`all-linear`, or `backbone,expert`), and on the vision tower's with `model.lora.vision` (as
for VLMs); everything else is frozen but Flow-Noise's head, which starts untrained. Checkpoints hold the base weights
plus `lora/`, as a VLM's; `mmrl export` merges them.

The sampled chain is recorded in the rollout (`FlowRollout.chain` `[R, K+1, C, A]`); `logprobs` recomputes every
transition's density under the current weights with gradients, in one pass of the action expert over the K steps
(the prompt's key/value cache repeated K times). Action and state normalisation statistics (`FlowStats`) belong to
the policy and are saved with it, in the fields `PI0Processor` uses (`processor_config.json`); a folder may carry
LeRobot's instead (`mmrl.policy.flow.folders`).
"""

from __future__ import annotations

import inspect
import math
import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from sim.base import Observation

from ...runtime.config import ModelConfig, TrainConfig
from ...runtime.schema import ConfigError, require
from ...types import Demonstrations, Sampling
from ..base import POLICY_KINDS, Policy
from .data import NOISE_METHODS, STATS_FILE, FlowRollout, FlowStats, cat_flow_rollouts, sampler_problem  # noqa: F401
from .demonstrations import collect_flow_demonstrations
from .folders import (  # noqa: F401  (is_flow_folder, NOISE_HEAD_FILE re-exported)
    NOISE_HEAD_FILE,
    check_flow_folder,
    check_loaded_weights,
    is_flow_folder,
    read_flow_folder,
    read_folder_stats,
    read_image_settings,
    write_flow_folder,
)
from .options import LORA_PARTS, apply_flow_lora, apply_flow_options, train_noise_head  # noqa: F401
from .sde import NOISE_STD_RANGE, NoiseHead, ValueTap, gaussian_logprob, sde_schedule, sde_step  # noqa: F401

ASSETS = Path(__file__).resolve().parents[3] / "assets"
TINY_PI0 = ASSETS / "tiny_models" / "pi0"


# ---------------------------------------------------------------------------------------------- the policy


@POLICY_KINDS.register("flow")
class FlowPolicy(Policy):
    """A π0 policy: images of every view, the instruction and the proprioceptive state in, an action chunk out.

    Verbs as `VLMPolicy`'s: `generate(obs, group_size, sampling)` -> a `FlowRollout` with the sampling-time
    log-probs `[R, K]`; `logprobs(batch)` -> `[R, K]` under the current weights, with gradients.

    Args:
        model: a `PI0ForConditionalGeneration`.
        tokenizer: its tokenizer (PaliGemma's special tokens: `<image>`, `<bos>`, `<pad>`).
        image: the image processor's settings (`size`, `image_mean`, `image_std`, `image_seq_length`), as in a π0
            folder's `preprocessor_config.json`.
        stats: normalisation statistics, or None until demonstrations provide them (`set_stats`).
        noise_method: `"flow_sde"` or `"flow_noise"` (a learned noise head, attached to the model here).
        noise_level: a, the SDE's noise level (πRL uses 0.5 for π0 on LIBERO); Flow-Noise does not read it.
        num_steps: K denoising steps (default: the config's `num_inference_steps`).
    """

    features = frozenset({"flow_sampler", "chunk_labels", "untied_expert"})
    refusals = {
        "history": "a flow policy sees the current observation only",
        "system_prompt": "π0's prompt is PaliGemma's `<image>... <bos>{instruction}\\n` (PI0Processor's, openpi's), "
        "with no chat template and so no system turn (the VLM policy refuses it for PaliGemma alike)",
        "pixel_range": "π0's images are resized to its vision tower's fixed size (preprocessor_config.json)",
        "action_tokens": "a flow policy's actions are continuous and its chunk is its config's chunk_size, not action "
        "tokens",
        "engines": "a flow policy samples with its own denoising loop ('lean')",
        "papo": "PAPO's masked-image pass",
        "text_answers": "its rows are denoising steps, not text that ends with an EOS token",
    }
    label = "flow policies (π0)"
    model_types = frozenset({"pi0"})  # transformers' PI0 folders, and LeRobot's (`"type": "pi0"`, refused on load)
    tiny_names = ("pi0",)

    def __init__(
        self,
        model,
        tokenizer,
        image: dict,
        stats: FlowStats | None = None,
        noise_method: str = "flow_sde",
        noise_level: float = 0.5,
        num_steps: int | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.config = model.config
        self.noise_method = noise_method
        self.noise_level = float(noise_level)
        self.num_steps = int(num_steps or self.config.num_inference_steps)
        problem = sampler_problem(noise_method, self.noise_level, self.num_steps)
        if problem is not None:
            raise ValueError(" ".join(problem))
        self.chunk = int(self.config.chunk_size)
        self.image_size = int(image["size"]["height"])
        self.image_mean = torch.tensor(image["image_mean"], dtype=torch.float32)
        self.image_std = torch.tensor(image["image_std"], dtype=torch.float32)
        self.image_tokens = int(image["image_seq_length"])
        self.image_settings = dict(image)
        self.image_token = "<image>"
        self.pad_token_id = tokenizer.pad_token_id
        # transformers 5.24 names the forward's cache argument `cache` (`past_key_values` deprecated); older ones do not.
        self._cache_kwarg = (
            "cache" if "cache" in inspect.signature(model.model.forward).parameters else "past_key_values"
        )
        self.stats: FlowStats | None = None
        if stats is not None:
            self.set_stats(stats)
        if not hasattr(model, "value_tap"):
            model.value_tap = ValueTap(self.config.vlm_config.text_config.hidden_size + self.config.max_state_dim)
        if noise_method == "flow_noise":
            self.attach_noise_head()

    def attach_noise_head(self, seed: int = 0) -> None:
        """Give the model Flow-Noise's head (`model.noise_head`, a fresh one drawn from `seed`) unless it has one."""
        if getattr(self.net, "noise_head", None) is None:
            head = NoiseHead(self.config.dit_config.hidden_size, self.config.max_action_dim, seed=seed)
            self.net.noise_head = head.to(self.device)

    # ------------------------------------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls, path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu", **kwargs
    ) -> FlowPolicy:
        """A π0 folder laid out as the hub's (config.json, weights, tokenizer, preprocessor_config.json; the
        normalisation statistics from processor_config.json when it carries them): `folders.read_flow_folder`."""
        return read_flow_folder(cls, Path(path), dtype, device, **kwargs)

    def save_pretrained(self, path: str | Path) -> None:
        """Weights, config, tokenizer, image settings, and the statistics and Flow-SDE settings
        (`processor_config.json`, in `PI0Processor`'s fields): `folders.write_flow_folder`."""
        write_flow_folder(self, Path(path))

    @classmethod
    def load(cls, folder: str | Path, cfg: ModelConfig, dtype: torch.dtype) -> FlowPolicy:
        return cls.from_pretrained(folder, dtype=dtype, device=cfg.device)

    @classmethod
    def tiny(cls, name: str, cfg: ModelConfig, action_dim: int | None = None) -> FlowPolicy:
        """tiny:pi0 for an env of `action_dim`-D actions: the asset's model (`build_tiny_flow`) where its padded action
        width (`max_action_dim` 4) holds them, as for reach; otherwise the same model built with `max_action_dim =
        action_dim` (LIBERO's 7), from the same seed, tokenizer and image settings."""
        return build_tiny_flow(seed=cfg.seed, action_dim=action_dim)

    # ------------------------------------------------------------------------------------------- fitting to a run
    @classmethod
    def check_config(cls, cfg: TrainConfig, world_size: int = 1) -> None:
        super().check_config(cfg, world_size)
        model = cfg.model
        problem = sampler_problem(model.flow.noise_method, model.flow.noise_level, model.flow.steps)
        if problem is not None:
            raise ConfigError(" ".join(problem))

    def apply_options(self, cfg: ModelConfig) -> FlowPolicy:
        return apply_flow_options(self, cfg)

    def fit(self, cfg: TrainConfig, env) -> FlowPolicy:
        """The model options (`apply_flow_options`), checked against the env; without a cold start the policy must
        carry its normalisation statistics."""
        policy = self.apply_options(cfg.model)
        policy.check_env(env)
        require(policy.stats is not None or cfg.sft.episodes > 0, "model.path", f"{cfg.model.path!r} carries no "
                "normalisation statistics (state_mean, ...): cold-start it on demonstrations (sft.episodes > 0)",
                sep=" ")  # fmt: skip
        return policy

    def row_sampling(self, sampling: Sampling) -> Sampling:
        """A row holds the chain's K denoising steps."""
        return replace(sampling, max_new_tokens=self.num_steps)

    def actions(self, rollout: FlowRollout) -> torch.Tensor:
        return rollout.actions  # [R, C, D]

    def value_input(self, model: torch.nn.Module) -> torch.nn.Module:
        """The `value_tap` every scoring pass feeds with the row's state features (see the module docstring)."""
        return model.value_tap

    def demonstrations(self, env, cfg: TrainConfig) -> Demonstrations:
        """The expert's chunks (`collect_flow_demonstrations`); they give the policy its normalisation statistics
        when it has none."""
        sft = cfg.sft
        images, instructions, proprio, chunks, rate = collect_flow_demonstrations(
            env, self.chunk, sft.episodes, noise=sft.noise, seed=cfg.trainer.seed, every_step=sft.every_step
        )
        if self.stats is None:
            self.set_stats(FlowStats.from_demonstrations(proprio, chunks))
        self.check_env(env)  # the statistics' widths now
        return Demonstrations(images, instructions, chunks, rate, sft.episodes, {"proprio": proprio})

    def demonstration_loss(
        self, demonstrations: Demonstrations, rows: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:
        """π0's flow-matching loss on the rows' expert chunks (times and noise drawn from `generator`)."""
        d = demonstrations
        obs = Observation(image=d.images[rows], instruction=[d.instructions[i] for i in rows.tolist()],
                          proprio=d.extra["proprio"][rows])  # fmt: skip
        return self.flow_matching_loss(obs, d.labels[rows], generator=generator)

    def set_stats(self, stats: FlowStats) -> None:
        """Use `stats` to normalise states and actions; their widths must fit the model's padded ones."""
        if stats.state_dim > self.config.max_state_dim:
            raise ValueError(f"state_mean has {stats.state_dim} dimensions; the model's max_state_dim is "
                             f"{self.config.max_state_dim}")  # fmt: skip
        if stats.action_dim > self.config.max_action_dim:
            raise ValueError(f"actions_mean has {stats.action_dim} dimensions; the model's max_action_dim is "
                             f"{self.config.max_action_dim}")  # fmt: skip
        self.stats = stats

    @property
    def net(self):
        """The `PI0ForConditionalGeneration` (under LoRA's PEFT wrapper, which injects its adapters into it)."""
        return self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def action_dim(self) -> int:
        return self._stats().action_dim

    def _stats(self) -> FlowStats:
        if self.stats is None:
            raise ValueError("the flow policy has no normalisation statistics (state_mean, actions_mean, ...): "
                             "cold-start it on demonstrations (sft.episodes > 0) or load a folder that carries "
                             "them in processor_config.json")  # fmt: skip
        return self.stats

    def check_env(self, env) -> None:
        """Refuse an env this policy cannot act in, naming the field: it must take continuous actions of the
        statistics' width, and one chunk must fit in an episode."""
        env_label = f"the env.name env ({type(env).__name__})"
        if env.action_kind != "continuous":
            raise ConfigError(f"model.path: a flow policy (π0) acts in continuous envs; {env_label} takes "
                              f"{env.action_kind} actions")  # fmt: skip
        if self.stats is not None and env.action_dim != self.action_dim:
            raise ConfigError(f"model.path: {env_label}'s env.action_dim is {env.action_dim}; the policy's "
                              f"actions_mean has {self.action_dim}")  # fmt: skip
        if self.chunk > env.max_episode_steps:
            raise ConfigError(f"model.path: the model's chunk_size {self.chunk} is longer than the episode "
                              f"(env.max_episode_steps {env.max_episode_steps})")  # fmt: skip

    # ------------------------------------------------------------------------------------------------ inputs
    def encode(self, obs: Observation) -> dict[str, torch.Tensor]:
        """The model inputs of N observations: prompt ids and mask `[N, P]` (left padded), pixel values
        `[N, V, 3, S, S]`, pixel mask `[N, V]` and the normalised, padded state `[N, Smax]`."""
        stats = self._stats()
        if obs.proprio is None:
            raise ValueError("obs.proprio is None: a flow policy reads the robot's proprioceptive state, and this env "
                             "gives none (Observation.proprio)")  # fmt: skip
        if obs.proprio.shape[-1] != stats.state_dim:
            raise ValueError(f"obs.proprio has {obs.proprio.shape[-1]} dimensions; the policy's state_mean has "
                             f"{stats.state_dim}")  # fmt: skip
        device = self.device
        views = obs.views.to(device)  # [N, V, H, W, 3] uint8
        n, v = views.shape[:2]
        images = views.permute(0, 1, 4, 2, 3).flatten(0, 1).float() / 255.0  # [N*V, 3, H, W]
        if images.shape[-1] != self.image_size or images.shape[-2] != self.image_size:
            images = F.interpolate(images, size=(self.image_size, self.image_size), mode="bilinear", antialias=True)
        mean, std = self.image_mean.to(device).view(1, 3, 1, 1), self.image_std.to(device).view(1, 3, 1, 1)
        pixel_values = ((images - mean) / std).view(n, v, 3, self.image_size, self.image_size)
        prefix = self.image_token * (self.image_tokens * v) + self.tokenizer.bos_token
        prompts = [f"{prefix}{text}\n" for text in obs.instruction]  # PaliGemma's prompt, as PI0Processor builds it
        tok = self.tokenizer(prompts, add_special_tokens=False, padding=True, padding_side="left", return_tensors="pt")
        state = self._normalise(obs.proprio.to(device).float(), stats.state_mean, stats.state_std)
        state = F.pad(state, (0, self.config.max_state_dim - state.shape[-1]))
        return {
            "input_ids": tok["input_ids"].to(device),
            "attention_mask": tok["attention_mask"].to(device).bool(),
            "pixel_values": pixel_values.to(self.net.dtype),
            "pixel_attention_mask": torch.ones(n, v, dtype=torch.bool, device=device),
            "state": state.to(self.net.dtype),
        }

    @staticmethod
    def _normalise(x: torch.Tensor, mean, std) -> torch.Tensor:
        return (x - torch.tensor(mean, device=x.device)) / torch.tensor(std, device=x.device)

    def unnormalise_actions(self, chunk: torch.Tensor) -> torch.Tensor:
        """`[.., C, A]` normalised (padded) chunk -> `[.., C, D]` actions in env units."""
        stats = self._stats()
        d = stats.action_dim
        mean = torch.tensor(stats.actions_mean, device=chunk.device)
        return chunk[..., :d].float() * torch.tensor(stats.actions_std, device=chunk.device) + mean

    def normalise_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """`[.., C, D]` env actions -> `[.., C, A]` normalised and zero padded (π0's training targets)."""
        stats = self._stats()
        x = self._normalise(actions.float(), stats.actions_mean, stats.actions_std)
        return F.pad(x, (0, self.config.max_action_dim - x.shape[-1]))

    # ------------------------------------------------------------------------------------------------ the model
    def prefix_cache(self, inputs: dict[str, torch.Tensor], with_hidden: bool = False):
        """The backbone's key/value cache of the prompts (images + instruction), as `sample_actions` builds it; with
        `with_hidden`, also the backbone's last hidden state `[B, P, H]`."""
        model = self.net
        mask = inputs["attention_mask"]
        embeds = model.model.embed_prefix(inputs["input_ids"], inputs["pixel_values"], inputs["pixel_attention_mask"])
        out = model.model.vlm(
            inputs_embeds=embeds, attention_mask=mask.long(), position_ids=mask.long().cumsum(-1) - 1,
            token_type_ids=torch.zeros_like(embeds)[:, :, 0], use_cache=True,
        )  # fmt: skip
        cache = getattr(out, "cache", None)  # `cache` in transformers 5.24, `past_key_values` before
        cache = out.past_key_values if cache is None else cache
        return (cache, out.last_hidden_state) if with_hidden else cache

    def velocity(
        self, cache, mask: torch.Tensor, state: torch.Tensor, x: torch.Tensor, t: torch.Tensor, with_hidden=False
    ):
        """The expert's velocity `[B, C, A]` at chains `x` `[B, C, A]` and times `t` `[B]` given the prompts' cache
        (which it leaves as it found it); with `with_hidden`, also the expert's last hidden state `[B, C, He]` of
        the action positions (what the velocity projection reads)."""
        # `PI0ForConditionalGeneration.forward`'s own steps with the noise given, from its parts: the expert's hidden
        # state is at hand, and a sharded model runs them inside `in_root_call`'s single call of the root.
        net, length = self.net, cache.get_seq_length()
        embeds = net.embed_action_time(state, x, t)
        out = net.model(action_embeds=embeds, attention_mask=mask.long(), **{self._cache_kwarg: cache})
        cache.crop(length - cache.get_seq_length())  # drop the expert's own keys: each step sees the prompt only
        hidden = out.last_hidden_state[:, -self.chunk :]
        velocity = net.action_out_proj(hidden)
        return (velocity, hidden) if with_hidden else velocity

    def in_root_call(self, fn, *args):
        """`fn(*args)` run as the forward of one call of the policy's root module. Under FSDP2 (torchrun) the root
        holds the parameters outside the decoder layers (embeddings, projections, norms): its call hooks gather them
        and, after backward, reduce their gradients; scoring calls the model's parts, so it runs inside such a
        call. A model that is not sharded runs `fn` directly."""
        fsdp = sys.modules.get("torch.distributed.fsdp")  # never imported by a single-process run
        root = self.model
        if fsdp is None or not isinstance(root, fsdp.FSDPModule):
            return fn(*args)
        # The expert's gradient reaches the backbone's layers through the prompt's key/value cache, not through the
        # layers' outputs, where FSDP's pre-backward hook would gather their weights again: with grad, they keep them
        # from forward to backward (freed by the post-backward reshard, as the others).
        kept = [m for m in self.net.model.vlm.language_model.modules() if isinstance(m, fsdp.FSDPModule)]
        kept = kept if torch.is_grad_enabled() else []
        for unit in kept:
            unit.set_reshard_after_forward(False, recurse=False)
        root.forward = lambda: fn(*args)  # the instance's forward: nn.Module.__call__ runs FSDP's hooks around it
        try:
            return root()
        finally:
            del root.forward
            for unit in kept:
                unit.set_reshard_after_forward(True, recurse=False)

    def transition(self, cache, mask, state, x, t, sigma, dt: float, stochastic: bool = True):
        """Mean `[B, C, A]` and std (`[B, 1, 1]` for Flow-SDE, `[B, C, A]` for Flow-Noise) of one denoising step
        from `x` at times `t` `[B]`; `sigma` `[B]` is Flow-SDE's noise scale. Not `stochastic`: the ODE step, std 0."""
        if self.noise_method == "flow_noise" and stochastic:
            v, hidden = self.velocity(cache, mask, state, x, t, with_hidden=True)
            return x + v * dt, self.net.noise_head(hidden).to(x.dtype)
        v = self.velocity(cache, mask, state, x, t)
        return sde_step(x, v, t, sigma if stochastic else torch.zeros_like(sigma), dt)

    def state_features(self, hidden: torch.Tensor, mask: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """`[B, 1, H + Smax]` what the critic reads: the backbone's last hidden state `[B, P, H]` averaged over the
        prompt mask `[B, P]`, joined with the normalised state `[B, Smax]`."""
        weights = mask.to(hidden.dtype).unsqueeze(-1)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)
        return torch.cat([pooled.float(), state.float()], -1).unsqueeze(1)

    # ------------------------------------------------------------------------------------------------ verbs
    @torch.no_grad()
    def generate(
        self,
        obs: Observation,
        group_size: int = 1,
        sampling: Sampling | None = None,
        history=None,
        generator: torch.Generator | None = None,
    ) -> FlowRollout:
        """Sample a chunk for each of the R worlds of `obs`; temperature 0 runs the ODE.

        As `VLMPolicy.generate`: `obs` holds R = B*G worlds where each run of G consecutive worlds was reset with the
        same seed (the GRPO group contract), so only every G-th world is encoded (the backbone reads B prompts, its
        cache then repeated G times) and G chains are sampled for it.

        Args:
            obs: R observations (with `proprio`).
            group_size: G.
            sampling: `temperature` 0 is greedy (the ODE); any other temperature samples the SDE at the policy's
                noise level, or Flow-Noise's learned noise (the temperature does not scale either).
            history: must be None (a flow policy sees the current observation only).
            generator: draws the noise (default: torch's global generator, seeded by the collector).

        Returns:
            A `FlowRollout` with R rows.
        """
        if history is not None and any(history):
            raise ValueError("model.history_turns: a flow policy sees the current observation only")
        if len(obs) % group_size:
            raise ValueError(f"{len(obs)} worlds do not split into groups of {group_size}")
        sampling = sampling or Sampling()
        level = 0.0 if sampling.temperature == 0 else self.noise_level
        noisy = self.noise_method == "flow_noise" and sampling.temperature != 0
        stochastic = level > 0 or noisy
        prompts = obs.select(range(0, len(obs), group_size)) if group_size > 1 else obs
        encoded = self.encode(prompts)
        cache = self.prefix_cache(encoded)
        cache.batch_repeat_interleave(group_size)
        inputs = {k: v.repeat_interleave(group_size, 0) for k, v in encoded.items()}
        r, k, c, a = inputs["state"].shape[0], self.num_steps, self.chunk, self.config.max_action_dim
        d = self.action_dim
        dtype, device = self.net.dtype, self.device
        x = torch.randn(r, c, a, generator=generator, dtype=torch.float32).to(device, dtype)  # [R, C, A] x_K
        chain, logprobs = [x], torch.zeros(r, k, device=device)
        times, sigmas, dt = sde_schedule(k, level)
        for step in range(k):
            t = times[step].expand(r).to(device)
            mean, std = self.transition(
                cache, inputs["attention_mask"], inputs["state"], x, t, sigmas[step].expand(r).to(device), dt,
                stochastic=stochastic,
            )  # fmt: skip
            if stochastic:
                noise = torch.randn(r, c, a, generator=generator, dtype=torch.float32).to(device, dtype)
                x = mean + std * noise
                logprobs[:, step] = gaussian_logprob(x[..., :d], mean[..., :d], _executed(std, d))
            else:
                x = mean
            chain.append(x)
        chain = torch.stack(chain, 1)  # [R, K+1, C, A]
        return FlowRollout(
            prompt_ids=inputs["input_ids"],
            prompt_mask=inputs["attention_mask"],
            pixel_values=inputs["pixel_values"],
            pixel_attention_mask=inputs["pixel_attention_mask"],
            state=inputs["state"],
            chain=chain,
            actions=self.unnormalise_actions(chain[:, -1]),
            completion_ids=torch.arange(k, device=device).expand(r, k).clone(),
            completion_mask=torch.full((r, k), stochastic, dtype=torch.bool, device=device),
            logprobs=logprobs,
            group_size=group_size,
            noise_level=level,
            noise_method=self.noise_method,
            texts=[""] * r,
        )

    def logprobs(
        self, batch: FlowRollout, temperature: float = 1.0, with_entropy: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Each row's per-step log-densities `[R, K]` of its recorded chain under the current weights, with
        gradients (0 where masked); with `with_entropy`, also each transition's entropy `[R, K]` over the executed
        dimensions, which Flow-SDE fixes by its noise level (no gradient: an entropy bonus does nothing there) and
        Flow-Noise's head learns.

        The backbone reads each row's prompt once (and feeds the critic's `value_tap`); the expert then runs the K
        steps of every row in one batch over the prompt cache repeated K times. `temperature` is not used: the rows
        carry the noise they were sampled with (`noise_method`, `noise_level`).
        """
        return self.in_root_call(self._logprobs, batch, with_entropy)

    def _logprobs(self, batch: FlowRollout, with_entropy: bool):
        r, k = batch.completion_mask.shape
        d = self.action_dim
        if batch.noise_method != self.noise_method and batch.completion_mask.any():
            raise ValueError(f"rows sampled with noise_method {batch.noise_method!r} cannot be scored by a policy "
                             f"whose noise_method is {self.noise_method!r}")  # fmt: skip
        inputs = {
            "input_ids": batch.prompt_ids, "attention_mask": batch.prompt_mask, "pixel_values": batch.pixel_values,
            "pixel_attention_mask": batch.pixel_attention_mask,
        }  # fmt: skip
        cache, hidden = self.prefix_cache(inputs, with_hidden=True)
        self.net.value_tap(self.state_features(hidden, batch.prompt_mask, batch.state))  # a critic's hook reads it
        if not batch.completion_mask.any():  # greedy rows: a deterministic chain has no density (nothing trains)
            zeros = torch.zeros(r, k, device=self.device)
            return (zeros, zeros) if with_entropy else zeros
        cache.batch_repeat_interleave(k)  # row-major: row i's K steps are rows i*K .. i*K+K-1
        times, sigmas, dt = sde_schedule(k, batch.noise_level)
        t = times.to(self.device).repeat(r)  # [R*K]
        sigma = sigmas.to(self.device).repeat(r)
        x = batch.chain[:, :k].flatten(0, 1)  # [R*K, C, A] each step's input
        state = batch.state.repeat_interleave(k, 0)
        mask = batch.prompt_mask.repeat_interleave(k, 0)
        mean, std = self.transition(cache, mask, state, x, t, sigma, dt)
        target = batch.chain[:, 1:].flatten(0, 1)  # [R*K, C, A]
        std = _executed(std, d)
        logprobs = gaussian_logprob(target[..., :d], mean[..., :d], std).view(r, k)
        logprobs = torch.where(batch.completion_mask, logprobs, torch.zeros_like(logprobs))
        if not with_entropy:
            return logprobs
        per_dim = 0.5 * math.log(2 * math.pi * math.e) + torch.log(std.expand(r * k, self.chunk, d))
        return logprobs, per_dim.flatten(1).sum(-1).view(r, k)

    # ------------------------------------------------------------------------------------------------ cold start
    def flow_matching_loss(
        self, obs: Observation, actions: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """π0's flow-matching loss on expert chunks `actions` `[N, C, D]` (env units): the mean squared error of
        the predicted velocity against `noise - action` at a Beta-drawn time, over the executed dimensions."""
        inputs = self.encode(obs)
        target = self.normalise_actions(actions.to(self.device)).to(self.net.dtype)  # [N, C, A]
        n, cfg = target.shape[0], self.config
        beta = torch.distributions.Beta(cfg.time_sampling_beta_alpha, cfg.time_sampling_beta_beta)
        # Drawn with the generator (Beta has none): the inverse CDF would need scipy, so sample by the ratio of Gammas.
        u = torch._standard_gamma(torch.full((n,), float(beta.concentration1)), generator=generator)
        w = torch._standard_gamma(torch.full((n,), float(beta.concentration0)), generator=generator)
        t = (u / (u + w)) * cfg.time_sampling_scale + cfg.time_sampling_offset
        t = t.to(self.device, self.net.dtype)
        noise = torch.randn(target.shape, generator=generator).to(self.device, self.net.dtype)
        cache = self.prefix_cache(inputs)
        x = t.view(-1, 1, 1) * noise + (1 - t.view(-1, 1, 1)) * target
        v = self.velocity(cache, inputs["attention_mask"], inputs["state"], x, t)
        d = self.action_dim
        return F.mse_loss(v[..., :d], (noise - target)[..., :d])


def _executed(std: torch.Tensor, d: int) -> torch.Tensor:
    """The std of the executed action dimensions: Flow-SDE's `[B, 1, 1]` as is, Flow-Noise's `[B, C, A]` cut to D."""
    return std if std.shape[-1] == 1 else std[..., :d]


# ---------------------------------------------------------------------------------------------- tiny


def build_tiny_flow(seed: int = 0, action_dim: int | None = None, **kwargs) -> FlowPolicy:
    """A randomly initialised tiny π0 from assets/tiny_models/pi0 (the same for the same seed); no statistics yet. With
    `action_dim` wider than the asset's padded action width, the same model with `max_action_dim = action_dim`."""
    from transformers import AutoConfig, AutoTokenizer, PI0ForConditionalGeneration

    config = AutoConfig.from_pretrained(TINY_PI0)
    if action_dim is not None and action_dim > config.max_action_dim:
        config.max_action_dim = int(action_dim)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = PI0ForConditionalGeneration(config)
    return FlowPolicy(model, AutoTokenizer.from_pretrained(TINY_PI0), read_image_settings(TINY_PI0), **kwargs)
