"""The event log: one flat record per event, straight into a DataFrame.

Records are tuples in :data:`COLUMNS` order, appended on the hot path; nothing is formatted
until the log is turned into a DataFrame. The tables are typed a column at a time as pandas
would type them (:func:`plain_columns`) without importing pandas, which loads (~0.6 s) only
when a DataFrame is asked for: ``pdsim run``'s report and summary need none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import simpy

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = ("time", "event", "component", "rank", "rid", "room", "peer", "value", "detail")


class EventLog:
    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.rows: list[tuple] = []

    def __call__(self, event: str, component: str = "", rank: int = -1, rid: int = -1,
                 room: int = -1, peer: str = "", value: float = 0.0, detail: str = "") -> None:
        self.rows.append((self.env.now, event, component, rank, rid, room, peer, value, detail))

    def frame(self) -> pd.DataFrame:
        return records_frame(self.rows, COLUMNS)


# the numpy dtype pandas infers for a column whose values are all of exactly one of these types
_NUMPY_DTYPES = {int: np.int64, float: np.float64, bool: np.bool_}
_INT_FLOAT = {int, float}  # a column of both: float64


def records_frame(rows: list[tuple], columns: tuple[str, ...] | list[str]) -> pd.DataFrame:
    """``pd.DataFrame.from_records(rows, columns=columns)`` (rows as long as ``columns``): the
    same dtypes and values, built a column at a time (:func:`plain_columns`)."""
    return frame_of(plain_columns(rows, columns) if rows else None, columns)


def frame_of(plain: dict | None, columns: tuple[str, ...] | list[str]) -> pd.DataFrame:
    """The DataFrame of :func:`plain_columns` ``plain`` (None: no rows), as
    ``from_records`` makes it: a column of strings becomes what pandas infers for strings."""
    import pandas as pd

    if plain is None:  # what from_records makes of none: object columns (at ~half its cost)
        return pd.DataFrame(np.empty((0, len(columns)), object), columns=list(columns))
    return pd.DataFrame(_with_pandas_strings(plain))  # (in the columns' order; copies each)


def records_columns(rows: list[tuple], columns: tuple[str, ...] | list[str]) -> dict:
    """The columns of ``pd.DataFrame.from_records(rows, columns=columns)`` (rows as long as
    ``columns``, at least one), by name: the same dtypes and values, one array at a time
    (:func:`plain_columns`, its strings as pandas' string arrays)."""
    return _with_pandas_strings(plain_columns(rows, columns))


def plain_columns(rows: list[tuple], columns: tuple[str, ...] | list[str]) -> dict:
    """The columns of ``pd.DataFrame.from_records(rows, columns=columns)`` (rows as long as
    ``columns``, at least one), by name, typed as ``from_records`` types them, without pandas
    where the values allow: a column of strings stays the tuple of its ``str`` values (its
    frame column is what pandas infers for strings, :func:`frame_of`).

    ``from_records`` copies the rows into one 2-D object array and infers each column's dtype
    from its objects, converting every value to float and complex on the way: for the run's
    tables (thousands of rows, a few dozen columns) most of the cost of the table. A column
    whose values are all of exactly one type among int, float, bool and str (what the records
    hold) is converted straight to the dtype ``from_records`` infers for such a column (int64,
    float64, bool; strings as above); so is a column of ints and floats (float64, each int
    converted as pandas does, by ``float(int)``), as long as its ints fit int64 (times start
    at the int 0, and log values mix counts and seconds). Any other column (None, ints beyond
    int64, numpy scalars, other mixed types) goes through ``from_records`` itself, alone (so
    pandas is imported for it): it infers each column on its own, so the result is the same
    either way.
    """
    n = len(rows)
    data = {}
    for name, col in zip(columns, zip(*rows, strict=True), strict=True):
        kind = type(col[0])
        if list(map(type, col)).count(kind) == n:
            if kind is str:
                data[name] = col
                continue
            dtype = _NUMPY_DTYPES.get(kind)
            if dtype is not None:
                try:
                    data[name] = np.fromiter(col, dtype, n)
                    continue
                except OverflowError:  # ints beyond int64: pandas' own inference decides
                    pass
        elif set(map(type, col)) == _INT_FLOAT:
            try:
                np.fromiter([v for v in col if type(v) is int], np.int64)  # they fit int64
                data[name] = np.fromiter(col, np.float64, n)
                continue
            except OverflowError:
                pass
        import pandas as pd

        data[name] = pd.DataFrame.from_records(list(zip(col)), columns=[name])[name].array
    return data


def plain_rows(plain: dict) -> list[tuple] | None:
    """The rows of :func:`plain_columns` ``plain``, each value the Python object
    ``DataFrame.itertuples`` gives for it (numpy values as Python ints, floats and bools), or
    None when a column went through pandas (then iterate the frame itself)."""
    cols = []
    for col in plain.values():
        if isinstance(col, tuple):
            cols.append(col)
        elif isinstance(col, np.ndarray) and col.dtype.kind in "ifb":
            cols.append(col.tolist())
        else:
            return None
    return list(zip(*cols, strict=True))


def _with_pandas_strings(plain: dict) -> dict:
    """``plain`` with each column of strings (a tuple) as the array pandas makes of it."""
    str_dtype = None
    out = {}
    for name, col in plain.items():
        if isinstance(col, tuple):
            if str_dtype is None:
                import pandas as pd

                str_dtype = pd.DataFrame.from_records([("",)]).dtypes.iloc[0]
            col = _strings(col, str_dtype)
        out[name] = col
    return out


def _strings(col: tuple[str, ...], dtype: object) -> object:
    """``pd.array(col, dtype=dtype)`` of a column of ``str`` values (exactly that type).

    For the pyarrow-backed string dtype (pandas 3's default ``str``), pandas converts the
    values to an object array, checks each is a string and hands them to pyarrow as a
    ``large_string`` array; these values all are strings, none missing, so they go to pyarrow
    as that array at once (the same array, ~40% fewer instructions). Any other dtype: as
    pandas builds it."""
    import pandas as pd
    import pyarrow as pa

    if isinstance(dtype, pd.StringDtype) and dtype.storage == "pyarrow":
        return dtype.construct_array_type()._from_sequence(
            pa.array(col, type=pa.large_string()), dtype=dtype)
    return pd.array(col, dtype=dtype)
