"""Prefix-block hashing: chain identities, segment ownership, trace sub-blocks."""

from __future__ import annotations

import numpy as np

from sim.workload import hashing


def test_combine_is_deterministic_and_separates_arguments() -> None:
    values = np.arange(10_000)
    a = hashing.combine(hashing.ROOT, values)
    assert len(np.unique(a)) == len(values)
    assert np.array_equal(a, hashing.combine(hashing.ROOT, values))
    b = hashing.combine(values, 7)
    assert len(np.unique(b)) == len(values)
    assert hashing.combine(-1, 0)[0] == hashing.combine(np.uint64(2**64 - 1), 0)[0]
    assert hashing.chain(1, 2)[0] != hashing.chain(2, 1)[0]


def test_segment_hashes_owner_is_the_segment_of_the_last_token() -> None:
    """Row 0: [A: 10][B: 10]; row 1: [empty D][A: 10][E: 6]; 4-token blocks."""
    a, b, d, e = (hashing.chain(k) for k in range(4))
    seg_row = np.array([0, 0, 1, 1, 1])
    seg_tokens = np.array([10, 10, 0, 10, 6])
    seg_chain = np.concatenate([a, b, d, a, e])
    flat = hashing.segment_hashes(seg_row, seg_tokens, seg_chain, np.array([5, 4]), 4)
    row0, row1 = flat[:5], flat[5:]
    assert row0[:2].tolist() == row1[:2].tolist()  # blocks 0, 1 end inside A in both rows
    assert row0[2] != row1[2]  # block 2 ends in B (row 0) and E (row 1)
    expected = hashing.block_hash(np.concatenate([a, a, b, b, b]), np.arange(5))
    assert row0.tolist() == expected.tolist()


def test_sequence_hashes_split_prompt_and_output() -> None:
    chain = hashing.chain(9)
    prefix, output = hashing.sequence_hashes(
        np.array([0, 1]), np.array([40, 23]), np.concatenate([chain, chain]),
        np.array([30, 16]), np.array([10, 7]), 8,
    )  # fmt: skip
    assert [len(p) for p in prefix] == [3, 2] and [len(o) for o in output] == [2, 0]
    assert np.concatenate([prefix[0], output[0]]).tolist()[:2] == prefix[1].tolist()


def test_trace_fast_and_general_paths_agree() -> None:
    ids = np.array([3, 4, 3, 8, 9], dtype=np.int64)
    offsets = np.array([0, 2, 5])
    prompt = np.array([1000, 1500])
    fast = hashing.trace_block_hashes(ids, offsets, prompt, 4, np.array([1, 2]), 128)
    general = hashing._trace_hashes_with_tails(ids, offsets, prompt // 128, 4, np.array([1, 2]))
    assert fast.tolist() == general.tolist() and len(fast) == 7 + 11
