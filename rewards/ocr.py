"""Text in images: OCR with RapidOCR (ONNX Runtime), and a reward for rendering the right words.

RapidOCR (`pip install rapidocr-onnxruntime`, the `ocr` extra) ships its PP-OCR detection, orientation and
recognition weights inside the package (about 15 MB), so nothing is downloaded. It is imported on first use, and
one engine per process is kept (building it takes about half a second). Recognition costs roughly 0.3-1 s an image
on one CPU thread, so this reward suits evaluation and small batches better than every training step.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from rewards.catalog import REWARDS
from rewards.image import as_uint8_images

_ENGINE: Any = None
_WORD = re.compile(r"\w+")


def ocr_engine() -> Any:
    """The process's RapidOCR engine (one ONNX Runtime thread per operator: renders are small, cores are shared)."""
    global _ENGINE
    if _ENGINE is None:
        from rapidocr_onnxruntime import RapidOCR

        _ENGINE = RapidOCR(intra_op_num_threads=1, inter_op_num_threads=1)
    return _ENGINE


def ocr_text(images: torch.Tensor) -> list[str]:
    """Reads the text in each image.

    Args:
        images: `[R, H, W, 3]` uint8 RGB (or float in [0, 1]).

    Returns:
        R strings: the recognised pieces in RapidOCR's reading order (top to bottom, left to right), joined by
        spaces; "" where no text was found.
    """
    engine = ocr_engine()
    batch = as_uint8_images(images).cpu().numpy()
    texts = []
    for image in batch:  # RapidOCR takes one image at a time
        found, _ = engine(image[..., ::-1].copy())  # it expects OpenCV's BGR order
        texts.append(" ".join(str(item[1]) for item in found or []).strip())
    return texts


def words(text: str) -> list[str]:
    """Case-folded word tokens (`\\w+`) of a text."""
    return _WORD.findall(text.casefold())


def text_f1(predictions: Sequence[str], targets: Sequence[str]) -> torch.Tensor:
    """Word-level F1 between each prediction and its target (SQuAD-style bag-of-words overlap).

    Words are `words(text)`; a word counts as many times as it appears in both. Two texts without words score 1;
    one without words against one with them scores 0.

    Args:
        predictions: R texts.
        targets: R texts.

    Returns:
        `[R]` float32 in [0, 1].
    """
    if len(predictions) != len(targets):
        raise ValueError(f"{len(predictions)} predictions but {len(targets)} targets")
    scores = []
    for prediction, target in zip(predictions, targets):
        pred_words, target_words = Counter(words(prediction)), Counter(words(target))
        if not pred_words and not target_words:
            scores.append(1.0)
            continue
        common = sum((pred_words & target_words).values())
        if common == 0:
            scores.append(0.0)
            continue
        precision = common / sum(pred_words.values())
        recall = common / sum(target_words.values())
        scores.append(2 * precision * recall / (precision + recall))
    return torch.tensor(scores, dtype=torch.float32)  # [R]


@REWARDS.register("ocr")
def ocr_similarity(images: torch.Tensor, target_texts: Sequence[str]) -> torch.Tensor:
    """Word F1 between the text OCR reads in each image and the text it should show (titles, labels, values).

    Args:
        images: `[R, H, W, 3]` uint8 RGB (or float in [0, 1]).
        target_texts: R expected texts.

    Returns:
        `[R]` float32 in [0, 1].
    """
    if images.shape[0] != len(target_texts):
        raise ValueError(f"{images.shape[0]} images but {len(target_texts)} target texts")
    return text_f1(ocr_text(images), list(target_texts))  # [R]
