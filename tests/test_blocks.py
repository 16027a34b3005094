"""The block table's bulk operations against the one-block-at-a-time ones they replace."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.memory.blocks import BlockTable

# a script: ("new", owner, count) allocates count blocks; ("drop", i) drops the i-th live one
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("new"), st.integers(0, 5), st.integers(1, 40)),
        st.tuples(st.just("drop"), st.integers(0, 10_000), st.integers(1, 30)),
    ),
    max_size=30,
)


def _play(script, bulk: bool) -> BlockTable:
    table = BlockTable(initial=8)
    live: list[int] = []
    heat = 0.0
    for op, a, k in script:
        if op == "new":
            heats = np.arange(heat, heat + k)
            heat += k
            if bulk:
                ids = table.new_many(a, 7, heats)
            else:
                ids = [table.new(a, 7 + i, h) for i, h in enumerate(heats.tolist())]
            live.extend(ids)
            for b in ids[::3]:
                table.register(b, 1000 + b)
        elif live:
            start = a % len(live)
            gone, live = live[start : start + k], live[:start] + live[start + k :]
            table.ref[gone] = 0
            if bulk:
                table.drop_many(np.asarray(gone, dtype=np.int64))
            else:
                for b in gone:
                    table.drop(b)
    return table


@settings(max_examples=60, deadline=None)
@given(_steps)
def test_bulk_new_and_drop_leave_the_table_as_single_calls_do(script):
    one, bulk = _play(script, bulk=False), _play(script, bulk=True)
    assert bulk.size == one.size
    assert bulk._free_ids == one._free_ids
    assert bulk.index == one.index
    n = one.size
    for name in ("ref", "hash", "owner", "position", "heat", "dirty"):
        assert np.array_equal(getattr(bulk, name)[:n], getattr(one, name)[:n]), name
