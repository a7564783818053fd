"""GUI agent envs on procedurally drawn screens: `gui_click` (single-step grounding) and `gui_task` (multi-step).

Importing this package registers both in `sim.ENVS`. Screens are drawn with PIL only (`sim.gui.screen`, `sim.gui.layouts`, `sim.gui.paint`), so the
package needs nothing beyond `import sim`'s own dependencies.

Real pages would plug in behind the same two pieces: a `Screen` is just elements with kinds, labels and pixel boxes
plus a picture, and an app is a state machine with `act`, `expert` and `remaining`. A headless-Chromium adapter
(Playwright, imported lazily inside it, as a `[gui]` extra) would render a local HTML page per world at
`image_size`, read the clickable elements' labels and boxes from the DOM (`getBoundingClientRect` of buttons, inputs,
`[role]` elements), and map parsed actions to `page.mouse.click(x, y)`, `page.keyboard.type`, `page.mouse.wheel`
and `page.go_back()`; the rewards would stay the same, and the goal checks would read the DOM's state.
"""

from sim.gui.envs import TASKS, GUIClickEnv, GUITaskEnv
from sim.gui.miniwob import MiniWoBEnv
from sim.gui.paint import draw
from sim.gui.screen import LAYOUTS, THEMES, Element, Screen

__all__ = ["LAYOUTS", "TASKS", "THEMES", "Element", "GUIClickEnv", "GUITaskEnv", "MiniWoBEnv", "Screen", "draw"]
