"""Bad rows: one clear error naming file, line, field and value; or skipped and counted."""

from __future__ import annotations

import pytest

from sim.errors import KvsimError
from tests.workload.workload_helpers import build

GOOD = '{"timestamp": %d, "input_length": 1000, "output_length": 10, "hash_ids": [%d, %d]}\n'


def mooncake(*rows: str) -> str:
    """A Mooncake file: good rows, with ``rows`` replacing some (None keeps the good one)."""
    return "".join(
        row if row is not None else GOOD % (i, 2 * i, 2 * i + 1) for i, row in enumerate(rows)
    )


def spec(path, fmt: str = "mooncake", **options) -> dict:
    return {"kind": "trace", "format": fmt, "path": str(path), **options}


def error_of(data: dict) -> str:
    with pytest.raises(KvsimError) as caught:
        build(data)
    return str(caught.value)


def test_truncated_json_line(write) -> None:
    path = write("t.jsonl", mooncake(None, None, '{"timestamp": 5, "input_length": 10\n', None))
    message = error_of(spec(path))
    assert message.startswith(f"{path}:3: not valid JSON")
    assert '{"timestamp": 5, "input_length": 10' in message
    assert "on_bad_rows: skip" in message
    requests = build(spec(path, on_bad_rows="skip"))
    assert len(requests) == 3 and requests.report.bad_rows_skipped == 1


def test_negative_length(write) -> None:
    bad = '{"timestamp": 1, "input_length": -5, "output_length": 10, "hash_ids": []}\n'
    path = write("n.jsonl", mooncake(None, bad, None))
    message = error_of(spec(path))
    assert message.startswith(f"{path}:2: field 'input_length'")
    assert "-5" in message and "tokens > 0" in message


def test_missing_key_in_one_jsonl_row(write) -> None:
    bad = '{"timestamp": 1, "input_length": 500, "hash_ids": [7]}\n'
    path = write("m.jsonl", mooncake(None, bad))
    message = error_of(spec(path))
    assert f"{path}:2: field 'output_length'" in message and "missing" in message


def test_missing_column_in_csv_header(write) -> None:
    path = write("a.csv", "TIMESTAMP,GeneratedTokens\n2023-11-16 18:17:03.9799600,10\n")
    message = error_of(spec(path, "azure"))
    assert message.startswith(f"{path}:1: column 'ContextTokens'")
    assert "'TIMESTAMP', 'GeneratedTokens'" in message


def test_missing_key_everywhere_in_jsonl(write) -> None:
    path = write("k.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n')
    assert "no row has the key 'hash_ids'" in error_of(spec(path))


def test_unparsable_time(write) -> None:
    path = write(
        "a.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,100,10\n"
        "yesterday,200,20\n"
        "2023-11-16 18:17:05.0000000,300,30\n",
    )
    message = error_of(spec(path, "azure"))
    assert message.startswith(f"{path}:3: field 'TIMESTAMP': expected a date-time")
    assert "'yesterday'" in message
    requests = build(spec(path, "azure", on_bad_rows="skip"))
    assert requests.prompt_tokens.tolist() == [100, 300]
    assert requests.arrival_s.tolist() == pytest.approx([0.0, 1.02004])
    assert requests.report.bad_rows_skipped == 1 and requests.report.rows_in_file == 3


def test_unparsable_numeric_time(write) -> None:
    path = write("t.csv", "ts,in,out\n0.5,10,1\nsoon,10,1\n")
    columns = {"arrival": "ts", "prompt_tokens": "in", "output_tokens": "out"}
    message = error_of(spec(path, "csv", columns=columns))
    assert message.startswith(f"{path}:3: field 'ts': expected a number") and "'soon'" in message


def test_earliest_bad_line_reported_with_count(write) -> None:
    rows = [None] * 6
    rows[4] = '{"timestamp": 4, "input_length": 1.5, "output_length": 1, "hash_ids": [1]}\n'
    rows[2] = '{"timestamp": 2, "input_length": 10, "output_length": "x", "hash_ids": [1]}\n'
    path = write("e.jsonl", mooncake(*rows))
    message = error_of(spec(path))
    assert message.startswith(f"{path}:3: field 'output_length'") and "'x'" in message
    assert "(2 bad rows in all)" in message
    assert build(spec(path, on_bad_rows="skip")).report.bad_rows_skipped == 2


def test_hash_ids_not_a_list_and_too_many(write) -> None:
    not_list = '{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": "0,1"}\n'
    too_many = '{"timestamp": 2, "input_length": 10, "output_length": 1, "hash_ids": [1, 2]}\n'
    path = write("h.jsonl", mooncake(None, not_list, too_many, None))
    message = error_of(spec(path))
    assert message.startswith(f"{path}:2: field 'hash_ids': expected a list of integer block ids")
    requests = build(spec(path, on_bad_rows="skip"))
    assert len(requests) == 2 and requests.report.bad_rows_skipped == 2


def test_csv_row_with_too_many_fields(write) -> None:
    text = "ts,in,out\n0,10,1\n1,10,1,9\n2,10,1\n\n3,x,1\n"
    path = write("f.csv", text)
    columns = {"arrival": "ts", "prompt_tokens": "in", "output_tokens": "out"}
    message = error_of(spec(path, "csv", columns=columns))
    assert message.startswith(f"{path}:3: expected 3 fields, saw 4")
    requests = build(spec(path, "csv", columns=columns, on_bad_rows="skip"))
    assert requests.arrival_s.tolist() == [0.0, 2.0]
    assert requests.report.bad_rows_skipped == 2


def test_line_numbers_after_a_skipped_csv_line(write) -> None:
    """With malformed lines dropped by the parser, later rows keep their true line numbers."""
    from sim.workload.tracefile import read_csv

    path = write("g.csv", "ts,in,out\n0,10,1\n1,10,1,9\n\n2,10,1\n")
    raw = read_csv(path, skip_bad=True)
    assert raw.line.tolist() == [2, 5] and raw.skipped == 1


def test_truncated_csv_row_is_missing_value(write) -> None:
    path = write("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,100\n")
    message = error_of(spec(path, "azure"))
    assert message.startswith(f"{path}:2: field 'GeneratedTokens'") and "missing" in message


def test_empty_and_all_bad_files(write) -> None:
    empty = write("e.csv", "")
    assert "empty file" in error_of(spec(empty, "azure"))
    blank = write("b.jsonl", "\n\n")
    assert "no data rows" in error_of(spec(blank))
    bad = write("x.jsonl", "{\n")
    assert "no valid rows" in error_of(spec(bad, on_bad_rows="skip"))
