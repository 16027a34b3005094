"""``sim.observe.metrics`` request table and summary on hand-built runs: a rejected request,
decode-only step times, and the overload rule on hand-written queues."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.instance.timeline import TIMELINE_COLUMNS, Timeline
from sim.observe.metrics import Columns, mean, request_columns, summarize
from sim.workload.requests import Requests

NAN = float("nan")


def test_throughput_and_latency_count_finished_requests_only():
    """Two finished requests and one rejected (at arrival): the throughputs over the 8 s run
    count the finished ones' tokens and requests only (30 out, 300 in, 2 requests), and the
    latency figures are theirs, computed by hand."""
    requests = Requests(
        arrival_s=np.array([0.0, 1.0, 2.0]),
        prompt_tokens=np.array([100, 200, 5000]),
        output_tokens=np.array([10, 20, 500]),
    )
    frame = request_columns(
        requests,
        scheduled_s=np.array([0.5, 1.5, NAN]),
        first_token_s=np.array([1.0, 2.0, NAN]),
        finish_s=np.array([3.0, 6.0, NAN]),
        preemptions=np.array([0, 1, 0]),
        reject_reason={2: "too long"},
    )
    assert frame["status"].tolist() == ["finished", "finished", "rejected"]
    assert frame["tpot_s"][:2].tolist() == pytest.approx([2.0 / 9, 4.0 / 19])
    s = summarize(frame, Timeline().to_frame(), 8.0)
    assert s["requests_finished"] == 2 and s["requests_rejected"] == 1
    assert s["rejected_reasons"] == {"too long": 1}
    assert s["output_tokens_per_s"] == pytest.approx(30 / 8)
    assert s["input_tokens_per_s"] == pytest.approx(300 / 8)
    assert s["requests_per_s"] == pytest.approx(2 / 8)
    assert s["ttft_mean_s"] == pytest.approx(1.0)
    assert s["e2e_mean_s"] == pytest.approx(4.0)
    assert s["preemptions"] == 1 and s["steps"] == 0


def timeline(**columns: list[float]) -> pd.DataFrame:
    """A hand-written timeline: the given columns, every other column 0."""
    rows = len(next(iter(columns.values())))
    t = Timeline()
    t.record_many(rows, **{c: np.asarray(columns.get(c, 0.0), float) for c in TIMELINE_COLUMNS})
    return t.to_frame()


def finished(arrival_s: list[float]) -> Columns:
    """A request table of requests arriving at ``arrival_s``, each finished 1 s later."""
    n = len(arrival_s)
    arrival = np.asarray(arrival_s, dtype=float)
    requests = Requests(arrival, prompt_tokens=np.full(n, 64), output_tokens=np.ones(n, int))
    return request_columns(requests, arrival, arrival + 1, arrival + 1, np.zeros(n, int), {})


def test_decode_step_times_are_those_of_the_steps_without_prefill():
    """Five steps, three of them decode-only (0.01, 0.02, 0.04 s): mean 0.07 / 3, median
    0.02, p99 by linear interpolation at rank 0.99 x 2 = 1.98: 0.02 + 0.98 x 0.02."""
    steps = timeline(prefill_tokens=[512, 0, 0, 100, 0], step_s=[0.05, 0.01, 0.02, 0.03, 0.04])
    s = summarize(finished([0.0]), steps, 1.0)
    assert s["decode_step_mean_s"] == pytest.approx(0.07 / 3)
    assert s["decode_step_p50_s"] == pytest.approx(0.02)
    assert s["decode_step_p99_s"] == pytest.approx(0.0396)
    only_prefill = summarize(finished([0.0]), timeline(prefill_tokens=[64], step_s=[0.1]), 1.0)
    assert only_prefill["decode_step_p50_s"] is None and only_prefill["decode_step_mean_s"] is None


def one_a_second(waiting: list[int]) -> dict:
    """The summary of 11 requests arriving one a second over [0, 10] (1.1/s), finished by
    11 s, with one 1-s step a second whose queue is ``waiting``."""
    steps = timeline(time_s=list(range(10)), step_s=[1.0] * 10, waiting=waiting)
    return summarize(finished(list(range(11))), steps, 11.0)


def test_a_queue_that_grows_with_the_arrivals_is_overloaded():
    """The queue is i at step i: means over [0, 5) and [5, 10) are 2 and 7; the 5 requests
    arriving in (5, 10] see a rise of 5: queue growth 1."""
    s = one_a_second(list(range(10)))
    assert s["queue_growth"] == pytest.approx(1.0)
    assert s["overloaded"] is True
    assert s["offered_rate_rps"] == pytest.approx(1.1)
    assert s["served_rate_rps"] == pytest.approx(1.0)


def test_a_level_queue_is_not_overload_however_long_it_is():
    """3 requests always waiting: no growth, not overloaded. A queue empty in the first half
    and 0, 1, 2, 2, 2 in the second: means 0 and 1.4, a rise of 1.4 over the 5 requests
    arriving in the second half: growth 0.28, above 0.1."""
    level = one_a_second([3] * 10)
    assert level["queue_growth"] == pytest.approx(0.0) and level["overloaded"] is False
    late = one_a_second([0] * 5 + [0, 1, 2, 2, 2])
    assert late["queue_growth"] == pytest.approx(0.28) and late["overloaded"] is True


def test_a_closed_batch_has_no_arrival_rate_and_is_not_overloaded():
    steps = timeline(time_s=[0.0, 1.0], step_s=[1.0, 1.0], waiting=[5, 4])
    s = summarize(finished([0.0] * 6), steps, 2.0)
    assert s["offered_rate_rps"] is None and s["queue_growth"] is None
    assert s["overloaded"] is False
    assert s["served_rate_rps"] == pytest.approx(3.0)


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.floats(-1e12, 1e12, allow_nan=False), st.just(NAN)), min_size=0, max_size=300
    )
)
def test_mean_is_pandas_mean_to_the_bit(values: list[float]):
    """The summary's means (now of numpy columns) are the ones pandas gave, bit for bit:
    NaNs skipped, the sum in pandas' order; None-worthy (NaN) when nothing is known."""
    floats = np.asarray(values, dtype=np.float64)
    got, want = mean(floats), pd.Series(floats).mean()
    assert (np.isnan(got) and np.isnan(want)) or got == want
    ints = np.arange(len(values), dtype=np.int64) * 7919 % 1000
    if len(ints):
        assert mean(ints) == pd.Series(ints).mean()


def test_a_run_table_summarizes_alike_as_columns_and_as_a_dataframe():
    """The summary reads a table's columns, however it is held: a DataFrame gives the same."""
    requests = finished([0.0, 0.5, 1.0, 4.0])
    steps = timeline(time_s=[0.0, 1.0, 2.0], step_s=[1.0, 1.0, 2.0], waiting=[2, 1, 0])
    columns = {str(name): steps[name].to_numpy() for name in steps.columns}
    as_columns = summarize(requests, columns, 5.0)
    assert as_columns == summarize(pd.DataFrame(requests), steps, 5.0)
