"""A set of block ids kept as a mask over the ids: a batch joins or leaves in one numpy pass."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

Keys = np.ndarray | Sequence[int]


class KeySet:
    """Distinct non-negative ids as a bool ``mask`` (ids past its end are absent) and a count.

    The batch methods take distinct keys (a set of ids, as every caller in the tiers has);
    a scalar one costs about a numpy scalar access, a batch one a few numpy passes.
    """

    __slots__ = ("count", "mask")

    def __init__(self, size: int = 1024):
        self.mask = np.zeros(size, dtype=bool)
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def __contains__(self, key: int) -> bool:
        return key < len(self.mask) and bool(self.mask[key])

    def __iter__(self) -> Iterator[int]:
        """The ids, ascending."""
        return iter(np.flatnonzero(self.mask).tolist())

    def __eq__(self, other: object) -> bool:
        """The same ids as another KeySet or a Python set."""
        if isinstance(other, KeySet | set | frozenset):
            return set(self) == set(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # (mutable, as a set)

    def add(self, key: int) -> None:
        if key >= len(self.mask):
            self._reach(key)
        if not self.mask[key]:
            self.mask[key] = True
            self.count += 1

    def discard(self, key: int) -> None:
        if key < len(self.mask) and self.mask[key]:
            self.mask[key] = False
            self.count -= 1

    def update(self, keys: Keys) -> None:
        """Add each of ``keys`` (distinct)."""
        if len(keys) == 0:
            return
        at = np.asarray(keys, dtype=np.int64)
        self._reach(int(at.max()))
        self.count += len(at) - int(np.count_nonzero(self.mask[at]))
        self.mask[at] = True

    def difference_update(self, keys: Keys) -> None:
        """Remove each of ``keys`` (distinct) that is in the set."""
        if len(keys) == 0 or self.count == 0:
            return
        if len(keys) == 1:  # (scalar stores are quicker)
            self.discard(int(keys[0]))
            return
        at = self._inside(np.asarray(keys, dtype=np.int64))
        self.count -= int(np.count_nonzero(self.mask[at]))
        self.mask[at] = False

    def members(self, keys: Keys) -> np.ndarray:
        """Which of ``keys`` are in the set (a bool per key)."""
        at = np.asarray(keys, dtype=np.int64)
        out = np.zeros(len(at), dtype=bool)
        inside = at < len(self.mask)
        out[inside] = self.mask[at[inside]]
        return out

    def among(self, keys: Keys) -> list[int]:
        """The keys in the set, in the order given."""
        at = np.asarray(keys, dtype=np.int64)
        return at[self.members(at)].tolist()

    def isdisjoint(self, keys: Keys) -> bool:
        return self.count == 0 or len(keys) == 0 or not self.members(keys).any()

    def _inside(self, at: np.ndarray) -> np.ndarray:
        """``at`` without the ids past the mask's end (none of them is in the set)."""
        return at if len(at) == 0 or int(at.max()) < len(self.mask) else at[at < len(self.mask)]

    def _reach(self, key: int) -> None:
        """Make the mask reach ``key`` (doubling)."""
        if key < len(self.mask):
            return
        grown = np.zeros(max(key + 1, 2 * len(self.mask)), dtype=bool)
        grown[: len(self.mask)] = self.mask
        self.mask = grown
