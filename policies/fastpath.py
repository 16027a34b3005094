"""Fused replay loops: one demand-cached pool, one policy, no per-access method calls.

Each function replays ``keys`` through a fresh pool of ``capacity`` keys and returns the
hit mask (a numpy bool array, one entry per access). Each is the policy's interface
behaviour (``policies.pool.replay_generic``) inlined, with no pinned keys; the tests check
that both give the same hits on random sequences and on real traces.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from itertools import pairwise

import numpy as np


def _mask(hits: bytearray) -> np.ndarray:
    return np.frombuffer(hits, dtype=np.uint8).astype(bool)


def next_uses(keys: np.ndarray) -> np.ndarray:
    """For each position ``i``, the next position holding the same key (``len(keys)`` if none)."""
    n = len(keys)
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    out = np.full(n, n, dtype=np.int64)
    same = ordered[1:] == ordered[:-1]
    out[order[:-1][same]] = order[1:][same]
    return out


def fifo(keys: np.ndarray, capacity: int) -> np.ndarray:
    """FIFO hit mask."""
    hits = bytearray(len(keys))
    resident: set[int] = set()
    order: deque[int] = deque()
    for i, key in enumerate(keys.tolist()):
        if key in resident:
            hits[i] = 1
            continue
        if len(resident) >= capacity:
            resident.remove(order.popleft())
        resident.add(key)
        order.append(key)
    return _mask(hits)


def lru(keys: np.ndarray, capacity: int) -> np.ndarray:
    """LRU hit mask."""
    hits = bytearray(len(keys))
    order: OrderedDict[int, None] = OrderedDict()
    move, pop = order.move_to_end, order.popitem
    for i, key in enumerate(keys.tolist()):
        if key in order:
            move(key)
            hits[i] = 1
        else:
            if len(order) >= capacity:
                pop(False)
            order[key] = None
    return _mask(hits)


def lfu(keys: np.ndarray, capacity: int) -> np.ndarray:
    """LFU hit mask: frequency buckets, least recently used first within a bucket."""
    hits = bytearray(len(keys))
    freq: dict[int, int] = {}
    buckets: dict[int, OrderedDict[int, None]] = {1: OrderedDict()}
    ones, low = buckets[1], 1
    for i, key in enumerate(keys.tolist()):
        count = freq.get(key)
        if count is not None:
            hits[i] = 1
            bucket = buckets[count]
            del bucket[key]
            if not bucket and low == count:
                low = count + 1
            up = buckets.get(count + 1)
            if up is None:
                up = buckets[count + 1] = OrderedDict()
            up[key] = None
            freq[key] = count + 1
            continue
        if len(freq) >= capacity:
            del freq[buckets[low].popitem(last=False)[0]]
        freq[key] = 1
        ones[key] = None
        low = 1
    return _mask(hits)


def lfu_aging(keys: np.ndarray, capacity: int) -> np.ndarray:
    """LFU-DA hit mask: priority ``L + count``, least recently used first on ties."""
    hits = bytearray(len(keys))
    count: dict[int, int] = {}
    tick_of: dict[int, int] = {}
    heap: list[tuple[int, int, int]] = []
    inflation = 0
    for tick, key in enumerate(keys.tolist(), start=1):
        c = count.get(key)
        if c is not None:
            hits[tick - 1] = 1
            c += 1
        else:
            if len(count) >= capacity:
                while True:
                    prio, t, victim = heapq.heappop(heap)
                    if tick_of.get(victim) == t:
                        break
                inflation = prio
                del count[victim], tick_of[victim]
            c = 1
        count[key] = c
        tick_of[key] = tick
        heapq.heappush(heap, (inflation + c, tick, key))
    return _mask(hits)


def arc(keys: np.ndarray, capacity: int) -> np.ndarray:
    """ARC hit mask (as ``policies.arc.ARC``)."""
    hits = bytearray(len(keys))
    t1: OrderedDict[int, None] = OrderedDict()
    t2: OrderedDict[int, None] = OrderedDict()
    b1: OrderedDict[int, None] = OrderedDict()
    b2: OrderedDict[int, None] = OrderedDict()
    p = 0.0
    for i, key in enumerate(keys.tolist()):
        if key in t2:
            t2.move_to_end(key)
            hits[i] = 1
            continue
        if key in t1:
            del t1[key]
            t2[key] = None
            hits[i] = 1
            continue
        in_b1 = key in b1
        in_b2 = not in_b1 and key in b2
        if in_b1:
            p = min(p + max(len(b2) / len(b1), 1.0), float(capacity))
        elif in_b2:
            p = max(p - max(len(b1) / len(b2), 1.0), 0.0)
        n1 = len(t1)
        if n1 + len(t2) >= capacity:
            if (n1 > 0 and (n1 > p or (n1 == p and in_b2))) or not t2:
                b1[t1.popitem(last=False)[0]] = None
            else:
                b2[t2.popitem(last=False)[0]] = None
        if in_b1:
            del b1[key]
            t2[key] = None
        elif in_b2:
            del b2[key]
            t2[key] = None
        else:
            in_l1 = len(t1) + len(b1)
            if in_l1 >= capacity:
                if b1:
                    b1.popitem(last=False)
            elif in_l1 + len(t2) + len(b2) >= 2 * capacity and b2:
                b2.popitem(last=False)
            t1[key] = None
    return _mask(hits)


def s3fifo(
    keys: np.ndarray, capacity: int, small_size: int, ghost_size: int, threshold: int
) -> np.ndarray:
    """S3-FIFO hit mask (as ``policies.s3fifo.S3FIFO``)."""
    hits = bytearray(len(keys))
    main_size = capacity - small_size
    small: OrderedDict[int, None] = OrderedDict()
    main: OrderedDict[int, None] = OrderedDict()
    ghost: OrderedDict[int, None] = OrderedDict()
    freq: dict[int, int] = {}
    evicted = False
    for i, key in enumerate(keys.tolist()):
        count = freq.get(key)
        if count is not None:
            hits[i] = 1
            if count < 3:
                freq[key] = count + 1
            continue
        ghost_hit = key in ghost  # looked up before an eviction can trim the ghost
        if ghost_hit:
            del ghost[key]
        if len(freq) >= capacity:
            evicted = True
            while True:
                if len(main) > main_size or not small:
                    while True:
                        victim = main.popitem(last=False)[0]
                        count = freq[victim]
                        if count == 0:
                            break
                        freq[victim] = count - 1
                        main[victim] = None
                    del freq[victim]
                    break
                victim = -1
                while small:
                    candidate = small.popitem(last=False)[0]
                    if freq[candidate] >= threshold:
                        freq[candidate] = 0
                        main[candidate] = None
                    else:
                        victim = candidate
                        break
                if victim >= 0:
                    del freq[victim]
                    if ghost_size > 0:
                        ghost[victim] = None
                        if len(ghost) > ghost_size:
                            ghost.popitem(last=False)
                    break
        if ghost_hit or (not evicted and len(small) >= small_size):
            main[key] = None
        else:
            small[key] = None
        freq[key] = 0
    return _mask(hits)


def sieve(keys: np.ndarray, capacity: int) -> np.ndarray:
    """SIEVE hit mask (as ``policies.sieve.SIEVE``)."""
    hits = bytearray(len(keys))
    end = -1
    newer: dict[int, int] = {end: end}
    older: dict[int, int] = {end: end}
    visited: dict[int, bool] = {}
    hand = end
    for i, key in enumerate(keys.tolist()):
        if key in visited:
            visited[key] = True
            hits[i] = 1
            continue
        if len(visited) >= capacity:
            cur = hand if hand != end else newer[end]
            while True:
                if cur == end:
                    cur = newer[end]
                elif visited[cur]:
                    visited[cur] = False
                    cur = newer[cur]
                else:
                    break
            before, hand = older.pop(cur), newer.pop(cur)
            newer[before], older[hand] = hand, before
            del visited[cur]
        newest = older[end]
        older[key], newer[key] = newest, end
        newer[newest] = older[end] = key
        visited[key] = False
    return _mask(hits)


def opt(keys: np.ndarray, capacity: int) -> np.ndarray:
    """Belady OPT hit mask (demand caching; never-used-again keys first, smallest key first)."""
    hits = bytearray(len(keys))
    upcoming = next_uses(np.asarray(keys)).tolist()
    next_of: dict[int, int] = {}
    heap: list[tuple[int, int]] = []
    for i, key in enumerate(keys.tolist()):
        if key in next_of:
            hits[i] = 1
        elif len(next_of) >= capacity:
            while True:
                neg, victim = heapq.heappop(heap)
                if next_of.get(victim) == -neg:
                    break
            del next_of[victim]
        nxt = upcoming[i]
        next_of[key] = nxt
        heapq.heappush(heap, (-nxt, key))
    return _mask(hits)


def prefix_lru(keys: np.ndarray, starts: np.ndarray, capacity: int) -> np.ndarray:
    """Prefix-aware LRU hit mask (as ``policies.prefix_lru.PrefixLRU``; needs request starts)."""
    hits = bytearray(len(keys))
    parent_of: dict[int, int] = {}
    is_parent: set[int] = set()
    children: dict[int, int] = {}
    tick_of: dict[int, int] = {}
    heap: list[tuple[int, int]] = []
    flat = keys.tolist()
    bounds = [*starts.tolist(), len(flat)]
    tick = 0
    for first, end in pairwise(bounds):
        for i in range(first + 1, end):  # on_request: the block before is the parent
            key, parent = flat[i], flat[i - 1]
            if key in parent_of or key == parent:
                continue
            up = parent if key in is_parent else None
            while up is not None and up != key:
                up = parent_of.get(up)
            if up is None:
                parent_of[key] = parent
                is_parent.add(parent)
                if key in tick_of:
                    children[parent] = children.get(parent, 0) + 1
        for i in range(first, end):
            key = flat[i]
            tick += 1
            if key in tick_of:
                hits[i] = 1
            else:
                if len(tick_of) >= capacity:
                    while True:
                        t, victim = heapq.heappop(heap)
                        if tick_of.get(victim) == t and victim not in children:
                            break
                    del tick_of[victim]
                    parent = parent_of.get(victim)
                    if parent is not None:
                        children[parent] -= 1
                        if not children[parent]:
                            del children[parent]
                            if parent in tick_of:
                                heapq.heappush(heap, (tick_of[parent], parent))
                parent = parent_of.get(key)
                if parent is not None:
                    children[parent] = children.get(parent, 0) + 1
            tick_of[key] = tick
            heapq.heappush(heap, (tick, key))
    return _mask(hits)
