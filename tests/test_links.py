"""Fluid fair sharing against closed forms."""

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.memory.links import Link, chunk_efficiency

BW = 50e9
LAT = 10e-6


def run(link_kwargs, starts):
    """Start transfers of (start_time, bytes); return their finish times."""
    env = simpy.Environment()
    link = Link(env, "h2d", **link_kwargs)
    finish = [None] * len(starts)

    def start(i, at, nbytes):
        yield env.timeout(at)
        yield link.transfer(nbytes)
        finish[i] = env.now

    for i, (at, nbytes) in enumerate(starts):
        env.process(start(i, at, nbytes))
    env.run()
    return finish, link


def test_one_transfer_takes_latency_plus_size_over_bandwidth():
    (t,), _ = run({"bandwidth": BW, "latency": LAT}, [(0.0, 1e9)])
    assert t == pytest.approx(LAT + 1e9 / BW)


def test_two_equal_transfers_together_finish_at_twice_size_over_bandwidth():
    size = 1e9
    finish, link = run({"bandwidth": BW, "latency": LAT}, [(0.0, size), (0.0, size)])
    assert finish == pytest.approx([LAT + 2 * size / BW] * 2)
    assert link.bytes_submitted == link.bytes_delivered == 2 * size


def test_transfer_starting_halfway_through_another():
    # A: 1 GB at t=0 alone until t=T/2 (half done), then shares with B (1 GB):
    # A's remaining 0.5 GB at BW/2 takes T; B has sent 0.5 GB then, finishes alone in T/2.
    size, T = 1e9, 1e9 / BW
    finish, _ = run({"bandwidth": BW}, [(0.0, size), (T / 2, size)])
    assert finish[0] == pytest.approx(T / 2 + T)
    assert finish[1] == pytest.approx(T / 2 + T + T / 2)


def test_small_chunks_are_slower():
    assert chunk_efficiency(8192, 24576) == pytest.approx(0.25)
    (t,), _ = run({"bandwidth": BW, "half_efficiency_bytes": 24576}, [(0.0, 1e6)])
    assert t == pytest.approx(1e6 / (BW * 1e6 / (1e6 + 24576)))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 0.05), st.floats(1e3, 2e9)), min_size=1, max_size=8))
def test_bytes_conserved_and_work_conserving(starts):
    finish, link = run({"bandwidth": BW}, starts)
    assert link.bytes_delivered == pytest.approx(link.bytes_submitted)
    assert link.in_flight == 0
    # the link is never idle while a transfer waits: it is busy exactly total/BW seconds
    assert link.busy_s == pytest.approx(sum(b for _, b in starts) / BW, rel=1e-6)
    for (at, nbytes), end in zip(starts, finish, strict=True):
        assert end >= at + nbytes / BW * (1 - 1e-9)


@settings(max_examples=50, deadline=None)
@given(
    st.floats(1e3, 1e7),
    st.lists(st.tuples(st.floats(0, 1e-3), st.floats(1, 1e7)), min_size=2, max_size=12),
)
def test_late_clock_and_odd_sizes_still_finish(start, transfers):
    # far from t=0 a finish time's float residue once kept a transfer alive forever
    env = simpy.Environment(initial_time=start)
    link = Link(env, "d2h", bandwidth=55e9, latency=5e-6)
    link._last = start
    done = []

    def send(at, nbytes):
        yield env.timeout(at)
        yield link.transfer(nbytes)
        done.append(nbytes)

    for at, nbytes in transfers:
        env.process(send(at, nbytes))
    env.run(until=start + 10.0)
    assert len(done) == len(transfers)
    assert link.bytes_delivered == pytest.approx(link.bytes_submitted)


def test_a_copy_in_small_pieces_runs_at_the_pieces_efficiency():
    """1 MB moved as 8 KiB pieces, on a link at half efficiency for 24 KiB pieces: each
    piece gets 8/(8+24) = 1/4 of the bandwidth, so the copy takes 4 MB/BW (not the
    nearly full speed of one 1 MB piece)."""
    env = simpy.Environment()
    link = Link(env, "h2d", BW, half_efficiency_bytes=24576)
    done = link.transfer(1e6, chunk_bytes=8192)
    env.run(done)
    assert env.now == pytest.approx(4e6 / BW)
    assert link.bytes_delivered == 1e6


def test_blended_chunk_efficiency_closed_form():
    # p = 1: s / (s + h); at s = h any p gives 2^(-1/p); p large: min(1, s/h)
    assert chunk_efficiency(8192, 24576, 1.0) == pytest.approx(0.25)
    assert chunk_efficiency(30000, 30000, 2.0) == pytest.approx(2**-0.5)
    assert chunk_efficiency(8192, 32768, 8.0) == pytest.approx(0.25, rel=1e-4)
    # h100-sxm's fit at vLLM's 32 KiB chunks, by hand: (1 + 0.94994^2.271)^(-1/2.271)
    assert chunk_efficiency(32768, 31129.6, 2.271) == pytest.approx(0.7556, abs=1e-3)


def test_two_equal_chunked_transfers_share_the_link_at_its_chunk_efficiency():
    # two 1 GB copies in 32 KiB chunks on h100-sxm's curve: each sees the link's bytes at
    # BW x 0.7556 / 2, so both end at latency + 2 x size / (BW x 0.7556)
    env = simpy.Environment()
    link = Link(env, "h2d", BW, LAT, half_efficiency_bytes=31129.6, blend=2.271)
    done = [link.transfer(1e9, 32768), link.transfer(1e9, 32768)]
    env.run()
    assert all(event.processed for event in done)
    assert env.now == pytest.approx(LAT + 2 * 1e9 / (BW * 0.75561), rel=1e-4)
    assert link.bytes_delivered == link.bytes_submitted == 2e9


@pytest.mark.parametrize("copier", ["ce", "sm"])
def test_each_direction_copies_at_its_copiers_rate(copier):
    """h100-sxm's host links, built from the profile: 64 MiB in 32 KiB chunks takes one
    latency plus the bytes at the copy engines' 55 GB/s times the chunk curve's
    1 / (1 + (30.4 KiB / 32 KiB)^2.271)^(1/2.271), or, copied by a kernel (``sm``), at
    sm_h2d's 37.8 GB/s and sm_d2h's 52.8 GB/s flat."""
    from sim.config.loader import load_hardware
    from sim.memory.links import Links

    hw = load_hardware("h100-sxm")
    link = hw.link.model_copy(update={"h2d_copier": copier, "d2h_copier": copier})
    hw = hw.model_copy(update={"link": link})
    curve = (1 + (30.4 / 32) ** 2.271) ** (-1 / 2.271)
    rates = (
        {"h2d": 37.8e9, "d2h": 52.8e9}
        if copier == "sm"
        else dict.fromkeys(("h2d", "d2h"), 55e9 * curve)
    )
    nbytes = 64 * 2**20
    for direction, rate in rates.items():
        env = simpy.Environment()
        links = Links.from_hardware(env, hw)
        env.run(until=getattr(links, direction).transfer(nbytes, 32 * 2**10))
        assert env.now == pytest.approx(5e-6 + nbytes / rate, rel=1e-9)
