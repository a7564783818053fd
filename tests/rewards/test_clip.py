"""CLIP rewards: kernels pinned by hand and against an explicit-P reference, a tiny real CLIPModel built offline."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rewards import REWARDS, build_reward_fns
from rewards.clip import (
    CLIPScorer,
    clip_similarity,
    contrastive_goal_reward,
    goal_baseline_reward,
    load_clip,
)

torch.set_num_threads(1)

R2 = 1 / math.sqrt(2)


def test_registered_names():
    for name in ("clip_text", "clip_goal_baseline", "clip_contrast"):
        assert name in REWARDS


def test_clip_similarity_by_hand():
    image_emb = torch.tensor([[3.0, 4.0], [0.0, 2.0]])  # norms 5 and 2: the kernel normalises
    torch.testing.assert_close(clip_similarity(image_emb, torch.tensor([[1.0, 0.0]])), torch.tensor([0.6, 0.0]))
    per_row = torch.tensor([[1.0, 0.0], [0.0, -1.0]])
    torch.testing.assert_close(clip_similarity(image_emb, per_row), torch.tensor([0.6, -1.0]))


def test_goal_baseline_by_hand():
    goal, baseline = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.0, 2.0, 0.0])  # d = (1, -1, 0) / sqrt 2
    x = torch.tensor([[0.0, 0.0, 1.0], [R2, R2, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    # alpha = 0: 1 - ||x - g||^2 / 2 = x . g on unit vectors.
    torch.testing.assert_close(goal_baseline_reward(x, goal, baseline, alpha=0.0), torch.tensor([0.0, R2, 1.0, 0.0]))
    # alpha = 1: only (x - g) . d counts; rows 0 and 1 differ only orthogonally to d, so they score the same:
    # (x - g) . d = -1 / sqrt 2, reward 1 - 0.5 * 0.5 = 0.75.
    got = goal_baseline_reward(x, goal, baseline, alpha=1.0)
    torch.testing.assert_close(got, torch.tensor([0.75, 0.75, 1.0, 0.0]))
    # alpha = 0.5, the goal image (row 2) against the baseline image (row 3): x = b gives
    # v = b - g, (v . d)^2 = 2, ||v||^2 = 2, so 1 - 0.5 * (0.75 * 2 + 0.25 * 2) = 0.
    got = goal_baseline_reward(x, goal, baseline, alpha=0.5)
    torch.testing.assert_close(got[2:], torch.tensor([1.0, 0.0]))
    assert bool(got[2] > got[3])


def test_goal_baseline_matches_explicit_projection():
    """The closed form against the formula as written: P = alpha d d^T + (1 - alpha) I, per row."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 6, generator=gen)
    goals, baselines = torch.randn(5, 6, generator=gen), torch.randn(5, 6, generator=gen)

    def reference(x, g, b, alpha):
        x, g, b = (t / t.norm(dim=-1, keepdim=True) for t in (x, g, b))
        d = (g - b) / (g - b).norm()
        projection = alpha * torch.outer(d, d) + (1 - alpha) * torch.eye(len(d))
        return 1 - 0.5 * ((x - g) @ projection).norm() ** 2

    for alpha in (0.0, 0.3, 1.0):
        shared = goal_baseline_reward(x, goals[0], baselines[0], alpha=alpha)  # one goal for every row
        per_row = goal_baseline_reward(x, goals, baselines, alpha=alpha)  # one goal per row
        torch.testing.assert_close(shared, torch.stack([reference(xi, goals[0], baselines[0], alpha) for xi in x]))
        torch.testing.assert_close(per_row, torch.stack([reference(*t, alpha) for t in zip(x, goals, baselines)]))


def test_contrastive_goal_by_hand():
    positive = torch.tensor([[1.0, 0.0, 0.0]])
    negative = torch.tensor([[0.0, 3.0, 0.0]])
    x = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [R2, R2, 0.0]])
    got = contrastive_goal_reward(x, positive, negative)
    torch.testing.assert_close(got, torch.tensor([1.0, -1.0, 0.0, 0.0]))
    assert bool(got[0] > got[1])  # the image equal to the positive beats the one equal to the negative
    weighted = contrastive_goal_reward(x, positive, negative, positive_weight=0.5, negative_weight=2.0)
    torch.testing.assert_close(weighted, torch.tensor([0.5, -2.0, 0.0, 0.5 * R2 - 2 * R2]))
    # Several goals of a kind are averaged: positives e1 and e3 -> x = e1 scores 0.5.
    two = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    torch.testing.assert_close(contrastive_goal_reward(x[:1], two, negative), torch.tensor([0.5]))


# ---------------------------------------------------------------------------------------------------------------------
# A tiny real CLIPModel, offline: the repo's tokenizer, random weights
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_scorer() -> CLIPScorer:
    transformers = pytest.importorskip("transformers")
    # An absolute path: a relative "assets/tokenizer" looks like a hub id when pytest runs from another directory.
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        Path(__file__).resolve().parents[2] / "assets" / "tokenizer"
    )
    # CLIP pools a text at its end-of-text token, and reads eos_token_id == 2 as "the largest id" (the old OpenAI
    # configs). Use the pad token as end-of-text, as CLIP's own tokenizer does.
    tokenizer.eos_token = tokenizer.pad_token
    eos = tokenizer.eos_token_id
    assert eos != 2
    config = transformers.CLIPConfig(
        text_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "vocab_size": len(tokenizer),
            "max_position_embeddings": 32,
            "bos_token_id": eos,
            "eos_token_id": eos,
            "pad_token_id": eos,
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 32,
            "patch_size": 8,
        },
        projection_dim=16,
    )
    torch.manual_seed(0)
    model = transformers.CLIPModel(config).eval()
    image_processor = transformers.CLIPImageProcessorPil(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
    )
    return CLIPScorer(model, tokenizer, image_processor, batch_size=3)


def random_images(rows: int, seed: int, size: tuple[int, int] = (40, 48)) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (rows, *size, 3), generator=gen, dtype=torch.uint8)  # [R, H, W, 3]


TEXTS = ["a red square", "two cars have collided with each other on the road", "a cat", "the road is clear"]


def test_embeddings_are_unit_norm_and_batch_independent(tiny_scorer):
    images = random_images(4, seed=1)
    batched = tiny_scorer.embed_images(images)  # batch_size 3: two forward passes
    assert batched.shape == (4, 16) and batched.dtype == torch.float32
    torch.testing.assert_close(batched.norm(dim=-1), torch.ones(4))
    one_by_one = torch.cat([tiny_scorer.embed_images(images[i : i + 1]) for i in range(4)])
    torch.testing.assert_close(batched, one_by_one)
    # Texts of different lengths: padding must not move the pooled end-of-text position.
    texts = tiny_scorer.embed_texts(TEXTS)
    assert texts.shape == (4, 16)
    torch.testing.assert_close(texts.norm(dim=-1), torch.ones(4))
    torch.testing.assert_close(texts, torch.cat([tiny_scorer.embed_texts([t]) for t in TEXTS]))
    assert not torch.allclose(texts[0], texts[2])


def test_pil_images_embed_like_tensors(tiny_scorer):
    image_module = pytest.importorskip("PIL.Image")
    images = random_images(2, seed=2)
    pil = [image_module.fromarray(image.numpy()) for image in images]
    torch.testing.assert_close(tiny_scorer.embed_images(pil), tiny_scorer.embed_images(images))
    mixed = [*pil, image_module.fromarray(random_images(1, seed=3, size=(20, 24))[0].numpy())]  # sizes differ
    assert tiny_scorer.embed_images(mixed).shape == (3, 16)


def test_registered_rewards_call_the_kernels(tiny_scorer):
    images = random_images(4, seed=4)
    completions = ["<svg/>"] * 4
    fns = build_reward_fns(
        [
            {"name": "clip_text", "kwargs": {"model": tiny_scorer}},
            {"name": "clip_goal_baseline", "kwargs": {"model": tiny_scorer, "alpha": 0.0}},
            {"name": "clip_contrast", "kwargs": {"model": tiny_scorer}},
        ]
    )
    targets = {"images": images, "texts": TEXTS, "goal": "a cat", "baseline": "a dog"}
    targets |= {"positive": ["the road is clear"], "negative": ["a crash", "a fire"]}
    image_emb, text_emb = tiny_scorer.embed_images(images), tiny_scorer.embed_texts(TEXTS)
    text = fns["clip_text"](completions, **targets)
    torch.testing.assert_close(text, (image_emb * text_emb).sum(-1))
    # One string is shared by every row; alpha = 0 is the plain cosine with the goal.
    shared = fns["clip_text"](completions, **{**targets, "texts": "a cat"})
    torch.testing.assert_close(fns["clip_goal_baseline"](completions, **targets), shared)
    positive, negative = tiny_scorer.embed_texts(["the road is clear"]), tiny_scorer.embed_texts(["a crash", "a fire"])
    expected = (image_emb @ positive.T).mean(-1) - (image_emb @ negative.T).mean(-1)
    torch.testing.assert_close(fns["clip_contrast"](completions, **targets), expected)
    # Per-row goals: rows with the same goal and baseline strings score as the shared call.
    per_row = fns["clip_goal_baseline"](completions, **{**targets, "goal": ["a cat"] * 4, "baseline": ["a dog"] * 4})
    torch.testing.assert_close(per_row, shared)
    with pytest.raises(ValueError, match="one per row"):
        fns["clip_text"](completions, **{**targets, "texts": TEXTS[:3]})


def test_goal_image_beats_baseline_image_end_to_end(tiny_scorer):
    """With the images' own embeddings as goal and baseline (as if their captions matched them perfectly)."""
    images = random_images(2, seed=5)
    emb = tiny_scorer.embed_images(images)  # row 0 plays the goal, row 1 the baseline
    scores = goal_baseline_reward(emb, emb[0], emb[1], alpha=0.5)
    torch.testing.assert_close(scores[0], torch.tensor(1.0))
    assert bool(scores[0] > scores[1])
    contrast = contrastive_goal_reward(emb, emb[:1], emb[1:])
    assert bool(contrast[0] > contrast[1])


def test_load_clip_from_a_saved_checkpoint_is_cached(tiny_scorer, tmp_path):
    tiny_scorer.model.save_pretrained(tmp_path)
    tiny_scorer.tokenizer.save_pretrained(tmp_path)
    tiny_scorer.image_processor.save_pretrained(tmp_path)
    loaded = load_clip(tmp_path, device="cpu")
    assert loaded is not tiny_scorer and load_clip(str(tmp_path), device="cpu") is loaded
    images = random_images(3, seed=6)
    torch.testing.assert_close(loaded.embed_images(images), tiny_scorer.embed_images(images))
    torch.testing.assert_close(loaded.embed_texts(TEXTS), tiny_scorer.embed_texts(TEXTS))
    # The registered reward with a path loads through the same cache.
    fns = build_reward_fns([{"name": "clip_text", "kwargs": {"model": str(tmp_path), "device": "cpu"}}])
    got = fns["clip_text"]([""] * 3, images=images, texts="a cat")
    torch.testing.assert_close(got, clip_similarity(loaded.embed_images(images), loaded.embed_texts(["a cat"])))
