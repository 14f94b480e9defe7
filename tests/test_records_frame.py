"""pdsim.log.records_frame builds the run's tables a column at a time; it must give exactly
what ``pd.DataFrame.from_records`` gives (dtypes and values), whatever the rows hold."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pdsim
from pdsim.log import records_frame


def _same_as_from_records(rows: list[tuple], columns: list[str]) -> None:
    got = records_frame(rows, columns)
    want = pd.DataFrame.from_records(rows, columns=columns)
    assert list(got.dtypes) == list(want.dtypes)
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert got.to_csv(index=False) == want.to_csv(index=False)


@pytest.mark.parametrize("rows", [
    [],  # an empty table: object columns
    [(1, 2.0, True, "a"), (2, math.nan, False, "b")],  # one type per column (the fast path)
    [(1, None, "x", 3), (True, 2.0, None, 4.5)],  # bool among ints, None, str/None, int/float
    [(2**70, np.float64(1.0), np.int64(3), 1), (1, 2.0, 4, 2)],  # beyond int64, numpy scalars
    [(2**63, -2**63, np.uint64(2**64 - 1), np.float32(0.1)), (1, 2**63 - 1, np.uint64(1),
                                                               np.float32(0.2))],
    [(None, math.nan, math.inf, -0.0)],
    [(1, "a", 1.5, True), ("b", 2, 3, 0)],  # mixed objects
    [(0, 2**53 + 1, 2**63, -2**63), (0.5, 1.0, 2.5, math.nan)],  # ints and floats: float64
    [(2**64, -2**63 - 1, 2**63 - 1, True), (0.5, 1.0, 2.5, 0.5)],  # ... unless they do not fit
])
def test_records_frame_matches_from_records(rows):
    _same_as_from_records(rows, ["a", "b", "c", "d"])


_values = st.one_of(st.integers(-2**65, 2**65), st.floats(allow_nan=True), st.booleans(),
                    st.text(max_size=3), st.none())


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 3).flatmap(lambda w: st.lists(
    st.one_of(st.tuples(*[_values] * w),  # anything goes
              st.tuples(*[st.sampled_from([0, 1, -5, 2.5, math.nan, True, "", "x"])] * w)),
    min_size=1, max_size=6)))
def test_records_frame_matches_from_records_on_any_rows(rows):
    _same_as_from_records(rows, [f"c{i}" for i in range(len(rows[0]))])


def test_a_run_s_tables_are_built_column_wise_as_from_records_would(monkeypatch):
    """The request and event tables of drop_timeout (NaN times, failed rooms, empty reasons,
    int and float log values in one column) are what from_records makes of the same rows."""
    from pdsim import log, sim

    captured = {}

    def capture(rows, columns):
        captured[tuple(columns)] = rows
        return records_frame(rows, columns)

    def capture_table(rows, columns):
        table, arrays = log.records_table(rows, columns)
        assert list(arrays) == list(columns)
        for name in columns:  # the arrays the summary reads are the frame's columns
            assert table[name].equals(pd.Series(arrays[name], name=name))
        return capture(rows, columns), arrays

    monkeypatch.setattr(sim, "records_table", capture_table)
    monkeypatch.setattr(log, "records_frame", capture)
    res = pdsim.run("scenarios/drop_timeout.yaml")
    assert set(captured) == {tuple(sim.REQUEST_COLUMNS), log.COLUMNS}
    assert (res.requests.status == "failed").any() and res.requests.t_first_token.isna().any()
    for columns, rows in captured.items():
        assert rows
        _same_as_from_records(rows, list(columns))


def test_the_time_series_has_the_dtypes_of_a_frame_of_its_samples():
    """The time series is made from samples as tuples (records_columns): each column has what
    pandas gives a frame of the samples' lists (a first sample at the int time 0 among float
    times: float64; counts: int64), and the rates are the same floats."""
    from pdsim import sim

    rows = [(0, 0, 0, 0, 0.0, 0.0, 0, 0, 0, 0, 0, 0, 0),
            (1.0, 120, 1, 0, 0.25, 0.5, 3, 1, 2, 0, 1, 4, 0),
            (1.0, 150, 1, 1, 0.5, 0.75, 2, 2, 0, 1, 0, 5, 2),
            (2.5, 300, 4, 2, 0.125, 1.0, 0, 0, 1, 0, 2, 3, 2)]
    got = sim._timeseries(rows)
    cols = {k: [r[i] for r in rows] for i, k in enumerate(sim.SAMPLE_COLUMNS)}
    want = pd.DataFrame(cols)
    t = np.array(cols["time"], dtype=float)
    dt = np.diff(t, prepend=0.0)
    dt[0] = t[0] or 1.0
    dt[dt == 0] = np.nan
    for name, col in (("tokens_per_s", "tokens_out"), ("failed_per_s", "failed")):
        x = np.array(cols[col], dtype=float)
        want.insert(list(want.columns).index("time") + 1 + (name == "failed_per_s"), name,
                    np.nan_to_num(np.diff(x, prepend=0.0) / dt, nan=0.0))
    assert list(got.columns) == list(want.columns)
    assert list(got.dtypes) == list(want.dtypes)
    pd.testing.assert_frame_equal(got, want, check_exact=True)
