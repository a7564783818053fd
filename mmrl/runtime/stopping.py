"""Stopping a run between steps: Ctrl-C (SIGINT) or SIGTERM asks the trainer to stop after the step in progress,
which it checkpoints first, so that `resume=true` continues exactly; a second one stops at once.

A `KeyboardInterrupt` raised wherever the loop is would leave the step in progress unsaved and print a long
traceback; SIGTERM (a scheduler's pre-emption) would kill the process with no word. Under torchrun the processes
agree on stopping at each step's end (`World.max`), so they all checkpoint the same step.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

from .distributed import World

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """A context in which SIGINT and SIGTERM set `signal_name` instead of stopping the process (the first one; the
    second raises `KeyboardInterrupt` at once). Outside the main thread it installs nothing (Python delivers
    signals to the main thread only)."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum: int, frame) -> None:
        if self.signal_name is not None:  # the second one: at once
            raise KeyboardInterrupt(self.signal_name)
        self.signal_name = signal.Signals(signum).name
        print(f"\nmmrl: {self.signal_name}: stopping after the step in progress, which is checkpointed "
              "(Ctrl-C again stops at once)", file=sys.stderr)  # fmt: skip

    def asked(self, world: World) -> bool:
        """Whether a signal asked to stop, in any process (every process must call this at the same step)."""
        return bool(world.max(1.0 if self.signal_name else 0.0))
