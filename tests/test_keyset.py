"""KeySet against a plain Python set: the same members, count and answers after any ops."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.memory.keyset import KeySet

KEYS = st.integers(0, 3000)  # past the initial mask (1024): it must grow
BATCH = st.lists(KEYS, max_size=12, unique=True)
OPS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["add", "discard"]), KEYS),
        st.tuples(st.sampled_from(["update", "difference_update"]), BATCH),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(ops=OPS, probe=BATCH)
def test_keyset_is_a_set_of_ids(ops, probe):
    ks, ref = KeySet(), set()
    for op, arg in ops:
        if op in ("update", "difference_update"):
            arg_in = np.asarray(arg, dtype=np.int64) if len(arg) % 2 else arg  # arrays or lists
            getattr(ks, op)(arg_in)
        else:
            getattr(ks, op)(arg)
        getattr(ref, op)(arg)
        assert len(ks) == len(ref) and bool(ks) == bool(ref)
    assert list(ks) == sorted(ref) and ks == ref
    assert ks.members(probe).tolist() == [k in ref for k in probe]
    assert ks.among(probe) == [k for k in probe if k in ref]
    assert ks.isdisjoint(probe) == ref.isdisjoint(probe)
    assert all((k in ks) == (k in ref) for k in probe)
    assert (5000 in ks) is False  # past the mask's end
