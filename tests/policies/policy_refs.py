"""Plainly written reference policies: lists, scans, and each paper's steps in its own order.

Each reference simulates a demand-cached pool of ``capacity`` keys on its own; ``access``
returns ``(hit, victim)`` with ``victim`` None when nothing was evicted. Ties are broken the
way each policy documents, so victims can be compared one by one.
"""

from __future__ import annotations

import math
from itertools import pairwise


class RefFIFO:
    """FIFO: a list, oldest first."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.queue = capacity, []

    def access(self, key, now=0.0):
        if key in self.queue:
            return True, None
        victim = self.queue.pop(0) if len(self.queue) >= self.capacity else None
        self.queue.append(key)
        return False, victim


class RefLRU(RefFIFO):
    """LRU: a list, least recent first."""

    def access(self, key, now=0.0):
        if key in self.queue:
            self.queue.remove(key)
            self.queue.append(key)
            return True, None
        return super().access(key, now)


class RefScan:
    """Demand caching where the victim is the resident key with the smallest ``rank(key)``."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.resident, self.clock = capacity, [], 0

    def rank(self, key):
        raise NotImplementedError

    def hit(self, key, now):
        pass

    def insert(self, key, now):
        pass

    def evicted(self, key):
        pass

    def access(self, key, now=0.0):
        self.clock += 1
        if key in self.resident:
            self.hit(key, now)
            return True, None
        victim = None
        if len(self.resident) >= self.capacity:
            victim = min(self.resident, key=self.rank)
            self.resident.remove(victim)
            self.evicted(victim)
        self.resident.append(key)
        self.insert(key, now)
        return False, victim


class RefLFU(RefScan):
    """LFU: smallest (count, last access); with aging, count is L + uses (LFU-DA)."""

    def __init__(self, capacity: int, aging: bool = False) -> None:
        super().__init__(capacity)
        self.aging, self.uses, self.count, self.last, self.inflation = aging, {}, {}, {}, 0

    def rank(self, key):
        return (self.count[key], self.last[key])

    def hit(self, key, now):
        self.uses[key] += 1
        self.count[key] = self.uses[key] + (self.inflation if self.aging else 0)
        self.last[key] = self.clock

    def insert(self, key, now):
        self.uses[key] = 1
        self.count[key] = 1 + (self.inflation if self.aging else 0)
        self.last[key] = self.clock

    def evicted(self, key):
        if self.aging:
            self.inflation = self.count[key]


class RefLengthAware(RefLFU):
    """LFU whose ties go to the earlier position (the last announced one)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.position = {}

    def rank(self, key):
        return (self.count[key], self.position.get(key, 0), self.last[key])

    def request(self, keys):
        for i, key in enumerate(keys):
            self.position[key] = i


class RefGDS(RefScan):
    """GreedyDual-Size with unit sizes: smallest (L + cost at last touch, last access)."""

    def __init__(self, capacity: int, cost) -> None:
        super().__init__(capacity)
        self.cost, self.h, self.last, self.inflation = cost, {}, {}, 0.0

    def rank(self, key):
        return (self.h[key], self.last[key])

    def hit(self, key, now):
        self.h[key], self.last[key] = self.inflation + self.cost(key), self.clock

    insert = hit

    def evicted(self, key):
        self.inflation = self.h[key]


class RefHeat(RefScan):
    """Coldest first: heat halves every half_life and gains 1 per access (log-space score)."""

    def __init__(self, capacity: int, half_life: float) -> None:
        super().__init__(capacity)
        self.half_life, self.score, self.last = half_life, {}, {}

    def rank(self, key):
        return (self.score[key], self.last[key])

    def hit(self, key, now):
        heat = 2.0 ** (self.score[key] - now / self.half_life) + 1.0
        self.score[key], self.last[key] = math.log2(heat) + now / self.half_life, self.clock

    def insert(self, key, now):
        self.score[key], self.last[key] = now / self.half_life, self.clock


class RefPrefixLRU(RefScan):
    """LRU among resident keys that are no resident key's parent."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.parent, self.last = {}, {}

    def ancestors(self, key):
        seen = []
        while key in self.parent:
            key = self.parent[key]
            seen.append(key)
        return seen

    def request(self, keys):
        for parent, key in pairwise(keys):
            if key not in self.parent and key != parent and key not in self.ancestors(parent):
                self.parent[key] = parent

    def rank(self, key):
        is_parent = any(self.parent.get(other) == key for other in self.resident)
        return (is_parent, self.last[key])

    def hit(self, key, now):
        self.last[key] = self.clock

    insert = hit


class RefOPT(RefScan):
    """Farthest next use first; never-used-again keys first, smallest key first."""

    def __init__(self, capacity: int, future) -> None:
        super().__init__(capacity)
        self.future, self.position = list(future), 0

    def next_use(self, key):
        for j in range(self.position, len(self.future)):
            if self.future[j] == key:
                return j
        return len(self.future)

    def rank(self, key):
        return (-self.next_use(key), key)

    def access(self, key, now=0.0):
        self.position += 1  # the current access is not a future use
        return super().access(key, now)


class RefARC:
    """ARC exactly as the paper's Fig. 4, cases I-IV (``p`` is a real number)."""

    def __init__(self, capacity: int) -> None:
        self.c, self.p = capacity, 0.0
        self.t1, self.t2, self.b1, self.b2 = [], [], [], []

    def replace(self, key):
        if self.t1 and (len(self.t1) > self.p or (key in self.b2 and len(self.t1) == self.p)):
            victim = self.t1.pop(0)
            self.b1.append(victim)
        else:
            victim = self.t2.pop(0)
            self.b2.append(victim)
        return victim

    def access(self, key, now=0.0):
        c = self.c
        if key in self.t1 or key in self.t2:  # case I
            (self.t1 if key in self.t1 else self.t2).remove(key)
            self.t2.append(key)
            return True, None
        if key in self.b1:  # case II
            self.p = min(float(c), self.p + max(len(self.b2) / len(self.b1), 1.0))
            victim = self.replace(key)
            self.b1.remove(key)
            self.t2.append(key)
            return False, victim
        if key in self.b2:  # case III
            self.p = max(0.0, self.p - max(len(self.b1) / len(self.b2), 1.0))
            victim = self.replace(key)
            self.b2.remove(key)
            self.t2.append(key)
            return False, victim
        victim = None  # case IV
        l1 = len(self.t1) + len(self.b1)
        total = l1 + len(self.t2) + len(self.b2)
        if l1 == c:
            if len(self.t1) < c:
                self.b1.pop(0)
                victim = self.replace(key)
            else:
                victim = self.t1.pop(0)
        elif total >= c:
            if total == 2 * c:
                self.b2.pop(0)
            victim = self.replace(key)
        self.t1.append(key)
        return False, victim


class RefS3FIFO:
    """S3-FIFO with libCacheSim's choices: one victim per step, counts reset on promotion."""

    def __init__(self, capacity, small_fraction=0.1, ghost_fraction=0.9, move_threshold=2):
        self.capacity = capacity
        self.small_cap = max(1, int(capacity * small_fraction))
        self.ghost_cap = int(capacity * ghost_fraction)
        self.threshold = move_threshold
        self.small, self.main, self.ghost, self.freq = [], [], [], {}
        self.evicted_once = False

    def evict(self):
        while True:
            if len(self.main) > self.capacity - self.small_cap or not self.small:
                while True:
                    key = self.main.pop(0)
                    if self.freq[key] == 0:
                        del self.freq[key]
                        return key
                    self.freq[key] -= 1
                    self.main.append(key)
            while self.small:
                key = self.small.pop(0)
                if self.freq[key] >= self.threshold:
                    self.freq[key] = 0
                    self.main.append(key)
                else:
                    del self.freq[key]
                    if self.ghost_cap:
                        self.ghost.append(key)
                        if len(self.ghost) > self.ghost_cap:
                            self.ghost.pop(0)
                    return key

    def access(self, key, now=0.0):
        if key in self.freq:
            self.freq[key] = min(self.freq[key] + 1, 3)
            return True, None
        ghost_hit = key in self.ghost  # looked up before the eviction can trim the ghost
        if ghost_hit:
            self.ghost.remove(key)
        victim = None
        if len(self.freq) >= self.capacity:
            self.evicted_once = True
            victim = self.evict()
        if ghost_hit or (not self.evicted_once and len(self.small) >= self.small_cap):
            self.main.append(key)
        else:
            self.small.append(key)
        self.freq[key] = 0
        return False, victim


class RefSIEVE:
    """SIEVE with a list (oldest first) and a hand index that moves towards the newest."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.queue, self.visited, self.hand = capacity, [], {}, None

    def access(self, key, now=0.0):
        if key in self.visited:
            self.visited[key] = True
            return True, None
        victim = None
        if len(self.queue) >= self.capacity:
            i = self.hand if self.hand is not None else 0
            while self.visited[self.queue[i]]:
                self.visited[self.queue[i]] = False
                i = (i + 1) % len(self.queue)
            victim = self.queue.pop(i)
            del self.visited[victim]
            self.hand = i if i < len(self.queue) else None
        self.queue.append(key)
        self.visited[key] = False
        return False, victim


class RefSchedulerAware(RefLRU):
    """LRU that skips upcoming keys unless only upcoming keys are left."""

    upcoming: frozenset = frozenset()

    def access(self, key, now=0.0):
        if key in self.queue or len(self.queue) < self.capacity:
            return super().access(key, now)
        others = [k for k in self.queue if k not in self.upcoming]
        victim = (others or self.queue)[0]
        self.queue.remove(victim)
        self.queue.append(key)
        return False, victim
