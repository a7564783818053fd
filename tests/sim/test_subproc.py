"""`sim.subproc.SubprocVecEnv`: worlds served by processes of another (here: the same) Python environment."""

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import sim
from sim import check_vec_env
from sim.serve import decode, encode
from sim.subproc import SubprocVecEnv

SLOW = f"{Path(__file__).with_name('worlds') / 'slow_worlds.py'}:SlowWorlds"


def test_wire_format_round_trips_arrays_of_every_kind():
    value = {"a": np.arange(6, dtype=np.int16).reshape(2, 3), "b": [np.float32(1.5), "x", (np.zeros(2, bool),)]}
    back = decode(encode(value))
    assert back["a"].dtype == np.int16 and back["a"].shape == (2, 3) and back["a"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert back["b"][0] == 1.5 and back["b"][1] == "x" and back["b"][2][0].dtype == bool
    back["a"][0, 0] = 7  # writable, not a view of the message's bytes


def test_served_env_equals_the_in_process_env():
    local = sim.make("reach", num_envs=3, image_size=64)
    served = SubprocVecEnv("sim.subproc:EnvWorlds", 3, workers=2, env="reach", image_size=64)
    try:
        assert served.worker_worlds == (range(0, 2), range(2, 3))
        assert served.action_kind == "continuous" and served.action_dim == 2
        assert served.max_episode_steps == local.max_episode_steps
        a, b = local.reset(seed=11), served.reset(seed=11)
        assert torch.equal(a.image, b.image) and a.instruction == b.instruction
        for t in range(4):
            actions = local.expert_action()
            assert torch.equal(served.call("expert_action"), actions)
            ra, rb = local.step(actions), served.step(actions)
            assert torch.equal(ra.obs.image, rb.obs.image)
            assert torch.equal(ra.reward, rb.reward) and torch.equal(ra.terminated, rb.terminated)
            assert torch.equal(ra.info["success"], rb.info["success"])
            if t == 1:  # a partial reset reaches only the worker that holds world 2
                a, b = local.reset(seed=[5], env_ids=[2]), served.reset(seed=[5], env_ids=[2])
                assert torch.equal(a.image, b.image)
    finally:
        local.close()
        served.close()


def test_served_env_passes_the_contract_check():
    env = SubprocVecEnv(SLOW, 3, workers=2)
    try:
        assert env.image_size == 8
        check_vec_env(env, seed=0)
    finally:
        env.close()


def test_a_worlds_error_comes_back_with_its_traceback_and_the_worker_lives():
    env = SubprocVecEnv(SLOW, 2, workers=1)
    try:
        with pytest.raises(RuntimeError, match="reset the worlds before stepping"):
            env.step(torch.ones(2, 1))
        env.reset(seed=0, env_ids=[0])
        with pytest.raises(RuntimeError, match="(?s)step before reset.*worker traceback"):
            env.step(torch.ones(2, 1))
        pid = env.call("pid")[0]
        env.reset(seed=[1, 2])
        assert env.step(torch.ones(2, 1)).reward.tolist() == [2.0, 3.0]
        assert env.call("pid")[0] == pid and env.restarts == 0
    finally:
        env.close()


def test_a_dead_worker_is_named_with_its_log_and_replaced():
    env = SubprocVecEnv(SLOW, 4, workers=2)
    try:
        env.reset(seed=0)
        with pytest.raises(RuntimeError, match=r"worker \d \(worlds \[\d, \d\].*died \(exit code 3\)"):
            env.call("crash")
        assert env.restarts == 2  # both workers were asked to crash
        with pytest.raises(RuntimeError, match="reset the worlds before stepping"):
            env.step(torch.ones(4, 1))
        env.reset(seed=10)
        assert env.step(torch.ones(4, 1)).reward.tolist() == [11.0, 12.0, 13.0, 14.0]
    finally:
        env.close()


def test_a_hung_worker_is_killed_after_the_timeout():
    env = SubprocVecEnv(SLOW, 2, workers=2, timeout_s=1.0)
    try:
        env.reset(seed=0)
        with pytest.raises(RuntimeError, match="gave no answer within 1 s"):
            env.call("sleep", 30.0)
        assert env.restarts == 2
        env.reset(seed=0)
        assert env.call("sleep", 0.0) == [0, 0]
    finally:
        env.close()


def test_start_up_errors_name_the_cause():
    with pytest.raises(FileNotFoundError, match="no Python interpreter"):
        SubprocVecEnv(SLOW, 1, python="/nonexistent/python")
    with pytest.raises(RuntimeError, match="(?s)asked to fail on start.*worker traceback"):
        SubprocVecEnv(SLOW, 1, fail_on_start=True)
    with pytest.raises(RuntimeError, match="No module named"):
        SubprocVecEnv("no_such_module:Worlds", 1)
    with pytest.raises(ValueError, match="workers must be"):
        SubprocVecEnv(SLOW, 2, workers=3)


def test_a_worker_exits_when_its_parent_goes_away():
    env = SubprocVecEnv(SLOW, 1)
    worker = env._workers[0]
    worker.conn.close()  # what the parent's death does to the pipe
    assert worker.proc.wait(timeout=20) == 0
    env._closed = True


def test_workers_run_isolated_from_the_callers_python_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/nonexistent")
    env = SubprocVecEnv(SLOW, 1, python=sys.executable)
    try:
        assert env.reset(seed=4).instruction == ["count 4"]
        assert os.getpid() not in env.call("pid")
    finally:
        env.close()
