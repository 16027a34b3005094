"""S3-FIFO's bulk calls (``on_insert_many``, ``on_release_many``, ``on_hold_many``) equal a
loop of the single calls, on states reached by random operations: before and after the first
eviction, with ghost hits among the inserted keys, and held keys from S and from M."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.s3fifo import S3FIFO

OPS = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 80)), max_size=150)


def _state(p: S3FIFO):
    """Everything the policy holds, and its eviction order (planned on shadows)."""
    return (
        list(p.small),
        list(p.main),
        list(p.ghost),
        sorted(p.freq.items()),
        sorted(p._held.items()),
        p._evicted,
        p.victims(len(p.small) + len(p.main)),
    )


def _drive(p: S3FIFO, ops) -> None:
    """Inserts (ids reused after eviction: ghost hits), hits, holds, releases, evictions."""
    queued = lambda: list(p.small) + list(p.main)  # noqa: E731
    for op, key in ops:
        if op == 0 and key not in p.freq:
            p.on_insert(key)
        elif op == 1 and queued():
            p.on_access(queued()[key % len(queued())])
        elif op == 2 and queued():
            p.on_hold(queued()[key % len(queued())])
        elif op == 3 and p._held:
            p.on_release(sorted(p._held)[key % len(p._held)])
        elif op == 4:
            p.evict(key % 4)


@settings(max_examples=200, deadline=None)
@given(ops=OPS, fresh=st.lists(st.integers(0, 120), unique=True, max_size=30), data=st.data())
def test_on_insert_many_and_on_release_many_match_single_calls(ops, fresh, data):
    bulk, loop = S3FIFO(capacity=20), S3FIFO(capacity=20)
    for p in (bulk, loop):
        _drive(p, ops)
    new = [k for k in fresh if k not in bulk.freq]
    bulk.on_insert_many(new, 5.0)
    for k in new:
        loop.on_insert(k, 5.0)
    assert _state(bulk) == _state(loop)
    held = data.draw(st.permutations(sorted(bulk._held)))
    bulk.on_release_many(list(held), 6.0)
    for k in held:
        loop.on_release(k, 6.0)
    assert _state(bulk) == _state(loop)
    assert bulk._version == loop._version


@settings(max_examples=200, deadline=None)
@given(ops=OPS, data=st.data())
def test_on_hold_many_matches_single_calls(ops, data):
    """Holding queued keys from S and from M, in any order: as one ``on_hold`` each."""
    bulk, loop = S3FIFO(capacity=20), S3FIFO(capacity=20)
    for p in (bulk, loop):
        _drive(p, ops)
    queued = list(bulk.small) + list(bulk.main)
    keys = data.draw(st.lists(st.sampled_from(queued), unique=True)) if queued else []
    bulk.on_hold_many(keys)
    for k in keys:
        loop.on_hold(k)
    assert _state(bulk) == _state(loop)
    assert bulk._version == loop._version
