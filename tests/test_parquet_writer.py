"""``sim.rundir.write_parquet`` (pyarrow alone) writes what pandas' ``to_parquet`` wrote:
the same arrow column types and values, read back by pandas as equal frames."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from sim.rundir import write_parquet

NAN = float("nan")
TABLES = {
    "mixed": {
        "id": np.arange(4, dtype=np.int64),
        "time_s": np.array([0.0, 1.5, NAN, -2.0]),
        "count": np.array([3, 0, 1, 2], dtype=np.int32),
        "status": np.array(["finished", "rejected", "finished", "finished"], dtype=object),
        "reason": np.array(["", "too long", "", ""], dtype=object),
    },
    "empty": {
        "time_s": np.zeros(0),
        "block": np.zeros(0, np.int64),
        "tier": np.zeros(0, object),
    },
    "all nan": {"tpot_s": np.full(3, NAN), "flag": np.array([True, False, True])},
}


@pytest.mark.parametrize("name", TABLES)
def test_pyarrow_writes_the_file_pandas_wrote(name: str, tmp_path: Path):
    columns = TABLES[name]
    ours, theirs = tmp_path / "ours.parquet", tmp_path / "theirs.parquet"
    write_parquet(columns, ours)
    pd.DataFrame(columns).to_parquet(theirs, index=False)
    ours_table, theirs_table = pq.read_table(ours), pq.read_table(theirs)
    assert ours_table.schema.types == theirs_table.schema.types
    assert ours_table.replace_schema_metadata(None).equals(
        theirs_table.replace_schema_metadata(None)
    )  # NaN stored as null, as pandas stores it
    back, want = pd.read_parquet(ours), pd.read_parquet(theirs)
    pd.testing.assert_frame_equal(back, want, check_exact=True)
    assert list(back.dtypes) == list(want.dtypes)
