"""The one `REWARDS` registry.

It lives in its own module so that `box.py` and `text.py` can register into it without importing the package
`__init__`, which imports them.
"""

from __future__ import annotations

from collections.abc import Callable

from rewards.registry import Registry

REWARDS: Registry[Callable[..., object]] = Registry("reward")
