"""One generic name -> object registry, used at the four extension points.

It lives in `rewards` because that package is the bottom of the import graph (mmrl -> sim -> rewards); `sim`
and `mmrl` import it from here rather than keeping copies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A name -> object map that refuses duplicate names and names unknown ones with the valid choices.

    >>> LOSSES = Registry("policy loss")
    >>> @LOSSES.register("ppo_clip")
    ... def ppo_clip_loss(): ...
    >>> LOSSES.get("ppo_clip") is ppo_clip_loss
    True
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(f"unknown {self.kind} {name!r}; registered: {', '.join(sorted(self._items))}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)
