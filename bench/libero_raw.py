"""robosuite's own loop over LIBERO worlds, for bench/libero.py: run with LIBERO's interpreter (.venv-libero).

N processes, each one `OffScreenRenderEnv` with its two cameras (agent view and wrist, robosuite's observables) at
the given size, reset to task 0's initial state 0, then stepped `steps` times with uniform random actions in a plain
Python loop, as a LIBERO user writes it. The processes start stepping together (a barrier); the figure is
N * steps / (the last process's end - the common start), on stdout as JSON.

    LIBERO_CONFIG_PATH=.venv-libero/libero-config .venv-libero/bin/python bench/libero_raw.py N STEPS SIZE
"""

import json
import multiprocessing as mp
import os
import sys
import time

import numpy as np

# This folder holds bench/libero.py, which would shadow the `libero` package: take it off the path (spawned children
# get this process's path).
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]


def world(barrier, queue, steps: int, size: int, seed: int) -> None:
    try:
        run_world(barrier, queue, steps, size, seed)
    except BaseException as error:  # the parent waits on the queue: tell it rather than leave it waiting
        barrier.abort()
        queue.put(repr(error))
        raise


def run_world(barrier, queue, steps: int, size: int, seed: int) -> None:
    from libero.libero import benchmark, get_libero_path
    from libero.libero.envs import OffScreenRenderEnv

    suite = benchmark.get_benchmark_dict()["libero_spatial"]()
    task = suite.get_task(0)
    env = OffScreenRenderEnv(
        bddl_file_name=os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file),
        camera_heights=size,
        camera_widths=size,
    )
    env.seed(0)
    env.reset()
    env.set_init_state(suite.get_task_init_states(0)[0])
    rng = np.random.default_rng(seed)
    actions = rng.uniform(-1, 1, size=(steps, 7))
    barrier.wait()
    start = time.perf_counter()
    for t in range(steps):
        obs, reward, done, info = env.step(actions[t])
        assert obs["agentview_image"].shape == (size, size, 3)
    queue.put((start, time.perf_counter()))
    env.close()


def main(n: int, steps: int, size: int) -> None:
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=world, args=(barrier, queue, steps, size, k)) for k in range(n)]
    for p in procs:
        p.start()
    times = [queue.get() for _ in procs]
    failed = [t for t in times if isinstance(t, str)]
    if failed:
        sys.exit(f"libero_raw: a world failed: {failed[0]}")
    for p in procs:
        p.join()
    wall = max(end for _, end in times) - min(start for start, _ in times)
    print(json.dumps({"n": n, "steps": steps, "seconds": wall, "steps_per_s": n * steps / wall}))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:4]))
