"""The datasets-as-envs adapter: JSON lines and saved `datasets` folders, letterboxing, rewards by hand, split."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import sim.tasks.dataset  # noqa: F401  (registers `dataset`)
from sim import check_vec_env, make
from sim.errors import InputError
from sim.seeds import DEMO_SEED_BASE, EVAL_SEED_BASE, eval_seeds, validation_seeds
from sim.tasks.dataset import DEFAULT_PATH, DatasetEnv


def write_png(path: Path, size: tuple[int, int], colour: tuple[int, int, int], box: list[int] | None = None) -> None:
    """A flat image of `size` (W, H) in light grey with a `colour` rectangle filling `box` (x2/y2 exclusive)."""
    image = Image.new("RGB", size, (230, 230, 230))
    if box is not None:
        image.paste(colour, tuple(box))
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)


def write_jsonl(path: Path, records: list[dict | str]) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    return path


@pytest.fixture()
def mixed(tmp_path) -> Path:
    """Four records of each target kind, on a 40x20 image (landscape: letterboxed with bands above and below)."""
    write_png(tmp_path / "img" / "wide.png", (40, 20), (200, 0, 0), [4, 2, 24, 12])
    records = [
        {"image": "img/wide.png", "question": "Find the red box.", "box": [4, 2, 24, 12]},
        {"image": str(tmp_path / "img" / "wide.png"), "instruction": "Point at it.", "point": [10, 5]},
        {"image": "img/wide.png", "question": "What colour is it?", "answer": "red"},
        {"image": "img/wide.png", "question": "How wide is it?", "answer": "12.5"},
    ]
    return write_jsonl(tmp_path / "data.jsonl", records)


def test_contract_on_the_sample_dataset_with_garbage_and_with_the_expert():
    for n, seed in ((4, 0), (1, 7)):
        env = make("dataset", num_envs=n)
        check_vec_env(env, seed=seed)
        env.reset(seed=seed)
        check_vec_env(env, seed=seed, actions=env.expert_action())


def test_expert_answers_every_sample_record_correctly():
    env = DatasetEnv(num_envs=21)  # the 21 training records of the 24 (eval_fraction 0.1 holds out 3)
    obs = env.reset(seed=0)
    assert sorted(env._record_ids) == list(range(21))
    assert obs.image.shape == (21, 64, 64, 3)
    result = env.step(env.expert_action())
    assert result.info["success"].all() and (result.reward >= 0.8).all()
    assert result.info["reasons"] == [""] * 21
    kinds = {name for name, c in result.info["reward_components"].items() if c.abs().sum() > 0}
    assert kinds == {"box_iou", "point_in_box", "numeric_match", "exact_match"}  # auto reward per target kind


def test_letterbox_and_rewards_by_hand(mixed):
    env = DatasetEnv(num_envs=4, path=mixed, image_size=40, eval_fraction=0.0, shuffle=False)
    obs = env.reset(seed=0)
    # 40x20 on a 40x40 square: scale 1, 10 black rows above and below; the red rectangle lands 10 rows lower.
    image = obs.image[0]
    assert (image[:10] == 0).all() and (image[30:] == 0).all()
    assert (image[12:22, 4:24] == torch.tensor([200, 0, 0], dtype=torch.uint8)).all()
    target = torch.tensor([[4.0, 12.0, 24.0, 22.0], [8.0, 13.0, 12.0, 17.0]])  # box; point (10, 15) +- 0.05 * 40
    result = env.step(
        [
            "<answer>[4, 12, 24, 17]</answer>",  # the top half of the target: IoU 100 / 200 = 0.5
            "<answer>(11, 16)</answer>",  # within 2 px of (10, 15) on both axes
            "<answer>Red.</answer>",  # exact_match normalises case and punctuation
            "so the width is <answer>12.50</answer>",  # numeric_match
        ]
    )
    torch.testing.assert_close(result.info["target_box"][:2], target)
    assert torch.isnan(result.info["target_box"][2:]).all()
    c = result.info["reward_components"]
    torch.testing.assert_close(c["box_iou"], torch.tensor([0.5, 0.0, 0.0, 0.0]))
    torch.testing.assert_close(c["point_in_box"], torch.tensor([0.0, 1.0, 0.0, 0.0]))
    torch.testing.assert_close(c["exact_match"], torch.tensor([0.0, 0.0, 1.0, 0.0]))
    torch.testing.assert_close(c["numeric_match"], torch.tensor([0.0, 0.0, 0.0, 1.0]))
    torch.testing.assert_close(result.reward, torch.tensor([0.5, 1.0, 1.0, 1.0]))
    assert result.info["success"].all() and result.terminated.all() and not result.truncated.any()
    assert obs.instruction[1] == "Point at it. Answer with <answer>(x, y)</answer> in pixels of the 40x40 image."

    env.reset(seed=0)
    wrong = env.step(["<answer>[30, 30, 39, 39]</answer>", "<answer>(13, 15)</answer>", "blue", "12.4"])
    torch.testing.assert_close(wrong.reward, torch.zeros(4))
    assert not wrong.info["success"].any()
    assert wrong.info["reasons"][1] == "wrong answer (point_in_box = 0.00)"

    # Twice the size: scale 2, the 80x40 picture sits 20 rows down; targets follow.
    big = DatasetEnv(num_envs=2, path=mixed, image_size=80, eval_fraction=0.0, shuffle=False)
    big.reset(seed=0)
    torch.testing.assert_close(big._target_boxes, torch.tensor([[8.0, 24.0, 48.0, 44.0], [16.0, 26.0, 24.0, 34.0]]))


def test_malformed_answers_score_zero_with_reasons(mixed):
    env = DatasetEnv(num_envs=4, path=mixed, eval_fraction=0.0, shuffle=False)
    env.reset(seed=0)
    result = env.step(["[1,2", "}{", "", "<answer></answer>"])
    torch.testing.assert_close(result.reward, torch.zeros(4))
    assert all(result.info["reasons"]), result.info["reasons"]
    assert result.info["reasons"][2] == "empty answer"


def test_explicit_reward_and_options(mixed, tmp_path):
    boxes = write_jsonl(
        tmp_path / "boxes.jsonl", [{"image": "img/wide.png", "question": "Find it.", "box": [4, 2, 24, 12]}]
    )
    env = DatasetEnv(num_envs=1, path=boxes, reward="box_giou", image_size=40, eval_fraction=0.0)
    env.reset(seed=0)
    # Target [4, 12, 24, 22]; answer [24, 12, 44, 22] touches it: IoU 0, enclosing box 40 x 10, union 400, GIoU 0.
    result = env.step(["<answer>[24, 12, 44, 22]</answer>"])
    torch.testing.assert_close(result.reward, torch.tensor([0.0]))
    assert not result.info["success"][0]
    env.reset(seed=0)
    assert env.step(env.expert_action()).info["success"][0]  # GIoU's success is the IoU of the same answer

    hits = DatasetEnv(num_envs=1, path=boxes, reward="point_in_box", image_size=40, eval_fraction=0.0)
    hits.reset(seed=0)
    assert hits.expert_action() == ["<answer>(14, 17)</answer>"]  # the box's centre
    assert hits.step(hits.expert_action()).reward[0] == 1.0

    relaxed = DatasetEnv(
        num_envs=4, path=mixed, eval_fraction=0.0, shuffle=False, reward_kwargs={"numeric_match": {"rel_tol": 0.05}}
    )
    relaxed.reset(seed=0)
    assert relaxed.step(["", "", "", "<answer>12</answer>"]).reward[3] == 1.0  # |12 - 12.5| <= 5% of 12.5
    with pytest.raises(ValueError, match="no record uses"):
        DatasetEnv(num_envs=1, path=mixed, reward_kwargs={"box_giou": {}})
    with pytest.raises(ValueError, match="unknown reward 'iou'"):
        DatasetEnv(num_envs=1, path=mixed, reward="iou")
    with pytest.raises(ValueError, match=r"line 3: reward 'box_iou' needs a field 'box' or 'point'"):
        DatasetEnv(num_envs=1, path=mixed, reward="box_iou")


def test_held_out_seeds_read_records_disjoint_from_training(tmp_path):
    write_png(tmp_path / "a.png", (16, 16), (0, 0, 200))
    records = [{"image": "a.png", "question": f"Question {i}?", "answer": str(i)} for i in range(8)]
    path = write_jsonl(tmp_path / "data.jsonl", records)
    env = DatasetEnv(num_envs=1, path=path, eval_fraction=0.25)  # the last ceil(0.25 * 8) = 2 records held out
    assert env.train_ids == list(range(6)) and env.eval_ids == [6, 7]
    train = [env.record_index(s) for s in range(60)]
    held = [env.record_index(EVAL_SEED_BASE + s) for s in range(60)]
    assert set(train) == set(range(6)) and set(held) == {6, 7}
    for epoch in range(10):  # every epoch of seeds visits each training record once, in its own shuffled order
        assert sorted(train[6 * epoch : 6 * epoch + 6]) == list(range(6))
    assert train[:6] != train[6:12] or train[6:12] != train[12:18]
    assert train == [env.record_index(s) for s in range(60)]  # a pure function of the seed
    obs = env.reset(seed=EVAL_SEED_BASE + 3)
    assert env._record_ids[0] in (6, 7) and obs.instruction[0].startswith(f"Question {env._record_ids[0]}?")

    assert {DatasetEnv(1, path=path, split="test", eval_fraction=0.25).record_index(s) for s in range(20)} == {6, 7}
    assert {DatasetEnv(1, path=path, split="all").record_index(s) for s in range(40)} == set(range(8))
    unshuffled = DatasetEnv(1, path=path, eval_fraction=0.25, shuffle=False)
    assert [unshuffled.record_index(s) for s in range(8)] == [0, 1, 2, 3, 4, 5, 0, 1]
    other = DatasetEnv(1, path=path, eval_fraction=0.25, shuffle_seed=1)
    assert [other.record_index(s) for s in range(60)] != train
    none_held = DatasetEnv(1, path=path, eval_fraction=0.0)
    with pytest.raises(ValueError, match="none is held out"):
        none_held.reset(seed=EVAL_SEED_BASE)

    # The shipped sample: the 3 held-out records never show up under training seeds.
    sample = DatasetEnv(num_envs=1)
    assert sample.eval_ids == [21, 22, 23]
    trained = {sample.record_index(s) for s in range(500)}
    assert not trained & {sample.record_index(EVAL_SEED_BASE + s) for s in range(50)}


def test_three_splits_train_validation_and_test_are_disjoint_and_the_test_records_stay_put(tmp_path):
    write_png(tmp_path / "a.png", (16, 16), (0, 0, 200))
    records = [{"image": "a.png", "question": f"Question {i}?", "answer": str(i)} for i in range(10)]
    path = write_jsonl(tmp_path / "data.jsonl", records)
    before = DatasetEnv(num_envs=1, path=path, eval_fraction=0.2)  # no validation part (the default)
    env = DatasetEnv(num_envs=1, path=path, eval_fraction=0.2, val_fraction=0.3)  # ceil(0.3 * 10) = 3 records
    assert (env.train_ids, env.val_ids, env.eval_ids) == (list(range(5)), [5, 6, 7], [8, 9])
    train = {env.record_index(s) for s in range(100)}
    validation = [env.record_index(s) for s in validation_seeds(30)]
    test = [env.record_index(s) for s in eval_seeds(30)]
    assert train == set(range(5)) and set(validation) == {5, 6, 7} and set(test) == {8, 9}
    for epoch in range(10):  # validation seeds visit every validation record once an epoch, as training seeds do
        assert sorted(validation[3 * epoch : 3 * epoch + 3]) == [5, 6, 7]
    # The test records and their order are those of a run without a validation split: recorded scores stay valid.
    assert test == [before.record_index(s) for s in eval_seeds(30)]
    # Demonstration seeds still train; a named split sends every seed into its part.
    assert env.record_index(DEMO_SEED_BASE + 7) in range(5)
    assert {DatasetEnv(1, path=path, split="validation", val_fraction=0.3).record_index(s) for s in range(9)} == {
        6, 7, 8,  # eval_fraction 0.1 holds out record 9 alone
    }  # fmt: skip

    with pytest.raises(
        InputError, match=r"^seed 800000000 asks for a validation record, but none is held out: set val_fraction > 0"
    ):
        before.reset(seed=validation_seeds(1))
    with pytest.raises(InputError, match=r"split='validation' needs validation records; set val_fraction > 0"):
        DatasetEnv(num_envs=1, path=path, split="validation")
    with pytest.raises(InputError, match=r"val_fraction must be in \[0, 1\), got 1.0"):
        DatasetEnv(num_envs=1, path=path, val_fraction=1.0)
    with pytest.raises(InputError, match=r"eval_fraction=0.5 and val_fraction=0.5 hold out all 10 records"):
        DatasetEnv(num_envs=1, path=path, eval_fraction=0.5, val_fraction=0.5)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"image": "missing.png", "question": "Q?", "answer": "a"}', r"line 2: field 'image': file .*missing.png"),
        ('{"image": "a.png", "answer": "a"}', r"line 2: field 'question' \(or 'instruction'\)"),
        ('{"image": "a.png", "question": "Q?"', r"line 2: not valid JSON"),
        ('{"image": "a.png", "question": "Q?"}', r"line 2: needs a target"),
        ('{"image": "a.png", "question": "Q?", "box": [5, 5, 2, 9]}', r"line 2: field 'box' must be .* x1 < x2"),
        ('{"image": "a.png", "question": "Q?", "point": [1, "2"]}', r"line 2: field 'point' must be a list of 2"),
        ('{"question": "Q?", "answer": "a"}', r"line 2: field 'image' must be a path"),
        ('["a.png"]', r"line 2: expected a JSON object"),
        ('{"image": "a.png", "question": "Q?", "box": [NaN, 1, 5, 5]}', r"line 2: field 'box' must be .* finite"),
        # Boxes and points are checked against the image's size (8x8), read from its header when the data loads.
        ('{"image": "a.png", "question": "Q?", "box": [1, 1, 50, 5]}', r"line 2: field 'box' .* outside the 8x8"),
        ('{"image": "a.png", "question": "Q?", "box": [-4, 1, 5, 5]}', r"line 2: field 'box' .* outside the 8x8"),
        ('{"image": "a.png", "question": "Q?", "point": [3, 9.5]}', r"line 2: field 'point' .* outside the 8x8"),
        (
            '{"image": "a.png", "question": "Q?", "boxes": [[1, 1, 5, 5], [2, 2, 9.5, 4]]}',
            r"line 2: field 'boxes\[1\]' .* outside the 8x8",
        ),
        (
            '{"image": "cut.png", "question": "Q?", "answer": "a"}',
            r"line 2: field 'image': .*cut.png.* (truncated|broken)",
        ),
        (
            '{"image": "text.png", "question": "Q?", "answer": "a"}',
            r"line 2: field 'image': .*text.png.* not an image",
        ),
        (
            '{"image": "huge.png", "question": "Q?", "answer": "a"}',
            r"line 2: field 'image': .*huge.png is 400000000 pixels, above the limit of 89478485",
        ),
    ],
)
def test_bad_records_fail_at_construction_naming_line_and_field(tmp_path, line, message):
    write_png(tmp_path / "a.png", (8, 8), (0, 0, 0))
    write_damaged_images(tmp_path)
    good = '{"image": "a.png", "question": "Q?", "answer": "a"}'
    path = write_jsonl(tmp_path / "data.jsonl", [good, line, good])
    with pytest.raises(InputError, match=message):  # the type the command line turns into one line, exit 2
        DatasetEnv(num_envs=1, path=path)


def write_damaged_images(folder: Path) -> None:
    """`cut.png` (a 32x32 PNG cut off half-way), `text.png` (not an image) and `huge.png` (a valid PNG header
    declaring 20000x20000 pixels, 400 M, which must be refused from the header, before anything is decoded)."""
    import struct
    import zlib

    noise = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(noise).save(folder / "cut.png")
    data = (folder / "cut.png").read_bytes()
    (folder / "cut.png").write_bytes(data[: len(data) // 2])
    (folder / "text.png").write_text("not a picture")
    Image.new("L", (1, 1)).save(folder / "huge.png")
    data = bytearray((folder / "huge.png").read_bytes())
    ihdr = bytearray(data[12:29])  # b"IHDR" + width, height, depth, colour, compression, filter, interlace
    ihdr[4:12] = struct.pack(">II", 20000, 20000)
    data[12:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(ihdr)))
    (folder / "huge.png").write_bytes(bytes(data))


def test_lenient_reading_skips_bad_records_counting_and_naming_them(tmp_path, capsys):
    write_png(tmp_path / "a.png", (8, 8), (0, 0, 0))
    write_damaged_images(tmp_path)
    good = {"image": "a.png", "question": "Q?", "answer": "a"}
    bad = [
        {"image": "cut.png", "question": "Q?", "answer": "a"},
        {"image": "a.png", "question": "Q?", "box": [1, 1, 50, 5]},
        "not json",
    ]
    path = write_jsonl(tmp_path / "data.jsonl", [good, *bad, good])
    env = DatasetEnv(num_envs=1, path=path, eval_fraction=0.0, bad_records="skip")
    assert [r.where for r in env.records] == ["data.jsonl line 1", "data.jsonl line 5"]
    assert [m.split(":")[0] for m in env.skipped_records] == [f"data.jsonl line {n}" for n in (2, 3, 4)]
    err = capsys.readouterr().err
    assert "skipped 3 bad record(s) of 5" in err and "data.jsonl line 2: field 'image'" in err
    with pytest.raises(InputError, match=r"line 2: field 'image'"):  # strict, the default
        DatasetEnv(num_envs=1, path=path)
    only_bad = write_jsonl(tmp_path / "bad.jsonl", bad)
    with pytest.raises(InputError, match=r"every record is bad \(3; the first: bad.jsonl line 1"):
        DatasetEnv(num_envs=1, path=only_bad, bad_records="skip")


def test_a_box_on_the_image_border_is_inside(tmp_path):
    """x2 = width is the image's right edge (pixel edges, not centres), and half a pixel of rounding is let through."""
    write_png(tmp_path / "a.png", (8, 6), (0, 0, 0))
    path = write_jsonl(
        tmp_path / "data.jsonl",
        [
            {"image": "a.png", "question": "Q?", "box": [0, 0, 8, 6]},
            {"image": "a.png", "question": "Q?", "point": [8.4, 0]},
        ],
    )
    assert len(DatasetEnv(num_envs=1, path=path, eval_fraction=0.0).records) == 2


def test_an_image_that_breaks_after_loading_is_named_when_shown(tmp_path):
    """An image damaged after the data loaded (or one whose damage only decoding finds) names its record and field
    when a world first shows it, as an InputError."""
    write_png(tmp_path / "a.png", (8, 8), (0, 0, 0))
    path = write_jsonl(tmp_path / "data.jsonl", [{"image": "a.png", "question": "Q?", "answer": "a"}])
    env = DatasetEnv(num_envs=1, path=path, eval_fraction=0.0)
    (tmp_path / "a.png").write_bytes((tmp_path / "a.png").read_bytes()[:20])
    with pytest.raises(InputError, match=r"data.jsonl line 1: field 'image': cannot read"):
        env.reset(seed=0)


def test_saved_hugging_face_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    rng = np.random.default_rng(0)
    images, boxes = [], []
    for _ in range(12):
        x, y = (int(v) for v in rng.integers(0, 20, size=2))
        image = Image.new("RGB", (32, 32), (240, 240, 240))
        image.paste((0, 120, 0), (x, y, x + 10, y + 10))
        images.append(image)
        boxes.append([x, y, x + 10, y + 10])
    columns = {"image": images, "question": ["Find the green square."] * 12, "box": boxes}
    datasets.Dataset.from_dict(columns).save_to_disk(str(tmp_path / "flat"))
    env = DatasetEnv(num_envs=2, path=tmp_path / "flat", image_size=32, eval_fraction=0.25)  # 9 train, 3 held out
    check_vec_env(env, seed=0)
    env.reset(seed=[0, EVAL_SEED_BASE])
    index = env._record_ids
    assert index[0] < 9 <= index[1]
    torch.testing.assert_close(env._target_boxes, torch.tensor([boxes[i] for i in index], dtype=torch.float32))
    result = env.step(env.expert_action())
    assert result.info["success"].all() and (result.reward == 1.0).all()
    # A DatasetDict is read at hf_split; an unknown split names the ones there.
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(columns)}).save_to_disk(str(tmp_path / "dict"))
    assert len(DatasetEnv(num_envs=1, path=tmp_path / "dict").records) == 12
    with pytest.raises(ValueError, match="has splits train"):
        DatasetEnv(num_envs=1, path=tmp_path / "dict", hf_split="test")
    datasets.Dataset.from_dict({"question": ["Q?"], "answer": ["a"]}).save_to_disk(str(tmp_path / "no_image"))
    with pytest.raises(ValueError, match="no 'image' column"):
        DatasetEnv(num_envs=1, path=tmp_path / "no_image")
    # Image paths in a string column are relative to the dataset folder; bad rows are named by their index.
    paths = {"image": ["a.png", "a.png"], "question": ["Q?", "Count."], "answer": ["7", "two"]}
    datasets.Dataset.from_dict(paths).save_to_disk(str(tmp_path / "paths"))
    write_png(tmp_path / "paths" / "a.png", (10, 10), (0, 0, 0))
    by_path = DatasetEnv(num_envs=2, path=tmp_path / "paths", eval_fraction=0.0, shuffle=False)
    by_path.reset(seed=0)
    assert by_path.step(["<answer>7.0</answer>", "<answer>Two</answer>"]).reward.tolist() == [1.0, 1.0]
    bad = {"image": ["a.png", "gone.png"], "question": ["Q?", "Q?"], "answer": ["a", "b"]}
    datasets.Dataset.from_dict(bad).save_to_disk(str(tmp_path / "bad"))
    write_png(tmp_path / "bad" / "a.png", (10, 10), (0, 0, 0))
    with pytest.raises(ValueError, match=r"bad row 1: field 'image': file .*gone.png not found"):
        DatasetEnv(num_envs=1, path=tmp_path / "bad")


def test_expert_noise_is_seeded_and_default_path_ships():
    assert DEFAULT_PATH.is_file()
    env = DatasetEnv(num_envs=8)
    env.reset(seed=0)
    a = env.expert_action(noise=0.5, generator=torch.Generator().manual_seed(1))
    b = env.expert_action(noise=0.5, generator=torch.Generator().manual_seed(1))
    assert a == b and a != env.expert_action()
    rewards = env.step(env.expert_action(noise=1.0, generator=torch.Generator().manual_seed(2))).reward
    assert rewards.mean() < 1.0 and math.isfinite(rewards.sum())
    with pytest.raises(ValueError, match="Generator"):
        env.expert_action(noise=0.5)


def test_expert_number_offset_shifts_numeric_answers_only(mixed, tmp_path):
    env = DatasetEnv(num_envs=4, path=mixed, image_size=40, eval_fraction=0.0, shuffle=False, expert_number_offset=-1)
    env.reset(seed=0)
    clean = DatasetEnv(num_envs=4, path=mixed, image_size=40, eval_fraction=0.0, shuffle=False)
    clean.reset(seed=0)
    shifted, right = env.expert_action(), clean.expert_action()
    assert right[3] == "<answer>12.5</answer>" and shifted[3] == "<answer>11.5</answer>"
    assert shifted[:3] == right[:3]  # box, point and text answers are as the records give them
    result = env.step(shifted)
    assert result.info["reward_components"]["numeric_match"][3] == 0 and result.info["success"][:3].all()
    percent = write_jsonl(
        tmp_path / "pct.jsonl", [{"image": str(mixed.parent / "img" / "wide.png"), "question": "q", "answer": "45%"}]
    )
    env = DatasetEnv(num_envs=1, path=percent, split="all", expert_number_offset=2)
    env.reset(seed=0)
    assert env.expert_action() == ["<answer>47%</answer>"]
    for bad in (float("nan"), "one"):
        with pytest.raises(ValueError, match="expert_number_offset must be a finite number"):
            DatasetEnv(num_envs=1, path=percent, split="all", expert_number_offset=bad)


def test_several_boxes_per_record_reach_the_box_list_rewards(tmp_path):
    write_png(tmp_path / "street.png", (40, 20), (0, 0, 200), [2, 2, 10, 10])
    records = [
        {"image": "street.png", "question": "Find every car.", "boxes": [[2, 2, 10, 10], [20, 4, 36, 16]]},
        {"image": "street.png", "question": "Find every dog.", "boxes": []},  # nothing to find
        {"image": "street.png", "question": "Find every car.", "boxes": [[2, 2, 10, 10]], "answer": "x"},
    ]
    path = write_jsonl(tmp_path / "data.jsonl", records)
    env = DatasetEnv(num_envs=3, path=path, image_size=40, split="all", shuffle=False)
    obs = env.reset(seed=0)
    assert "one box per object ([] for none)" in obs.instruction[0]
    # 40x20 letterboxed on 40x40: 10 rows down. Targets follow; a record with boxes has no single target box.
    torch.testing.assert_close(env._boxes[0], torch.tensor([[2.0, 12.0, 10.0, 20.0], [20.0, 14.0, 36.0, 26.0]]))
    assert env._boxes[1].shape == (0, 4) and torch.isnan(env._target_boxes).all()
    expert = env.expert_action()
    assert expert[:2] == ["<answer>[[2, 12, 10, 20], [20, 14, 36, 26]]</answer>", "<answer>[]</answer>"]
    result = env.step(expert)
    assert result.reward.tolist() == [1.0, 1.0, 1.0] and result.info["success"].all()
    assert result.info["reward_components"]["matched_iou"].tolist() == [1.0, 1.0, 1.0]

    env.reset(seed=0)
    # One of two cars found exactly (matched IoU averages over the larger count: 1/2); a box where there is nothing;
    # an answer with no box list at all.
    result = env.step(["<answer>[[2, 12, 10, 20]]</answer>", "<answer>[[1, 1, 5, 5]]</answer>", "a car"])
    torch.testing.assert_close(result.reward, torch.tensor([0.5, 0.0, 0.0]))
    assert not result.info["success"].any()
    assert result.info["reasons"][0] == "wrong answer (matched_iou = 0.50)" and result.info["reasons"][2] != ""

    f1 = DatasetEnv(num_envs=1, path=path, image_size=40, split="all", shuffle=False, reward="detection_f1")
    f1.reset(seed=0)
    # 1 of 2 found, nothing wrong: precision 1, recall 1/2, F1 2/3.
    torch.testing.assert_close(f1.step(["<answer>[[2, 12, 10, 20]]</answer>"]).reward, torch.tensor([2 / 3]))


@pytest.mark.parametrize(
    ("field", "message"),
    [
        (
            '"boxes": [[1, 1, 5, 5], [6, 6, 2, 9]]',
            r"line 1: field 'boxes\[1\]' must be \[x1, y1, x2, y2\] with x1 < x2",
        ),
        ('"boxes": {"a": 1}', r"line 1: field 'boxes' must be a list"),
        ('"boxes": [[1, 1, 5, 5]], "box": [1, 1, 5, 5]', r"line 1: give one of the fields 'box' .* and 'boxes'"),
    ],
)
def test_bad_box_lists_are_named(tmp_path, field, message):
    write_png(tmp_path / "a.png", (8, 8), (0, 0, 0))
    path = write_jsonl(tmp_path / "data.jsonl", ['{"image": "a.png", "question": "Q?", ' + field + "}"])
    with pytest.raises(ValueError, match=message):
        DatasetEnv(num_envs=1, path=path)


def test_a_box_list_reward_on_a_record_without_boxes_is_named(mixed):
    with pytest.raises(ValueError, match=r"line 1: reward 'matched_iou' needs a field 'boxes'"):
        DatasetEnv(num_envs=1, path=mixed, reward="matched_iou")
