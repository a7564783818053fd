"""CLIP rewards: text-image similarity, VLM-RM's goal-baseline projection, VLM-RL's contrasting language goals.

Three pure kernels over embeddings (`clip_similarity`, `goal_baseline_reward`, `contrastive_goal_reward`) and three
registered rewards that embed images and texts with a `CLIPScorer` and call them:

* `clip_text(images, texts, *, model)`: cosine of each image with its text (Radford et al. 2021).
* `clip_goal_baseline(images, goal, baseline, *, model, alpha)`: VLM-RM's goal-baseline regularisation,
  `1 - 1/2 ||(x - g) P||^2` (Rocamonde et al. 2023, https://arxiv.org/abs/2310.12921).
* `clip_contrast(images, positive, negative, *, model)`: VLM-RL's contrasting language goals, mean similarity to the
  positive goals minus mean similarity to the negative ones (Huang et al. 2024, https://arxiv.org/abs/2412.15544).

`model` is a checkpoint path (or hub name) loaded once per process through `load_clip`, or a `CLIPScorer`.
transformers is imported inside `CLIPScorer.from_pretrained`, so `import rewards` still needs torch alone.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from rewards.catalog import REWARDS
from rewards.image import HFImageEncoder

# ---------------------------------------------------------------------------------------------------------------------
# Kernels: embeddings in, [R] scores out
# ---------------------------------------------------------------------------------------------------------------------


def clip_similarity(image_emb: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of each image with its text, CLIP's zero-shot score.

    Args:
        image_emb: `[R, D]` image embeddings (any norm).
        text_emb: `[R, D]` one text per row, or `[1, D]` / `[D]` one text for every row.

    Returns:
        `[R]` in [-1, 1].
    """
    return (F.normalize(image_emb.float(), dim=-1) * F.normalize(text_emb.float(), dim=-1)).sum(-1)  # [R]


def goal_baseline_reward(
    image_emb: torch.Tensor, goal_emb: torch.Tensor, baseline_emb: torch.Tensor, *, alpha: float
) -> torch.Tensor:
    """VLM-RM's goal-baseline regularised CLIP reward, `1 - 1/2 ||(x - g) P||^2`.

    With `x`, `g`, `b` the normalised image, goal and baseline embeddings and `d = (g - b) / ||g - b||`,
    `P = alpha d d^T + (1 - alpha) I` (Rocamonde et al. 2023, Eq. 3, https://arxiv.org/abs/2310.12921; their code
    builds the same P from `direction = target - baseline`). `alpha = 0` is `1 - 1/2 ||x - g||^2 = x . g`, the plain
    cosine; `alpha = 1` keeps only the component of `x - g` along the goal-minus-baseline direction, so changes of the
    image that the baseline prompt says are irrelevant do not move the reward.

    P is never formed: with `v = x - g` and `s = v . d`, `||v P||^2 = (1 - (1 - alpha)^2) s^2 + (1 - alpha)^2 ||v||^2`
    (P is symmetric and `d` a unit vector), which is `O(R D)` instead of `O(D^2)` and lets goal and baseline differ
    per row. If goal equals baseline, `d` is 0 and only the `(1 - alpha)^2 ||v||^2` part remains.

    Args:
        image_emb: `[R, D]` image embeddings (any norm).
        goal_emb: `[D]` one goal for every row, or `[R, D]` one per row.
        baseline_emb: `[D]` or `[R, D]`, as `goal_emb`.
        alpha: how much of the projection onto the goal-baseline direction to use, in [0, 1].

    Returns:
        `[R]`; at most 1 (x = g), and in [-1, 1] for alpha = 0.
    """
    x = F.normalize(image_emb.float(), dim=-1)  # [R, D]
    g = F.normalize(goal_emb.float(), dim=-1)  # [D] or [R, D]
    b = F.normalize(baseline_emb.float(), dim=-1)
    d = F.normalize(g - b, dim=-1)  # unit goal-minus-baseline direction; 0 if g == b
    v = x - g  # [R, D]
    along = (v * d).sum(-1)  # [R]
    keep = (1.0 - alpha) ** 2
    return 1.0 - 0.5 * ((1.0 - keep) * along.square() + keep * v.square().sum(-1))  # [R]


def contrastive_goal_reward(
    image_emb: torch.Tensor,
    positive_emb: torch.Tensor,
    negative_emb: torch.Tensor,
    *,
    positive_weight: float = 1.0,
    negative_weight: float = 1.0,
) -> torch.Tensor:
    """VLM-RL's contrasting-language-goal reward: similarity to the positive goals minus similarity to the negatives.

    `positive_weight * mean_p cos(x, p) - negative_weight * mean_n cos(x, n)` (Huang et al. 2024,
    https://arxiv.org/abs/2412.15544). The released VLM-RL code (`clip/clip_reward_model.py`, `forward_vlm_rl`) takes
    the unweighted difference of one positive and one negative goal, which is the default here; the weights are
    options for scaling the two terms, and several goals of a kind are averaged.

    Args:
        image_emb: `[R, D]` image embeddings (any norm).
        positive_emb: `[P, D]` positive goals ("the road is clear with no car accidents").
        negative_emb: `[N, D]` negative goals ("two cars have collided with each other").
        positive_weight: scale of the positive term.
        negative_weight: scale of the negative term.

    Returns:
        `[R]` in [-(pw + nw), pw + nw].
    """
    x = F.normalize(image_emb.float(), dim=-1)  # [R, D]
    positive = (x @ F.normalize(positive_emb.float(), dim=-1).T).mean(-1)  # [R]
    negative = (x @ F.normalize(negative_emb.float(), dim=-1).T).mean(-1)  # [R]
    return positive_weight * positive - negative_weight * negative  # [R]


# ---------------------------------------------------------------------------------------------------------------------
# The model: CLIPScorer and the per-process cache
# ---------------------------------------------------------------------------------------------------------------------


class CLIPScorer:
    """A CLIP-style model that embeds images and texts, batched, without gradients, L2-normalised.

    Images go through `HFImageEncoder` (the whole image resized to the model's input, no crop, normalised with the
    processor's mean and std), the same preprocessing as the `embedding` image reward.

    CLIP pools a text at its end-of-text token. A tokenizer that does not add one itself (checked once, here) gets it
    appended after truncation, so the pooled position is the text's end whatever the padding of the batch.

    Args:
        model: a model with `get_image_features` and `get_text_features` (`CLIPModel`), in eval mode on its device.
        tokenizer: its tokenizer.
        image_processor: its image processor, read for `image_mean` / `image_std`; None uses CLIP's.
        batch_size: images or texts per forward pass.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any, image_processor: Any = None, *, batch_size: int = 64):
        self.model = model
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.batch_size = batch_size
        self.image_encoder = HFImageEncoder(
            model,
            mean=getattr(image_processor, "image_mean", None),
            std=getattr(image_processor, "image_std", None),
            batch_size=batch_size,
        )
        text_config = getattr(getattr(model, "config", None), "text_config", None)
        self.max_length = int(getattr(text_config, "max_position_embeddings", 77))
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        probe = tokenizer("a")["input_ids"]
        self.append_eos = self.eos_id is not None and (not probe or probe[-1] != self.eos_id)

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        batch_size: int = 64,
    ) -> CLIPScorer:
        """Loads `CLIPModel`, its tokenizer and (if the checkpoint has one) its image processor.

        Args:
            path: a local checkpoint folder or hub name.
            device: where to put the model; None: CUDA if available, else CPU.
            dtype: weights dtype (e.g. `torch.float16` on GPU); None keeps the checkpoint's.
            batch_size: images or texts per forward pass.
        """
        from transformers import AutoTokenizer, CLIPModel

        device = device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
        kwargs = {"dtype": dtype} if dtype is not None else {}
        model = CLIPModel.from_pretrained(path, **kwargs).to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(path)
        return cls(model, tokenizer, _load_image_processor(path), batch_size=batch_size)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def embed_images(self, images: torch.Tensor | Sequence[Any]) -> torch.Tensor:
        """`[R, H, W, 3]` uint8 (or float in [0, 1]) tensor, or R PIL images -> `[R, D]` float32, unit norm."""
        if isinstance(images, torch.Tensor):
            features = self.image_encoder(images)  # [R, D]
        else:
            import numpy as np

            arrays = [torch.from_numpy(np.array(image.convert("RGB"))) for image in images]  # each [H, W, 3]
            if not arrays:
                raise ValueError("embed_images got no images")
            if len({a.shape for a in arrays}) == 1:
                features = self.image_encoder(torch.stack(arrays))
            else:  # sizes differ: they cannot share a tensor before the resize, so one call each
                features = torch.cat([self.image_encoder(a.unsqueeze(0)) for a in arrays])
        return F.normalize(features.float(), dim=-1)  # [R, D]

    @torch.no_grad()
    def embed_texts(self, texts: Sequence[str]) -> torch.Tensor:
        """T strings -> `[T, D]` float32, unit norm."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts:
            raise ValueError("embed_texts got no texts")
        out = []
        for start in range(0, len(texts), self.batch_size):
            input_ids, attention_mask = self._tokenize(texts[start : start + self.batch_size])
            features = self.model.get_text_features(input_ids=input_ids, attention_mask=attention_mask)
            if not isinstance(features, torch.Tensor):  # some transformers versions return a model output
                embeds = getattr(features, "text_embeds", None)
                features = embeds if embeds is not None else features.pooler_output
            out.append(features)
        return F.normalize(torch.cat(out).float(), dim=-1)  # [T, D]

    def _tokenize(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded `[T, L]` input ids and attention mask, each text ending in end-of-text."""
        ids = self.tokenizer(texts, truncation=True, max_length=self.max_length)["input_ids"]
        if self.append_eos:
            ids = [row[: self.max_length - 1] + [self.eos_id] for row in ids]
        length = max(len(row) for row in ids)
        input_ids = torch.full((len(ids), length), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(ids), length), dtype=torch.long)
        for i, row in enumerate(ids):
            input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            attention_mask[i, : len(row)] = 1
        return input_ids.to(self.device), attention_mask.to(self.device)


def _load_image_processor(path: str | os.PathLike[str]) -> Any:
    """The checkpoint's image processor, or None if it has none.

    The default (fast) CLIP image processor needs torchvision; without it, the PIL backend is used, which has the same
    mean and std (all that `CLIPScorer` reads).
    """
    from transformers import AutoImageProcessor

    if os.path.isdir(os.fspath(path)) and not os.path.isfile(
        os.path.join(os.fspath(path), "preprocessor_config.json")
    ):
        return None
    try:
        return AutoImageProcessor.from_pretrained(path)
    except (ImportError, ValueError):
        import transformers

        pil_class = getattr(transformers, "CLIPImageProcessorPil", None) or transformers.CLIPImageProcessor
        return pil_class.from_pretrained(path)


def load_clip(
    path: str | os.PathLike[str], *, device: str | torch.device | None = None, dtype: torch.dtype | None = None
) -> CLIPScorer:
    """`CLIPScorer.from_pretrained`, once per process for each (path, device, dtype): a run loads the model once.

    The path is made absolute first, so `load_clip("ckpt")` and `load_clip(Path("ckpt").resolve())` share the model.
    """
    path = os.fspath(path)
    if os.path.exists(path):
        path = os.path.abspath(path)
    return _load_clip_cached(path, None if device is None else str(device), dtype)


@functools.lru_cache(maxsize=4)
def _load_clip_cached(path: str, device: str | None, dtype: torch.dtype | None) -> CLIPScorer:
    return CLIPScorer.from_pretrained(path, device=device, dtype=dtype)


def _scorer(model: str | os.PathLike[str] | CLIPScorer, device: str | None) -> CLIPScorer:
    return model if isinstance(model, CLIPScorer) else load_clip(model, device=device)


def _per_row_texts(scorer: CLIPScorer, texts: str | Sequence[str], rows: int, name: str) -> torch.Tensor:
    """One string for every row, or R strings -> `[1, D]` or `[R, D]`; each distinct string is embedded once."""
    if isinstance(texts, str):
        return scorer.embed_texts([texts])  # [1, D]
    texts = list(texts)
    if len(texts) != rows:
        raise ValueError(f"{name} must be one string or {rows} strings (one per row), got {len(texts)}")
    unique = list(dict.fromkeys(texts))  # a batch usually repeats one task's prompt G times or more
    position = {text: i for i, text in enumerate(unique)}
    index = torch.tensor([position[text] for text in texts], device=scorer.device)
    return scorer.embed_texts(unique)[index]  # [R, D]


def _prompt_set(scorer: CLIPScorer, texts: str | Sequence[str], name: str) -> torch.Tensor:
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts:
        raise ValueError(f"{name} needs at least one prompt")
    return scorer.embed_texts(texts)  # [P, D]


# ---------------------------------------------------------------------------------------------------------------------
# Registered rewards: targets by name, `model` as an option
# ---------------------------------------------------------------------------------------------------------------------


@REWARDS.register("clip_text")
def clip_text_reward(
    images: torch.Tensor | Sequence[Any],
    texts: str | Sequence[str],
    *,
    model: str | os.PathLike[str] | CLIPScorer,
    device: str | None = None,
) -> torch.Tensor:
    """CLIP cosine similarity of each image with its text.

    Args:
        images: `[R, H, W, 3]` uint8 or float in [0, 1], or R PIL images.
        texts: one string for every row, or R strings.
        model: checkpoint path or hub name (loaded once per process by `load_clip`), or a `CLIPScorer`.
        device: where `load_clip` puts a model it loads; None: CUDA if available.

    Returns:
        `[R]` float32 in [-1, 1], on the images' device (CPU for PIL images).
    """
    scorer = _scorer(model, device)
    image_emb = scorer.embed_images(images)  # [R, D]
    text_emb = _per_row_texts(scorer, texts, image_emb.shape[0], "texts")  # [1 or R, D]
    return clip_similarity(image_emb, text_emb).to(_out_device(images))  # [R]


@REWARDS.register("clip_goal_baseline")
def clip_goal_baseline_reward(
    images: torch.Tensor | Sequence[Any],
    goal: str | Sequence[str],
    baseline: str | Sequence[str],
    *,
    model: str | os.PathLike[str] | CLIPScorer,
    alpha: float = 0.5,
    device: str | None = None,
) -> torch.Tensor:
    """VLM-RM's goal-baseline regularised CLIP reward (`goal_baseline_reward`) on images and prompts.

    Args:
        images: `[R, H, W, 3]` uint8 or float in [0, 1], or R PIL images.
        goal: the goal prompt ("a humanoid robot kneeling"), one for every row or R of them.
        baseline: the baseline prompt ("a humanoid robot"), one or R, as `goal`.
        model: checkpoint path or hub name (loaded once per process by `load_clip`), or a `CLIPScorer`.
        alpha: projection strength in [0, 1]; 0 is the plain cosine with the goal.
        device: where `load_clip` puts a model it loads; None: CUDA if available.

    Returns:
        `[R]` float32, at most 1, on the images' device (CPU for PIL images).
    """
    scorer = _scorer(model, device)
    image_emb = scorer.embed_images(images)  # [R, D]
    rows = image_emb.shape[0]
    goal_emb = _per_row_texts(scorer, goal, rows, "goal")  # [1 or R, D]
    baseline_emb = _per_row_texts(scorer, baseline, rows, "baseline")
    return goal_baseline_reward(image_emb, goal_emb, baseline_emb, alpha=alpha).to(_out_device(images))  # [R]


@REWARDS.register("clip_contrast")
def clip_contrast_reward(
    images: torch.Tensor | Sequence[Any],
    positive: str | Sequence[str],
    negative: str | Sequence[str],
    *,
    model: str | os.PathLike[str] | CLIPScorer,
    positive_weight: float = 1.0,
    negative_weight: float = 1.0,
    device: str | None = None,
) -> torch.Tensor:
    """VLM-RL's contrasting-language-goal reward (`contrastive_goal_reward`) on images and prompts.

    Unlike `texts` / `goal`, `positive` and `negative` are prompt sets shared by every row (their similarities are
    averaged), as VLM-RL uses one fixed pair of goals for a task.

    Args:
        images: `[R, H, W, 3]` uint8 or float in [0, 1], or R PIL images.
        positive: one or more positive goal prompts.
        negative: one or more negative goal prompts.
        model: checkpoint path or hub name (loaded once per process by `load_clip`), or a `CLIPScorer`.
        positive_weight: scale of the positive term.
        negative_weight: scale of the negative term.
        device: where `load_clip` puts a model it loads; None: CUDA if available.

    Returns:
        `[R]` float32, on the images' device (CPU for PIL images).
    """
    scorer = _scorer(model, device)
    image_emb = scorer.embed_images(images)  # [R, D]
    scores = contrastive_goal_reward(
        image_emb,
        _prompt_set(scorer, positive, "positive"),
        _prompt_set(scorer, negative, "negative"),
        positive_weight=positive_weight,
        negative_weight=negative_weight,
    )
    return scores.to(_out_device(images))  # [R]


def _out_device(images: torch.Tensor | Sequence[Any]) -> torch.device:
    return images.device if isinstance(images, torch.Tensor) else torch.device("cpu")
