"""The fidelity measurement set and its harness (validation/fidelity.py, docs/fidelity.md).

The set is checked against its own text (every number quoted, every source a URL, no held-out
source, a forbidden list written out here and not taken from the harness); the harness's runs
against the rows they reproduce."""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import pytest

from sim.config.loader import build_config
from validation import fidelity

REPO = Path(__file__).resolve().parents[2]
CSV = REPO / "validation" / "data" / "fidelity_measurements.csv"

# The project's held-out sources, and vLLM's memory-profile PRs kept for fitting (rules of
# issue 25); written out independently of validation.fidelity's own list.
HELD_OUT = re.compile(
    r"llm-inference-bench|argonne-lcf|llm-d-benchmark|offloading-connector"
    r"|vllm-project\.github\.io/pull/149|blog\.vllm\.ai/2026/01",
    re.IGNORECASE,
)
FIT_ONLY = re.compile(r"vllm-project/vllm/(pull|issues)/(10511|12126|17122|2031)\b")
UNIT_OF = {
    "output_throughput": {"tok/s"},
    "e2e_latency": {"s", "ms"},
    "ttft": {"s", "ms"},
    "itl": {"s", "ms"},
    "kv_load_time": {"s", "ms"},
    "kv_capacity_blocks": {"blocks"},
}


@pytest.fixture(scope="module")
def raw_rows() -> list[dict[str, str]]:
    """The CSV as text, row by row (no harness involved)."""
    with CSV.open(newline="") as f:
        return list(csv.DictReader(f))


def test_rows_parse_with_unique_ids(raw_rows):
    ids = [r["id"] for r in raw_rows]
    assert len(ids) >= 20
    assert len(set(ids)) == len(ids)
    assert fidelity.load_rows().index.tolist() == ids


def test_every_row_has_a_source_a_place_and_a_quote_holding_its_number(raw_rows):
    for r in raw_rows:
        assert r["source"].startswith("https://"), r["id"]
        assert r["where"].strip() and r["quote"].strip(), r["id"]
        assert r["value"] in r["quote"], f"{r['id']}: {r['value']} is not in the quote"
        assert float(r["value"]) > 0, r["id"]


def test_no_row_cites_a_held_out_or_fit_only_source(raw_rows):
    for r in raw_rows:
        text = " ".join(r.values())
        assert not HELD_OUT.search(text), r["id"]
        assert not FIT_ONLY.search(text), r["id"]


def test_units_are_known_and_fit_the_metric(raw_rows):
    for r in raw_rows:
        assert r["unit"] in UNIT_OF[r["metric"]], r["id"]


def test_simulated_rows_name_existing_profiles_and_others_say_why_not(raw_rows):
    for r in raw_rows:
        if r["simulate"] == "yes":
            assert (REPO / "model_profiles" / f"{r['model_profile']}.yaml").is_file(), r["id"]
            assert (REPO / "hardware_profiles" / f"{r['hardware_profile']}.yaml").is_file()
        else:
            assert re.match(r"no: \S", r["simulate"]), r["id"]


def test_the_harness_refuses_a_held_out_row(tmp_path, raw_rows):
    row = dict(raw_rows[0], id="bad", source="https://github.com/argonne-lcf/LLM-Inference-Bench")
    path = tmp_path / "bad.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(row))
        writer.writeheader()
        writer.writerow(row)
    with pytest.raises(ValueError, match="row bad: cites"):
        fidelity.load_rows(path)


# (id, model, hardware, TP, batch, prompt, output, weight dtype), copied from the rows by hand.
CASES = [
    ("lmd-70b-tp4-b64", "llama-2-70b", "a100-80g-sxm", 4, 64, 1, 128, "fp16"),
    ("vllm-ci-8b-h200", "llama-3-8b", "h200-sxm", 1, 8, 32, 128, "bf16"),
    ("nim-70b-fp8-tp2-itl-5000", "llama-3-70b", "h100-sxm", 2, 1, 5000, 500, "fp8"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_rows_config_is_what_the_row_says(case, raw_rows):
    rid, model, hardware, tp, batch, prompt, output, dtype = case
    row = next(r for r in raw_rows if r["id"] == rid)
    assert (row["model_profile"], row["hardware_profile"], row["dtype"]) == (model, hardware, dtype)
    assert [int(row[k]) for k in ("tp", "batch", "input_tokens", "output_tokens")] == [
        tp,
        batch,
        prompt,
        output,
    ]
    config = build_config(fidelity.row_config(fidelity.load_rows().loc[rid]))
    assert (config.model.name, config.model.dtype, config.hardware.name) == (model, dtype, hardware)
    assert config.engine.tensor_parallel_size == tp
    assert config.engine.max_num_seqs == config.workload.num_requests == batch
    assert config.workload.arrival.kind == "all_at_once"
    assert (config.workload.prompt_tokens.value, config.workload.output_tokens.value) == (
        prompt,
        output,
    )
    assert not config.kv.prefix_caching


def test_one_row_predicts_a_finite_figure_and_the_metrics_agree():
    row = fidelity.load_rows().loc["lmd-7b-b16"].copy()
    throughput = fidelity.predict(row)
    assert math.isfinite(throughput) and throughput > 0
    row["metric"], row["unit"] = "e2e_latency", "s"
    latency = fidelity.predict(row)
    # output_throughput is batch x output tokens over the batch's latency
    assert throughput == pytest.approx(16 * 128 / latency, rel=1e-12)


def test_main_writes_the_page_for_one_category(tmp_path, raw_rows):
    rows = [r for r in raw_rows if r["id"] in ("lmd-7b-ftl-128", "lmd-7b-b1")]
    data = tmp_path / "rows.csv"
    with data.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    out = tmp_path / "fidelity.md"
    assert fidelity.main(["--data", str(data), "--only", "prefill", "--out", str(out)]) == 0
    text = out.read_text()
    assert "lmd-7b-ftl-128" in text and "lmd-7b-b1 " not in text
    assert "## Which data fitted which parameter" in text
    with pytest.raises(SystemExit):
        fidelity.main(["--data", str(data), "--only", "no-such-category"])


def test_the_fidelity_page_is_current():
    """docs/fidelity.md is what `python -m validation.fidelity` makes of today's model."""
    rows = fidelity.load_rows()
    expected = fidelity.page(rows, fidelity.run(rows), None)
    assert (REPO / "docs" / "fidelity.md").read_text() == expected, (
        "regenerate with: python -m validation.fidelity --out docs/fidelity.md"
    )
