"""The dataset env using a dataset's own splits as its validation and test parts (`hf_validation_split`,
`hf_test_split`): a hub repository folder of three splits' shards and a saved `DatasetDict`, each split read with the
same column detection and checks, rows named with their split, a split's embedded images read from its own table,
and a part chosen by both a named split and a fraction refused naming both options."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

import sim.tasks.dataset  # noqa: F401  (registers `dataset`)
from sim import make
from sim.errors import InputError
from sim.seeds import EVAL_SEED_BASE, VALIDATION_SEED_BASE

IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
SPLITS = {"train": 4, "validation": 2, "test": 3}
COLOURS = {"train": (200, 0, 0), "validation": (0, 200, 0), "test": (0, 0, 200)}


def png(colour: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (20, 20), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def rows(split: str) -> dict:
    """`SPLITS[split]` rows whose images are the split's colour and whose answers say split and row."""
    count = SPLITS[split]
    return {
        "images": [[{"bytes": png(COLOURS[split]), "path": None}]] * count,
        "problem": [f"<image>Which {split} row is this?"] * count,
        "answer": [f"{split} {i}" for i in range(count)],
    }


@pytest.fixture
def hub(tmp_path):
    """A hub repository folder as Geometry3K ships it: data/<split>-00000-of-00001.parquet."""
    (tmp_path / "repo" / "data").mkdir(parents=True)
    for split in SPLITS:
        table = pa.table({k: pa.array(v, pa.list_(IMAGE) if k == "images" else None) for k, v in rows(split).items()})
        pq.write_table(table, tmp_path / "repo" / "data" / f"{split}-00000-of-00001.parquet", row_group_size=2)
    return tmp_path / "repo"


@pytest.fixture
def saved(tmp_path):
    """The same three splits as a `DatasetDict` saved to disk, images in the Image feature."""
    datasets = pytest.importorskip("datasets")
    parts = {}
    for split in SPLITS:
        columns = rows(split)
        columns["images"] = [[Image.open(io.BytesIO(row[0]["bytes"]))] for row in columns["images"]]
        features = datasets.Features({"images": datasets.Sequence(datasets.Image()), "problem": datasets.Value("string"),
                                      "answer": datasets.Value("string")})  # fmt: skip
        parts[split] = datasets.Dataset.from_dict(columns, features=features)
    datasets.DatasetDict(parts).save_to_disk(str(tmp_path / "saved"))
    return tmp_path / "saved"


def shown(env, seed: int) -> tuple[str, list[int]]:
    """The answer of the record a seed shows, and the colour at the centre of its image."""
    env.reset(seed=seed)
    return env.records[env._record_ids[0]].answer, env._images[0, 20, 20].tolist()


@pytest.mark.parametrize("layout", ["hub", "saved"])
def test_named_splits_are_the_validation_and_test_parts(layout, request):
    path = request.getfixturevalue(layout)
    env = make("dataset", num_envs=1, path=path, hf_validation_split="validation", hf_test_split="test", image_size=40)
    assert [len(env.train_ids), len(env.val_ids), len(env.eval_ids)] == [4, 2, 3]  # no fraction taken from train
    for split, base in (("train", 0), ("validation", VALIDATION_SEED_BASE), ("test", EVAL_SEED_BASE)):
        answers = set()
        for seed in range(base, base + SPLITS[split]):
            answer, colour = shown(env, seed)
            assert answer.startswith(split) and colour == list(COLOURS[split])  # the split's own image
            answers.add(answer)
        assert len(answers) == SPLITS[split]  # each epoch visits every record of the part once
    name = "validation-00000-of-00001.parquet" if layout == "hub" else "saved"
    assert env.records[env.val_ids[1]].where == f"{name} (split 'validation') row 1"
    assert env.records[0].where.endswith("(split 'train') row 0")
    only_validation = make("dataset", num_envs=1, path=path, hf_validation_split="validation", image_size=40)
    assert [len(only_validation.val_ids), len(only_validation.eval_ids)] == [2, 1]  # test: eval_fraction 0.1 of 6


def test_a_bad_row_of_a_named_split_is_named_with_its_split(hub):
    table = pq.read_table(hub / "data" / "validation-00000-of-00001.parquet").to_pydict()
    table["answer"][1] = None
    pq.write_table(pa.table({"images": pa.array(table["images"], pa.list_(IMAGE)), "problem": table["problem"],
                             "answer": table["answer"]}), hub / "data" / "validation-00000-of-00001.parquet")  # fmt: skip
    with pytest.raises(InputError, match=r"^validation-00000-of-00001.parquet \(split 'validation'\) row 1: needs a"):
        make("dataset", num_envs=1, path=hub, hf_validation_split="validation")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"hf_validation_split": "validation", "val_fraction": 0.2},
         r"^hf_validation_split='validation' and val_fraction=0.2 both choose the validation records; give one"),
        ({"hf_test_split": "test", "eval_fraction": 0.2},
         r"^hf_test_split='test' and eval_fraction=0.2 both choose the test records; give one"),
        ({"hf_test_split": "train"}, r"^hf_split and hf_test_split both name the split 'train'"),
        ({"hf_validation_split": "dev"}, r"has splits test, train, validation; choose one with hf_validation_split "
                                         r"\(got 'dev'\)"),
        ({"hf_validation_split": ""}, r"^hf_validation_split must be a split's name"),
    ],
)  # fmt: skip
def test_named_split_options_are_checked(hub, options, message):
    with pytest.raises(InputError, match=message):
        make("dataset", num_envs=1, path=hub, **options)


def test_named_splits_need_data_that_has_splits(tmp_path, saved):
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    (tmp_path / "d.jsonl").write_text(json.dumps({"image": "a.png", "question": "Q?", "answer": "a"}) + "\n")
    with pytest.raises(InputError, match=r"^hf_test_split='test' names a split of a repository folder .* is one file"):
        make("dataset", num_envs=1, path=tmp_path / "d.jsonl", hf_test_split="test")
    with pytest.raises(InputError, match=r"has splits train, validation, test; choose one with hf_test_split"):
        make("dataset", num_envs=1, path=saved, hf_test_split="held_out")
    flat = tmp_path / "flat"
    flat.mkdir()
    pq.write_table(pa.table({"image": pa.array([{"bytes": png((1, 2, 3)), "path": None}], IMAGE),
                             "question": ["Q?"], "answer": ["a"]}), flat / "part.parquet")  # fmt: skip
    with pytest.raises(InputError, match=r"has splits none \(no parquet file is named by a split\); choose one with "
                                         r"hf_validation_split"):  # fmt: skip
        make("dataset", num_envs=1, path=flat, hf_validation_split="validation")
