"""A trace file's raw columns, and their conversions with pandas' results, mostly without it.

Columns from :mod:`sim.workload.csvfast` are int64, float64 or objects (str, NaN where
missing); there, times, numbers, session codes and ``filter`` matches are computed with
numpy for the values whose meaning is plain, and by pandas (imported then) for a column
holding anything else. Columns that came from a pandas DataFrame (JSONL, or a CSV the fast
reader left to pandas) are converted by pandas as before, from that DataFrame.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from sim.workload.csvfast import certainly_not_a_number, decimal_value

if TYPE_CHECKING:
    import pandas as pd


class RawColumns:
    """Columns by name, in file order, all of one length, with the DataFrame they came from
    (None for the fast CSV reader's), for the conversions that need pandas."""

    def __init__(self, arrays: dict[str, np.ndarray], frame: pd.DataFrame | None = None):
        self.arrays, self.frame = arrays, frame
        self.length = len(frame) if frame is not None else len(next(iter(arrays.values()), ()))

    @classmethod
    def of_frame(cls, frame: pd.DataFrame) -> RawColumns:
        """A DataFrame's columns (as ``to_numpy`` gives them)."""
        return cls({str(name): frame[name].to_numpy() for name in frame.columns}, frame)

    @property
    def names(self) -> list[str]:
        return list(self.arrays)

    def __len__(self) -> int:
        return self.length

    def __contains__(self, name: object) -> bool:
        return name in self.arrays

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def series(self, name: str) -> pd.Series:
        """The column as pandas' reader makes it (strings as pandas' ``str`` dtype)."""
        import pandas as pd

        if self.frame is not None:
            return self.frame[name]
        values = self.arrays[name]
        strings = values.dtype == object and len(values) > 0  # (a header alone: objects)
        return pd.Series(values, name=name, dtype="str" if strings else None)

    def take(self, index: np.ndarray) -> RawColumns:
        """The rows at ``index`` (int positions, in that order)."""
        arrays = {name: values[index] for name, values in self.arrays.items()}
        if self.frame is None:
            return RawColumns(arrays)
        return RawColumns(arrays, self.frame.iloc[index].reset_index(drop=True))


def numbers(raw: RawColumns, name: str) -> np.ndarray:
    """The column as float64, NaN where it holds no number (``pd.to_numeric``, coerced)."""
    values = raw[name]
    if raw.frame is None and values.dtype.kind in "if":
        return values.astype(np.float64)
    if raw.frame is None and values.dtype == object:
        out = np.full(len(values), np.nan)
        for i, text in enumerate(values.tolist()):
            if isinstance(text, str) and not certainly_not_a_number(text):
                number = decimal_value(text)
                if number is None:
                    break  # (a number in a form of its own: pandas reads this column)
                out[i] = number
        else:
            return out
    import pandas as pd

    numeric = pd.to_numeric(raw.series(name), errors="coerce")
    return numeric.to_numpy(dtype=np.float64, na_value=np.nan)


_STAMP = (
    r"(?:19|20)[0-9]{2}-[01][0-9]-[0-3][0-9][ T][0-2][0-9]:[0-5][0-9]:[0-5][0-9]"
    r"(?:\.[0-9]{1,9})?"
)
_ISO = re.compile(rf"({_STAMP})(Z|[+-][01][0-9]:[0-5][0-9])?")


def datetimes_ns(raw: RawColumns, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The column's ISO 8601 date-times as UTC nanoseconds (int64; 0 where invalid) and
    which are invalid (``pd.to_datetime(format="ISO8601", errors="coerce")``, in UTC)."""
    values = raw[name]
    if raw.frame is None and values.dtype == np.float64 and np.isnan(values).all():
        return np.zeros(len(values), dtype=np.int64), np.ones(len(values), dtype=bool)
    if raw.frame is None and values.dtype == object:
        fast = _plain_datetimes(values)
        if fast is not None:
            return fast
    import pandas as pd

    parsed = pd.to_datetime(raw.series(name), format="ISO8601", errors="coerce")
    if isinstance(parsed.dtype, pd.DatetimeTZDtype):
        parsed = parsed.dt.tz_convert("UTC").dt.tz_localize(None)
    invalid = parsed.isna().to_numpy()
    ns = parsed.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    ns[invalid] = 0
    return ns, invalid


def _plain_datetimes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Date-times all in one plain form (``YYYY-MM-DD HH:MM:SS[.fraction]``, one zone
    suffix or none, years 1900-2099) or missing, parsed by numpy; else None."""
    texts = values.tolist()
    invalid = np.fromiter((type(t) is not str for t in texts), dtype=bool, count=len(texts))
    stamps = texts if not invalid.any() else [t for t in texts if type(t) is str]
    first = _ISO.fullmatch(stamps[0]) if stamps else None
    if first is None:
        return None
    zone = first[2] or ""
    one_form = re.compile(rf"{_STAMP}{re.escape(zone)}(?:\n{_STAMP}{re.escape(zone)})*")
    if one_form.fullmatch("\n".join(stamps)) is None:
        return None  # (another form, or another zone: mixed zones pandas refuses)
    if zone:
        stamps = [text[: -len(zone)] for text in stamps]
    try:
        parsed = np.array(stamps, dtype="datetime64[ns]").astype(np.int64)
    except ValueError:
        return None  # (a day or hour out of range)
    if zone not in ("", "Z"):
        sign = -1 if zone[0] == "-" else 1
        parsed -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60) * 10**9
    ns = np.zeros(len(texts), dtype=np.int64)
    ns[~invalid] = parsed
    return ns, invalid


def factorize(raw: RawColumns, name: str) -> np.ndarray:
    """Codes in order of first appearance, -1 where missing (``pd.factorize``)."""
    if raw.frame is None:
        codes: dict[object, int] = {}
        out = [-1 if is_missing(v) else codes.setdefault(v, len(codes)) for v in raw[name].tolist()]
        return np.asarray(out, dtype=np.int64).reshape(-1)
    import pandas as pd

    found, _ = pd.factorize(raw.series(name), use_na_sentinel=True)
    return found.astype(np.int64)


def is_missing(value: object) -> bool:
    """Whether a raw value is missing (None, or a float NaN), as pandas takes it."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def isin(raw: RawColumns, name: str, wanted: Sequence[object]) -> np.ndarray:
    """Which rows hold one of ``wanted`` (``Series.isin``)."""
    values = raw[name]
    kinds = set(map(type, wanted))
    if raw.frame is None:
        if values.dtype == object and kinds <= {str}:
            keep = set(wanted)
            return np.fromiter(map(keep.__contains__, values.tolist()), bool, len(values))
        if values.dtype == np.int64 and kinds <= {int} and _small(wanted, 2**62):
            return np.isin(values, np.asarray(wanted, dtype=np.int64))
        if values.dtype == np.float64 and kinds <= {int, float} and _small(wanted, 2**52):
            return np.isin(values, np.asarray(wanted, dtype=np.float64))
    return raw.series(name).isin(list(wanted)).to_numpy()


def _small(values: Sequence[object], limit: int) -> bool:
    """Whole numbers within ``limit`` of zero, or finite floats."""
    return all(math.isfinite(v) and abs(v) < limit for v in values)  # type: ignore[arg-type]
