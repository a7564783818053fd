"""One table of per-family facts: what differs between vision-language model families, and nothing else.

Every place that would otherwise ask "which model is this?" reads a `Family` from `FAMILIES` instead, keyed by
`model.config.model_type`. A family says:

* which token the model's image features replace (`image_token`, counted against the features before any forward)
  and what its chat template writes per image (`template_image`, expanded by `vision` into the processor's text);
* how its image processor's output becomes the generic layout of `mmrl.types.Rollout` (`vision`): `pixel_values`
  stacked along a first "unit" dimension (a Qwen or GLM patch row, a Gemma 3 or PaliGemma image, an Idefics3,
  InternVL or LLaVA-OneVision tile), the units of each image, the extra per-image and per-unit tensors its forward
  takes (`forward_inputs` where they are not stored as the forward takes them), and each image's placeholder text;
* the rest of its conventions: turn-boundary tokens, positions (M-RoPE or 1-D, from 0 or 1), what its token types
  mark (image tokens, or PaliGemma's bidirectional prefix), the grounding coordinate convention, and for a family
  without a chat template (PaliGemma) the prompt its processor writes.

Sources of each convention are cited beside its entry. The expansions follow the families' own transformers
processors (`Gemma3Processor.full_image_sequence`, `Idefics3Processor.replace_image_token`, InternVL's, LLaVA-
OneVision's, PaliGemma's and GLM-4V's); tests compare them with those processors' output token for token.
Families transformers has but no tiny model here covers are named in `UNAVAILABLE` with the reason.
"""

from __future__ import annotations

import math
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
    engine_config: tuple[tuple[str, Any], ...] = ()


# vLLM's CPU attention (`CPUAttentionBackend`) has no `supports_mm_prefix`: image tokens attend causally there.
_CPU_CAUSAL = (
    "vLLM's CPU attention attends every token causally (it has no bidirectional `mm_prefix` attention), where {what}: "
    "its samples' log-probs would not be the training forward's (about 1e-2 apart on the tiny model; on a GPU vLLM's "
    "FlashAttention has it)"
)


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


# ---------------------------------------------------------------------------------------------- Qwen-VL


def _grid_vision(token: str) -> Callable[[Any, list[Image.Image], dict, list[int] | None], Vision]:
    """Qwen2-VL / 2.5-VL / 3-VL (and GLM-4.xV, which shares their vision layout): `pixel_values`
    `[patches, C*T*p*p]`, `image_grid_thw` `[I, 3]`; an image is `t*h*w / merge**2` `token`s (Qwen's template writes
    one `<|image_pad|>` between `<|vision_start|>`/`<|vision_end|>`, GLM's one `<|image|>` between
    `<|begin_of_image|>`/`<|end_of_image|>`)."""

    def vision(image_processor, images: list[Image.Image], settings: dict, per_row=None) -> Vision:
        out = image_processor(images=images, return_tensors="pt")
        grid = out["image_grid_thw"]  # [I, 3]
        merge = int(getattr(image_processor, "merge_size", 2))
        tokens = grid.prod(-1) // merge**2
        return Vision(
            pixel_values=out["pixel_values"],
            units=grid.prod(-1),
            per_image={"image_grid_thw": grid},
            per_unit={},
            tokens=tokens,
            texts=[token * int(n) for n in tokens],
        )

    return vision


_qwen_vision = _grid_vision("<|image_pad|>")


def _qwen_features(units: torch.Tensor, per_image: dict, settings: dict, image_processor=None) -> torch.Tensor:
    return per_image["image_grid_thw"].prod(-1) // int(settings.get("merge_size", 2)) ** 2


def _qwen(name: str, coordinates: str, vllm: VLLMFacts | None = None) -> Family:
    return Family(
        name=name,
        image_token="<|image_pad|>",
        template_image="<|image_pad|>",
        vision=_qwen_vision,
        features=_qwen_features,
        turn_start="<|im_start|>",
        turn_end="<|im_end|>",
        coordinates=coordinates,
        mrope=True,
        patch_rows=True,
        pixel_bounds=True,
        vllm=vllm or VLLMFacts(),
    )


# ---------------------------------------------------------------------------------------------- GLM-4.xV


GLM4V = Family(
    name="glm4v",
    image_token="<|image|>",
    template_image="<|image|>",
    vision=_grid_vision("<|image|>"),
    features=_qwen_features,
    turn_start="<|user|>",
    turn_end="<|user|>",  # no closing token: an answer ends where the model opens the next turn (an EOS of its)
    coordinates="0-1000",
    mrope=True,
    patch_rows=True,
    pixel_bounds=True,
    suppress=("<|begin_of_image|>", "<|end_of_image|>"),
    # vLLM builds the text attention's q/k/v biases only where `text_config.attention_bias` says so (zai-org's
    # config.json does); transformers' Glm4vTextConfig has no such field (its attention always has them).
    vllm=VLLMFacts(engine_config=(("text_config.attention_bias", True),)),
)


# ---------------------------------------------------------------------------------------------- Gemma 3


def _gemma3_vision(image_processor, images: list[Image.Image], settings: dict, per_row=None) -> Vision:
    """Gemma 3: `pixel_values` `[I, 3, H, W]` (one unit an image, no pan-and-scan), each image a fixed
    `image_seq_length` soft tokens (`mm_tokens_per_image` of the config; 256 in the released checkpoints), written
    `\\n\\n<start_of_image>` + soft tokens + `<end_of_image>\\n\\n` in place of the template's `<start_of_image>`."""
    out = image_processor(images=images, return_tensors="pt", do_pan_and_scan=False)
    n = int(settings["image_seq_length"])
    count = len(images)
    text = "\n\n<start_of_image>" + "<image_soft_token>" * n + "<end_of_image>\n\n"
    return Vision(
        pixel_values=out["pixel_values"],
        units=torch.ones(count, dtype=torch.long),
        per_image={},
        per_unit={},
        tokens=torch.full((count,), n, dtype=torch.long),
        texts=[text] * count,
    )


# ---------------------------------------------------------------------------------------------- Idefics3 / SmolVLM


def _idefics3_vision(image_processor, images: list[Image.Image], settings: dict, per_row=None) -> Vision:
    """Idefics3 (SmolVLM v1): each image is split into rows x cols tiles plus a global view (one tile when not
    split); `pixel_values` `[tiles, 3, H, W]` with `pixel_attention_mask` `[tiles, H, W]`; each tile is
    `image_seq_len` `<image>` tokens, framed by `<fake_token_around_image>` and `<row_r_col_c>`/`<global-img>` tags
    as `Idefics3Processor.replace_image_token` writes them."""
    if not images:
        raise ValueError("no images")
    out = image_processor(images=[[image] for image in images], return_tensors="pt", return_row_col_info=True)
    seq = int(settings["image_seq_len"])
    rows = [r[0] for r in out["rows"]]
    cols = [c[0] for c in out["cols"]]
    units = torch.tensor([r * c + 1 if r or c else 1 for r, c in zip(rows, cols)], dtype=torch.long)
    keep = torch.arange(out["pixel_values"].shape[1]).unsqueeze(0) < units.unsqueeze(1)  # [I, Nmax] real tiles
    texts = []
    for r, c in zip(rows, cols):
        glob = "<fake_token_around_image><global-img>" + "<image>" * seq + "<fake_token_around_image>"
        if not (r or c):
            texts.append(glob)
            continue
        text = ""
        for i in range(r):
            text += "".join(f"<fake_token_around_image><row_{i + 1}_col_{j + 1}>" + "<image>" * seq for j in range(c))
            text += "\n"
        texts.append(text + "\n" + glob)
    return Vision(
        pixel_values=out["pixel_values"][keep],
        units=units,
        per_image={},
        per_unit={"pixel_attention_mask": out["pixel_attention_mask"][keep]},
        tokens=units * seq,
        texts=texts,
    )


def _gemma3_features(units: torch.Tensor, per_image: dict, settings: dict, image_processor=None) -> torch.Tensor:
    return units * int(settings["image_seq_length"])


def _idefics3_features(units: torch.Tensor, per_image: dict, settings: dict, image_processor=None) -> torch.Tensor:
    return units * int(settings["image_seq_len"])


def _idefics3_like(name: str, vllm: VLLMFacts | None = None) -> Family:
    return Family(
        name=name,
        image_token="<image>",
        template_image="<image>",
        vision=_idefics3_vision,
        features=_idefics3_features,
        turn_start="<|im_start|>",
        turn_end="<end_of_utterance>",
        coordinates="0-1",
        batched_pixels=True,
        suppress=("<fake_token_around_image>", "<global-img>"),
        vllm=vllm or VLLMFacts(),
    )


# ---------------------------------------------------------------------------------------------- PaliGemma


def _paligemma_prompt(tokenizer, content: list[dict]) -> str:
    """What `PaliGemmaProcessor` writes for a prefix with images: every image's `<image>` first, then `<bos>`, the
    prefix's text and a newline (`prepare_inputs_layout`); the model continues with the suffix."""
    images = sum(1 for item in content if item["type"] == "image")
    text = "".join(item["text"] for item in content if item["type"] == "text")
    return "<image>" * images + tokenizer.bos_token + text + "\n"


def _paligemma_vision(image_processor, images: list[Image.Image], settings: dict, per_row=None) -> Vision:
    """PaliGemma: `pixel_values` `[I, 3, H, W]`, each image `image_seq_length` `<image>` tokens (the image
    processor's attribute, as `PaliGemmaProcessor` reads it; 256 at 224 px)."""
    out = image_processor(images=images, return_tensors="pt")
    n = int(image_processor.image_seq_length)
    count = len(images)
    return Vision(
        pixel_values=out["pixel_values"],
        units=torch.ones(count, dtype=torch.long),
        per_image={},
        per_unit={},
        tokens=torch.full((count,), n, dtype=torch.long),
        texts=["<image>" * n] * count,
    )


def _paligemma_features(units: torch.Tensor, per_image: dict, settings: dict, image_processor=None) -> torch.Tensor:
    return units * int(image_processor.image_seq_length)


# ---------------------------------------------------------------------------------------------- InternVL


def _internvl_vision(image_processor, images: list[Image.Image], settings: dict, per_row=None) -> Vision:
    """InternVL: each image cropped to tiles plus a thumbnail (`crop_to_patches`, which `InternVLProcessor` turns
    on), `pixel_values` `[tiles, 3, H, W]`; an image is `<img>` + `<IMG_CONTEXT>` x (image_seq_length x tiles) +
    `</img>` in place of the template's `<IMG_CONTEXT>` (`InternVLProcessor.replace_image_token`)."""
    out = image_processor(images=images, crop_to_patches=True, return_tensors="pt")
    units = torch.as_tensor(out["num_patches"], dtype=torch.long).reshape(-1)
    seq = int(settings["image_seq_length"])
    return Vision(
        pixel_values=out["pixel_values"],
        units=units,
        per_image={},
        per_unit={},
        tokens=units * seq,
        texts=["<img>" + "<IMG_CONTEXT>" * (seq * int(n)) + "</img>" for n in units],
    )


def _internvl_features(units: torch.Tensor, per_image: dict, settings: dict, image_processor=None) -> torch.Tensor:
    return units * int(settings["image_seq_length"])


# ---------------------------------------------------------------------------------------------- LLaVA-OneVision


def _onevision_tiles(size: tuple[int, int], image_processor) -> int:
    """Tiles of a lone image: its anyres grid (the best of the grid pinpoints for its size) plus the base view."""
    from transformers.image_processing_utils import select_best_resolution

    tile = int(image_processor.size["height"])
    height, width = select_best_resolution(list(size), image_processor.image_grid_pinpoints)
    return (height // tile) * (width // tile) + 1


def _onevision_tokens(size: tuple[int, int], multi: bool, settings: dict, image_processor) -> int:
    """`LlavaOnevisionProcessor.replace_image_token`'s count: base features, then (a lone image) the unpadded grid
    features with one newline per row, pooled down past `anyres_max_N` tiles; (several images) base + 1 newline."""
    from transformers.image_processing_utils import select_best_resolution

    base = int(settings["num_image_tokens"])
    drop = 1 if settings.get("vision_feature_select_strategy") == "default" else 0
    if multi:
        return base + 1 - drop
    height, width = (int(v) for v in size)
    tile = int(image_processor.size["height"])
    best_height, best_width = select_best_resolution([height, width], image_processor.image_grid_pinpoints)
    side = int(math.sqrt(base))
    current_height, current_width = side * (best_height // tile), side * (best_width // tile)
    if width / height > current_width / current_height:
        new_height = int(round(height * (current_width / width), 7))
        current_height -= (current_height - new_height) // 2 * 2
    else:
        new_width = int(round(width * (current_height / height), 7))
        current_width -= (current_width - new_width) // 2 * 2
    unpadded, newlines = current_height * current_width, current_height
    most = int(settings.get("vision_aspect_ratio", "anyres_max_9").removeprefix("anyres_max_"))
    ratio = math.sqrt(current_height * current_width / (most * side**2))
    if ratio > 1.1:
        unpadded = int(current_height // ratio) * int(current_width // ratio)
        newlines = int(current_height // ratio)
    return unpadded + newlines + base - drop


def _onevision_vision(image_processor, images: list[Image.Image], settings: dict, per_row=None) -> Vision:
    """LLaVA-OneVision: a prompt's lone image is tiled "anyres" (its grid's tiles after a base view), each image of
    a prompt with several is one padded-square tile; `pixel_values` `[tiles, 3, H, W]` (the real tiles, padding
    dropped), `image_sizes` `[I, 2]` (original sizes) and `prompt_images` `[I]` (the images of its prompt)."""
    per_row = list(per_row) if per_row is not None else [len(images)]
    groups, start = [], 0
    for n in per_row:
        groups.append(images[start : start + n])
        start += n
    out = image_processor(images=[g for g in groups if g], return_tensors="pt")
    prompt_images = torch.tensor([n for n in per_row for _ in range(n)], dtype=torch.long)
    multi = prompt_images != 1
    sizes = out["image_sizes"].long()
    units = torch.tensor(
        [1 if m else _onevision_tiles(tuple(s.tolist()), image_processor) for s, m in zip(sizes, multi)],
        dtype=torch.long,
    )
    keep = torch.arange(out["pixel_values"].shape[1]).unsqueeze(0) < units.unsqueeze(1)  # [I, Pmax] real tiles
    tokens = torch.tensor(
        [_onevision_tokens(tuple(s.tolist()), bool(m), settings, image_processor) for s, m in zip(sizes, multi)],
        dtype=torch.long,
    )
    return Vision(
        pixel_values=out["pixel_values"][keep],
        units=units,
        per_image={"image_sizes": sizes, "prompt_images": prompt_images},
        per_unit={},
        tokens=tokens,
        texts=["<image>" * int(n) for n in tokens],
    )


def _onevision_features(units: torch.Tensor, per_image: dict, settings: dict, image_processor=None) -> torch.Tensor:
    sizes, counts = per_image["image_sizes"].tolist(), per_image["prompt_images"].tolist()
    return torch.tensor(
        [_onevision_tokens(tuple(s), n != 1, settings, image_processor) for s, n in zip(sizes, counts)],
        dtype=torch.long,
    )


def _onevision_forward_inputs(per_image: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`image_sizes` as stored, and `batch_num_images` (the images of each prompt, which the forward reads to tell a
    lone, tiled image from one of several) from each image's `prompt_images`."""
    counts, images = [], per_image["prompt_images"].tolist()
    first = 0
    while first < len(images):
        counts.append(images[first])
        first += max(images[first], 1)
    sizes = per_image["image_sizes"]
    return {"image_sizes": sizes, "batch_num_images": torch.tensor(counts, dtype=torch.long, device=sizes.device)}


FAMILIES: dict[str, Family] = {
    # Qwen2-VL answers boxes in 0-1000 relative coordinates; Qwen2.5-VL in absolute pixels of the resized image
    # (Qwen2.5-VL technical report, sec. 2.2.1 "native resolution ... actual dimensions"); Qwen3-VL back to 0-1000
    # (Qwen3-VL model card, "Grounding: relative coordinates 0-1000").
    "qwen2_vl": _qwen("qwen2_vl", "0-1000"),
    "qwen2_5_vl": _qwen("qwen2_5_vl", "pixels"),
    "qwen3_vl": _qwen("qwen3_vl", "0-1000"),
    # Qwen3.5: Qwen3-VL's vision stack and tokens in a hybrid (Gated DeltaNet + attention) language model; its
    # coordinates are taken as Qwen3-VL's 0-1000 (not confirmed from a Qwen3.5 model card on this machine).
    # vLLM's CPU build runs its Gated DeltaNet layers in bfloat16 only ("CPU GDN attention requires BF16"), and its
    # kernel refuses head sizes 16 ("multiples of 32") and 32 ("Unexpected head dim size"); 64 and 128 ran.
    "qwen3_5": _qwen(
        "qwen3_5",
        "0-1000",
        VLLMFacts(
            cpu_dtypes=("bfloat16",),
            cpu_config=(("linear_key_head_dim", (64, 128)), ("linear_value_head_dim", (64, 128))),
        ),
    ),
    # Gemma 3 (google/gemma-3-4b-it model card; the chat template's <start_of_turn>user / model turns). It has no
    # documented box format; PaliGemma's <locYYYY> tokens are 0-1023 bins, and Gemma 3 prompts in the wild ask for
    # 0-1000 boxes, which is what we use.
    "gemma3": Family(
        name="gemma3",
        image_token="<image_soft_token>",
        template_image="<start_of_image>",
        vision=_gemma3_vision,
        features=_gemma3_features,
        turn_start="<start_of_turn>",
        turn_end="<end_of_turn>",
        coordinates="0-1000",
        suppress=("<start_of_image>", "<end_of_image>"),
        # vLLM re-merges the "\n\n" around each image with the newlines next to it by looking them up (gemma3_mm.py).
        vllm=VLLMFacts(
            vocab=("\n", "\n\n", "\n\n\n", "\n\n\n\n"),
            cpu=_CPU_CAUSAL.format(what="Gemma 3 attends each image's tokens bidirectionally"),
        ),
    ),
    # Idefics3 / SmolVLM (HuggingFaceTB/SmolVLM-Instruct chat template: "User:"/"Assistant:" turns closed by
    # <end_of_utterance>). SmolVLM's grounding data (and Idefics3's) writes boxes relative, 0-1.
    "idefics3": _idefics3_like("idefics3"),
    # SmolVLM2 (SmolVLMForConditionalGeneration): Idefics3's image layout and prompt strings
    # (`SmolVLMProcessor.replace_image_token` writes the same tiles and tags), its own model classes.
    # vLLM builds transformers' SmolVLMProcessor, which imports num2words (for video frame timestamps).
    "smolvlm": _idefics3_like("smolvlm", VLLMFacts(modules=("num2words",))),
    # PaliGemma (google/paligemma-3b-pt-224; transformers' PaliGemmaProcessor): no chat template; the processor
    # writes `<image>` x N + <bos> + prefix + "\n" and the model answers with the suffix, the prefix (images and
    # text) attended bidirectionally, positions from 1. A single-turn model: a conversation is refused. Its boxes
    # are <locYYYY> tokens (1024 bins of y0 x0 y1 x1, big_vision's README), a format our grounding parsers do not
    # read; "0-1000" is the nearest relative convention and is what the demo's prompts ask for.
    "paligemma": Family(
        name="paligemma",
        image_token="<image>",
        template_image="<image>",
        vision=_paligemma_vision,
        features=_paligemma_features,
        turn_start="<bos>",
        turn_end="<eos>",
        coordinates="0-1000",
        prompt=_paligemma_prompt,
        prefix_lm=True,
        first_position=1,
        # vLLM inserts `<image>` x N + `<bos>` at the prompt's start itself and appends a "\n" (paligemma.py), one image
        # a prompt.
        vllm=VLLMFacts(
            image="",
            after_images="<bos>",
            vocab=("\n",),
            max_images=1,
            cpu=_CPU_CAUSAL.format(what="PaliGemma attends its whole prefix (images and text) bidirectionally"),
        ),
    ),
    # InternVL 3 (OpenGVLab/InternVL3-1B-hf: Qwen2.5's <|im_start|> / <|im_end|> turns). InternVL writes boxes as
    # <box>[[x1, y1, x2, y2]]</box> normalised to 0-1000 (InternVL2 / 3 model cards, "grounding").
    "internvl": Family(
        name="internvl",
        image_token="<IMG_CONTEXT>",
        template_image="<IMG_CONTEXT>",
        vision=_internvl_vision,
        features=_internvl_features,
        turn_start="<|im_start|>",
        turn_end="<|im_end|>",
        coordinates="0-1000",
        suppress=("<img>", "</img>"),
    ),
    # LLaVA-OneVision (llava-hf/llava-onevision-qwen2-0.5b-ov-hf: Qwen2's <|im_start|> / <|im_end|> turns, images
    # before a message's text). Its grounding data (LLaVA-OneVision's, from LLaVA-1.5) writes boxes relative, 0-1.
    "llava_onevision": Family(
        name="llava_onevision",
        image_token="<image>",
        template_image="<image>",
        vision=_onevision_vision,
        features=_onevision_features,
        turn_start="<|im_start|>",
        turn_end="<|im_end|>",
        coordinates="0-1",
        forward_inputs=_onevision_forward_inputs,
        # vLLM's LLaVA-OneVision tiles every image "anyres" as a lone one; transformers' (and the training forward)
        # shows each image of a prompt with several as one base view: two-image prompts would differ.
        vllm=VLLMFacts(max_images=1),
    ),
    # GLM-4.1V (zai-org/GLM-4.1V-9B-Thinking: `[gMASK]<sop>`, then `<|user|>` / `<|assistant|>` turns with no closing
    # token: the model ends its answer with `<|user|>`, `<|observation|>` or `<|endoftext|>`, its EOS tokens), Qwen2-VL's
    # vision layout and M-RoPE. Boxes `<|begin_of_box|>[x1, y1, x2, y2]<|end_of_box|>` relative, taken as 0-1000 (the
    # GLM-V README's grounding examples; not confirmed from a model card on this machine).
    "glm4v": GLM4V,
}

# Families transformers has that no tiny model here covers yet, and why (named by `family_for`).
UNAVAILABLE: dict[str, str] = {
    "lfm2_vl": (
        "LFM2-VL is not supported yet: its only image processor in transformers (Lfm2VlImageProcessorFast) needs "
        "torchvision, which the project's CPU install lacks (the registry has no CPU torchvision build for torch "
        "2.13), so its image layout could not be built and tested against its processor"
    ),
}


def family_for(model_type: str) -> Family:
    """The `Family` of a checkpoint whose config says `model_type`.

    Raises:
        ValueError: naming the model type and the supported ones, or the installed transformers when it lacks the
            family's classes (Qwen3.5 came in transformers 5.2x; the project's floor is older).
    """
    if model_type in UNAVAILABLE:
        raise ValueError(
            f"model family {model_type!r} (config.json's model_type) cannot be used here: {UNAVAILABLE[model_type]}"
        )
    if model_type not in FAMILIES:
        raise ValueError(
            f"model family {model_type!r} (config.json's model_type) is not supported yet; supported: "
            f"{', '.join(FAMILIES)}"
        )
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if model_type not in CONFIG_MAPPING_NAMES:
        import transformers

        raise ValueError(
            f"model family {model_type!r} needs a transformers that has its classes; transformers "
            f"{transformers.__version__} here has none (upgrade transformers)"
        )
    return FAMILIES[model_type]
