"""The sensor-alerts plugin in Python: the same logic and parameters as the Rust one.

Per sensor (key = `sensor_id`), each call's events are processed in `ts` order:

- an event more than `gap_ms` (default 10 minutes) after the sensor's last event starts
  a new episode: the state is reset first;
- `"err"` counts one more consecutive error (the first one's `ts` is remembered),
  `"ok"` sets the count back to 0; any other status fails the call;
- when the count becomes exactly 3 and the third error is at most `window_ms` (default
  1 minute) after the first, it emits `{"sensor_id":…,"ts":<3rd>,"first_ts":<1st>}`;
- the state expires through an event-time timeout `gap_ms` after the sensor's last
  event (skipped in pipelines without event-time timeouts); the timed-out call removes
  it and emits nothing.
"""

from dataclasses import dataclass
from typing import Any, List, Optional

from groupstate_sdk import (
    I64_MAX,
    I64_MIN,
    Event,
    GroupState,
    JsonCodec,
    ParamError,
    Params,
    StateFunction,
    TimeoutKindMismatch,
    export,
)

GAP_MS_DEFAULT = 600_000
WINDOW_MS_DEFAULT = 60_000


@dataclass
class Reading:
    """One input line; only `ts` and `status` are needed."""

    ts: int
    is_error: bool


@dataclass
class Episode:
    """A sensor's state between calls (stored as JSON)."""

    consecutive_errors: int = 0
    first_error_ts: int = 0
    last_ts: int = 0


@dataclass
class Alert:
    """The output: three consecutive errors within the window."""

    sensor_id: str
    ts: int
    first_ts: int


class SensorAlerts(StateFunction[Episode, Reading]):
    name = "sensor-alerts"
    version = "0.1.0"
    state_schema_version = 1
    codec = JsonCodec(Episode)
    event_name = "Reading"

    def __init__(self, gap_ms: int, window_ms: int) -> None:
        self.gap_ms = gap_ms
        self.window_ms = window_ms

    @staticmethod
    def decode_event(obj: Any) -> Reading:
        if not isinstance(obj, dict):
            raise TypeError(f"expected a JSON object, got {type(obj).__name__}")
        for field in ("ts", "status"):
            if field not in obj:
                raise ValueError(f"missing field `{field}`")
        ts = obj["ts"]
        if type(ts) is not int or not I64_MIN <= ts <= I64_MAX:
            raise ValueError(f"`ts` must be an i64, got {ts!r}")
        status = obj["status"]
        if type(status) is not str:
            raise ValueError(f"`status` must be a string, got {status!r}")
        if status != "ok" and status != "err":
            raise ValueError(f"unknown variant `{status}`, expected `ok` or `err`")
        return Reading(ts, status == "err")

    @classmethod
    def init(cls, params: Params) -> "SensorAlerts":
        params.reject_unknown(["gap_ms", "window_ms"])
        gap_ms = params.get_int("gap_ms", GAP_MS_DEFAULT)
        if gap_ms <= 0:
            raise ParamError("gap_ms", f"must be greater than 0 ms, got {gap_ms}")
        window_ms = params.get_int("window_ms", WINDOW_MS_DEFAULT)
        if window_ms < 0:
            raise ParamError("window_ms", f"must be 0 ms or more, got {window_ms}")
        return cls(gap_ms, window_ms)

    def process(self, sensor_id: str, events: List[Event[Reading]], state: GroupState[Episode]) -> List[Alert]:
        # Checked only without events: a call with data is never a timeout call.
        if not events:
            if state.has_timed_out():
                state.remove()
            else:
                episode = state.get()
                if episode is not None:
                    self.set_expiry(state, episode.last_ts)
            return []

        episode: Optional[Episode] = state.get()
        alerts = []
        gap_ms, window_ms = self.gap_ms, self.window_ms
        # Stable: events with equal `ts` keep their arrival order.
        for event in sorted(events, key=lambda event: event.value.ts):
            reading = event.value
            ts = reading.ts
            if episode is None or ts - episode.last_ts > gap_ms:
                episode = Episode()
            episode.last_ts = ts
            if not reading.is_error:
                episode.consecutive_errors = 0
                continue
            episode.consecutive_errors += 1
            if episode.consecutive_errors == 1:
                episode.first_error_ts = ts
            if episode.consecutive_errors == 3 and ts - episode.first_error_ts <= window_ms:
                alerts.append(Alert(sensor_id, ts, episode.first_error_ts))

        state.update(episode)
        self.set_expiry(state, episode.last_ts)
        return alerts

    def set_expiry(self, state: GroupState[Episode], last_ts: int) -> None:
        """Expires the state `gap_ms` after the last event; kept without event-time timeouts."""
        try:
            state.set_timeout_timestamp(last_ts + self.gap_ms)
        except TimeoutKindMismatch:
            pass


WitWorld = export(SensorAlerts)
