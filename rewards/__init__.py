"""Reward functions that score model outputs, text and images, for RL on vision-language models.

Parsers read answers out of untrusted completions (malformed text scores zero with a reason, never raises), and
pure tensor rewards are registered in `REWARDS`. The package needs only torch and imports nothing from `sim` or
`mmrl`, so it is usable alone: `from rewards import box_iou`.
"""

from rewards.box import box_iou
from rewards.catalog import REWARDS
from rewards.parse import BoxParse, extract_answer, parse_box, parse_boxes, strip_think
from rewards.registry import Registry
from rewards.text import format_reward

__all__ = [
    "REWARDS",
    "BoxParse",
    "Registry",
    "box_iou",
    "extract_answer",
    "format_reward",
    "parse_box",
    "parse_boxes",
    "strip_think",
]

# --- text, geometry, actions ----------------------------------------------------------------------------------------
# The calling convention of every reward registered by parse/box/text/actions (`REWARDS.get(name)`):
#
#     fn(completions: list[str], <targets by name>, *, <options>) -> torch.Tensor  # [R]
#
# * completions come first, positionally; the function parses them itself (like TRL's reward functions, but typed).
# * targets are named per-row arguments, one spelling per concept: `target_box` [R, 4], `target_boxes` (R tensors
#   [T_i, 4]), `answer` (R strings), `target_action` (R strings), `image_size` / `input_size` [R, 2] (W, H),
#   `completion_lengths` [R].
# * options are keyword arguments with defaults (`iou_threshold`, `normalized_1000`, ...), bound from a config by
#   `RewardSpec.kwargs` / `build_reward_fns`, which also hands each function only the targets it names.
# * scores: NaN where the row's target is missing (None, or a NaN box row): the reward does not apply there and
#   `combine` skips it; an answer that does not parse scores the reward's minimum (0.0; -1.0 for GIoU), never NaN.
# Tensor kernels (`box_iou`, `box_giou`, `matched_iou`, `detection_f1`, `point_in_box`, `box_size_similarity`,
# `box_size_factor`, `length_penalty`) are plain functions, not registered; where a registered name equals a kernel's
# (box_iou, length_penalty), the name points at the text-level `<kernel>_reward` wrapper. Text rewards that only
# compare strings (exact_match, multiple_choice, numeric_match, format) are registered as they are.
# `build_reward_fns` also binds registered functions whose first parameter is not `completions`/`texts` (tensor
# kernels such as image similarities): those get every argument by name from the targets.
from rewards.actions import (  # noqa: E402
    ACTION_KINDS,
    Action,
    action_match_reward,
    action_type_reward,
    parse_action,
    parse_actions,
)
from rewards.box import (  # noqa: E402
    box_giou,
    box_giou_reward,
    box_iou_reward,
    box_size_factor,
    box_size_reward,
    box_size_similarity,
    detection_f1,
    detection_f1_reward,
    matched_iou,
    matched_iou_reward,
    pairwise_box_iou,
    point_in_box,
    point_in_box_reward,
)
from rewards.combine import BoundReward, RewardFn, RewardSpec, build_reward_fns, combine  # noqa: E402
from rewards.parse import (  # noqa: E402
    BoxListParse,
    ChoiceParse,
    NumberParse,
    PointParse,
    answer_code,
    answer_region,
    extract_code,
    parse_box_list,
    parse_box_lists,
    parse_choice,
    parse_number,
    parse_point,
    parse_points,
    rescale_boxes,
    rescale_points,
)
from rewards.text import (  # noqa: E402
    exact_match,
    length_penalty,
    length_penalty_reward,
    multiple_choice,
    normalize_answer,
    numeric_match,
)

__all__ += [
    "ACTION_KINDS",
    "Action",
    "BoundReward",
    "BoxListParse",
    "ChoiceParse",
    "NumberParse",
    "PointParse",
    "RewardFn",
    "RewardSpec",
    "action_match_reward",
    "action_type_reward",
    "answer_code",
    "answer_region",
    "box_giou",
    "box_giou_reward",
    "box_iou_reward",
    "box_size_factor",
    "box_size_reward",
    "box_size_similarity",
    "build_reward_fns",
    "combine",
    "detection_f1",
    "detection_f1_reward",
    "exact_match",
    "extract_code",
    "length_penalty",
    "length_penalty_reward",
    "matched_iou",
    "matched_iou_reward",
    "multiple_choice",
    "normalize_answer",
    "numeric_match",
    "pairwise_box_iou",
    "parse_action",
    "parse_actions",
    "parse_box_list",
    "parse_box_lists",
    "parse_choice",
    "parse_number",
    "parse_point",
    "parse_points",
    "point_in_box",
    "point_in_box_reward",
    "rescale_boxes",
    "rescale_points",
]
# --- end text, geometry, actions ------------------------------------------------------------------------------------

# --- images and renders ---------------------------------------------------------------------------------------------
# Image similarities are tensor kernels over image pairs, `fn(images_a, images_b, *, <options>) -> [R]` ([R, H, W, 3]
# uint8 or float in [0, 1]), registered as pixel, ssim, edge, color_histogram, embedding (+ `encoder`); also
# code_length (`sources`, `reference_lengths`) and ocr (`images`, `target_texts`). Rendering (`render`,
# `render_batch`, `render_similarity`) runs model-written SVG / chart code in the sandbox of `rewards.render`;
# cairosvg, matplotlib, OpenCV and RapidOCR are imported only where they are used (in the sandbox worker, or inside
# the function), so `import rewards` still needs torch alone.
from rewards.image import (  # noqa: E402
    HFImageEncoder,
    ImageEncoder,
    code_length_reward,
    color_histogram_similarity,
    edge_similarity,
    embedding_similarity,
    grayscale,
    pixel_mse,
    pixel_similarity,
    ssim,
)
from rewards.ocr import ocr_similarity, ocr_text, text_f1  # noqa: E402
from rewards.render import RenderPool, RenderResult, render, render_batch, render_similarity  # noqa: E402

__all__ += [
    "HFImageEncoder",
    "ImageEncoder",
    "RenderPool",
    "RenderResult",
    "code_length_reward",
    "color_histogram_similarity",
    "edge_similarity",
    "embedding_similarity",
    "grayscale",
    "ocr_similarity",
    "ocr_text",
    "pixel_mse",
    "pixel_similarity",
    "render",
    "render_batch",
    "render_similarity",
    "ssim",
    "text_f1",
]
# --- end images and renders -----------------------------------------------------------------------------------------

# --- CLIP rewards ---------------------------------------------------------------------------------------------------
# Kernels over embeddings (`clip_similarity`, `goal_baseline_reward`, `contrastive_goal_reward`) and registered
# rewards clip_text (`images`, `texts`), clip_goal_baseline (`images`, `goal`, `baseline`, + `alpha`) and clip_contrast
# (`images`, `positive`, `negative`), each with a `model` option: a checkpoint path loaded once per process by
# `load_clip`, or a `CLIPScorer`. transformers is imported only when a model is loaded.
from rewards.clip import (  # noqa: E402
    CLIPScorer,
    clip_contrast_reward,
    clip_goal_baseline_reward,
    clip_similarity,
    clip_text_reward,
    contrastive_goal_reward,
    goal_baseline_reward,
    load_clip,
)

__all__ += [
    "CLIPScorer",
    "clip_contrast_reward",
    "clip_goal_baseline_reward",
    "clip_similarity",
    "clip_text_reward",
    "contrastive_goal_reward",
    "goal_baseline_reward",
    "load_clip",
]
# --- end CLIP rewards -----------------------------------------------------------------------------------------------
