"""The dataset env reading data as the field publishes it: parquet files and hub repository folders, images as
paths, bytes or `{bytes, path}` structs, the public sets' column names, chat messages, and boxes in other formats."""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

import sim.tasks.dataset  # noqa: F401  (registers `dataset`)
from sim import check_vec_env, make
from sim.errors import InputError
from sim.tasks.parquet import ParquetRows

IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])  # the hub's Image feature as parquet stores it


def png(size: tuple[int, int] = (40, 20), box: tuple[int, int, int, int] | None = (4, 2, 14, 12)) -> bytes:
    """A grey PNG of `size` (W, H) with a red rectangle on `box` (x2/y2 exclusive)."""
    image = Image.new("RGB", size, (230, 230, 230))
    if box is not None:
        image.paste((200, 0, 0), box)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def write_parquet(path: Path, columns: dict, schema: dict | None = None, row_group_size: int | None = None) -> Path:
    arrays = {name: pa.array(values, (schema or {}).get(name)) for name, values in columns.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(arrays), path, row_group_size=row_group_size)
    return path


def env_of(path, **options):
    options = {"num_envs": 1, "split": "all", "shuffle": False, "image_size": 40, **options}
    return make("dataset", path=path, **options)


def test_geometry3k_shape_parquet_file(tmp_path):
    # hiyouga/geometry3k (EasyR1): `images` a list of Image structs, `problem` holding <image>, `answer` "3".
    rows = 5
    path = write_parquet(
        tmp_path / "geo.parquet",
        {
            "images": [[{"bytes": png(box=(4, 2, 14 + i, 12)), "path": f"{i}.png"}] for i in range(rows)],
            "problem": ["<image>Find x. Round to the nearest tenth."] * rows,
            "answer": [str(i) for i in range(rows)],
        },
        {"images": pa.list_(IMAGE)},
        row_group_size=2,
    )
    env = env_of(path, num_envs=2)
    check_vec_env(env, seed=0)
    obs = env.reset(seed=[3, 4])
    assert obs.instruction[0].startswith("Find x. Round to the nearest tenth. Answer with a number")
    assert env._record_ids == [3, 4] and [r.reward for r in env.records] == ["numeric_match"] * rows
    assert env.step(env.expert_action()).reward.tolist() == [1.0, 1.0]
    # The image shown is the row's: letterboxed 40x20 -> rows 10..29 of the 40x40 square, red at (4..13, 2..11).
    assert obs.image[0, 10 + 5, 8].tolist() == [200, 0, 0] and obs.image[0, 5, 8].tolist() == [0, 0, 0]
    assert isinstance(env._rows, ParquetRows) and len(env._rows) == rows
    copy = pickle.loads(pickle.dumps(env._rows))  # a worker process gets the rows, not open files
    assert copy[4]["image"]["bytes"] == png(box=(4, 2, 18, 12))


def test_hub_repository_folder_shards_and_splits(tmp_path):
    repo = tmp_path / "repo"
    for name, answers in (("train-00000-of-00002", ["a", "b"]), ("train-00001-of-00002", ["c"]),
                          ("test-00000-of-00001", ["d"])):  # fmt: skip
        write_parquet(
            repo / "data" / f"{name}.parquet",
            {
                "image": [{"bytes": png(), "path": None}] * len(answers),
                "question": ["Q?"] * len(answers),
                "answer": answers,
            },  # fmt: skip
            {"image": IMAGE},
        )
    train = env_of(repo)
    assert [r.answer for r in train.records] == ["a", "b", "c"]
    assert train.records[2].where == "train-00001-of-00002.parquet row 0"
    assert [r.answer for r in env_of(repo, hf_split="test").records] == ["d"]
    with pytest.raises(InputError, match=r"has splits test, train; choose one with hf_split \(got 'validation'\)"):
        env_of(repo, hf_split="validation")


def test_readme_card_configs_choose_the_files(tmp_path):
    repo = tmp_path / "repo"
    for name, answer in (("a/one.parquet", "1"), ("a/two.parquet", "2"), ("b/eval.parquet", "3")):
        write_parquet(repo / name, {"image": [png()], "query": ["How many?"], "label": [[answer, "x"]]},
                      {"image": pa.binary()})  # fmt: skip
    card = """---
configs:
- config_name: first
  data_files:
  - split: train
    path: a/*.parquet
  - split: test
    path: b/eval.parquet
- config_name: second
  data_files: b/*.parquet
---
# A card
"""
    (repo / "README.md").write_text(card)
    with pytest.raises(InputError, match=r"declares configs first, second; choose one with hf_config"):
        env_of(repo)
    first = env_of(repo, hf_config="first")
    assert [r.answer for r in first.records] == [("1", "x"), ("2", "x")]  # ChartQA's list of accepted labels
    assert [r.answer for r in env_of(repo, hf_config="first", hf_split="test").records] == [("3", "x")]
    assert [r.answer for r in env_of(repo, hf_config="second").records] == [("3", "x")]  # a bare glob: train
    # One accepted label is one answer: a number is scored by numeric_match, ChartQA's relaxed accuracy with rel_tol.
    write_parquet(
        repo / "b/eval.parquet", {"image": [png()], "query": ["Peak?"], "label": [["12"]]}, {"image": pa.binary()}
    )
    chart = env_of(repo, hf_config="second", reward_kwargs={"numeric_match": {"rel_tol": 0.05}})
    assert (chart.records[0].answer, chart.records[0].reward) == ("12", "numeric_match")
    chart.reset(seed=0)
    assert chart.step(["<answer>12.5</answer>"]).reward.tolist() == [1.0]  # within 5%
    chart.reset(seed=0)
    assert chart.step(["<answer>12.7</answer>"]).reward.tolist() == [0.0]
    with pytest.raises(InputError, match=r"config 'second' has splits train; .*got 'test'"):
        env_of(repo, hf_config="second", hf_split="test")
    (repo / "README.md").write_text(card.replace("default", "").replace("- config_name: second", "- config_name: "
                                    "second\n  default: true"))  # fmt: skip
    assert len(env_of(repo).records) == 1  # the default config


def test_image_paths_in_parquet_are_checked_at_load(tmp_path):
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(png())
    columns = {
        "image": [{"bytes": None, "path": "img/a.png"}, {"bytes": None, "path": "img/gone.png"}],
        "instruction": ["Click the red box.", "Click."],
        "bbox": [[4, 2, 14, 12], [1, 1, 2, 2]],
    }
    path = write_parquet(tmp_path / "screens.parquet", columns, {"image": IMAGE})
    with pytest.raises(InputError, match=r"screens.parquet row 1: field 'image': file .*gone.png not found"):
        env_of(path)
    env = env_of(path, bad_records="skip", reward="point_in_box")
    assert env.records[0].size == (40, 20) and env.records[0].image.endswith("a.png")
    env.reset(seed=0)
    assert env.step(env.expert_action()).info["success"].tolist() == [True]


def test_a_bad_embedded_image_is_named_at_first_use_and_a_missing_one_at_load(tmp_path):
    columns = {"image": [png(), png()[:30]], "question": ["Q?", "Q?"], "answer": ["a", "b"]}
    env = env_of(write_parquet(tmp_path / "cut.parquet", columns, {"image": pa.binary()}))
    env.reset(seed=0)
    with pytest.raises(InputError, match=r"cut.parquet row 1: field 'image': cannot read the image"):
        env.reset(seed=1)
    columns["image"] = [png(), None]
    with pytest.raises(InputError, match=r"null.parquet row 1: field 'image' must be a path"):
        env_of(write_parquet(tmp_path / "null.parquet", columns, {"image": pa.binary()}))


@pytest.mark.parametrize(
    ("columns", "options", "message"),
    [
        ({"question": ["Q?"], "prompt": ["P?"], "answer": ["a"]}, {},
         r"columns 'prompt' and 'question' could each be the question; .*columns=\{question: NAME\}"),
        ({"question": ["Q?"], "answer": ["a"]}, {"columns": {"answer": "reply"}},
         r"columns maps 'answer' to 'reply', which is not a column \(columns: answer, image, question\)"),
        ({"question": ["Q?"], "answer": ["a"]}, {"columns": {"target": "answer"}}, r"columns: unknown role 'target'"),
        ({"text": ["Q?"], "answer": ["a"]}, {}, r"row 0: field 'question' \(or 'instruction'\) .*prompt, problem"),
        ({"question": ["Q?"], "caption": ["a"]}, {}, r"row 0: needs a target"),
        ({"question": ["<image> and <image>"], "answer": ["a"]}, {}, r"row 0: the question holds 2 <image>"),
    ],
)  # fmt: skip
def test_columns_ambiguous_or_missing_are_one_error(tmp_path, columns, options, message):
    path = write_parquet(tmp_path / "d.parquet", {"image": [png()], **columns}, {"image": pa.binary()})
    with pytest.raises(InputError, match=message):
        env_of(path, **options)


def test_columns_mapping_chooses(tmp_path):
    columns = {
        "image": [png()],
        "question": ["Describe the region."],
        "answer": ["the red box"],
        "bbox": [[4, 2, 10, 10]],
    }
    path = write_parquet(tmp_path / "refcoco.parquet", columns, {"image": pa.binary()})
    # RefCOCO as lmms-lab stores it: the referring expression is the answer column; the box is [x, y, w, h].
    env = env_of(path, columns={"question": "answer", "answer": None}, box_format="xywh")
    obs = env.reset(seed=0)
    assert obs.instruction[0].startswith("the red box Answer with <answer>[x1, y1, x2, y2]</answer>")
    assert env.records[0].box == (4.0, 2.0, 14.0, 12.0) and env.records[0].answer is None


def test_chat_messages_give_the_question_and_the_answer(tmp_path):
    (tmp_path / "a.png").write_bytes(png())
    trl = {
        "images": ["a.png"],
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many red boxes?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "1"}]},
        ],
    }
    llava = {"image": "a.png", "conversations": [{"from": "human", "value": "<image>\nWhat colour is the box?"},
                                                 {"from": "gpt", "value": "red"}]}  # fmt: skip
    two_users = {"image": "a.png", "messages": [{"role": "user", "content": "Q?"}, {"role": "user", "content": "Q?"}]}
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (trl, llava)) + "\n")
    env = env_of(path)
    assert [(r.question, r.answer, r.reward) for r in env.records] == [
        ("Be brief. How many red boxes?", "1", "numeric_match"),
        ("What colour is the box?", "red", "exact_match"),
    ]
    path.write_text(json.dumps(two_users) + "\n")
    with pytest.raises(InputError, match=r"chat.jsonl line 1: field 'messages' holds more than one user turn"):
        env_of(path)


def test_verl_prompt_and_ground_truth_columns(tmp_path):
    # verl's geo3k parquet: `prompt` a list of chat turns, the answer inside the `reward_model` struct.
    columns = {
        "images": [[{"bytes": png(), "path": None}]],
        "prompt": [[{"role": "user", "content": "<image>Find y."}]],
        "reward_model": [{"ground_truth": "12", "style": "rule"}],
    }
    env = env_of(write_parquet(tmp_path / "verl.parquet", columns, {"images": pa.list_(IMAGE)}))
    assert (env.records[0].question, env.records[0].answer) == ("Find y.", "12")


def test_several_images_in_a_row_are_refused_by_name(tmp_path):
    columns = {"images": [[png(), png()]], "problem": ["<image><image>Which is larger?"], "answer": ["A"]}
    path = write_parquet(tmp_path / "two.parquet", columns, {"images": pa.list_(pa.binary())})
    with pytest.raises(InputError, match=r"two.parquet row 0: field 'images' holds 2 images; .*one image per record"):
        env_of(path)


@pytest.mark.parametrize(
    ("box", "options"),
    [
        ([4, 2, 14, 12], {}),
        ([4, 2, 10, 10], {"box_format": "xywh"}),
        ([0.1, 0.1, 0.35, 0.6], {"box_units": "0-1"}),
        ([100, 100, 350, 600], {"box_units": "0-1000"}),
        ([100, 100, 250, 500], {"box_units": "0-1000", "box_format": "xywh"}),
    ],
)
def test_box_formats_and_units_become_pixels(tmp_path, box, options):
    # A 40x20 image: the red box is [4, 2, 14, 12] in pixels, whatever the data's format and units.
    (tmp_path / "a.png").write_bytes(png())
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text(json.dumps({"image": "a.png", "question": "Find it.", "bbox": box}) + "\n")
    embedded = write_parquet(tmp_path / "d.parquet", {"image": [png()], "question": ["Find it."], "bbox": [box]},
                             {"image": pa.binary()})  # fmt: skip
    expected = torch.tensor([[4.0, 12.0, 14.0, 22.0]])  # letterboxed into 40x40: 10 rows of black on top
    for path in (jsonl, embedded):
        env = env_of(path, **options)
        env.reset(seed=0)
        torch.testing.assert_close(env._target_boxes, expected)
        assert env.step(env.expert_action()).reward.tolist() == [1.0]


def test_boxes_outside_are_named(tmp_path):
    (tmp_path / "a.png").write_bytes(png())
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text(json.dumps({"image": "a.png", "question": "Q?", "bbox": [30, 2, 14, 12]}) + "\n")
    with pytest.raises(InputError, match=r"line 1: field 'bbox' = \[30.0, 2.0, 44.0, 14.0\] lies outside the 40x20"):
        env_of(jsonl, box_format="xywh")
    with pytest.raises(InputError, match=r"line 1: field 'bbox' must be \[x, y, w, h\] with w > 0"):
        jsonl.write_text(json.dumps({"image": "a.png", "question": "Q?", "bbox": [3, 2, -1, 12]}) + "\n")
        env_of(jsonl, box_format="xywh")
    path = write_parquet(tmp_path / "d.parquet", {"image": [png()], "question": ["Q?"], "point": [[0.5, 1.2]]},
                         {"image": pa.binary()})  # fmt: skip
    with pytest.raises(InputError, match=r"d.parquet row 0: field 'point' = \[0.5, 1.2\] lies outside 0-1"):
        env_of(path, box_units="0-1")  # found at load, before the embedded image is read
    with pytest.raises(InputError, match=r"box_units must be 'pixels', '0-1' or '0-1000'|option 'box_units'"):
        env_of(path, box_units="0-100")


def test_saved_dataset_with_an_image_list_and_public_names(tmp_path):
    datasets = pytest.importorskip("datasets")
    images = [[Image.open(io.BytesIO(png()))] for _ in range(3)]
    features = datasets.Features({"images": datasets.Sequence(datasets.Image()), "problem": datasets.Value("string"),
                                  "solution": datasets.Value("string")})  # fmt: skip
    columns = {"images": images, "problem": ["<image>How many?"] * 3, "solution": ["1", "2", "3"]}
    datasets.Dataset.from_dict(columns, features=features).save_to_disk(str(tmp_path / "saved"))
    env = env_of(tmp_path / "saved")
    assert [(r.question, r.answer, r.image) for r in env.records] == [("How many?", str(i), i - 1) for i in (1, 2, 3)]
    obs = env.reset(seed=1)
    assert obs.image[0, 10 + 5, 8].tolist() == [200, 0, 0]


def test_lenient_reading_of_parquet_names_the_rows_it_leaves_out(tmp_path, capsys):
    (tmp_path / "a.png").write_bytes(png())
    columns = {
        # A list of {bytes, path} structs holding only paths: files, checked at load.
        "images": [[{"bytes": None, "path": "a.png"}], [{"bytes": None, "path": "b.png"}], [], [{"bytes": png()}]],
        "question": ["Q?", "Q?", "Q?", "Q?"],
        "bbox": [[0.1, 0.1, 0.5, 0.5], [0.1, 0.1, 0.5, 0.5], [0.1, 0.1, 0.5, 0.5], [0.1, 0.1, 0.5, 1.5]],
    }
    path = write_parquet(tmp_path / "mixed.parquet", columns, {"images": pa.list_(IMAGE)})
    env = env_of(path, box_units="0-1", bad_records="skip")
    assert [r.where for r in env.records] == ["mixed.parquet row 0"]
    assert env.records[0].box == (4.0, 2.0, 20.0, 10.0) and env.records[0].units == "pixels"  # 40x20 at load
    assert [m.split(": field")[0] for m in env.skipped_records] == [f"mixed.parquet row {n}" for n in (1, 2, 3)]
    assert "b.png not found" in env.skipped_records[0] and "lies outside 0-1" in env.skipped_records[2]
    assert "skipped 3 bad record(s) of 4" in capsys.readouterr().err


def test_a_json_line_with_a_list_of_one_image_and_a_columns_mapping(tmp_path):
    (tmp_path / "a.png").write_bytes(png())
    line = {"images": ["a.png"], "sentence": "<image> the red box", "bbox": [4, 2, 10, 10], "caption": "x"}
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(line) + "\n")
    env = env_of(path, columns={"question": "sentence"}, box_format="xywh")
    assert (env.records[0].question, env.records[0].box) == ("the red box", (4.0, 2.0, 14.0, 12.0))


def test_older_list_layout_and_structs_of_bytes_only(tmp_path):
    # pyarrow before 13 and some writers name a list's child "item", not "element"; some structs hold bytes only.
    only_bytes = pa.struct([("bytes", pa.binary())])
    columns = {"images": [[{"bytes": png()}], [{"bytes": png()}]], "question": ["Q?", "Q?"], "answer": ["a", "b"]}
    path = tmp_path / "old.parquet"
    table = pa.table({"images": pa.array(columns["images"], pa.list_(only_bytes)), "question": columns["question"],
                      "answer": columns["answer"]})  # fmt: skip
    pq.write_table(table, path, use_compliant_nested_type=False)
    assert pq.ParquetFile(path).schema_arrow.field("images").type.value_field.name == "item"
    env = env_of(path)
    assert [r.image for r in env.records] == [0, 1]
    env.reset(seed=1)
    assert env._rows[1]["image"] == {"bytes": png()}


def test_saved_dataset_with_image_structs_not_typed_as_images(tmp_path):
    datasets = pytest.importorskip("datasets")
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "a.png").write_bytes(png())
    structs = [{"bytes": png(box=(0, 0, 40, 20)), "path": None}, {"bytes": None, "path": "a.png"}]
    columns = {"image": structs, "query": ["Q?", "Q?"], "label": [["a"], ["b"]]}
    datasets.Dataset.from_dict(columns).save_to_disk(str(tmp_path / "saved"))
    env = env_of(tmp_path / "saved", image_size=8)
    assert [(r.image, r.answer) for r in env.records] == [(0, "a"), (str(tmp_path / "saved" / "a.png"), "b")]
    obs = env.reset(seed=0)
    assert obs.image[0, 4, 4].tolist() == [200, 0, 0]  # the embedded image: red everywhere
