"""Argument choices loaded when first looked at, so building the parser imports nothing
heavy (``kvsim --help`` stays fast; the choices come from modules a command imports anyway)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence


class LazyChoices(Sequence[str]):
    """``choices=`` for argparse from ``load()``, called the first time they are needed: a
    value checked against them, or a help text that lists them (give the argument a
    ``metavar``, else argparse lists them as the argument is added)."""

    def __init__(self, load: Callable[[], Iterable[str]]):
        self._load = load
        self._values: tuple[str, ...] | None = None

    @property
    def values(self) -> tuple[str, ...]:
        if self._values is None:
            self._values = tuple(self._load())
        return self._values

    def __getitem__(self, i):  # type: ignore[override]
        return self.values[i]

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def __contains__(self, value: object) -> bool:
        return value in self.values
