"""The event log: one flat record per event, straight into a DataFrame.

Records are tuples in :data:`COLUMNS` order, appended on the hot path; nothing is formatted
until the log is turned into a DataFrame.
"""

from __future__ import annotations

import pandas as pd
import simpy

COLUMNS = ("time", "event", "component", "rank", "rid", "room", "peer", "value", "detail")


class EventLog:
    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.rows: list[tuple] = []

    def __call__(self, event: str, component: str = "", rank: int = -1, rid: int = -1,
                 room: int = -1, peer: str = "", value: float = 0.0, detail: str = "") -> None:
        self.rows.append((self.env.now, event, component, rank, rid, room, peer, value, detail))

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame.from_records(self.rows, columns=list(COLUMNS))
