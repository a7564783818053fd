"""Draw one observation of every env family into `docs/envs.png` (the README's table of env families).

    python scripts/env_gallery.py            # writes docs/envs.png

Each panel is what the policy sees after `reset(seed=0)` (for the multi-turn render env, after one expert turn),
with the instruction as the caption.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import sim  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PANELS = [
    ("grounding", {"image_size": 128}),
    ("reach", {"image_size": 128, "camera": "ego"}),
    ("push", {"image_size": 128}),
    ("svg", {"image_size": 128, "complexity": 4}),
    ("svg", {"image_size": 128, "complexity": 2, "turns": 2}),  # shown after one sloppy attempt
    ("chart", {"image_size": 192}),
    ("cad", {"image_size": 128}),
    ("gui_click", {"image_size": 160}),
    ("gui_task", {"image_size": 160}),
    ("highway", {"image_size": 128}),
    ("dataset", {"image_size": 64}),
]


def main() -> None:
    import torch

    fig, axes = plt.subplots(2, 6, figsize=(18, 7.2))
    for ax, (name, options) in zip(axes.flat, PANELS):
        env = sim.make(name, num_envs=1, **options)
        obs = env.reset(seed=0)
        title = name
        if options.get("turns", 1) > 1:
            obs = env.step(env.expert_action(noise=0.3, generator=torch.Generator().manual_seed(0))).obs
            title = f"{name} (turn 2)"
        elif name == "reach":
            title = "reach (camera=ego)"
        ax.imshow(obs.image[0].numpy())
        caption = "\n".join(textwrap.wrap(obs.instruction[0].splitlines()[0], 34)[:3])
        ax.set_title(title, fontsize=11, fontweight="bold")
        ax.set_xlabel(caption, fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
        env.close()
    for ax in list(axes.flat)[len(PANELS) :]:
        ax.axis("off")
    fig.tight_layout()
    out = REPO / "docs" / "envs.png"
    fig.savefig(out, dpi=80)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
