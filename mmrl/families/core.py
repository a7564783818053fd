"""The dataclasses of the per-family facts (`Family`, its `Vision` layout and its `VLLMFacts`); the layout modules
beside this one fill them in, and the package's `FAMILIES` gathers them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image

COORDINATES = ("pixels", "0-1000", "0-1")


@dataclass(frozen=True)
class Vision:
    """The images of one processor call in the generic layout (I images, U units in all).

    Attributes:
        pixel_values: `[U, ...]` each image's units, image after image.
        units: `[I]` long, the units of each image.
        per_image: extra forward inputs with a first dimension of I (Qwen's `image_grid_thw` `[I, 3]`).
        per_unit: extra forward inputs with a first dimension of U (Idefics3's `pixel_attention_mask` `[U, H, W]`).
        tokens: `[I]` long, the image-token placeholders each image's features fill.
        texts: I strings, each image's placeholder text as the family's processor writes it.
    """

    pixel_values: torch.Tensor
    units: torch.Tensor
    per_image: dict[str, torch.Tensor]
    per_unit: dict[str, torch.Tensor]
    tokens: torch.Tensor
    texts: list[str]


@dataclass(frozen=True)
class VLLMFacts:
    """What the vllm backend (`mmrl.policy.engines.vllm_prompts`, `vllm_backend`) must know of a family beyond its prompt
    layout, read from vLLM 0.32's processor and model files for it (`vllm/model_executor/models/<family>.py`).

    Attributes:
        image: what the prompt vLLM takes holds for one image, which its processor replaces with the image's text;
            None: the chat template's placeholder (`Family.template_image`, vLLM's `PromptReplacement` target for
            every family here but PaliGemma); "": nothing, vLLM inserts the images at the prompt's start itself
            (PaliGemma's `PromptInsertion`).
        after_images: text the family's prompt writes after its images that vLLM inserts with them (PaliGemma's
            `<bos>`), left out of the prompt it is sent.
        vocab: literal entries its vLLM processor looks up in the tokenizer's vocabulary (Gemma 3's newline runs, which
            it merges around each image; PaliGemma's `"\\n"`, which it appends to a prompt): a tokenizer without them
            (a byte-level BPE writes a newline `Ċ`) is refused before the engine starts.
        modules: Python modules the Hugging Face processor vLLM builds for it imports (SmolVLM's `num2words`).
        max_images: the images a prompt may hold in vLLM as the training forward reads them (PaliGemma: vLLM's own
            limit; LLaVA-OneVision: vLLM lays out several otherwise); None: any.
        cpu_dtypes: the dtypes its layers run in on vLLM's CPU build (Qwen3.5's Gated DeltaNet kernel: bfloat16
            only); empty: any.
        cpu_config: `(text-config attribute, values its CPU kernels take)` pairs (Qwen3.5's Gated DeltaNet head
            sizes).
        cpu: why vLLM's CPU build would sample from another distribution than the training forward scores (the
            backend refuses the family on CPU, saying this); empty: it samples the same.
        refused: why the vllm backend refuses the family on any device (what it samples has not been checked against
            the training forward); empty: the checks above decide.
        engine_config: `(dotted config attribute, value)` pairs written into the engine's config.json: what vLLM
            reads from the released checkpoints' config.json and transformers' config class does not carry (GLM-4.1V's
            `text_config.attention_bias`: transformers' text attention always has q/k/v biases).
    """

    image: str | None = None
    after_images: str = ""
    vocab: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    max_images: int | None = None
    cpu_dtypes: tuple[str, ...] = ()
    cpu_config: tuple[tuple[str, tuple[int, ...]], ...] = ()
    cpu: str = ""
    refused: str = ""
    engine_config: tuple[tuple[str, Any], ...] = ()


# vLLM's CPU attention (`CPUAttentionBackend`) has no `supports_mm_prefix`: image tokens attend causally there.


@dataclass(frozen=True)
class Family:
    """The facts of one model family (see the module docstring).

    Attributes:
        name: the `model_type` of its checkpoints' config.json.
        image_token: the placeholder token the vision features replace, one per feature vector.
        template_image: what the chat template writes for one image; each occurrence becomes one image's text.
        vision: `(image_processor, images, processor_settings, per_row) -> Vision`; `per_row` the images of each
            prompt, in order (None: one prompt holds them all; LLaVA-OneVision lays out a lone image differently).
        features: `(units [I], per_image, settings, image_processor) -> [I]` the feature vectors each image gives
            (the placeholders it needs), from the stored layout alone (a training batch re-checks its prompts
            against it).
        batched_pixels: the forward takes `pixel_values` (and per-unit tensors) with a leading batch dimension
            `[1, U, ...]` (Idefics3 reads `[B, N, ...]` and drops all-zero padding tiles).
        mrope: positions are Qwen's 3-axis multimodal RoPE, offset by the model's `rope_deltas`; otherwise 1-D
            positions numbering the real (unpadded) tokens from 0.
        patch_rows: each `pixel_values` row is one vision patch (PAPO's `patches` masking domain applies).
        pixel_bounds: the image processor resizes to any area within `min_pixels`/`max_pixels` (Qwen-VL's dynamic
            resolution); other families resize to their fixed sizes.
        turn_start, turn_end: the tokens that open and close a chat turn.
        coordinates: the grounding coordinate convention of its checkpoints: "pixels" (absolute, in the resized
            image the model sees), "0-1000" or "0-1" (relative).
        suppress: further special tokens never to sample (structure tokens of the image placeholders).
        prompt: for a family without a chat template (PaliGemma), `(tokenizer, content) -> text`: the prompt its
            processor writes for one user turn's content (chat-template content items); such a family holds no
            conversation (a multi-turn prompt is refused, naming the family).
        prefix_lm: `token_type_ids` mark the prompt 0 (attended bidirectionally) and the completion 1 (causal), as
            PaliGemma's prefix-LM takes them; otherwise they mark image tokens 1 (Gemma 3's bidirectional images).
        first_position: the position id of a row's first real token (PaliGemma numbers positions from 1).
        forward_inputs: `(per_image) -> forward keyword arguments` where the stored per-image tensors are not the
            forward's own (LLaVA-OneVision's per-image count of its prompt's images becomes the forward's
            `batch_num_images`); None passes them as they are.
        vllm: what the vllm backend needs to know of it (`VLLMFacts`).
    """

    name: str
    image_token: str
    template_image: str
    vision: Callable[[Any, list[Image.Image], dict, list[int] | None], Vision]
    features: Callable[[torch.Tensor, dict[str, torch.Tensor], dict, Any], torch.Tensor]
    turn_start: str
    turn_end: str
    coordinates: str
    batched_pixels: bool = False
    mrope: bool = False
    patch_rows: bool = False
    pixel_bounds: bool = False
    suppress: tuple[str, ...] = field(default=())
    prompt: Callable[[Any, list[dict]], str] | None = None
    prefix_lm: bool = False
    first_position: int = 0
    forward_inputs: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None
    vllm: VLLMFacts = field(default=VLLMFacts())

    def token_types(self, input_ids: torch.Tensor, image_token_id: int, prompt_length: int | None) -> torch.Tensor:
        """`[B, T]` int `token_type_ids` for a forward over `input_ids` whose first `prompt_length` columns are the
        prompt (None: all of them)."""
        if not self.prefix_lm:
            return (input_ids == image_token_id).int()
        types = torch.zeros_like(input_ids, dtype=torch.int)
        if prompt_length is not None:
            types[:, prompt_length:] = 1
        return types


def tokens_per_unit(key: str) -> Callable[..., torch.Tensor]:
    """The `features` of a family whose every vision unit (an image, a tile) takes the same number of tokens, read from
    the image processor's settings under `key`."""

    def features(units: torch.Tensor, per_image: dict, settings: dict, image_processor=None) -> torch.Tensor:
        return units * int(settings[key])

    return features
