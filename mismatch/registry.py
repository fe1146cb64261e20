"""A named registry: items registered once under a name, looked up with a one-line error.

The shape every registry here shares (OPD losses, pair kinds; perturbation kinds add a second key,
their config class): a read-only mapping in registration order, `register` that refuses a name
twice, and `get` whose error names the valid entries (lm-eval's `api/registry.py` does the same).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """A read-only mapping `name → item` filled by `register`.

    Args:
        what: what the items are, for error messages ("loss", "pair kind").
        error: the exception type an unknown name raises (a `ValueError` subclass).
    """

    def __init__(self, what: str, error: type[ValueError] = ValueError) -> None:
        self.what, self.error = what, error
        self._items: dict[str, T] = {}

    def register(self, name: str, item: T) -> T:
        """Register `item` under `name`; returns it. Raises `ValueError` when `name` is taken."""
        if name in self._items:
            raise ValueError(f"{self.what} {name!r} is already registered")
        self._items[name] = item
        return item

    def get(self, name: str) -> T:  # type: ignore[override] - an unknown name is an error, not None
        """The item registered under `name`; `self.error` naming the valid names otherwise."""
        if name not in self._items:
            raise self.error(f"unknown {self.what} {name!r}; valid: {', '.join(self._items)}")
        return self._items[name]

    def __getitem__(self, name: str) -> T:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)
