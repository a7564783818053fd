"""`VLMPolicy`: the only module that knows chat templates, padding sides and a model's vision inputs (through its
processor and the family table, `mmrl.families`).

Verbs: `generate(obs, group_size, sampling)` samples G completions per prompt and keeps the sampling-time
per-token log-probs; `logprobs(batch)` recomputes them under the current weights (with gradients); `masked(batch,
...)` hides part of each image for PAPO's perception pass.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import replace
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor
from transformers import AutoModelForImageTextToText

from sim.base import Observation

from ...algos.losses import entropy_from_logits
from ...algos.papo import masked_images
from ...families import Vision
from ...runtime.config import ModelConfig, TrainConfig
from ...runtime.schema import ConfigError, require
from ...types import Demonstrations, Rollout, Sampling, Turn
from ..base import POLICY_KINDS, Policy
from ..engines.backends import forget_compiled_calls, make_backend
from ..lora import LORA_DIR, is_lora, load_lora, plain_model, save_lora
from ..tokens import AllowOnly, completion_mask_from_ids, token_logprobs  # noqa: F401  (re-exported)
from ..vision import to_pil
from . import demonstrations as demos
from .action_codec import add_action_tokens, load_action_codec
from .options import apply_model_options
from .processing import VisionTextProcessor, check_image_tokens, check_vlm_folder
from .tiny import ALL_TINY_ARCHS, tiny_model


@POLICY_KINDS.register("vlm")
class VLMPolicy(Policy):
    """A Hugging Face image-text-to-text model with its processor, as a policy over text actions (a token policy; with
    an action codec, a VLA over continuous actions).

    Args:
        model: an `AutoModelForImageTextToText` model of a family in `mmrl.families.FAMILIES` (Qwen2-VL,
            Qwen2.5-VL, Qwen3-VL, Gemma 3, Idefics3 / SmolVLM tested).
        processor: its `VisionTextProcessor`.
        prompt_template: how an env instruction becomes the user turn: `{instruction}` is replaced by it, and
            `{image}`, if present, marks where the image goes (otherwise the image comes first).
        generation_backend: what runs `generate`'s decoding loop: "lean" (a sampling loop over the model's
            forward, the default), "hf" (transformers' `generate`, the reference), "static" (static KV cache,
            decoding compiled on CUDA) or "vllm" (a colocated vLLM engine); see
            `mmrl.policy.engines.backends`. Also settable later: `policy.generation_backend = "static"`, or
            `policy.set_generation_backend("vllm", gpu_memory_utilization=0.3)` for a backend with options.
    """

    features = frozenset({
        "papo", "branching", "judge", "history", "rollout_workers", "sharded_async", "text_answers", "progress",
        "engines", "system_prompt", "pixel_range", "action_tokens",
    })  # fmt: skip
    refusals = {
        "flow_sampler": "a token policy samples tokens; the flow fields are a flow policy's (π0: tiny:pi0 or a π0 "
        "folder)",
        "chunk_labels": "it labels a flow policy's (π0's) chunks at every step; the token path labels every step "
        "already",
        "untied_expert": "with model.lora.r 0, freezing every part leaves nothing to train",
    }
    label = "VLM policies"
    tiny_names = ALL_TINY_ARCHS

    def __init__(
        self,
        model,
        processor: VisionTextProcessor,
        prompt_template: str = "{instruction}",
        generation_backend: str = "lean",
        history_turns: int = 0,
    ):
        self.model = model
        self.processor = processor
        self.prompt_template = prompt_template
        # > 0: a multi-turn episode's prompt keeps this many earlier turns (images, instruction, the answer's
        # sampled tokens) as a conversation (`mmrl.stages.rollout.collect_episodes`); 0: the current observation only.
        self.history_turns = history_turns
        tok = processor.tokenizer
        eos = model.generation_config.eos_token_id if model.generation_config is not None else None
        eos = eos if eos is not None else tok.eos_token_id
        self.eos_token_ids = [eos] if isinstance(eos, int) else list(eos)
        self.pad_token_id = tok.pad_token_id
        # transformers >= 5.2x computes multimodal RoPE positions only when told which tokens are image tokens;
        # without `mm_token_type_ids` it silently falls back to 1-D positions. Older versions take no such input.
        # A PEFT wrapper's forward takes **kwargs, so the signature is read from the model it wraps.
        plain = model.get_base_model() if hasattr(model, "get_base_model") else model
        # Gemma 3 reads the same marks as `token_type_ids` (bidirectional attention within an image).
        parameters = inspect.signature(plain.forward).parameters
        self._token_type_keys = [k for k in ("mm_token_type_ids", "token_type_ids") if k in parameters]
        self._wants_mm_token_types = bool(self._token_type_keys)
        self.family = processor.family
        # A sampled vision placeholder would make the next forward pass expect image features that do not exist.
        names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
        suppress = {i for n in names if (i := getattr(model.config, n, None)) is not None}
        suppress |= {processor.image_token_id} | {tok.convert_tokens_to_ids(t) for t in self.family.suppress}
        self.suppress_token_ids = sorted(i for i in suppress if isinstance(i, int))
        # Set by `add_action_tokens` for a VLA: generation then emits exactly C*D action tokens, and both sampling
        # and scoring see the distribution restricted to them (so the PPO ratio compares like with like).
        self.action_codec = None
        self._backend = None
        self.set_generation_backend(generation_backend)

    def __deepcopy__(self, memo: dict) -> VLMPolicy:
        """A deep copy less the compiled forward transformers caches on the model (`forget_compiled_calls`), so
        that every copy (the pipelined collector's, the one shipped to rollout workers, a reference) decodes with
        its own weights."""
        clone = object.__new__(type(self))
        memo[id(self)] = clone
        clone.__dict__.update(copy.deepcopy(self.__dict__, memo))
        forget_compiled_calls(clone.model)
        return clone

    @classmethod
    def from_pretrained(
        cls, path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu", **kwargs
    ) -> VLMPolicy:
        """Load a checkpoint folder (or a hub id where a hub is reachable) with its processor."""
        check_vlm_folder(Path(path))
        processor = VisionTextProcessor.from_pretrained(path)  # first: names a family this transformers lacks
        model = AutoModelForImageTextToText.from_pretrained(str(path), dtype=dtype).to(device)
        policy = cls(model, processor, **kwargs)
        load_action_codec(policy, path)  # a VLA carries its codec next to its weights
        if (Path(path) / LORA_DIR).is_dir():  # a LoRA checkpoint: base weights here, trainable adapters beside
            load_lora(policy, Path(path) / LORA_DIR)
        return policy

    def save_pretrained(self, path: str | Path) -> None:
        """Write the model, processor and action codec to `path`, loadable by `VLMPolicy.from_pretrained`.

        A LoRA policy (see `mmrl.policy.lora.apply_lora`) is written as its *unmerged* base weights, a plain
        Hugging Face checkpoint, plus its adapters (and trained action-token rows) in `path/lora/`; `from_pretrained`
        re-attaches them, trainable, so a resumed run continues from exactly the weights and optimiser state it
        left. Loading the folder with plain `transformers` gives the base model WITHOUT the adapters: for a
        standalone model call `mmrl.policy.lora.merge_lora(policy)` first (export).
        """
        if is_lora(self):
            save_lora(self, path)
        else:
            self.model.save_pretrained(path)
        self.processor.save_pretrained(path)
        if self.action_codec is not None:
            self.action_codec.save(path)

    @classmethod
    def load(cls, folder: str | Path, cfg: ModelConfig, dtype: torch.dtype) -> VLMPolicy:
        return cls.from_pretrained(
            folder,
            dtype=dtype,
            device=cfg.device,
            prompt_template=cfg.prompt_template,
            history_turns=cfg.history_turns,
        )

    @classmethod
    def tiny(cls, name: str, cfg: ModelConfig, action_dim: int | None = None) -> VLMPolicy:
        return build_tiny(name, seed=cfg.seed, prompt_template=cfg.prompt_template, history_turns=cfg.history_turns)

    # ------------------------------------------------------------------ fitting to a run
    def apply_options(self, cfg: ModelConfig) -> VLMPolicy:
        return apply_model_options(self, cfg)

    def fit(self, cfg: TrainConfig, env) -> VLMPolicy:
        """Action tokens for a continuous env (a VLA, `model.action_bins`), then the model options
        (`apply_model_options`: LoRA keeps the action tokens' rows trainable), the coordinate convention its
        checkpoints record, and the env checked."""
        if env.action_kind == "continuous" and self.action_codec is None:
            require(cfg.model.action_bins >= 2, "model.action_bins", f"must be set (e.g. 256): env {cfg.env.name!r} "
                    "takes continuous actions, which a token policy emits as added action tokens")  # fmt: skip
            add_action_tokens(
                self, env.action_low, env.action_high, cfg.model.action_bins, cfg.model.action_chunk,
                seed=cfg.trainer.seed,
            )  # fmt: skip
        policy = self.apply_options(cfg.model)
        if "coordinates" in cfg.env.options:
            # Its checkpoints say which units it answers in, whatever its family's (mmrl.runtime.conventions reads them).
            plain_model(policy.model).config.grounding_coordinates = cfg.env.options["coordinates"]
        policy.check_env(env)
        return policy

    def check_env(self, env) -> None:
        codec = self.action_codec
        env_label = f"the env.name env ({type(env).__name__})"
        if env.action_kind == "continuous" and codec is None:
            raise ConfigError(f"model.action_bins: {env_label} takes continuous actions, which need a VLA policy: "
                              "set model.action_bins to add action tokens")  # fmt: skip
        if env.action_kind == "text" and codec is not None:
            raise ConfigError(f"model.path: a VLA policy (with action tokens) cannot act in {env_label}, a text env")
        if codec is not None and codec.action_dim != env.action_dim:
            raise ConfigError(f"model.path: the policy's action codec has {codec.action_dim} dimensions, "
                              f"{env_label} {env.action_dim}")  # fmt: skip

    @property
    def chunk(self) -> int:
        """Actions one generation executes: a VLA's chunk, one for a text answer."""
        return self.action_codec.chunk if self.action_codec is not None else 1

    def row_sampling(self, sampling: Sampling) -> Sampling:
        """A VLA emits exactly its C*D action tokens per generation; a text policy answers within the budget."""
        if self.action_codec is None:
            return sampling
        return replace(sampling, max_new_tokens=self.action_codec.tokens_per_generation)

    def actions(self, rollout: Rollout) -> torch.Tensor:
        return self.action_codec.decode(rollout.completion_ids)  # [R, C, D]

    def value_input(self, model: torch.nn.Module) -> torch.nn.Module:
        """The language-model head: its input at the last prompt position is the row's state."""
        return model.get_output_embeddings()

    def demonstrations(self, env, cfg: TrainConfig) -> Demonstrations:
        return demos.demonstrations(self, env, cfg)

    def demonstration_loss(self, demonstrations: Demonstrations, rows: torch.Tensor, generator=None) -> torch.Tensor:
        return demos.demonstration_loss(self, demonstrations, rows)

    def release_memory(self) -> None:
        """A colocated vLLM engine frees its weights and KV cache (sleep mode, where the platform has it); the next
        `generate` wakes it and re-syncs."""
        if hasattr(self._backend, "sleep"):
            self._backend.sleep()

    def expect_version(self, version: int | None) -> None:
        if hasattr(self._backend, "next_version"):
            self._backend.next_version = version

    def sampled_version(self) -> int | None:
        return getattr(self._backend, "last_version", None) if hasattr(self._backend, "next_version") else None

    # ------------------------------------------------------------------ backend
    @property
    def generation_backend(self) -> str:
        """The name of the backend `generate` uses ("lean", "hf", "static" or "vllm"); assign a name to switch."""
        return self._backend.name

    @generation_backend.setter
    def generation_backend(self, name: str) -> None:
        self.set_generation_backend(name)

    def set_generation_backend(self, name: str, **options) -> None:
        """Use backend `name` for `generate`; `options` go to its constructor (vllm: `gpu_memory_utilization`...).

        Raises a ValueError naming the choices for an unknown name, and an ImportError naming the `vllm` extra
        when "vllm" is asked for without vLLM installed.
        """
        backend = make_backend(name, **options)
        self.close()  # an engine the old backend started
        self._backend = backend

    def close(self) -> None:
        """Let go of what the generation backend holds (a vLLM engine shuts down); the next `generate` starts it
        again. The trainer calls it when a run ends, before torch.distributed's group is ended."""
        if self._backend is not None:
            self._backend.close()

    @property
    def backend(self):
        """The `GenerationBackend` object behind `generate`."""
        return self._backend

    def _restrict(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits over the tokens a completion may hold: the action tokens of a VLA, else the whole vocabulary."""
        if self.action_codec is None:
            return logits
        return logits[..., self.action_codec.token_ids.to(logits.device)]

    def token_index(self, completion_ids: torch.Tensor) -> torch.Tensor:
        """Completion ids as indices into the restricted logits' last dimension (`_restrict`)."""
        if self.action_codec is None:
            return completion_ids
        lookup = self.action_codec._bin_of.to(completion_ids.device)
        return lookup[completion_ids.clamp(0, len(lookup) - 1)].clamp(min=0)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ inputs
    def encode(self, obs: Observation) -> ModelInputs:
        """Model inputs for every world of `obs`: its V images (`obs.views`, in order) and its instruction per row."""
        views = obs.views  # [N, V, H, W, 3]
        texts = [
            self.processor.prompt_text(s, num_images=views.shape[1], template=self.prompt_template)
            for s in obs.instruction
        ]
        images = [to_pil(img) for row in obs.view_images() for img in row]  # cropped to each image's own size
        enc, vision = self.processor.encode(texts, images)
        self._check_length(enc["input_ids"].shape[1], views.shape[1])
        return self._model_inputs(enc, vision)

    def _model_inputs(self, enc: dict[str, torch.Tensor], vision: Vision) -> ModelInputs:
        """The forward's keyword arguments on the policy's device, carrying the images in the generic layout."""
        device = self.device
        vision = Vision(
            pixel_values=vision.pixel_values.to(device),
            units=vision.units.cpu(),
            per_image={k: v.to(device) for k, v in vision.per_image.items()},
            per_unit={k: v.to(device) for k, v in vision.per_unit.items()},
            tokens=vision.tokens,
            texts=vision.texts,
        )
        inputs = ModelInputs({k: v.to(device) for k, v in enc.items()})
        inputs.update(self.processor.model_inputs(vision.pixel_values, vision.per_image, vision.per_unit))
        inputs.vision = vision
        return self._with_token_types(inputs)

    def image_fields(self, inputs: ModelInputs) -> dict:
        """The `Rollout` fields of the images of `inputs` (`encode`'s or `prompt_inputs`' output)."""
        vision = inputs.vision
        return {
            "pixel_values": vision.pixel_values,
            "image_units": vision.units,
            "image_inputs": dict(vision.per_image),
            "unit_inputs": dict(vision.per_unit),
        }

    def vision_inputs(self, batch: Rollout) -> dict[str, torch.Tensor]:
        """The forward's vision keyword arguments for the rows of `batch`."""
        return self.processor.model_inputs(batch.pixel_values, batch.image_inputs, batch.unit_inputs)

    def check_image_tokens(self, input_ids: torch.Tensor, batch: Rollout) -> None:
        """Refuse a batch whose image tokens do not match its images' features (naming the row and the counts)."""
        features = self.processor.features(
            batch.image_units.cpu(), {k: v.cpu() for k, v in batch.image_inputs.items()}
        )
        check_image_tokens(input_ids, self.processor.image_token_id, features, batch.images_per_row)

    def positions(self, attention_mask: torch.Tensor) -> torch.Tensor | None:
        """1-D position ids numbering each row's real tokens from 0 (pads at 1), as transformers' `generate` numbers
        them; None for M-RoPE families, whose model computes its own from the image grid."""
        if self.family.mrope:
            return None
        first = self.family.first_position  # PaliGemma numbers from 1
        return (attention_mask.long().cumsum(-1) - 1 + first).masked_fill(attention_mask == 0, 1)

    def _check_length(self, length: int, images: int) -> None:
        """Prompts are never truncated (a cut through an image's placeholder tokens would make the model read
        features that do not line up): one longer than the model's context is an error instead."""
        limit = self.context_length
        if limit is not None and length > limit:
            raise ValueError(
                f"a prompt of {length} tokens (its {images} image(s) included) is longer than the model's context "
                f"of {limit}; lower model.max_pixels (fewer tokens per image), model.history_turns, or the "
                "instruction's length"
            )

    @property
    def context_length(self) -> int | None:
        """The model's maximum sequence length (`max_position_embeddings`), where its config states one."""
        config = self.model.config
        return getattr(getattr(config, "text_config", config), "max_position_embeddings", None)

    def _with_token_types(self, inputs: dict[str, torch.Tensor], prompt_length: int | None = None) -> dict:
        """`inputs` with the token types the forward takes (`Family.token_types`; `prompt_length`: the prompt's
        columns when completions follow)."""
        for key in self._token_type_keys:
            inputs[key] = self.family.token_types(inputs["input_ids"], self.processor.image_token_id, prompt_length)
        return inputs

    # ------------------------------------------------------------------ generation
    def encode_conversations(self, obs: Observation, history: list[list[Turn]]) -> tuple[dict, list[int]]:
        """Model inputs where world i's prompt holds its earlier turns `history[i]` (each turn's images and
        instruction as a user turn, its answer as the exact tokens sampled then), then its current observation;
        and each row's image count."""
        if len(history) != len(obs):
            raise ValueError(f"history for {len(history)} worlds, observation of {len(obs)}")
        views = obs.views  # [N, V, H, W, 3]
        shown = obs.view_images()  # each image cropped to its own size
        per_row = [[to_pil(img) for turn in turns for img in turn.views] + [to_pil(v) for v in shown[i]]
                   for i, turns in enumerate(history)]  # fmt: skip
        images, counts = [img for row in per_row for img in row], [len(row) for row in per_row]
        vision = self.processor.vision(images, counts)
        rows, start = [], 0
        for i, turns in enumerate(history):
            past = [(t.instruction, len(t.views), t.answer_ids) for t in turns]
            rows.append(
                self.processor.conversation_ids(
                    past,
                    obs.instruction[i],
                    views.shape[1],
                    vision.texts[start : start + counts[i]],
                    self.prompt_template,
                    tuple(self.eos_token_ids),
                )  # fmt: skip
            )
            start += counts[i]
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_token_id or 0, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):  # left padded, as `encode`
            input_ids[i, width - len(row) :] = torch.tensor(row)
            attention_mask[i, width - len(row) :] = 1
        self._check_length(width, max(counts))
        check_image_tokens(input_ids, self.processor.image_token_id, vision.tokens, torch.tensor(counts))
        enc = {"input_ids": input_ids, "attention_mask": attention_mask}
        inputs = self._model_inputs(enc, vision)
        inputs.images = per_row  # each row's images in order, for a backend that takes images with token ids (vllm)
        return inputs, counts

    def prompt_inputs(
        self, obs: Observation, history: list[list[Turn]] | None = None
    ) -> tuple[dict[str, torch.Tensor], int | torch.Tensor]:
        """The prompts' model inputs (`encode`, or `encode_conversations` where `history` holds earlier turns) and
        the images of each row, as `Rollout.images_per_row` takes them (an int when all rows have as many)."""
        if history is None or not any(history):
            return self.encode(obs), obs.views.shape[1]
        inputs, counts = self.encode_conversations(obs, history)
        return inputs, counts[0] if len(set(counts)) == 1 else torch.tensor(counts)

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(
        self,
        obs: Observation,
        group_size: int = 1,
        sampling: Sampling = Sampling(),  # noqa: B008 (frozen)
        history: list[list[Turn]] | None = None,
    ) -> Rollout:
        """Sample `group_size` completions for each distinct prompt of `obs`.

        `obs` holds R = B*G worlds where each run of G consecutive worlds was reset with the same seed (the GRPO
        group contract), so only every G-th world is encoded and the model samples G completions for it. The
        decoding itself runs in the policy's generation backend (`generation_backend`); every backend gives the
        same `Rollout` (prompts encoded here, sampling-time log-probs under `logprobs`' convention). With
        `history` (one list of earlier `Turn`s per world; `group_size` 1), each prompt is that conversation
        (`encode_conversations`).

        Returns:
            A `Rollout` with R rows.
        """
        if len(obs) % group_size:
            raise ValueError(f"{len(obs)} worlds do not split into groups of {group_size}")
        prompts = obs.select(range(0, len(obs), group_size)) if group_size > 1 else obs
        if history is not None and any(history):
            if group_size != 1:
                raise ValueError("a conversation's later turns are sampled one per world (group_size 1)")
        inputs, per_row = self.prompt_inputs(prompts, history)
        out = self._backend.sample(self, prompts, inputs, group_size, sampling)
        texts = self.processor.tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)
        prompts_only = Rollout(
            prompt_ids=inputs["input_ids"],
            prompt_mask=inputs["attention_mask"].bool(),
            **self.image_fields(inputs),
            completion_ids=inputs["input_ids"][:, :0],
            completion_mask=inputs["attention_mask"][:, :0].bool(),
            logprobs=inputs["input_ids"][:, :0].float(),
            texts=[""] * len(prompts),
            group_size=1,
            images_per_row=per_row,
        )
        if group_size > 1:  # each prompt's row (its images with it) repeated G times, in order
            prompts_only = prompts_only.select(torch.arange(len(prompts)).repeat_interleave(group_size))
        return replace(
            prompts_only,
            completion_ids=out.completion_ids,
            completion_mask=out.completion_mask,
            logprobs=out.logprobs,
            texts=texts,
            group_size=group_size,
        )

    # ------------------------------------------------------------------ scoring
    def logprobs(
        self, batch: Rollout, temperature: float = 1.0, with_entropy: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probs of `batch`'s completions under the current weights, with gradients.

        Returns:
            `[R, L]` per token (values at masked positions are meaningless; callers mask them), and with
            `with_entropy` also the `[R, L]` entropy of each position's temperature-scaled distribution.
        """
        input_ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
        attention_mask = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1).long()
        length = batch.completion_ids.shape[1]
        self.check_image_tokens(batch.prompt_ids, batch)
        inputs = self._with_token_types(
            {"input_ids": input_ids, "attention_mask": attention_mask, **self.vision_inputs(batch)},
            batch.prompt_ids.shape[1],
        )
        positions = self.positions(attention_mask)
        if positions is not None:
            inputs["position_ids"] = positions
        embeds = embeds_sharing_images(
            self.model, input_ids, batch.pixel_values, batch.image_inputs.get("image_grid_thw")
        )
        if embeds is not None:  # each distinct image encoded once (a group's rows share theirs); same values
            inputs.update(inputs_embeds=embeds, pixel_values=None)
        out = self.model(
            **inputs,
            logits_to_keep=length + 1,  # only the positions that predict completion tokens
            use_cache=False,
        )
        logits = self._restrict(out.logits[:, :-1].float())  # [R, L, V]
        temperature = temperature if temperature > 0 else 1.0
        logprobs = token_logprobs(logits, self.token_index(batch.completion_ids), temperature)
        if not with_entropy:
            return logprobs
        return logprobs, entropy_from_logits(logits / temperature)

    def masked(self, batch: Rollout, domain: str, ratio: float, generator: torch.Generator) -> Rollout:
        """`batch` with part of each image hidden (PAPO's perception pass): whole vision patches (`patches`, black in
        this policy's normalisation) or single entries of the pixel tensor (`pixels`), with probability `ratio`.
        `patches` needs a family whose pixel rows are patches (Qwen-VL); every family takes `pixels`."""
        if domain == "patches" and not self.family.patch_rows:
            raise ValueError(
                "algo.papo.mask=patches needs pixel rows that are vision patches (Qwen-VL); a "
                f"{self.family.name} model's are not: use pixels"
            )
        return masked_images(batch, domain, ratio, generator, self.processor.image_processor)


def build_tiny(arch: str = "qwen2_vl", seed: int = 0, **policy_kwargs) -> VLMPolicy:
    """A randomly initialised tiny model of `arch` (`tiny_model`) as a policy, the same for the same seed."""
    return VLMPolicy(*tiny_model(arch, seed), **policy_kwargs)


SHARED_IMAGE_MODELS = ("Qwen2VLModel", "Qwen2_5_VLModel")  # vision features enter as input embeddings only


def embeds_sharing_images(model, input_ids: torch.Tensor, pixel_values: torch.Tensor, grid_thw: torch.Tensor):
    """Input embeddings `[R, T, H]` with every distinct image of the batch encoded once, or None to run as usual.

    The rows of a GRPO group hold copies of one image (`_repeat_images`), so the training forward would run the
    vision tower G times on the same pixels: on the tiny benchmark model that is about a third of the update's
    forward and backward (and a conversation's rows show the images of earlier turns again). Here an image equal to
    an earlier one of the batch (same grid, same pixels) reuses its features;
    the features are gathered back to every row and scattered into the token embeddings at the image
    placeholders, as the model's forward does, and the model receives `inputs_embeds` (with `input_ids`, which it
    still reads for the M-RoPE positions) and no `pixel_values`. The gradient of a shared image is the sum over its
    copies, which is what the separate copies' gradients add up to (tested equal).

    None (the model's own path) where this does not apply: models whose vision features also enter later layers
    (Qwen3-VL's deepstack), FSDP-sharded models (the embedding and vision tower are called outside the root
    module's forward here, which would see sharded weights), and batches without a repeated image.
    """
    base = plain_model(model)
    inner = getattr(base, "model", None)
    if type(inner).__name__ not in SHARED_IMAGE_MODELS or grid_thw is None or len(grid_thw) < 2:
        return None
    if any(isinstance(p, DTensor) for p in base.lm_head.parameters()):
        return None
    chunks = pixel_values.split(grid_thw.prod(-1).tolist(), dim=0)
    owner = []  # image i's features are those of image owner[i]
    seen: dict[tuple, list[int]] = {}  # a cheap fingerprint -> the distinct images that have it (checked exactly)
    for i, chunk in enumerate(chunks):
        key = (tuple(grid_thw[i].tolist()), float(chunk[0].sum()), float(chunk.sum()))
        match = next((j for j in seen.get(key, ()) if torch.equal(chunks[j], chunk)), None)
        if match is None:
            seen.setdefault(key, []).append(i)
        owner.append(i if match is None else match)
    distinct = sorted(set(owner))
    if len(distinct) == len(chunks):
        return None
    out = inner.get_image_features(torch.cat([chunks[i] for i in distinct]), grid_thw[distinct])
    pooled = out.pooler_output if hasattr(out, "pooler_output") else out
    per_image = dict(zip(distinct, pooled, strict=True))  # one [tokens, H] tensor per distinct image
    features = torch.cat([per_image[o] for o in owner])
    embeds = base.get_input_embeddings()(input_ids)
    placeholders = (input_ids == base.config.image_token_id).unsqueeze(-1)
    if int(placeholders.sum()) != features.shape[0]:
        raise ValueError(f"{int(placeholders.sum())} image placeholders for {features.shape[0]} image features")
    return embeds.masked_scatter(placeholders, features.to(embeds.dtype))


class ModelInputs(dict):
    """A model forward's keyword arguments, carrying the images in the generic layout as `.vision` (and, from
    `encode_conversations`, each row's PIL images in order as `.images`)."""

    vision: Vision
