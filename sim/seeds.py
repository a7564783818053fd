"""Seed ranges: which world seeds train, which demonstrate, which validate and which test. One place, for every
package.

A world's seed decides everything random about its episode (scene, target, dataset record), so disjoint ranges
keep training, demonstrations and evaluation on disjoint worlds. `sim` owns the numbers because envs read them
(the dataset env serves validation records to validation seeds and test records to test seeds) and `sim` cannot
import `mmrl`.

| range                                  | used by                                                    |
| -------------------------------------- | ---------------------------------------------------------- |
| `[s * TRAIN_SEED_STRIDE, +TRAIN_SEED_STRIDE)` | training prompts of a run with `trainer.seed = s` (0 <= s < TRAIN_SEEDS) |
| `[SFT_SEED_BASE, +10**8)`              | the warm-start asset's supervised worlds (scripts/)        |
| `[VALIDATION_SEED_BASE, DEMO_SEED_BASE)` | the validation split: `trainer.eval_every`'s evaluations during a run, tuning, `mmrl eval --split validation` |
| `[DEMO_SEED_BASE, EVAL_SEED_BASE)`     | cold-start demonstrations (`sft.episodes`), warm-start validation |
| `[EVAL_SEED_BASE, ...)`                | the test split (held out): the score before and after a run, `mmrl eval` |

Three splits, as a dataset ships them: training, validation and test. Anything chosen by looking at scores (a
setting, a checkpoint, a recipe) is chosen on the validation split, and the test split is scored to report, so the
reported figure is not one the choice was fitted to. The test range is where the held-out evaluation always was
(`eval_seeds`), so the figures recorded before the validation split existed are the same worlds' scores.

Beside the world seeds, every random stream of a training step has a named function here, so no two streams start
from the same integer: `sampling_seed` (the completions of one generation shard), `mini_batch_seed` (the order of the
groups in PPO mini-batches), `image_mask_seed` (which patches PAPO hides), `critic_seed` (the value head's initial
weights). Others derive theirs with `stream_seed` (the action-token rows, demonstration noise). The cold start's batch
order keeps the run seed itself, so that the recorded cold starts reproduce.
"""

from __future__ import annotations

import hashlib

# trainer.seed s trains on seeds [s * TRAIN_SEED_STRIDE, (s + 1) * TRAIN_SEED_STRIDE): ten million prompts a run,
# TRAIN_SEEDS run seeds, all below SFT_SEED_BASE, so no run seed trains on the demonstrations' or the warm start's
# worlds.
TRAIN_SEED_STRIDE = 10_000_000
SFT_SEED_BASE = 500_000_000
TRAIN_SEEDS = SFT_SEED_BASE // TRAIN_SEED_STRIDE  # 50
VALIDATION_SEED_BASE = 800_000_000  # the validation split: 10**8 worlds below the demonstrations'
DEMO_SEED_BASE = 900_000_000
EVAL_SEED_BASE = 1_000_000_000  # the test split; no run seed's training worlds and no demonstrations reach it

assert SFT_SEED_BASE + 10**8 <= VALIDATION_SEED_BASE < DEMO_SEED_BASE < EVAL_SEED_BASE

SPLITS = ("test", "validation")  # the splits an evaluation scores (`mmrl eval --split`)


def train_seeds(step: int, prompts_per_step: int, group_size: int, seed: int = 0) -> list[int]:
    """Per-world seeds of one training step of a run with `trainer.seed = seed`: B prompts, each repeated G times
    (contiguous groups), the step's B seeds of the run's own range."""
    if not 0 <= seed < TRAIN_SEEDS:
        raise ValueError(f"trainer.seed must be in [0, {TRAIN_SEEDS}) (each has its own training worlds), got {seed}")
    first = step * prompts_per_step
    if first + prompts_per_step > TRAIN_SEED_STRIDE:
        raise ValueError(f"step {step} would use training seeds beyond this run's {TRAIN_SEED_STRIDE}")
    first += seed * TRAIN_SEED_STRIDE
    return [first + b for b in range(prompts_per_step) for _ in range(group_size)]


def demo_seed_base(seed: int, episodes: int, num_envs: int) -> int:
    """The first world seed of a cold start's `episodes` demonstrations with `trainer.seed = seed`, played in
    batches of `num_envs` worlds (a last batch's spare worlds are reset too): `DEMO_SEED_BASE + seed * episodes`.
    Refuses a cold start whose worlds would reach the held-out range."""
    base = DEMO_SEED_BASE + seed * episodes
    if base + episodes + num_envs > EVAL_SEED_BASE:
        raise ValueError(f"{episodes} demonstration episodes at seed {seed} would reach the held-out worlds")
    return base


def eval_seeds(episodes: int, first: int = 0) -> list[int]:
    """Test (held-out) seeds `first .. first + episodes - 1` of the test range."""
    return [EVAL_SEED_BASE + first + i for i in range(episodes)]


def validation_seeds(episodes: int, first: int = 0) -> list[int]:
    """Validation seeds `first .. first + episodes - 1` of the validation range."""
    if first + episodes > DEMO_SEED_BASE - VALIDATION_SEED_BASE:
        raise ValueError(f"{first + episodes} validation episodes would reach the demonstrations' worlds")
    return [VALIDATION_SEED_BASE + first + i for i in range(episodes)]


def split_seeds(split: str, episodes: int) -> list[int]:
    """The first `episodes` seeds of an evaluation split: `"test"` (`eval_seeds`) or `"validation"`."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    return eval_seeds(episodes) if split == "test" else validation_seeds(episodes)


def seed_split(seed: int) -> str:
    """Which split a world seed belongs to: `"test"`, `"validation"` or `"train"` (every other seed: training,
    demonstrations, the warm start's worlds). Envs whose test worlds are special (the dataset env's test records,
    LIBERO's fixed initial states) read it."""
    if seed >= EVAL_SEED_BASE:
        return "test"
    return "validation" if VALIDATION_SEED_BASE <= seed < DEMO_SEED_BASE else "train"


def stream_seed(*parts: object) -> int:
    """The generator seed of one named random stream, e.g. `stream_seed("demonstration noise", seed, episode)`: the
    first 8 bytes of a SHA-256 of `"mmrl <part> <part> ..."`. Streams derived from one run seed this way draw
    unrelated numbers, where seeding each with the run seed itself would hand them the same ones."""
    text = " ".join(str(part) for part in ("mmrl", *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def sampling_seed(seed: int, step: int, shard: int = 0, attempt: int = 0) -> int:
    """The torch seed of one generation: a function of (run seed, step, prompt shard, refill attempt) alone, so a
    resumed run samples what an uninterrupted one would have, and K processes what one process generating the same
    shards would. Shard 0 of the first attempt keeps the seed of a run generating everything at once (the figures
    recorded for the presets were drawn with it)."""
    return seed * 1_000_003 + step + (shard << 32) + (attempt << 48)


def mini_batch_seed(seed: int, step: int) -> int:
    """The generator seed of step `step`'s mini-batch order (alike in every process: they cut the same batches)."""
    return stream_seed("mini-batch order", seed, step)


def image_mask_seed(seed: int, step: int, rank: int = 0) -> int:
    """The generator seed of the patches PAPO hides at step `step` in process `rank` (each masks its own rows)."""
    return stream_seed("papo image mask", seed, step, rank)


def critic_seed(seed: int) -> int:
    """The generator seed of the value head's initial weights in a run with `trainer.seed = seed`."""
    return stream_seed("critic head", seed)
