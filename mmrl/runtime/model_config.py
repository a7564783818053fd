"""The `model` section of the configuration (`mmrl.runtime.config`) and its sub-sections: `model.lora.*` (adapters)
and `model.flow.*` (a flow policy's sampler). Each section checks its own fields when it is built."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .schema import require

FREEZE_PARTS = ("vision", "projector", "language")  # model.freeze: see mmrl.policy.lora.part_parameters


@dataclass(frozen=True)
class LoRAConfig:
    """LoRA adapters (PEFT) trained instead of every weight (`mmrl.policy.lora`)."""

    r: int = 0  # > 0 trains LoRA adapters of this rank instead of every weight
    alpha: int = 32
    dropout: float = 0.0
    # PEFT's target_modules: "all-linear" or comma-separated names; for a flow policy (π0) the parts that get
    # adapters: "backbone" (PaliGemma's language model), "expert" (the action expert), both, or all-linear for both
    target_modules: str = "all-linear"
    # Adapters on the vision side too: every linear layer of the vision tower and its projector, added to
    # target_modules' (which otherwise leave the vision tower out); needs model.lora.r > 0.
    vision: bool = False

    def __post_init__(self):
        require(self.r >= 0, "model.lora.r", "must be >= 0 (0: no LoRA)")
        require(not self.vision or self.r > 0, "model.lora.vision", "needs model.lora.r > 0 (LoRA on)")


@dataclass(frozen=True)
class FlowConfig:
    """A flow policy's (π0's) sampling; null keeps the model folder's own (processor_config.json), else the policy's
    defaults (flow_sde, 0.5, the config's num_inference_steps).

    Set for any other model, they are refused. Their values are checked by the flow policy kind
    (`mmrl.policy.flow.data.sampler_problem`), the one check that also sees the values a folder fills in.
    """

    noise_level: float | None = None  # Flow-SDE's noise level a (0: the deterministic ODE; πRL uses 0.5)
    noise_method: str | None = None  # a denoising step's noise: "flow_sde" (noise level) or "flow_noise" (learned)
    steps: int | None = None  # K denoising steps per action chunk (the rows' "tokens")


@dataclass(frozen=True)
class ModelConfig:
    # A checkpoint folder (or a hub id where a hub is reachable), or "tiny:<arch>" for a random tiny model
    # built from assets/ (arch: qwen2_vl, qwen2_5_vl, qwen3_vl).
    path: str = "assets/tiny_models/qwen3_vl_warm_start"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    # How an env instruction becomes the user turn of the chat; `{instruction}` is replaced.
    prompt_template: str = "{instruction}"
    # A system turn before every prompt (and conversation), rendered by the model's own chat template (Gemma 3 folds it
    # into the first user turn); TRL and verl users put it in each dataset row's messages, here it is one field.
    # "": no system turn (a template's own default stays: Qwen2-VL's "You are a helpful assistant.").
    system_prompt: str = ""
    # Multi-turn episodes as conversations: each turn's prompt keeps the world's last K turns (their images, the
    # instructions and the exact tokens the policy sampled as answers) before the current observation; 0: none.
    history_turns: int = 0
    seed: int = 0  # initialisation seed for "tiny:" models and LoRA adapters
    # A VLA: > 0 adds this many action tokens (uniform bins per action dimension, bounds from the env) so the model
    # acts in continuous-action envs; 0 keeps a text policy. A checkpoint that already has a codec keeps its own.
    action_bins: int = 0
    action_chunk: int = 1  # actions per generation (C*D tokens at once)
    # Real-size training on one GPU.
    gradient_checkpointing: bool = False  # recompute activations in the backward pass (less memory, ~30% slower)
    freeze_vision: bool = False  # keep the vision tower (and its merger) fixed; only the language model trains
    # Parts kept fixed, any of "vision" (the vision encoder), "projector" (its merger into the language model's
    # space; Qwen3-VL's deepstack mergers too), "language" (the language model, embeddings and head included).
    freeze: list[str] = field(default_factory=list)
    # Each image's area after resizing, in pixels, as qwen-vl-utils' min_pixels/max_pixels (0: the processor's own);
    # bounds the image tokens per image (about area / (patch * merge)^2).
    min_pixels: int = 0
    max_pixels: int = 0
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    # Generation backend behind the policy's one `generate`: "lean" (a sampling loop over the model's forward and
    # dynamic cache; each prompt prefilled once), "hf" (transformers' generate, the reference), "static" (static KV
    # cache + compiled decoding; GPU), "vllm" (a colocated vLLM engine; needs vllm installed).
    # "vllm_process": vLLM in a process of its own, which trainer.max_staleness >= 1 samples from while this one updates
    generation_backend: Literal["lean", "hf", "static", "vllm", "vllm_process"] = "lean"
    vllm_gpu_memory_utilization: float = 0.3  # share of GPU memory the vLLM engine may take (vllm or vllm_process)
    # GPUs one vLLM engine spans; 1 only: under torchrun each rank's engine samples that rank's own prompts, which a
    # tensor-parallel engine forbids (its ranks must send the same ones), so a model must fit one GPU (docs/vllm.md).
    vllm_tensor_parallel_size: int = 1
    flow: FlowConfig = field(default_factory=FlowConfig)

    def __post_init__(self):
        require(
            self.action_bins == 0 or self.action_bins >= 2, "model.action_bins", "must be 0 (a text policy) or >= 2"
        )
        require(self.action_chunk >= 1, "model.action_chunk", "must be >= 1")
        require(self.history_turns >= 0, "model.history_turns", "must be >= 0 (0: the current observation only)")
        require(0 < self.vllm_gpu_memory_utilization < 1, "model.vllm_gpu_memory_utilization", "must be in (0, 1)")
        require(
            self.vllm_tensor_parallel_size == 1,
            "model.vllm_tensor_parallel_size",
            f"must be 1, got {self.vllm_tensor_parallel_size}: each rank's vLLM engine samples that rank's own prompts "
            "(the external launcher, one engine per rank), which a tensor-parallel engine forbids (its ranks must send "
            "the same prompts); a model must fit one GPU",
        )
        for name in ("min_pixels", "max_pixels"):
            require(
                getattr(self, name) >= 0,
                f"model.{name}",
                f"must be >= 0 (0: the processor's own), got {getattr(self, name)}",
            )
        require(
            not (self.min_pixels and self.max_pixels) or self.min_pixels <= self.max_pixels,
            "model.min_pixels",
            f"({self.min_pixels}) is above model.max_pixels ({self.max_pixels})",
        )
        unknown = [part for part in self.freeze if part not in FREEZE_PARTS]
        require(not unknown, "model.freeze", f"unknown part(s) {unknown}; choose from {', '.join(FREEZE_PARTS)}")
