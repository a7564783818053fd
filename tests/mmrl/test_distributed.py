"""FSDP2 under torchrun: two CPU processes (gloo) train exactly what one process generating the same shards trains.

The runs are real `torchrun --nproc_per_node=2 -m mmrl train` subprocesses on the cold-started tiny Qwen3-VL of the
demo, whose boxes miss at 64 px but by varying amounts: with the dense GIoU term, rewards and advantages differ
within groups and the loss has a real gradient; a KL term puts the sharded frozen reference to work as well. The
one-process reference run passes `generation_shards=2`, so it samples each half of the prompts with the seed the
corresponding process uses. Every launch has a timeout and its whole process group is killed on expiry, so a
deadlock fails a test instead of hanging the suite.

Run as a script under torchrun, this file is the worker of the uneven-generation test (see `_worker`), and with the
argument `evaluate` that of the sharded-evaluation test (`_eval_worker`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]
ASSET = "assets/tiny_models/qwen3_vl_warm_start"
RUN = {
    "model": {"path": ASSET, "prompt_template": "{instruction} {image} Answer as <answer>[x1,y1,x2,y2]</answer>."},
    "env": {"name": "grounding", "options": {"image_size": 64, "giou_weight": 1.0}},
    "sampling": {"max_new_tokens": 20, "temperature": 1.0},
    "algo": {"group_size": 2, "kl_coef": 0.05},
    # 4 prompts x 2 samples: 4 rows per process in slices of 3 + 1, 8 rows in one process in 3 + 3 + 2.
    "trainer": {
        "total_steps": 2,
        "prompts_per_step": 4,
        "micro_batch_size": 3,
        "lr": 1e-3,
        # 5 held-out episodes: ranks play 3 + 2 (in batches of 3, 2), one process 4 + 1; the 4 kept samples are rank
        # 0's first 3 and rank 1's first.
        "eval_episodes": 5,
        "eval_batch_size": 4,
        "save_every": 1,
        "threads": 1,
    },
}
COMPARED = ("loss/policy", "loss/kl", "grad_norm", "reward/total", "reward/giou", "completion_len")


def torchrun(log: Path, *args: str, timeout: float = 300) -> str:
    """`torchrun --standalone --nproc_per_node=2 ARGS` (a free rendezvous port), its output, or a failed test."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args]
    with open(log, "w") as out:
        # A session of its own: on a timeout the workers die with the launcher instead of hanging on.
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"torchrun still running after {timeout} s (a deadlock?):\n{log.read_text()[-4000:]}")
    text = log.read_text()
    assert code == 0, text[-6000:]
    return text


def resume_after_step_one(config: Path, two: Path, resumed: Path) -> Path:
    """A copy of the two-process run `two` cut back to its step-1 checkpoint (as if killed there), resumed under
    torchrun into `resumed`; returns `resumed`."""
    shutil.copytree(two, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_00000002")
    log = torchrun(resumed.with_suffix(".log"), "-m", "mmrl", "train", str(config), f"output_dir={resumed}",
                   "resume=true")  # fmt: skip
    assert "resumed from" in log
    return resumed


def training_rows(output_dir: Path) -> list[dict]:
    from mmrl.runtime.metrics import read_metrics

    return [m for m in read_metrics(output_dir / "metrics.jsonl") if "reward/total" in m]


def final_weights(output_dir: Path) -> dict[str, torch.Tensor]:
    from mmrl.runtime.checkpoint import latest_checkpoint

    return load_file(latest_checkpoint(output_dir) / "model.safetensors")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same two steps in two processes and in one: (config file, two-process dir, one-process dir)."""
    from mmrl.runtime.config import load_config
    from mmrl.trainer import train

    root = tmp_path_factory.mktemp("fsdp")
    config = root / "run.yaml"
    config.write_text(yaml.safe_dump(RUN))
    two, one = root / "two", root / "one"
    torchrun(root / "two.log", "-m", "mmrl", "train", str(config), f"output_dir={two}")
    train(load_config(config, [f"output_dir={one}"]), generation_shards=2)
    return config, two, one


def test_two_processes_log_what_one_process_logs(runs):
    _, two, one = runs
    got, want = training_rows(two), training_rows(one)
    assert [m["step"] for m in got] == [m["step"] for m in want] == [1, 2]
    for g, w in zip(got, want):
        for key in COMPARED:
            assert g[key] == pytest.approx(w[key], rel=1e-4, abs=1e-6), f"step {w['step']}: {key}"
        assert g["grad_norm"] > 0.1  # a real gradient, not the zero of equal rewards
    assert got[1]["loss/kl"] > 0  # step 2 is measured against the (sharded) reference
    assert got[0]["reward/total"] != got[1]["reward/total"]
    # Rank 0 alone wrote the file: held-out rows before and after, one row per step, none twice.
    from mmrl.runtime.metrics import read_metrics

    assert [m["step"] for m in read_metrics(two / "metrics.jsonl")] == [0, 1, 2, 2]


def test_two_processes_with_epochs_mini_batches_and_a_critic_step_as_one_process(tmp_path):
    """Mini-batches cut from both processes' groups with one draw, the old log-probs recomputed, and a value head whose
    gradients are averaged over the processes: two processes still train what one process with two shards trains."""
    from mmrl.runtime.config import load_config
    from mmrl.trainer import train

    run = {**RUN, "algo": {"group_size": 2, "kl_coef": 0.0, "advantage": "gae", "ppo_epochs": 2,
                           "mini_batch_groups": 3, "old_logprobs": "recompute", "critic": {"lr": 0.01}}}  # fmt: skip
    run["trainer"] = {**RUN["trainer"], "eval_episodes": 2, "save_every": 0}
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(run))
    two, one = tmp_path / "two", tmp_path / "one"
    torchrun(tmp_path / "two.log", "-m", "mmrl", "train", str(config), f"output_dir={two}")
    train(load_config(config, [f"output_dir={one}"]), generation_shards=2)
    got, want = training_rows(two), training_rows(one)
    assert [m["step"] for m in got] == [m["step"] for m in want] == [1, 2]
    for g, w in zip(got, want):
        assert g["optimizer_steps"] == w["optimizer_steps"] == 4  # 2 epochs x ceil(4 groups / 3)
        for key in ("loss/policy", "grad_norm", "reward/total", "value/loss", "critic/value_mean",
                    "critic/grad_norm", "ratio/max", "ratio/min", "clip_fraction", "mismatch/kl"):  # fmt: skip
            # Four Adam steps a training step compound the float32 rounding of summing gradients in another order
            # (FSDP's reduce-scatter against one process's accumulation): 1e-3 here where one step holds 1e-4.
            assert g[key] == pytest.approx(w[key], rel=1e-3, abs=1e-6), f"step {w['step']}: {key}"
    assert got[1]["critic/value_mean"] != 0


def test_two_processes_evaluate_what_one_process_evaluates(runs):
    """Each process plays its share of the held-out seeds; the sums over processes are one process's."""
    from PIL import Image

    from mmrl.runtime.metrics import read_metrics

    _, two, one = runs
    got, want = ([m for m in read_metrics(d / "metrics.jsonl") if "eval/iou" in m] for d in (two, one))
    assert [m["step"] for m in got] == [m["step"] for m in want] == [0, 2]
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for key in w:
            assert g[key] == pytest.approx(w[key], rel=1e-5, abs=1e-7), f"step {w['step']}: {key}"
    assert got[1]["eval/episode_steps"] == 1.0  # a mean over all 5 episodes, not over one process's share
    scores = [json.loads((d / "eval.json").read_text()) for d in (two, one)]
    assert scores[0].keys() == scores[1].keys() == {"before", "after"}
    for when in scores[1]:
        assert scores[0][when] == pytest.approx(scores[1][when], rel=1e-5, abs=1e-7)
    # Rank 0 drew the 4 kept samples, one of them played by rank 1, as one process draws them.
    pictures = [np.asarray(Image.open(d / "predictions.png")) for d in (two, one)]
    assert pictures[0].shape == pictures[1].shape and (pictures[0] == pictures[1]).all()


def test_each_process_evaluates_only_its_share_of_the_seeds(tmp_path):
    log = torchrun(tmp_path / "eval.log", str(Path(__file__)), "evaluate")
    assert "evaluate 0 ok" in log and "evaluate 1 ok" in log


def test_held_out_seeds_split_into_contiguous_blocks():
    from mmrl.runtime.distributed import World, eval_shard

    assert [eval_shard(5, World(rank=r, size=2)) for r in range(2)] == [range(0, 3), range(3, 5)]
    assert [len(eval_shard(10, World(rank=r, size=4))) for r in range(4)] == [3, 3, 2, 2]
    assert eval_shard(1, World(rank=1, size=2)) == range(1, 1)  # fewer episodes than processes: nothing to play
    assert eval_shard(7, World()) == range(7)


def test_checkpoint_holds_full_weights_that_load_in_one_process(runs):
    from mmrl.policy import VLMPolicy
    from mmrl.runtime.checkpoint import latest_checkpoint, load_training_state

    _, two, one = runs
    got, want = final_weights(two), final_weights(one)
    assert got.keys() == want.keys()  # the tied LM head written once, as one process writes it
    for name in want:
        # Equal up to float32 summation order, except where Adam amplifies it: each element's step is its gradient
        # over its own running scale plus eps (1e-8), so an element whose gradient is near eps steps by a fraction
        # of lr that follows the roundoff. Seen with transformers 5.24: layer 1's v_proj[12, 32], gradient 1.2e-8
        # (the tensor's median 3.7e-5), 6% apart between the runs, stepped 1.5e-5 apart at lr 1e-3. A wrong shard
        # or a lost gradient moves whole slices: at most 1 element in 1000 may differ, and by less than one step.
        close = torch.isclose(got[name], want[name], rtol=1e-4, atol=1e-5)
        assert (~close).sum() <= close.numel() // 1000, f"{name}: {(~close).sum()} of {close.numel()} elements differ"
        torch.testing.assert_close(
            got[name], want[name], rtol=0, atol=RUN["trainer"]["lr"], msg=lambda m, n=name: f"{n}: {m}"
        )
    start = load_file(REPO / ASSET / "model.safetensors")
    assert any(not torch.equal(got[k], start[k]) for k in got)  # training moved them
    policy = VLMPolicy.from_pretrained(latest_checkpoint(two))
    loaded = dict(policy.model.named_parameters())
    for name, value in got.items():
        torch.testing.assert_close(loaded[name].detach(), value, rtol=0, atol=0)
    # The optimiser state is whole as well (each process held a slice), keyed by parameter name.
    _, states = load_training_state(latest_checkpoint(two))
    name = "model.language_model.embed_tokens.weight"
    assert states["optimizer"]["state"][name]["exp_avg"].shape == loaded[name].shape


def test_resumed_two_process_run_matches_the_uninterrupted_one(runs, tmp_path):
    config, two, _ = runs
    resumed = resume_after_step_one(config, two, tmp_path / "resumed")
    got, want = final_weights(resumed), final_weights(two)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    for g, w in zip(training_rows(resumed), training_rows(two), strict=True):
        for key in COMPARED:
            assert g[key] == pytest.approx(w[key], rel=1e-5, abs=1e-7), f"step {w['step']}: {key}"


# ---------------------------------------------------------------------------------------------- LoRA
@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory):
    """The runs of `runs` with LoRA adapters (rank 4, KL against the sharded PEFT reference as well)."""
    from mmrl.runtime.config import load_config
    from mmrl.trainer import train

    root = tmp_path_factory.mktemp("fsdp_lora")
    config = root / "run.yaml"
    config.write_text(yaml.safe_dump({**RUN, "model": {**RUN["model"], "lora": {"r": 4}}}))
    two, one = root / "two", root / "one"
    torchrun(root / "two.log", "-m", "mmrl", "train", str(config), f"output_dir={two}")
    torch.rand(3)  # this process has drawn from the global generator; the torchrun workers have not
    train(load_config(config, [f"output_dir={one}"]), generation_shards=2)
    return config, two, one


def final_adapters(output_dir: Path) -> dict[str, torch.Tensor]:
    from mmrl.runtime.checkpoint import latest_checkpoint

    return load_file(latest_checkpoint(output_dir) / "lora" / "adapter_model.safetensors")


def test_two_process_lora_run_trains_what_one_process_trains(lora_runs):
    _, two, one = lora_runs
    got, want = training_rows(two), training_rows(one)
    assert [m["step"] for m in got] == [m["step"] for m in want] == [1, 2]
    for g, w in zip(got, want):
        for key in COMPARED:  # the grad norm too: the adapters start alike in every process (apply_lora's seed)
            assert g[key] == pytest.approx(w[key], rel=1e-4, abs=1e-6), f"step {w['step']}: {key}"
        assert g["grad_norm"] > 0.1
    adapters, reference = final_adapters(two), final_adapters(one)
    assert adapters.keys() == reference.keys() and any(".lora_B." in k for k in adapters)
    for name in reference:
        torch.testing.assert_close(
            adapters[name], reference[name], rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}"
        )
    assert all(adapters[k].abs().max() > 0 for k in adapters if ".lora_B." in k)  # B left zero: nothing trained
    # The base weights, gathered from the shards, are the untouched starting ones, under their plain names.
    start = load_file(REPO / ASSET / "model.safetensors")
    base = final_weights(two)
    assert base.keys() == start.keys() and all(torch.equal(base[k], start[k]) for k in start)


def test_two_process_lora_checkpoint_resumes_and_merges(lora_runs, tmp_path):
    from mmrl.policy import VLMPolicy
    from mmrl.policy.lora import is_lora, merge_lora
    from mmrl.runtime.checkpoint import latest_checkpoint

    config, two, one = lora_runs
    resumed = resume_after_step_one(config, two, tmp_path / "resumed")
    got, want = final_adapters(resumed), final_adapters(two)
    for name in want:  # the adapters' optimiser state came back too: step 2 repeats exactly
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    for g, w in zip(training_rows(resumed), training_rows(two), strict=True):
        for key in COMPARED:
            assert g[key] == pytest.approx(w[key], rel=1e-5, abs=1e-7), f"step {w['step']}: {key}"
    # One process loads the two-process checkpoint as a LoRA policy; merged, it is the one-process run's model.
    policy = VLMPolicy.from_pretrained(latest_checkpoint(two))
    assert is_lora(policy)
    merged = merge_lora(policy).model.state_dict()
    reference = merge_lora(VLMPolicy.from_pretrained(latest_checkpoint(one))).model.state_dict()
    start = load_file(REPO / ASSET / "model.safetensors")
    assert merged.keys() >= start.keys()
    for name in start:
        torch.testing.assert_close(
            merged[name], reference[name], rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}"
        )
    q_proj = "model.language_model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged[q_proj], start[q_proj])  # the adapters are folded in


# ---------------------------------------------------------------------------------------------- float32 masters
@pytest.fixture(scope="module")
def master_runs(tmp_path_factory):
    """The runs of `runs` in bfloat16 at lr 1e-6 with float32 master weights (FSDP: float32 shards computing in
    bfloat16; one process: `MasterWeights`), and the two-process run resumed after step 1."""
    from mmrl.runtime.config import load_config
    from mmrl.trainer import train

    root = tmp_path_factory.mktemp("fsdp_masters")
    config = root / "run.yaml"
    run = {**RUN, "model": {**RUN["model"], "dtype": "bfloat16"}}
    run["trainer"] = {**RUN["trainer"], "lr": 1e-6, "master_weights": "float32"}
    config.write_text(yaml.safe_dump(run))
    two, one = root / "two", root / "one"
    torchrun(root / "two.log", "-m", "mmrl", "train", str(config), f"output_dir={two}")
    train(load_config(config, [f"output_dir={one}"]), generation_shards=2)
    return two, one, resume_after_step_one(config, two, root / "resumed")


def test_two_processes_with_float32_masters_step_what_one_process_steps(master_runs):
    two, one, _ = master_runs
    got, want = training_rows(two), training_rows(one)
    # Step 1 is the starting weights' rollout in both; bfloat16 gradients summed over other micro-batches round
    # differently, hence a tolerance. The reference computes as the policy does: KL 0 at step 1.
    for key in ("loss/policy", "grad_norm", "reward/total", "completion_len"):
        assert got[0][key] == pytest.approx(want[0][key], rel=1e-3), key
    assert got[0]["loss/kl"] == want[0]["loss/kl"] == 0.0
    # Step 2 samples from the updated weights, which differ by bfloat16 rounding between the two runs, so a draw
    # that falls close to a boundary between two tokens can take the neighbour (seen once: one digit of one box,
    # GIoU off by 9e-5; the same lengths, IoU and format). The rollout is otherwise the same.
    for key in ("completion_len", "reward/iou", "reward/format"):
        assert got[1][key] == pytest.approx(want[1][key], rel=1e-5), key
    assert got[1]["reward/total"] == pytest.approx(want[1]["reward/total"], rel=1e-3)
    # The update is compared where both runs updated on the same rollout: step 1's (its checkpoint).
    start = load_file(REPO / ASSET / "model.safetensors")
    trained, reference = (load_file(d / "checkpoints" / "step_00000001" / "model.safetensors") for d in (two, one))
    assert {w.dtype for w in trained.values()} == {torch.float32}  # the float32 shards, gathered
    moved = torch.cat([(trained[k].float() - start[k].float()).flatten() for k in start])
    expected = torch.cat([(reference[k].float() - start[k].float()).flatten() for k in start])
    large = torch.cat([(start[k].abs() > 1e-2).flatten() for k in start])  # bfloat16 would round lr away there
    assert (moved[large] != 0).float().mean() > 0.95
    assert (moved.sign() == expected.sign()).float().mean() > 0.98  # the one-process step, elementwise
    assert (moved - expected).norm() < 0.1 * expected.norm()


def test_two_process_run_with_float32_masters_resumes_exactly(master_runs):
    two, _, resumed = master_runs
    got, want = final_weights(resumed), final_weights(two)
    assert got.keys() == want.keys()
    for name in want:  # steps of 1e-6: only exact float32 masters and optimiser state reproduce them
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")
    for g, w in zip(training_rows(resumed), training_rows(two), strict=True):
        for key in COMPARED:
            assert g[key] == pytest.approx(w[key], rel=1e-5, abs=1e-7), f"step {w['step']}: {key}"


def test_processes_generate_unevenly_without_deadlock(tmp_path):
    log = torchrun(tmp_path / "worker.log", str(Path(__file__)))
    assert "worker 0 ok" in log and "worker 1 ok" in log


def test_prompts_split_into_whole_shards_per_process():
    from mmrl.runtime.distributed import World, prompt_shards
    from sim.seeds import sampling_seed

    assert prompt_shards(8, 1, World()) == range(0, 1)
    assert prompt_shards(8, 4, World(rank=1, size=2)) == range(2, 4)
    with pytest.raises(ValueError, match=r"prompts_per_step=3 is not valid with 2 processes"):
        prompt_shards(3, 2, World(rank=0, size=2))
    with pytest.raises(ValueError, match=r"generation_shards=3"):
        prompt_shards(6, 3, World(rank=0, size=2))  # 3 shards do not split over 2 processes
    # One process generating everything at once keeps the seed it always had; other shards and refills differ.
    assert sampling_seed(7, 5) == 7 * 1_000_003 + 5
    assert len({sampling_seed(7, 5, shard, attempt) for shard in range(3) for attempt in range(3)}) == 9


def test_without_torchrun_nothing_is_distributed(monkeypatch):
    import torch.distributed as dist

    from mmrl.runtime.distributed import World, init_world

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    world = init_world("cpu")
    assert world == World() and world.sum(3) == 3 and world.max(2.5) == 2.5
    x = torch.ones(2)
    assert world.gather_rows(x)[0] is x and world.reduce_metrics({"a": x[0]}, weight=2) == {"a": x[0]}
    assert not dist.is_initialized()


def _worker() -> None:
    """Each of two processes: uneven generation inside `full_weights`, then training collectives in step."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    import torch.distributed as dist

    import sim
    from mmrl.policy import Sampling, build_tiny
    from mmrl.runtime.distributed import clip_grad_norm, close_world, full_weights, init_world, shard_model

    world = init_world("cpu")
    rank = world.rank
    # The World helpers on inputs that differ between processes.
    rows, first = world.gather_rows(torch.arange(rank + 1.0))  # rank 0 holds [0], rank 1 [0, 1]
    assert rows.tolist() == [0.0, 0.0, 1.0] and first == rank
    assert world.sum(rank + 1) == 3 and world.max(torch.tensor(rank)).item() == 1
    metrics = world.reduce_metrics(
        {"mean": float(rank), "loss": 0.25, "time": rank + 1.0}, weight=rank + 1, summed=("loss",), maxed=("time",)
    )
    assert metrics == pytest.approx({"mean": 2 / 3, "loss": 0.5, "time": 2.0})  # (0*1 + 1*2) / 3

    policy = build_tiny("qwen2_vl", seed=rank)  # different weights in each process: shard_model takes rank 0's
    shard_model(policy.model, world)
    obs = sim.make("grounding", num_envs=2, image_size=56).reset(seed=[0, 0])
    with full_weights(policy.model):
        torch.manual_seed(rank)
        # Different numbers of forward passes and of generate calls: any collective in there would hang.
        rollout = policy.generate(obs, group_size=2, sampling=Sampling(max_new_tokens=2 + 4 * rank))
        for _ in range(2 * rank):
            policy.generate(obs, sampling=Sampling(max_new_tokens=2))
        greedy = policy.generate(obs, sampling=Sampling(max_new_tokens=4, temperature=0.0))
    answers = [None, None]
    dist.all_gather_object(answers, greedy.completion_ids.tolist())
    assert answers[0] == answers[1]  # the same (rank 0's) weights everywhere
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-3)
    loss = -(policy.logprobs(rollout) * rollout.completion_mask).sum() / rollout.completion_mask.sum()
    loss.backward()
    norm = clip_grad_norm(policy.model, 1.0)
    optimizer.step()
    assert torch.isfinite(norm) and norm > 0 and world.max(norm) == world.sum(norm) / 2  # one global norm
    print(f"worker {rank} ok", flush=True)
    close_world()


def _eval_worker() -> None:
    """Each of two processes: held-out evaluation of its share of the seeds, against one process playing them all.

    A single-step task (grounding: boxes in `info`) and a multi-step one (gui_task: recorded frames). 5 episodes in
    batches of 4: rank 0 plays seeds 0-2, rank 1 seeds 3-4; the 4 kept samples are rank 0's 3 and rank 1's first.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    import mmrl.stages.evaluate
    from mmrl.policy import build_tiny
    from mmrl.runtime.distributed import close_world, full_weights, init_world, shard_model
    from mmrl.stages.evaluate import evaluate
    from sim.seeds import eval_seeds

    world = init_world("cpu")
    rank = world.rank
    played: list[int] = []
    collect = mmrl.stages.evaluate.collect_episodes

    def counting(policy, env, seeds, *args, **kwargs):
        played.extend(seeds)
        return collect(policy, env, seeds, *args, **kwargs)

    mmrl.stages.evaluate.collect_episodes = counting
    policy = build_tiny("qwen2_vl", seed=0)
    shard_model(policy.model, world)
    share = eval_seeds(5)[:3] if rank == 0 else eval_seeds(5)[3:]
    for name, options in (("grounding", {"image_size": 56}), ("gui_task", {"image_size": 112})):
        with full_weights(policy.model):
            played.clear()
            sharded = evaluate(policy, name, options, episodes=5, batch_size=4, max_new_tokens=4, world=world)
            assert played == share, (name, played)  # this process's share, each seed once
            played.clear()
            whole = evaluate(policy, name, options, episodes=5, batch_size=4, max_new_tokens=4)  # no collective
            assert played == eval_seeds(5)
        assert sharded.metrics.keys() == whole.metrics.keys()
        assert sharded.metrics == pytest.approx(whole.metrics, rel=1e-5, abs=1e-7), name
        if rank != 0:
            continue
        assert sharded.texts == whole.texts and sharded.instructions == whole.instructions and len(whole.texts) == 4
        assert torch.equal(sharded.images, whole.images)
        assert sharded.info.keys() == whole.info.keys() and sharded.info
        for key, value in whole.info.items():
            got = sharded.info[key]
            if isinstance(value, torch.Tensor):  # pred_box holds NaN rows where nothing parsed
                torch.testing.assert_close(got, value, rtol=0, atol=0, equal_nan=True, msg=key)
            else:
                assert got == value, key
        assert (sharded.frames is None) == (whole.frames is None) == (name == "grounding")
        if whole.frames is not None:
            assert torch.equal(sharded.success, whole.success)
            # Frames run to the end of the longest recorded episode; compare the steps both recorded.
            steps = min(sharded.frames.shape[1], whole.frames.shape[1])
            assert sharded.frames.shape[0] == 4 and torch.equal(sharded.frames[:, :steps], whole.frames[:, :steps])
    print(f"evaluate {rank} ok", flush=True)
    close_world()


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    _eval_worker() if sys.argv[1:] == ["evaluate"] else _worker()
