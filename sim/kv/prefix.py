"""Prefix identity: which cached blocks hold a request's prompt prefix, and its progress in
registering the blocks it computes (so that later requests find them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from sim.memory.blocks import BlockTable
from sim.workload.requests import Requests

PREFIX_MEMO = 64  # requests whose prefix lookups are memoised
FIRST_LOOKUPS = 32  # hashes a prefix lookup looks up first (then twice as many, and so on)


@dataclass(frozen=True, eq=False)
class PrefixHits:
    """A prompt's longest cached prefix: its blocks in order, and the tier each is read from;
    ``remote``: blocks the cluster's KV pool holds after those (fetched on admission)."""

    blocks: np.ndarray
    tiers: np.ndarray
    remote: int = 0

    def __len__(self) -> int:
        return len(self.blocks) + self.remote

    def __iter__(self) -> Iterator[tuple[int, int]]:
        """(block, tier) pairs."""
        return zip(self.blocks.tolist(), self.tiers.tolist(), strict=True)


NO_HITS = PrefixHits(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
NO_HASHES = np.zeros(0, dtype=np.uint64)
NO_BLOCKS = np.zeros(0, dtype=np.int64)


def prefix_hashes(requests: Requests, enabled: bool) -> list[np.ndarray]:
    """Each request's block hashes that can ever be registered: its prompt's, and (with
    prefix caching) those of blocks that fill up while generating (the next turn's prompt);
    none where the workload names no prefix (a request may get its own when preempted:
    :meth:`PrefixIndex.give_own`)."""
    hashes = requests.prefix_hashes
    if hashes is None:
        return [NO_HASHES] * len(requests)
    if enabled and requests.output_hashes is not None:
        return [np.concatenate((p, o)) for p, o in zip(hashes, requests.output_hashes, strict=True)]
    return list(hashes)


def own_hashes(rid: int, start: int, stop: int) -> np.ndarray:
    """Hashes of request ``rid``'s blocks ``start`` to ``stop`` that no other block has: the
    splitmix64 finaliser (a bijection of 64-bit words, 0 only at 0) of ``(rid + 1) << 32 |
    block``; a workload's own hashes meet one of them with chance ~2^-64 a pair."""
    if stop <= start:
        return NO_HASHES
    x = (np.uint64(rid + 1) << np.uint64(32)) | np.arange(start, stop, dtype=np.uint64)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def hashed_block_counts(requests: Requests, enabled: bool) -> np.ndarray:
    """How many blocks of each request :func:`prefix_hashes` names (counted, not joined)."""
    if requests.prefix_hashes is None:
        return np.zeros(len(requests), dtype=np.int64)
    counts = np.array([len(h) for h in requests.prefix_hashes], dtype=np.int64)
    if enabled and requests.output_hashes is not None:
        counts += np.array([len(h) for h in requests.output_hashes], dtype=np.int64)
    return counts


def lost_block_cost(
    table: BlockTable, hashed_blocks: np.ndarray, block_tokens: int
) -> Callable[[int], float]:
    """What losing a block costs: the tokens from it to the end of its prefix chain (its
    owner's hashed blocks), which a prefix match can no longer reach without it (a match
    stops at the first missing block); one block's tokens for a block past the chain. The
    start of a long shared prefix is worth the most. ``hashed_blocks``: each request's
    registrable blocks (:func:`hashed_block_counts`)."""

    def cost(b: int) -> float:
        owner, position = int(table.owner[b]), int(table.position[b])
        end = int(hashed_blocks[owner]) if len(hashed_blocks) else 0
        return float(max(end - position, 1) * block_tokens)

    return cost


class PrefixIndex:
    """Hash-chain lookups of prompt prefixes in the block table's index (memoised), and
    how many of each request's hashed blocks are registered (``registered``)."""

    def __init__(
        self, table: BlockTable, requests: Requests, block_tokens: int, enabled: bool,
        lookup_tiers: int,
    ):  # fmt: skip
        self.table = table
        self.bt = block_tokens
        self.enabled = enabled
        self.named = requests.prefix_hashes is not None  # the workload names prefixes
        self.lookup_tiers = lookup_tiers  # tiers a hit may be read from (HBM first)
        self.hashes = prefix_hashes(requests, enabled)
        # blocks of each request that can ever be registered (its hashes)
        self.hashed_blocks = hashed_block_counts(requests, enabled)
        self.prompt = requests.prompt_tokens
        # tokens a lookup covers: the prompt; after a recompute preemption, all it had
        self.lookup_tokens = requests.prompt_tokens.astype(np.int64)  # (a copy)
        self.blocks_ever = -(-(requests.prompt_tokens + requests.output_tokens) // block_tokens)
        self.own_from = np.full(len(requests), -1, dtype=np.int64)  # its first own hash
        self.owners = 0  # unfinished requests that hold hashes of their own
        self.registered = np.zeros(len(requests), dtype=np.int64)
        self._memo: dict[int, tuple[int, np.ndarray]] = {}  # rid -> (index version, ids)

    def lookup_blocks(self, rid: int) -> int:
        """Blocks a lookup of ``rid``'s prompt covers (its full blocks but the last token)."""
        return min(len(self.hashes[rid]), (int(self.lookup_tokens[rid]) - 1) // self.bt)

    def give_own(self, rid: int) -> None:
        """Hashes of its own for ``rid``'s blocks past the workload's (all of them where the
        workload names none), as vLLM hashes every full block: unique to ``rid``, so only it
        can find them, after a recompute preemption."""
        if self.own_from[rid] >= 0:
            return
        hashes, total = self.hashes[rid], int(self.blocks_ever[rid])
        self.own_from[rid] = len(hashes)
        self.owners += 1
        if total > len(hashes):
            self.hashes[rid] = np.concatenate((hashes, own_hashes(rid, len(hashes), total)))
            self.hashed_blocks[rid] = total
        self._memo.pop(rid, None)

    def finished(self, rid: int) -> np.ndarray:
        """``rid`` is done: no one can find its own hashes any more. Returns the blocks the
        index holds under them (none if it has none)."""
        start = int(self.own_from[rid])
        if start < 0:
            return NO_BLOCKS
        self.owners -= 1
        self.own_from[rid] = -1
        got = map(self.table.index.get, self.hashes[rid][start:].tolist())
        return np.array([b for b in got if b is not None], dtype=np.int64)

    def preempted(self, rid: int, tokens: int) -> None:
        """``rid`` lost its KV to a recompute preemption holding ``tokens`` tokens (prompt
        and output so far): its next lookup covers them all, as vLLM's does (the blocks it
        wrote that are still cached come back instead of being computed again)."""
        self.lookup_tokens[rid] = tokens
        self._memo.pop(rid, None)

    def match(self, rid: int) -> PrefixHits:
        """The longest cached prefix of ``rid``'s prompt (one token left over)."""
        if not self.enabled:
            return NO_HITS
        ids = np.asarray(self.indexed_prefix(rid), dtype=np.int64)
        if not len(ids):
            return NO_HITS
        where = self.table.where[: self.lookup_tiers, ids]
        present = where.any(axis=0)
        cut = len(ids) if present.all() else int(np.argmin(present))
        return PrefixHits(ids[:cut], np.argmax(where[:, :cut], axis=0))

    def indexed_prefix(self, rid: int) -> np.ndarray:
        """Blocks registered under ``rid``'s leading prompt hashes, up to the first that is not.

        Memoised per request. While the index is unchanged the memo stands; after a change,
        its blocks up to the first that no longer holds its hash still stand (a block holds a
        hash exactly while the index maps the hash to it), and the lookups go on from there
        (if the memo holds all, from its next hash only if that one is registered now).
        """
        version, memo = self.table.index_version, self._memo.get(rid)
        if memo is not None and memo[0] == version:
            return memo[1]
        hashes = self.hashes[rid]  # (a request's hashes never change; a lookup's length
        # grows only at a preemption, which drops the memo)
        limit = self.lookup_blocks(rid)
        if memo is not None:
            ids = memo[1]
            held = self.table.hash[ids] == hashes[: len(ids)]
            m = len(ids) if held.all() else int(held.argmin())
            if m < len(ids) or (m < limit and int(hashes[m]) in self.table.index):
                ids = np.concatenate((ids[:m], self._lookups(hashes[m:limit])))
        else:
            ids = self._lookups(hashes[:limit])
            if len(self._memo) >= PREFIX_MEMO:  # the queue head, a prefetch lookahead
                self._memo = {}
        self._memo[rid] = (version, ids)
        return ids

    def _lookups(self, hashes: np.ndarray) -> np.ndarray:
        """The blocks the index holds for ``hashes``, up to the first it does not hold
        (looked up in chunks that double: a prompt's cached prefix often ends early)."""
        get, ids, at, chunk = self.table.index.get, [], 0, FIRST_LOOKUPS
        while at < len(hashes):
            got = list(map(get, hashes[at : at + chunk].tolist()))
            if None in got:
                ids.extend(got[: got.index(None)])
                break
            ids.extend(got)
            at, chunk = at + chunk, 2 * chunk
        return np.array(ids, dtype=np.int64)

    def newly_full(self, rid: int, held_blocks: int, computed: int) -> tuple[int, int] | None:
        """The range ``[start, full)`` of ``rid``'s blocks that ``computed`` tokens fill and
        are not registered yet (None: nothing new)."""
        hashes, start = self.hashes[rid], int(self.registered[rid])
        if start >= len(hashes):  # the usual call, once its hashed blocks are all registered
            return None
        full = min(computed // self.bt, len(hashes), held_blocks)
        return (start, full) if full > start else None

    def growing(self, ids: np.ndarray, computed: np.ndarray) -> np.ndarray:
        """Indices into ``ids`` (holding ``computed`` tokens) with a newly full hashed block."""
        full = np.minimum(computed // self.bt, self.hashed_blocks[ids])
        return np.flatnonzero(full > self.registered[ids])
