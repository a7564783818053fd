"""One table of per-family facts: what differs between vision-language model families, and nothing else.

Every place that would otherwise ask "which model is this?" reads a `Family` from `FAMILIES` instead, keyed by
`model.config.model_type`. A family says:

* which token the model's image features replace (`image_token`, counted against the features before any forward)
  and what its chat template writes per image (`template_image`, expanded by `vision` into the processor's text);
* how its image processor's output becomes the generic layout of `mmrl.types.Rollout` (`vision`): `pixel_values`
  stacked along a first "unit" dimension (a Qwen or GLM patch row, a Gemma 3, PaliGemma or Gemma 4 image, an Idefics3,
  InternVL or LLaVA-OneVision tile), the units of each image, the extra per-image and per-unit tensors its forward
  takes (`forward_inputs` where they are not stored as the forward takes them), and each image's placeholder text;
* the rest of its conventions: turn-boundary tokens, positions (M-RoPE or 1-D, from 0 or 1), what its token types
  mark (image tokens, or PaliGemma's bidirectional prefix), the grounding coordinate convention, and for a family
  without a chat template (PaliGemma) the prompt its processor writes.

The facts' dataclasses are in `core`; the entries, with the source of each convention cited beside them, in a module
per layout kind: `grid` (Qwen-VL, Qwen3.5, GLM-4.xV: patch rows on a dynamic-resolution grid), `tiles` (Idefics3,
SmolVLM2, InternVL, LLaVA-OneVision: crops of a fixed size), `whole_image` (Gemma 3, PaliGemma, Gemma 4: one view an
image). The expansions follow the families' own transformers processors (`Gemma3Processor.full_image_sequence`,
`Idefics3Processor.replace_image_token`, InternVL's, LLaVA-OneVision's, PaliGemma's, GLM-4V's and Gemma 4's); tests
compare them with those processors' output token for token.
Families transformers has but no tiny model here covers are named in `UNAVAILABLE` with the reason.
"""

from __future__ import annotations

from .core import COORDINATES, Family, Vision, VLLMFacts
from .grid import GLM4V, QWEN2_5_VL, QWEN2_VL, QWEN3_5, QWEN3_VL
from .tiles import IDEFICS3, INTERNVL, LLAVA_ONEVISION, SMOLVLM
from .whole_image import GEMMA3, GEMMA4, PALIGEMMA

__all__ = ["COORDINATES", "FAMILIES", "UNAVAILABLE", "Family", "VLLMFacts", "Vision", "family_for", "missing_classes"]

FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        QWEN2_VL, QWEN2_5_VL, QWEN3_VL, QWEN3_5, GEMMA3, IDEFICS3, SMOLVLM, PALIGEMMA, INTERNVL, LLAVA_ONEVISION,
        GLM4V, GEMMA4,
    )
}  # fmt: skip

# Families transformers has that no tiny model here covers yet, and why (named by `family_for`).
UNAVAILABLE: dict[str, str] = {
    "lfm2_vl": (
        "LFM2-VL is not supported yet: its only image processor in transformers (Lfm2VlImageProcessorFast) needs "
        "torchvision, which the project's CPU install lacks (the registry has no CPU torchvision build for torch "
        "2.13), so its image layout could not be built and tested against its processor"
    ),
}


def missing_classes(model_type: str) -> str:
    """Why the installed transformers cannot build a model of `model_type` (it has none of the family's classes:
    Qwen3.5 came in transformers 5.2x; Gemma 4 is in 5.19 and 5.24), or "" where it can."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if model_type in CONFIG_MAPPING_NAMES:
        return ""
    import transformers

    return (
        f"model family {model_type!r} needs a transformers that has its classes; transformers "
        f"{transformers.__version__} here has none (upgrade transformers)"
    )


def family_for(model_type: str) -> Family:
    """The `Family` of a checkpoint whose config says `model_type`.

    Raises:
        ValueError: naming the model type and the supported ones, or the installed transformers when it lacks the
            family's classes (`missing_classes`).
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
    if missing := missing_classes(model_type):
        raise ValueError(missing)
    return FAMILIES[model_type]
