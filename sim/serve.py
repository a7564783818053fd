"""The worker side of `sim.subproc.SubprocVecEnv`: serve one block of worlds over a pipe, in any Python environment.

Run by the parent as `<python> -I sim/serve.py <fd> <target>`: `<fd>` is the worker's end of a socket pair and
`<target>` names the class that holds the worlds, either `path/to/file.py:Class` (loaded from the file, so that the
file's own imports are the only ones made: the `sim` package is not imported) or `package.module:Class`. Isolated
mode (`-I`) keeps this folder and the caller's PYTHONPATH off `sys.path`.

This file uses only the standard library and NumPy, so that it runs in an environment built for one simulator (LIBERO
on robosuite 1.4 and mujoco 3) whose pins conflict with the project's. It is imported by the parent too, for the
wire format (`encode`, `decode`).

**The worlds class** takes `(num_envs, **options)` and speaks the VecEnv contract in NumPy:

* `reset(seeds, env_ids) -> obs`: `seeds` and `env_ids` are lists (already resolved by the parent), `obs` a dict with
  `image` (`[n, H, W, 3]` or `[n, V, H, W, 3]` uint8 of ALL n worlds of the block), `instruction` (n strings) and
  optionally `state` (`[n, S]` float) and `proprio` (`[n, P]` float);
* `step(actions) -> dict(obs, reward, terminated, truncated, info)`: `actions` `[n, D]` float64 or n strings; `info`
  holds per-world arrays or lists of n entries (and dicts of them);
* `describe() -> dict`: the constants the parent serves (`action_kind`, `max_episode_steps`, `action_dim`, ...);
* any other public method is reachable through the parent's `call`, and `close()` ends the worlds.

**Messages** are `(method, args, kwargs)` tuples; answers are `("ok", value)` or `("error", type name, message,
traceback)`. NumPy arrays travel as `("__ndarray__", dtype, shape, bytes)`: a pickled array names NumPy's internal
modules, which differ between NumPy 1 and 2, and the two environments need not share a NumPy.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

_ARRAY_TAG = "__ndarray__"


def encode(value: Any) -> Any:
    """`value` with every NumPy array (and NumPy scalar) replaced by plain data, recursively through containers."""
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        return (_ARRAY_TAG, array.dtype.str, array.shape, array.tobytes())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {key: encode(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(encode(item) for item in value)
    return value


def decode(value: Any) -> Any:
    """The inverse of `encode`: tagged tuples back to (writable) NumPy arrays."""
    if isinstance(value, tuple) and len(value) == 4 and value[0] == _ARRAY_TAG:
        _, dtype, shape, data = value
        return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape).copy()
    if isinstance(value, dict):
        return {key: decode(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(decode(item) for item in value)
    return value


def load_target(target: str) -> Any:
    """The class `target` names: `path/to/file.py:Class` (loaded from the file alone) or `package.module:Class`."""
    location, sep, name = target.rpartition(":")
    if not sep or not location or not name:
        raise ValueError(f"target must be 'path/to/file.py:Class' or 'package.module:Class', got {target!r}")
    if location.endswith(".py"):
        module_name = "mmrl_worlds_" + os.path.splitext(os.path.basename(location))[0]
        spec = importlib.util.spec_from_file_location(module_name, location)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {location}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses and pickling look the module up by name
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(location)
    return getattr(module, name)


def serve(conn: Connection, target: str) -> None:
    """Answer the parent's messages until `close` or EOF; the first message builds the worlds."""
    worlds = None
    try:
        while True:
            try:
                method, args, kwargs = conn.recv()
            except (EOFError, OSError, KeyboardInterrupt):
                break
            try:
                args, kwargs = decode(args), decode(kwargs)
                if method == "__init__":
                    worlds = load_target(target)(*args, **kwargs)
                    value = worlds.describe()
                elif worlds is None:
                    raise RuntimeError("the worlds were not built (the first message must be __init__)")
                elif method.startswith("_"):
                    raise AttributeError(f"{method!r} is private")
                else:
                    value = getattr(worlds, method)(*args, **kwargs)
                reply: tuple = ("ok", encode(value))
            except BaseException as error:  # noqa: BLE001  (everything goes back to the parent, which raises)
                reply = ("error", type(error).__name__, str(error), traceback.format_exc())
            conn.send(reply)
            if method == "close":
                break
    finally:
        if worlds is not None and hasattr(worlds, "close"):
            try:
                worlds.close()
            except Exception:  # noqa: BLE001  (closing twice, or a simulator that cannot: nothing left to do)
                pass
        conn.close()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -I sim/serve.py <fd> <target>", file=sys.stderr)
        return 2
    serve(Connection(int(argv[0])), argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown: simulators' and renderers' atexit hooks (EGL, for one) can hang or print.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
