"""Rendering-feedback envs: the policy writes SVG, matplotlib or build123d code that should reproduce a target.

Importing this package registers `svg`, `chart` and `cad` in `sim.ENVS` (`sim.render.envs` documents them;
`sim.render.targets` holds the procedural targets). Renderers run in `rewards.render`'s sandbox and are imported
there, lazily, so importing this package costs no more than `import sim`.
"""

from sim.render.envs import CadEnv, ChartEnv, SvgEnv, image_similarity, side_by_side
from sim.render.targets import Target, cad_target, chart_target, svg_target

__all__ = [
    "CadEnv",
    "ChartEnv",
    "SvgEnv",
    "Target",
    "cad_target",
    "chart_target",
    "image_similarity",
    "side_by_side",
    "svg_target",
]
