"""The `mmrl` command: train, eval and envs; mistakes are exit code 2 with a message that names them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from mmrl.cli import main
from mmrl.runtime.checkpoint import latest_checkpoint

REPO = Path(__file__).resolve().parents[2]
PRESET = str(REPO / "configs" / "grounding_tiny.yaml")
TINY = ["model.path=tiny:qwen2_vl", "env.options.image_size=112", "sampling.max_new_tokens=4"]


@pytest.fixture(scope="module")
def one_step_checkpoint(tmp_path_factory) -> Path:
    """The final checkpoint of a one-step `mmrl train` run of a random tiny model."""
    out = tmp_path_factory.mktemp("cli_run")
    overrides = [
        *TINY,
        "algo.group_size=2",
        "trainer.prompts_per_step=1",
        "trainer.total_steps=1",
        "trainer.eval_episodes=2",
        "trainer.threads=1",
        f"output_dir={out}",
    ]
    assert main(["train", PRESET, *overrides]) == 0
    path = latest_checkpoint(out)
    assert path is not None and path.name == "step_00000001"
    return path


def test_typo_in_an_override_exits_2_naming_the_key_and_the_valid_ones(capsys):
    assert main(["train", PRESET, "trainer.totl_steps=3"]) == 2
    err = capsys.readouterr().err
    assert "totl_steps" in err
    assert "total_steps" in err and "prompts_per_step" in err


def test_bad_value_exits_2_naming_the_key(capsys):
    assert main(["train", PRESET, "algo.aggregation=token_sum"]) == 2
    assert "algo.aggregation" in capsys.readouterr().err


def test_missing_config_file_exits_2(tmp_path, capsys):
    assert main(["train", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err


def test_unknown_env_option_exits_2_naming_it(tmp_path, capsys):
    code = main(["train", PRESET, *TINY, "env.options.image_sise=64", f"output_dir={tmp_path}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "image_sise" in err and "image_size" in err


def test_unknown_env_name_exits_2_listing_the_registered_ones(tmp_path, capsys):
    assert main(["train", PRESET, *TINY, "env.name=groundng", f"output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "groundng" in err and "grounding" in err


def test_envs_lists_grounding(capsys):
    assert main(["envs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.split()[:2] == ["grounding", "text"] for line in lines), lines


def test_envs_lists_real_values_for_every_env(capsys):
    assert main(["envs"]) == 0
    rows = {line.split()[0]: line.split()[1:4] for line in capsys.readouterr().out.splitlines()[1:]}
    assert not [name for name, columns in rows.items() if "?" in columns], rows
    assert rows["push"] == ["continuous", "64x64", "20"]  # 20 pushes an episode, not 1
    assert rows["libero"][2] == "suite"  # set by an option: named, not guessed


HEAVY = ("torch", "transformers", "sim", "numpy")


@pytest.mark.parametrize(
    "code",
    [
        "import mmrl.cli",
        "from mmrl.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass",
        "from mmrl.cli import main\ntry:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass",
    ],
    ids=["import", "help", "train_help"],
)
def test_the_command_line_imports_no_heavy_module_before_a_command_runs(code):
    # A subprocess: this test process has imported all of them already. Asserting on modules, not seconds, so the
    # test fails for the cause (an eager import in mmrl.cli) and not for a slow machine.
    probe = f"{code}\nimport sys\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


def test_no_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main([])
    assert exit_.value.code == 2


def test_eval_prints_the_held_out_line_for_a_checkpoint(one_step_checkpoint, tmp_path, capsys):
    args = ["eval", PRESET, *TINY, f"checkpoint={one_step_checkpoint}", "trainer.eval_episodes=2",
            f"output_dir={tmp_path}"]  # fmt: skip
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "eval: 100%" in err, err  # the held-out evaluation's bar
    assert re.search(r"^held-out mean IoU: \d+\.\d{3}$", out, re.MULTILINE), out
    for key in ("iou", "format", "reward", "success"):
        assert re.search(rf"^{key}\s+\d+\.\d{{4}}$", out, re.MULTILINE), f"no {key} line in:\n{out}"
    assert not (tmp_path / "eval").exists()  # written next to the checkpoint, not into output_dir
    markdown = (one_step_checkpoint.parent / "step_00000001.eval" / "eval.md").read_text()
    iou = re.search(r"^held-out mean IoU: (\d+\.\d{3})$", out, re.MULTILINE).group(1)
    assert f"**mean IoU: {iou}**" in markdown and f"checkpoint `{one_step_checkpoint}`" in markdown


def test_eval_with_k_samples_reports_avg_and_pass_at_k(one_step_checkpoint, tmp_path, capsys):
    import json

    out = tmp_path / "eval_out"
    args = ["eval", PRESET, *TINY, f"checkpoint={one_step_checkpoint}", "trainer.eval_episodes=3", "eval.k=4",
            "eval.batch_size=8", "eval.report_items=2", f"output_dir={out}", "trainer.threads=1"]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    for key in ("avg@4", "best@4", "pass@1", "pass@2", "pass@4"):
        assert re.search(rf"^{key}\s+\d+\.\d{{4}}$", printed, re.MULTILINE), f"no {key} line in:\n{printed}"
    report_dir = one_step_checkpoint.parent / "step_00000001.eval"
    report = json.loads((report_dir / "report.json").read_text())
    assert report["k"] == 4 and report["items"] == 3 and len(report["per_item"]) == 3
    assert all(len(item["answers"]) == 4 for item in report["per_item"])
    # The summary is what the items say: avg@k their mean, pass@1 the fraction correct.
    means = [item["mean_iou"] for item in report["per_item"]]
    assert report["sampled"]["avg@4"] == pytest.approx(sum(means) / 3, abs=1e-6)
    assert report["sampled"]["pass@1"] == pytest.approx(sum(i["correct"] for i in report["per_item"]) / 12)
    assert report["sampled"]["pass@4"] >= report["sampled"]["pass@1"]
    markdown = (report_dir / "report.md").read_text()
    assert "## Best items" in markdown and "## Worst items" in markdown
    assert len(list((report_dir / "items").glob("*.png"))) >= 2
    assert main([*args[:-1], "eval.temperature=0"]) == 2  # greedy is always reported; k samples need a temperature
    assert "eval.temperature" in capsys.readouterr().err


def test_eval_with_k_samples_reports_each_kind_of_task(one_step_checkpoint, tmp_path, capsys):
    import json

    out = tmp_path / "eval_out"
    args = ["eval", PRESET, *TINY, f"checkpoint={one_step_checkpoint}", "env.name=dataset",
            "env.options={image_size: 112, eval_fraction: 0.25}", "env.eval_metric=reward", "trainer.eval_episodes=6",
            "eval.k=2", "eval.batch_size=12", f"output_dir={out}", "trainer.threads=1"]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    report_dir = one_step_checkpoint.parent / "step_00000001.eval"
    report = json.loads((report_dir / "report.json").read_text())
    tasks = [item["task"] for item in report["per_item"]]
    assert len(set(tasks)) >= 2 and set(report["per_task"]) == set(tasks)  # the held-out records mix kinds
    for task, row in report["per_task"].items():
        means = [item["mean_reward"] for item in report["per_item"] if item["task"] == task]
        assert row["items"] == len(means) and row["avg@2"] == pytest.approx(sum(means) / len(means), abs=1e-6)
        assert re.search(rf"^{task}: avg@2 \d\.\d{{3}}", printed, re.MULTILINE), printed
    assert "## By task" in (report_dir / "report.md").read_text()


def test_eval_without_checkpoint_exits_2(capsys):
    assert main(["eval", PRESET, *TINY]) == 2
    assert "checkpoint=" in capsys.readouterr().err


def test_eval_of_a_missing_checkpoint_exits_2_naming_it(tmp_path, capsys):
    missing = tmp_path / "checkpoints" / "step_00000099"
    assert main(["eval", PRESET, *TINY, f"checkpoint={missing}"]) == 2
    assert str(missing) in capsys.readouterr().err


def test_eval_split_validation_plays_the_validation_seeds(one_step_checkpoint, tmp_path, capsys):
    import json

    args = ["eval", PRESET, *TINY, f"checkpoint={one_step_checkpoint}", "trainer.eval_episodes=2",
            f"output_dir={tmp_path}", "--split", "validation"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert re.search(r"^validation mean IoU: \d+\.\d{3}$", out, re.MULTILINE), out
    report_dir = one_step_checkpoint.parent / f"{one_step_checkpoint.name}.eval-validation"
    report = json.loads((report_dir / "eval.json").read_text())
    assert report["split"] == "validation" and "validation split" in (report_dir / "eval.md").read_text()


def test_eval_split_is_test_or_validation(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["eval", PRESET, "--split", "train"])
    assert exit_.value.code == 2 and "invalid choice: 'train'" in capsys.readouterr().err


def test_train_ends_by_naming_where_everything_went(one_step_checkpoint):
    from types import SimpleNamespace

    from mmrl.cli import where_it_went

    out = one_step_checkpoint.parents[1]
    printed = where_it_went(SimpleNamespace(output_dir=str(out)))
    assert f"run folder:      {out}" in printed and f"last checkpoint: {one_step_checkpoint}" in printed
    assert f"metrics:         {out / 'metrics.jsonl'}" in printed and f"{out / 'eval.json'}" in printed, printed
