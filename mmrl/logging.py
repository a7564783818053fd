"""One metrics stream: JSON lines always, TensorBoard when asked. Every value is synced to Python here, once."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch


def to_float(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.detach().float().cpu())
    return float(value)


class MetricsLogger:
    """Appends `{"step": k, ...}` lines to `metrics.jsonl`.

    On resume from step k it first drops lines logged after k's checkpoint, so a killed-and-resumed run leaves
    exactly the lines an uninterrupted run would have: every line of a later step, a torn last line, and, when k is
    the run's last step (`final_step`), the end-of-run evaluation (logged at k after the last checkpoint, and
    evaluated again by the resumed run).
    """

    def __init__(self, path: str | Path, resume_step: int | None = None, final_step: int | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self.path.write_text("")
        elif self.path.exists():
            kept = [
                line
                for line in self.path.read_text().splitlines()
                if _step_of(line) < resume_step
                or (_step_of(line) == resume_step and not (resume_step == final_step and _is_eval(line)))
            ]
            self.path.write_text("".join(line + "\n" for line in kept))

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, float]:
        row = {"step": step, **{k: to_float(v) for k, v in metrics.items()}}
        row = {k: (v if not (isinstance(v, float) and math.isnan(v)) else None) for k, v in row.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        return row


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _is_eval(line: str) -> bool:
    """Whether a (whole) line is a held-out evaluation's: every key but `step` under `eval/`."""
    return all(key == "step" or key.startswith("eval/") for key in json.loads(line))


def _step_of(line: str) -> int:
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, AttributeError):
        return 1 << 62  # a torn last line from a kill: drop it
