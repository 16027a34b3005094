"""Key queues for policies that plan on shadows: a real FIFO and a virtual copy of one."""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Protocol


class Queue(Protocol):
    """What an eviction step needs from a FIFO of keys."""

    def __len__(self) -> int: ...
    def pop_oldest(self) -> int: ...
    def push(self, key: int) -> None: ...
    def popitem(self, last: bool = True) -> tuple[int, None]: ...  # last=False: the oldest
    def __setitem__(self, key: int, value: None) -> None: ...  # push


class Fifo(OrderedDict[int, None]):
    """A FIFO of keys, oldest first."""

    def pop_oldest(self) -> int:
        """Remove and return the oldest key."""
        return self.popitem(last=False)[0]

    def push(self, key: int) -> None:
        """Append ``key`` as the newest."""
        self[key] = None


class Shadow:
    """A virtual copy of a ``Fifo``: pops and pushes happen here, the queue is untouched."""

    def __init__(self, queue: Fifo) -> None:
        self._it, self._left, self._tail = iter(queue), len(queue), deque[int]()

    def __len__(self) -> int:
        return self._left + len(self._tail)

    def pop_oldest(self) -> int:
        """Take the oldest key of the virtual queue."""
        if self._left:
            self._left -= 1
            return next(self._it)
        return self._tail.popleft()

    def push(self, key: int) -> None:
        """Append ``key`` to the virtual queue."""
        self._tail.append(key)

    def popitem(self, last: bool = True) -> tuple[int, None]:
        """``(pop_oldest(), None)``: a ``Fifo``'s ``popitem(False)`` (only the oldest)."""
        if last:
            raise NotImplementedError("a shadow queue pops only its oldest key")
        return self.pop_oldest(), None

    def __setitem__(self, key: int, value: None) -> None:
        """:meth:`push` ``key`` (a ``Fifo``'s ``queue[key] = None``)."""
        self._tail.append(key)
