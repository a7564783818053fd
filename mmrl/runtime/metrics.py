"""One metrics stream: JSON lines always, TensorBoard and Weights & Biases when asked (`trainer.log_with`).

Every value is synced to Python here, once, and the same row goes to every sink. The JSON lines are the record
(resume and the returned history read them); TensorBoard and W&B are views of it:

* TensorBoard (`torch.utils.tensorboard.SummaryWriter`, extra `mmrl[tensorboard]`): `<output_dir>/tensorboard`,
  one scalar per metric, flushed every row so a killed run loses nothing written. On resume from step k the writer
  purges the events after k (`purge_step`), as the JSON lines drop their rows after k.
* Weights & Biases (extra `mmrl[wandb]`): `<output_dir>/wandb`, offline by default (`trainer.wandb_mode`; no
  network or account needed, `wandb sync` uploads later); the run id is kept in `<output_dir>/wandb_id` so a
  resumed run continues the same W&B run.

A missing package is an `ImportError` naming the extra, raised when the run is built, before anything trains.
"""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path
from typing import Any

import torch

EXTREMES = ("_min", "/min", "_max", "/max")  # metric keys reduced by their extreme, not averaged


def to_float(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.detach().float().cpu())
    return float(value)


def require_backends(log_with: list[str]) -> None:
    """Raises the `ImportError` naming the extra for a `trainer.log_with` backend whose package is missing (each
    backend's package and mmrl extra share its name; `build` calls this before anything loads)."""
    import importlib.util

    for name in log_with:
        if name != "jsonl" and importlib.util.find_spec(name) is None:
            raise ImportError(
                f"trainer.log_with includes {name}, but the {name} package is not installed: pip install 'mmrl[{name}]'"
            )


class TensorBoardSink:
    """Scalars (and end-of-run images) to TensorBoard event files."""

    def __init__(self, folder: Path, purge_step: int | None):
        from torch.utils.tensorboard import SummaryWriter  # the package is checked by `require_backends`

        self.writer = SummaryWriter(str(folder), purge_step=purge_step)

    def log(self, step: int, row: dict[str, Any]) -> None:
        for key, value in row.items():
            if key != "step" and value is not None:
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def image(self, step: int, tag: str, image: Any) -> None:
        self.writer.add_image(tag, torch.tensor(image), step, dataformats="HWC")
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """Scalars (and end-of-run images) to a Weights & Biases run, offline unless asked otherwise."""

    def __init__(self, folder: Path, project: str, mode: str, config: dict[str, Any], resume: bool):
        import wandb  # the package is checked by `require_backends`

        self.wandb = wandb
        folder.mkdir(parents=True, exist_ok=True)
        id_file = folder.parent / "wandb_id"
        run_id = id_file.read_text().strip() if resume and id_file.exists() else uuid.uuid4().hex[:12]
        id_file.write_text(run_id)
        self.run = wandb.init(
            project=project, dir=str(folder.parent), mode=mode, id=run_id, resume="allow", config=config,
            name=folder.parent.name,
        )  # fmt: skip

    def log(self, step: int, row: dict[str, Any]) -> None:
        self.run.log({k: v for k, v in row.items() if k != "step" and v is not None}, step=step)

    def image(self, step: int, tag: str, image: Any) -> None:
        self.run.log({tag: self.wandb.Image(image)}, step=step)

    def close(self) -> None:
        self.run.finish()


class MetricsLogger:
    """Appends `{"step": k, ...}` lines to `metrics.jsonl`.

    On resume from step k it first drops lines logged after k's checkpoint, so a killed-and-resumed run leaves
    exactly the lines an uninterrupted run would have: every line of a later step, a torn last line, and, when k is
    the run's last step (`final_step`), the end-of-run evaluation (logged at k after the last checkpoint, and
    evaluated again by the resumed run).
    """

    def __init__(
        self, path: str | Path, resume_step: int | None = None, final_step: int | None = None, sinks: tuple = ()
    ):
        self.sinks = list(sinks)  # TensorBoardSink / WandbSink: each gets every row
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
        for sink in self.sinks:
            sink.log(step, row)
        return row

    def images(self, step: int, paths: list[Path]) -> None:
        """Image files (the end-of-run plots) to the sinks that take images, tagged by file stem."""
        if not self.sinks:
            return
        import numpy as np
        from PIL import Image

        for path in paths:
            with Image.open(path) as image:
                pixels = np.asarray(image.convert("RGB"))
            for sink in self.sinks:
                sink.image(step, f"plots/{path.stem}", pixels)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.sinks = []


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
