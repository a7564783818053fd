"""Checkpoints and resume: a run stopped or killed after step k and resumed ends where an uninterrupted run ends.

The runs train a random tiny Qwen2-VL. On the plain grounding task its babble never holds a box, so every reward and
every advantage is 0 and nothing would move; the in-process runs use `grounding_letters` (conftest), whose dense
extra reward gives GRPO a real gradient, and the subprocess run (which cannot see a test-registered env) moves the
weights with a k1 KL term instead, whose gradient does not vanish at the reference.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from mmrl.runtime.checkpoint import (
    MANIFEST,
    checkpoint_problem,
    latest_checkpoint,
    list_checkpoints,
    load_training_state,
    save_checkpoint,
)
from mmrl.runtime.metrics import MetricsLogger, read_metrics
from mmrl.trainer import train
from sim.errors import InputError

REPO = Path(__file__).resolve().parents[2]


def final_weights(output_dir: Path) -> dict[str, torch.Tensor]:
    path = latest_checkpoint(output_dir)
    assert path is not None, f"no checkpoint in {output_dir}"
    return load_file(path / "model.safetensors")


def assert_same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], atol: float = 0.0) -> None:
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


def training_rows(output_dir: Path) -> list[dict]:
    """The per-step training rows of metrics.jsonl, without timings (which differ between any two runs)."""
    rows = [m for m in read_metrics(output_dir / "metrics.jsonl") if "reward/total" in m]
    return [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in rows]


def assert_same_rows(got: list[dict], want: list[dict], keys: tuple[str, ...] | None = None) -> None:
    assert [m["step"] for m in got] == [m["step"] for m in want]
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for key in keys or tuple(w):
            assert g[key] == pytest.approx(w[key], abs=1e-6), f"step {w['step']}: {key} {g[key]} != {w[key]}"


# A learning-rate warm-up and cosine decay, so that a scheduler restarted from step 0 shows in the weights and the lr.
RESUMED_RUN = ("trainer.total_steps=4", "trainer.warmup_steps=2", "trainer.lr_schedule=cosine",
               "trainer.min_lr_ratio=0.1")  # fmt: skip
RESUMED_LRS = [1e-3 * m for m in (0.5, 1.0, 0.55, 0.1)]  # warm-up 1/2, 2/2; then 0.1 + 0.9 * (1 + cos(pi * p)) / 2


@pytest.fixture(scope="module")
def uninterrupted_run(tmp_path_factory, tiny_run_config, letters_env):
    """Four steps in one go, a checkpoint after each: the run every resumed one must reproduce."""
    out = tmp_path_factory.mktemp("uninterrupted")
    cfg = tiny_run_config(out, f"env.name={letters_env}", *RESUMED_RUN)
    train(cfg)
    return out


def test_uninterrupted_run_moved_the_weights(uninterrupted_run):
    """Guards the resume tests below against passing vacuously (weights that never move are easy to restore)."""
    checkpoints = list_checkpoints(uninterrupted_run)
    first, last = (load_file(p / "model.safetensors") for p in (checkpoints[0], checkpoints[-1]))
    assert any(not torch.equal(first[k], last[k]) for k in last)
    rewards = [m["reward/total"] for m in training_rows(uninterrupted_run)]
    assert len(set(rewards)) > 1
    assert [m["lr"] for m in training_rows(uninterrupted_run)] == pytest.approx(RESUMED_LRS, rel=1e-9)


def test_stopped_and_resumed_run_matches_the_uninterrupted_one(
    uninterrupted_run, tmp_path, tiny_run_config, letters_env
):
    cfg = tiny_run_config(tmp_path, f"env.name={letters_env}", *RESUMED_RUN)
    train(cfg, stop_after=2)
    assert latest_checkpoint(tmp_path).name == "step_00000002"
    assert not (tmp_path / "eval.json").exists()  # stopped before the end-of-run report
    # A fresh process would start from the config alone: no policy object carries over.
    resumed_cfg = tiny_run_config(tmp_path, f"env.name={letters_env}", *RESUMED_RUN, "resume=true")
    train(resumed_cfg)
    assert latest_checkpoint(tmp_path).name == "step_00000004"
    assert_same_weights(final_weights(tmp_path), final_weights(uninterrupted_run), atol=1e-6)
    assert_same_rows(training_rows(tmp_path), training_rows(uninterrupted_run))
    # The held-out score before training is carried in the checkpoint, not re-measured on the trained policy.
    before = json.loads((tmp_path / "eval.json").read_text())["before"]
    assert before == json.loads((uninterrupted_run / "eval.json").read_text())["before"]


def test_resuming_a_finished_run_leaves_its_metrics_as_they_were(
    uninterrupted_run, tmp_path, tiny_run_config, letters_env
):
    """Resumed at its last step, a finished run evaluates again but does not log the final evaluation twice."""
    import shutil

    shutil.copytree(uninterrupted_run, tmp_path, dirs_exist_ok=True)
    before = read_metrics(tmp_path / "metrics.jsonl")
    assert sum(1 for m in before if m["step"] == 4 and any(k.startswith("eval/") for k in m)) == 1
    train(tiny_run_config(tmp_path, f"env.name={letters_env}", *RESUMED_RUN, "resume=true"))
    after = read_metrics(tmp_path / "metrics.jsonl")
    strip = lambda rows: [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in rows]  # noqa: E731
    assert strip(after) == strip(before)


def test_metrics_logger_resumed_at_the_last_step_drops_only_the_final_evaluation(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [
        {"step": 0, "eval/score": 0.1}, {"step": 1, "reward/total": 0.2}, {"step": 2, "reward/total": 0.3},
        {"step": 2, "eval/score": 0.5},
    ]  # fmt: skip
    path.write_text("".join(json.dumps(m) + "\n" for m in lines))
    MetricsLogger(path, resume_step=2, final_step=2)
    assert read_metrics(path) == lines[:3]
    path.write_text("".join(json.dumps(m) + "\n" for m in lines))
    MetricsLogger(path, resume_step=2, final_step=4)  # a mid-run evaluation at the resumed step stays
    assert read_metrics(path) == lines


def test_resume_keeps_the_initial_policy_as_kl_reference(tmp_path, tiny_run_config, letters_env):
    """With kl_coef > 0 the reference is the policy before training, in a resumed run as in an uninterrupted one."""
    overrides = (f"env.name={letters_env}", "trainer.total_steps=2", "algo.kl_coef=0.5", "algo.kl_estimator=k3")
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    train(tiny_run_config(whole, *overrides))
    train(tiny_run_config(parts, *overrides), stop_after=1)
    train(tiny_run_config(parts, *overrides, "resume=true"))
    assert training_rows(whole)[1]["loss/kl"] > 0  # the second step is measured against a different policy
    assert_same_rows(training_rows(parts), training_rows(whole), keys=("loss/kl", "loss/policy", "reward/total"))
    assert_same_weights(final_weights(parts), final_weights(whole), atol=1e-6)


# ---------------------------------------------------------------------------------------------- a real kill


KILL_RUN = {
    "model": {"path": "tiny:qwen2_vl", "prompt_template": "{instruction}"},
    "env": {"name": "grounding", "options": {"image_size": 112}},
    "sampling": {"max_new_tokens": 6},
    # Zero rewards on plain grounding: the k1 KL term (gradient = kl_coef * grad log p) is what moves the weights.
    "algo": {"group_size": 2, "kl_coef": 0.5, "kl_estimator": "k1"},
    "trainer": {
        "total_steps": 4,
        "prompts_per_step": 2,
        "eval_episodes": 2,
        "eval_batch_size": 2,
        "save_every": 1,
        "lr": 1e-3,
        "lr_schedule": "linear",  # the resumed run must continue the decay where the killed one left it
        "warmup_steps": 1,
        "min_lr_ratio": 0.2,
        "threads": 1,
    },
}
KILL_LRS = [1e-3 * m for m in (1.0, 0.2 + 0.8 * 2 / 3, 0.2 + 0.8 / 3, 0.2)]


def mmrl_train(config: Path, log: Path, *overrides: str) -> subprocess.Popen:
    """`mmrl train` in a child process; its stderr goes to `log` (a pipe nobody reads could fill and block it)."""
    with open(log, "w") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "mmrl", "train", str(config), *overrides],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )


def test_killed_run_resumes_to_the_weights_of_an_uninterrupted_one(tmp_path):
    config = tmp_path / "kill.yaml"
    config.write_text(yaml.safe_dump(KILL_RUN))
    killed = tmp_path / "killed"

    log = tmp_path / "stderr.txt"
    proc = mmrl_train(config, log, f"output_dir={killed}")
    try:
        target = killed / "checkpoints" / "step_00000002"
        deadline = time.monotonic() + 120
        while not target.exists():
            assert proc.poll() is None, f"the run ended before step 2:\n{log.read_text()}"
            assert time.monotonic() < deadline, "no checkpoint of step 2 after 120 s"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    newest = latest_checkpoint(killed)
    assert newest.name in ("step_00000002", "step_00000003"), "the kill came too late"
    assert not (killed / "eval.json").exists()
    # Then the newest complete checkpoint is damaged too (a disk that filled up, a copy cut short): the resumed run
    # skips it, names it, and continues from the one before.
    cut(newest / "model.safetensors")

    resumed = mmrl_train(config, log, f"output_dir={killed}", "resume=true")
    assert resumed.wait(timeout=300) == 0, log.read_text()
    printed = log.read_text()
    assert re.search(rf"skipping checkpoint {newest.name} .*: model.safetensors is \d+ bytes", printed), printed
    assert f"step {int(newest.name.removeprefix('step_')) - 1})" in printed, printed  # resumed from the one before

    # The uninterrupted reference, in this process, from the same file.
    from mmrl.runtime.config import load_config

    whole = tmp_path / "whole"
    train(load_config(config, [f"output_dir={whole}"]))
    reference = final_weights(whole)
    previous = load_file(list_checkpoints(whole)[-2] / "model.safetensors")
    assert any(not torch.equal(reference[k], previous[k]) for k in reference)  # the KL term did move the weights
    assert_same_weights(final_weights(killed), reference, atol=1e-6)
    # loss/kl is left out: it depends on which policy is the reference (see the KL-reference test above).
    assert_same_rows(
        training_rows(killed), training_rows(whole), keys=("reward/total", "loss/policy", "grad_norm", "lr")
    )
    assert [m["lr"] for m in training_rows(killed)] == pytest.approx(KILL_LRS, rel=1e-9)


# ---------------------------------------------------------------------------------------------- atomicity


def test_latest_checkpoint_ignores_interrupted_writes_and_strays(tmp_path):
    root = tmp_path / "checkpoints"
    for name in ("step_00000002", "step_00000010", ".tmp_step_00000011_4242", "step_12"):
        (root / name).mkdir(parents=True)
    (root / "step_00000020").write_text("a file, not a checkpoint folder")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000002", "step_00000010"]
    # Both are empty folders, so neither is a complete checkpoint: named, not taken.
    with pytest.raises(
        InputError, match=r"no complete checkpoint .*step_00000010: the folder is empty; step_00000002"
    ):
        latest_checkpoint(tmp_path)
    assert latest_checkpoint(tmp_path / "nowhere") is None


# ---------------------------------------------------------------------------------------------- damage


def cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def garble(path: Path) -> None:
    """The same size, other bytes (not even UTF-8): only a checksum tells."""
    path.write_bytes(b"\xff" * path.stat().st_size)


DAMAGE = {
    "truncated_weights": (lambda p: cut(p / "model.safetensors"), r"model.safetensors is \d+ bytes, \d+ when saved"),
    "deleted_optimiser_state": (lambda p: (p / "training_state.pt").unlink(), r"training_state.pt is missing"),
    "cut_trainer_state": (lambda p: cut(p / "trainer_state.json"), r"trainer_state.json is \d+ bytes"),
    "garbage_trainer_state": (lambda p: garble(p / "trainer_state.json"), r"trainer_state.json does not match"),
    "empty_folder": (lambda p: (shutil.rmtree(p), p.mkdir()), r"the folder is empty"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_resume_skips_a_damaged_newest_checkpoint_and_matches_the_uninterrupted_run(
    damage, uninterrupted_run, tmp_path, tiny_run_config, letters_env, capsys
):
    """The newest checkpoint (step 4) damaged one way: resume warns naming it and why, continues from step 3, and
    ends with the uninterrupted run's weights and metrics history."""
    shutil.copytree(uninterrupted_run, tmp_path, dirs_exist_ok=True)
    newest = tmp_path / "checkpoints" / "step_00000004"
    spoil, reason = DAMAGE[damage]
    spoil(newest)
    capsys.readouterr()
    train(tiny_run_config(tmp_path, f"env.name={letters_env}", *RESUMED_RUN, "resume=true"))
    err = capsys.readouterr().err
    assert re.search(rf"skipping checkpoint step_00000004 \(newer than step_00000003\): {reason}", err), err
    assert re.search(r"resumed from .*step_00000003 \(step 3\)", err), err
    assert checkpoint_problem(newest) is None  # step 4 written again, whole
    assert_same_weights(final_weights(tmp_path), final_weights(uninterrupted_run), atol=1e-6)
    assert_same_rows(training_rows(tmp_path), training_rows(uninterrupted_run))


def test_a_write_cut_off_mid_checkpoint_then_a_damaged_newest_resumes_from_the_one_before(
    uninterrupted_run, tmp_path, tiny_run_config, letters_env, capsys, monkeypatch
):
    """What a kill -9 in the middle of writing step 3 leaves (the weights written, the optimiser state not, under the
    temporary name), then step 2 damaged as well: resume takes step 1 and ends where the uninterrupted run ends."""
    import mmrl.runtime.checkpoint as checkpoint_module

    real_save = torch.save

    def killed_at_step_3(obj, path, *args, **kwargs):
        if ".tmp_step_00000003" in str(path):
            raise KeyboardInterrupt("killed while writing step 3")  # not an Exception: nothing cleans up after it
        return real_save(obj, path, *args, **kwargs)

    cfg = tiny_run_config(tmp_path, f"env.name={letters_env}", *RESUMED_RUN)
    monkeypatch.setattr(checkpoint_module.torch, "save", killed_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        train(cfg)
    monkeypatch.undo()
    left = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert left[1:] == ["step_00000001", "step_00000002"] and left[0].startswith(".tmp_step_00000003_"), left
    garble(tmp_path / "checkpoints" / "step_00000002" / "trainer_state.json")
    capsys.readouterr()
    train(tiny_run_config(tmp_path, f"env.name={letters_env}", *RESUMED_RUN, "resume=true"))
    err = capsys.readouterr().err
    assert "skipping checkpoint step_00000002 (newer than step_00000001): trainer_state.json does not match" in err
    assert re.search(r"resumed from .*step_00000001 \(step 1\)", err), err
    assert_same_weights(final_weights(tmp_path), final_weights(uninterrupted_run), atol=1e-6)
    assert_same_rows(training_rows(tmp_path), training_rows(uninterrupted_run))


def test_resume_with_no_complete_checkpoint_refuses_and_leaves_the_folder_as_it_was(uninterrupted_run, tmp_path):
    from mmrl.runtime.checkpoint import resume_checkpoint

    shutil.copytree(uninterrupted_run, tmp_path, dirs_exist_ok=True)
    cut(tmp_path / "checkpoints" / "step_00000004" / "model.safetensors")
    (tmp_path / "checkpoints" / "step_00000003" / "training_state.pt").unlink()
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    message = r"resume=true: no complete checkpoint .*step_00000004: model.safetensors .*step_00000003: training_state"
    with pytest.raises(InputError, match=message + r".*would overwrite the earlier run's metrics.jsonl"):
        resume_checkpoint(tmp_path)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    (tmp_path / "checkpoints").rename(tmp_path / "moved")  # no checkpoint at all, but the history is there
    with pytest.raises(InputError, match=r"no checkpoint in .* holds a metrics.jsonl"):
        resume_checkpoint(tmp_path)
    assert resume_checkpoint(tmp_path / "fresh") is None  # nothing trained there (train then refuses resume=true)


def test_a_checkpoint_without_a_manifest_is_checked_by_what_it_must_hold(tmp_path, saver):
    """Folders written before manifests existed still resume when whole, and their damage is still found."""
    path = saver(tmp_path, 1)
    (path / MANIFEST).unlink()
    assert checkpoint_problem(path) is None
    assert latest_checkpoint(tmp_path) == path
    weights = path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-100])
    assert re.search(r"model.safetensors is \d+ bytes, its header says \d+", checkpoint_problem(path))
    weights.write_bytes(data)
    (path / "trainer_state.json").write_text('{"step": ')
    assert "trainer_state.json is not readable JSON" in checkpoint_problem(path)
    (path / "trainer_state.json").write_bytes(b"\xff\xfe{}")
    assert "trainer_state.json is not readable JSON (UnicodeDecodeError" in checkpoint_problem(path)


def test_the_manifest_lists_every_file_with_its_size(tmp_path, saver):
    path = saver(tmp_path, 1)
    listed = json.loads((path / MANIFEST).read_text())["files"]
    on_disk = {p.relative_to(path).as_posix(): p.stat().st_size for p in path.rglob("*") if p.is_file()}
    assert {name: entry["size"] for name, entry in listed.items()} == {
        k: v for k, v in on_disk.items() if k != MANIFEST
    }
    assert "sha256" in listed["trainer_state.json"] and "sha256" in listed["config.json"]


@pytest.fixture
def saver(tiny_policy):
    """`save(output_dir, step, keep)` writes a real checkpoint of a tiny policy with AdamW and a scheduler."""
    policy = tiny_policy("qwen2_vl", seed=0)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)

    def save(output_dir: Path, step: int, keep: int = 2) -> Path:
        return save_checkpoint(
            output_dir, step, policy, optimizer, scheduler, {"eval_before": {"iou": 0.5}}, keep=keep
        )

    return save


def test_save_checkpoint_writes_a_complete_folder_and_prunes_old_ones(tmp_path, saver):
    for step in (1, 2, 3):
        saver(tmp_path, step, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_00000002", "step_00000003"]  # no temporary folder left behind either
    state, states = load_training_state(tmp_path / "checkpoints" / "step_00000003")
    assert state == {"eval_before": {"iou": 0.5}, "step": 3}
    assert {"optimizer", "scheduler", "rng"} <= states.keys()
    assert (tmp_path / "checkpoints" / "step_00000003" / "model.safetensors").is_file()


def test_save_checkpoint_keep_zero_keeps_all_and_a_resaved_step_is_replaced(tmp_path, saver):
    for step in (1, 2, 3):
        saver(tmp_path, step, keep=0)
    assert len(list_checkpoints(tmp_path)) == 3
    stale = tmp_path / "checkpoints" / "step_00000003" / "stale.txt"
    stale.write_text("left from the first save of step 3")
    saver(tmp_path, 3, keep=0)
    assert not stale.exists()


def test_metrics_logger_on_resume_drops_later_lines_and_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "reward/total": s / 10}) for s in range(4)]
    path.write_text("\n".join(lines) + '\n{"step": 4, "reward/to')  # killed in the middle of a write
    logger = MetricsLogger(path, resume_step=2)
    assert [m["step"] for m in read_metrics(path)] == [0, 1, 2]
    logger.log(3, {"reward/total": torch.tensor(0.25), "loss/policy": math.nan})
    rows = read_metrics(path)
    assert [m["step"] for m in rows] == [0, 1, 2, 3]
    assert rows[-1] == {"step": 3, "reward/total": 0.25, "loss/policy": None}  # tensors synced, NaN as null


def test_metrics_logger_without_resume_starts_a_fresh_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 9}) + "\n")
    MetricsLogger(path).log(1, {"x": 1})
    assert read_metrics(path) == [{"step": 1, "x": 1.0}]


class RunsCode:
    """Pickles as a call of `os.mkdir(path)`: what a hostile `training_state.pt` could hold instead."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)


def test_a_training_state_whose_pickle_would_run_code_is_refused_and_not_run(
    uninterrupted_run, tmp_path, monkeypatch, tiny_run_config, letters_env
):
    from mmrl.runtime import checkpoint

    shutil.copytree(uninterrupted_run, tmp_path / "run")
    folder = latest_checkpoint(tmp_path / "run")
    states = load_training_state(folder)[1]  # a real one loads with weights_only (the queued steps' types allowed)
    assert set(states) >= {"optimizer", "scheduler", "rng"}
    ran = tmp_path / "ran"
    torch.save({**states, "payload": RunsCode(str(ran))}, folder / "training_state.pt")
    (folder / MANIFEST).unlink()
    (folder / MANIFEST).write_text(json.dumps(checkpoint._manifest(folder)))  # complete, as a colleague hands it over
    assert checkpoint_problem(folder) is None
    monkeypatch.delenv(checkpoint.TRUST_ENV, raising=False)
    with pytest.raises(InputError, match=r"training_state.pt holds objects other than tensors .*MMRL_TRUST_CHECKPOINTS"):
        load_training_state(folder)
    with pytest.raises(InputError, match="could run code"):
        train(tiny_run_config(tmp_path / "run", f"env.name={letters_env}", *RESUMED_RUN, "resume=true"))
    assert not ran.exists()
    monkeypatch.setenv(checkpoint.TRUST_ENV, "1")  # the documented opt-in loads a full pickle: it runs
    load_training_state(folder)
    assert ran.is_dir()


def test_a_new_run_never_writes_over_an_earlier_one(uninterrupted_run, tmp_path, tiny_run_config, letters_env):
    run = tmp_path / "run"
    shutil.copytree(uninterrupted_run, run)
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    options = (f"env.name={letters_env}", "trainer.total_steps=1")
    with pytest.raises(InputError, match=r"output_dir .*run holds an earlier run \(.*metrics.jsonl\): continue it with "
                       r"resume=true, or start a new run there with overwrite=true"):  # fmt: skip
        train(tiny_run_config(run, *options))
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()} == before  # untouched
    train(tiny_run_config(run, *options, "overwrite=true"))  # asked for: the earlier run is moved aside, whole
    aside = tmp_path / "run.previous-1"
    assert {p.relative_to(aside): p.read_bytes() for p in aside.rglob("*") if p.is_file()} == before
    assert [c.name for c in list_checkpoints(run)] == ["step_00000001"]  # the new run's, and only its
    assert [m["step"] for m in training_rows(run)] == [1]


def test_resume_with_nothing_to_resume_says_so_and_writes_nothing(tmp_path, tiny_run_config, letters_env):
    with pytest.raises(InputError, match=r"resume=true: nothing to resume in .*misspelt .*drop resume=true"):
        train(tiny_run_config(tmp_path / "misspelt", f"env.name={letters_env}", "resume=true"))
    assert not (tmp_path / "misspelt").exists()


# ---------------------------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_stops_after_the_step_checkpointed_and_says_how_to_resume(tmp_path):
    """SIGINT mid-run: the step in progress ends and is checkpointed (off the save_every schedule), one line names
    the checkpoint and the command that continues; the resumed run ends on the uninterrupted run's weights."""
    run = {**KILL_RUN, "trainer": {**KILL_RUN["trainer"], "save_every": 0}}  # only the last step, or a stop's
    config = tmp_path / "stop.yaml"
    config.write_text(yaml.safe_dump(run))
    stopped, log = tmp_path / "stopped", tmp_path / "stderr.txt"
    proc = mmrl_train(config, log, f"output_dir={stopped}")
    try:
        deadline = time.monotonic() + 120
        while "grpo:" not in log.read_text():  # the steps have started
            assert proc.poll() is None, f"the run ended before its steps:\n{log.read_text()}"
            assert time.monotonic() < deadline, "no step after 120 s"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=120) == 130, log.read_text()
    finally:
        proc.kill()
        proc.wait()
    printed = log.read_text()
    newest = latest_checkpoint(stopped)
    assert newest is not None and newest.name != "step_00000004", printed  # stopped before the end
    last = printed.strip().splitlines()[-1]
    assert last.startswith("mmrl: stopped (SIGINT); the last checkpoint is") and str(newest) in last, printed
    assert last.endswith("resume=true") and "Traceback" not in printed, printed
    assert "grpo:" in printed and "Writing model shards" not in printed, printed  # a save leaves the bar whole

    resumed = mmrl_train(config, log, f"output_dir={stopped}", "resume=true")
    assert resumed.wait(timeout=300) == 0, log.read_text()
    from mmrl.runtime.config import load_config

    whole = tmp_path / "whole"
    train(load_config(config, [f"output_dir={whole}"]))
    assert_same_weights(final_weights(stopped), final_weights(whole), atol=1e-6)
    assert_same_rows(training_rows(stopped), training_rows(whole), keys=("reward/total", "loss/policy", "grad_norm"))


def test_a_first_signal_asks_to_stop_and_a_second_stops_at_once():
    from mmrl.runtime.distributed import World
    from mmrl.runtime.stopping import StopRequest

    before = signal.getsignal(signal.SIGTERM)
    with StopRequest() as stop:
        assert not stop.asked(World())
        os.kill(os.getpid(), signal.SIGTERM)  # delivered to this, the main, thread before kill returns
        assert stop.signal_name == "SIGTERM" and stop.asked(World())
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is before  # the handlers are put back
