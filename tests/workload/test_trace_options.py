"""Trace formats, selection options, path resolution and prefix-block mapping (small files)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sim.errors import ConfigError, KvsimError
from tests.workload.workload_helpers import build

BURSTGPT = (
    "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    "19440110.0,aaa,43,GPT-4,906,446,1352,Conversation log\n"
    "19440111.5,bbb,2,ChatGPT,36,29,65,Conversation log\n"
    "19440112.0,aaa,8,GPT-4,1779,0,1779,Conversation log\n"
    "19440113.0,ccc,3,ChatGPT,935,178,1113,API log\n"
    "19440115.0,aaa,3,GPT-4,2100,50,2150,Conversation log\n"
)


def jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def moon(t_ms: int, tokens: int, ids: list[int], out: int = 5) -> dict:
    return {"timestamp": t_ms, "input_length": tokens, "output_length": out, "hash_ids": ids}


def trace(path: Path, fmt: str = "mooncake", **options) -> dict:
    return {"kind": "trace", "format": fmt, "path": str(path), **options}


# --- formats -------------------------------------------------------------------------------


def test_burstgpt_sessions_failures_and_filter(write) -> None:
    path = write("b.csv", BURSTGPT)
    requests = build(trace(path, "burstgpt"))
    assert requests.prompt_tokens.tolist() == [906, 36, 935, 2100]  # 0 response tokens: failed
    assert requests.arrival_s.tolist() == [0.0, 1.5, 3.0, 5.0]
    assert requests.session.tolist() == [0, 1, 2, 0]  # codes in order of first appearance
    assert requests.prefix_hashes is None
    assert requests.report.failed_requests_dropped == 1 and requests.report.rows_in_file == 5

    gpt4 = build(trace(path, "burstgpt", filter={"Model": "GPT-4", "Log Type": "Conversation log"}))
    assert gpt4.prompt_tokens.tolist() == [906, 2100]
    assert gpt4.report.filtered_out == 2
    both = build(trace(path, "burstgpt", filter={"Model": ["GPT-4", "ChatGPT"]}))
    assert len(both) == 4


def test_burstgpt_without_session_column(write) -> None:
    text = (
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,GPT-4,10,3,13,API log\n"
    )
    requests = build(trace(write("b.csv", text), "burstgpt"))
    assert requests.session is None and requests.prompt_tokens.tolist() == [10]


def test_filter_on_unknown_column(write) -> None:
    with pytest.raises(ConfigError, match=r"key 'workload.filter.model'.*no column 'model'"):
        build(trace(write("b.csv", BURSTGPT), "burstgpt", filter={"model": "GPT-4"}))


def test_generic_csv_with_units_and_sessions(write) -> None:
    path = write("g.csv", "t,p,o,sid\n1500,10,2,x\n500,20,3,y\n2500,30,4,x\n")
    columns = {"arrival": "t", "prompt_tokens": "p", "output_tokens": "o", "session": "sid"}
    requests = build(trace(path, "csv", columns=columns, time_unit="ms", on_unsorted="sort"))
    assert requests.arrival_s.tolist() == [0.0, 1.0, 2.0]  # sorted by time, from the first
    assert requests.prompt_tokens.tolist() == [20, 10, 30]
    assert requests.session.tolist() == [1, 0, 0]
    with pytest.raises(KvsimError, match=r"column 'session_id'"):
        build(trace(path, "csv", columns=columns | {"session": "session_id"}, on_unsorted="sort"))


def test_generic_jsonl_with_datetimes_and_hashes(write) -> None:
    rows = [
        {"when": "2024-01-01T00:00:00Z", "in": 40, "out": 1, "blocks": [1, 2, 3]},
        {"when": "2024-01-01T00:00:02Z", "in": 33, "out": 1, "blocks": [1, 2, 9]},
    ]
    columns = {
        "arrival": "when",
        "prompt_tokens": "in",
        "output_tokens": "out",
        "hash_ids": "blocks",
    }
    spec = trace(write("g.jsonl", jsonl(rows)), "jsonl", columns=columns, time_unit="datetime")
    requests = build(spec | {"hash_block_tokens": 16}, block_tokens=16)
    assert requests.arrival_s.tolist() == [0.0, 2.0]
    first, second = requests.prefix_hashes
    assert len(first) == 2 and len(second) == 2  # 40 // 16, 33 // 16: full blocks only
    assert first.tolist() == second.tolist()  # ids 1, 2 shared; id 3 / 9 blocks are partial


def test_schema_rules_for_columns() -> None:
    from pydantic import ValidationError

    from tests.workload.workload_helpers import workload

    cases = [
        ({"format": "csv"}, "needs 'columns'"),
        ({"format": "mooncake", "time_unit": "ms"}, "only for formats csv and jsonl"),
        ({"format": "jsonl", "columns": {"arrival": "a", "prompt_tokens": "p", "output_tokens": "o",
          "hash_ids": "h"}}, "go together"),
        ({"format": "mooncake", "time_window": [10, 10]}, "start < end"),
    ]  # fmt: skip
    for options, message in cases:
        with pytest.raises(ValidationError, match=message):
            workload({"kind": "trace", "path": "x"} | options)


# --- selection -----------------------------------------------------------------------------


@pytest.fixture
def ten(write) -> Path:
    """Ten Mooncake rows 1 s apart, prompts 100, 200, ... 1000."""
    return write("ten.jsonl", jsonl([moon(1000 * i, 100 * (i + 1), [i]) for i in range(10)]))


def test_time_window_max_requests_rate_scale(ten: Path) -> None:
    window = build(trace(ten, time_window=[2, 6]))
    assert window.prompt_tokens.tolist() == [300, 400, 500, 600]
    assert window.arrival_s.tolist() == [0.0, 1.0, 2.0, 3.0]  # measured from the window start
    assert window.report.outside_time_window == 6
    late = build(trace(ten, time_window=["2.5s", "1min"]))
    assert late.arrival_s[0] == pytest.approx(0.5)
    first = build(trace(ten, max_requests=3, rate_scale=2.0))
    assert first.prompt_tokens.tolist() == [100, 200, 300]
    assert first.arrival_s.tolist() == [0.0, 0.5, 1.0]
    assert first.report.beyond_max_requests == 7
    with pytest.raises(KvsimError, match="no requests left after selection"):
        build(trace(ten, time_window=[100, 200]))


def test_sample_is_deterministic(ten: Path, write) -> None:
    many = write("many.jsonl", jsonl([moon(10 * i, 50, [i]) for i in range(2000)]))
    half = build(trace(many, sample={"fraction": 0.5}), seed=1)
    again = build(trace(many, sample={"fraction": 0.5}), seed=1)
    other = build(trace(many, sample={"fraction": 0.5}), seed=2)
    pinned = build(trace(many, sample={"fraction": 0.5, "seed": 7}), seed=3)
    pinned_again = build(trace(many, sample={"fraction": 0.5, "seed": 7}), seed=4)
    assert 900 < len(half) < 1100
    assert half.arrival_s.tolist() == again.arrival_s.tolist()
    assert half.arrival_s.tolist() != other.arrival_s.tolist()
    assert pinned.arrival_s.tolist() == pinned_again.arrival_s.tolist()
    assert half.report.sampled_out == 2000 - len(half)


def test_jitter_is_seeded(ten: Path) -> None:
    a = build(trace(ten, jitter_s=0.5), seed=5)
    b = build(trace(ten, jitter_s=0.5), seed=5)
    c = build(trace(ten, jitter_s=0.5), seed=6)
    assert a.arrival_s.tolist() == b.arrival_s.tolist() != c.arrival_s.tolist()
    offsets = a.arrival_s - np.arange(10)
    assert np.all((offsets >= 0) & (offsets < 0.5))


def test_unsorted_trace_sorted_stably_on_request(write) -> None:
    path = write(
        "u.jsonl", jsonl([moon(2000, 1, []), moon(0, 2, []), moon(2000, 3, []), moon(0, 4, [])])
    )
    requests = build(trace(path, on_unsorted="sort"))
    assert requests.prompt_tokens.tolist() == [2, 4, 1, 3]


def test_unsorted_trace_is_refused_at_its_first_line_back_in_time(write) -> None:
    rows = [moon(0, 1, []), moon(2000, 2, []), moon(3000, 3, []), moon(1000, 4, []), moon(0, 5, [])]
    path = write("u.jsonl", jsonl(rows))
    with pytest.raises(KvsimError, match=r"u.jsonl:4: arrival 1 s is earlier than line 3's 3 s"):
        build(trace(path))


# --- paths ---------------------------------------------------------------------------------


def test_relative_paths_config_folder_then_env(ten: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("KVSIM_TRACES", raising=False)
    assert len(build(trace(Path("ten.jsonl")), base_dir=tmp_path)) == 10
    elsewhere = tmp_path / "configs"
    elsewhere.mkdir()
    with pytest.raises(ConfigError, match=r"key 'workload.path'.*not found.*set \$KVSIM_TRACES"):
        build(trace(Path("ten.jsonl")), base_dir=elsewhere)
    monkeypatch.setenv("KVSIM_TRACES", str(tmp_path))
    assert len(build(trace(Path("ten.jsonl")), base_dir=elsewhere)) == 10
    (elsewhere / "ten.jsonl").write_text(jsonl([moon(0, 7, [])]))  # the config folder wins
    assert build(trace(Path("ten.jsonl")), base_dir=elsewhere).prompt_tokens.tolist() == [7]


# --- prefix-block mapping ------------------------------------------------------------------


def test_block_mapping_partial_last_block(write) -> None:
    rows = [moon(0, 1000, [0, 1]), moon(1, 1000, [0, 2]), moon(2, 1024, [0, 1]), moon(3, 500, [0])]
    path = write("p.jsonl", jsonl(rows))
    a, b, c, d = build(trace(path), block_tokens=16).prefix_hashes
    assert [len(a), len(b), len(c), len(d)] == [62, 62, 64, 31]  # full 16-token blocks only
    assert a[:32].tolist() == b[:32].tolist()  # trace block 0 shared
    assert not set(a[32:].tolist()) & set(b[32:].tolist())  # trace block 1 differs
    assert c[:62].tolist() == a.tolist()  # same ids: same blocks; c fills id 1's last blocks
    assert d.tolist() == a[:31].tolist()  # block 0 is partial in d: its full sub-blocks match
    assert len(set(a.tolist())) == 62  # sub-blocks of one trace block differ


def test_block_size_must_divide_trace_blocks(write) -> None:
    path = write("p.jsonl", jsonl([moon(0, 1000, [0, 1])]))
    with pytest.raises(ConfigError, match=r"engine.block_tokens = 24 does not divide the 512"):
        build(trace(path), block_tokens=24)
    assert len(build(trace(path), block_tokens=512).prefix_hashes[0]) == 1


def test_rows_with_fewer_ids_than_blocks(write) -> None:
    """Blocks past a row's ids are its own (unique), after the shared ones."""
    path = write("f.jsonl", jsonl([moon(0, 1024, [5]), moon(1, 1024, [5])]))
    a, b = build(trace(path), block_tokens=256).prefix_hashes
    assert a[:2].tolist() == b[:2].tolist()
    assert a[2:].tolist() != b[2:].tolist() and len(a) == 4
