"""The env registry, in its own tiny module so that task modules can register without importing `sim` itself.

`sim/__init__.py` imports `sim.tasks`, whose modules import `ENVS` from here; keeping `ENVS` out of
`sim/__init__.py` is what avoids the import cycle.
"""

from __future__ import annotations

from rewards.registry import Registry

ENVS: Registry[type] = Registry("env")
