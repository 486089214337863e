"""Web sessionization on the 0.2 state API, in Python: the same logic and parameters as
the Rust `plugins/sessions`.

Events `{"user", "ts", "page"}` keyed by user; a session is the events of one user with
less than the gap (30 minutes by default, `--param gap_ms=N`) between one and the next
in event time. Events may come out of order (within the pipeline's watermark delay): an
event extends the session it falls into, starts a new one, or merges the two it bridges.

State: map variable `sessions` from a session's start to the session, and one
event-time timer per open session, at its end plus the gap, named by its start. When
the watermark reaches the timer no later event can join the session (it would be late),
so the handler emits `{"user","start","end","events","pages"}` and removes it.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List

from groupstate_sdk import I64_MAX, I64_MIN, Event, JsonCodec, ParamError, Params, PluginError
from groupstate_sdk.v2 import IntKey, KeyedFunction, KeyState, MapState, Timer, Variable, export

GAP_MS_DEFAULT = 30 * 60 * 1000


@dataclass
class View:
    """One page view: its event time and page."""

    ts: int
    page: str


@dataclass
class Session:
    """An open session: first and last event times, events, the pages it visited."""

    start: int
    end: int
    events: int
    pages: List[str] = field(default_factory=list)


@dataclass
class Closed:
    """A closed session, the output."""

    user: str
    start: int
    end: int
    events: int
    pages: int


SESSIONS = Variable.map("sessions", key=IntKey(), value=JsonCodec(Session))


class Sessions(KeyedFunction):
    name = "sessions-py"
    version = "0.1.0"
    state_schema_version = 1
    variables = [SESSIONS]
    event_name = "View"

    def __init__(self, gap_ms: int) -> None:
        self.gap_ms = gap_ms

    @staticmethod
    def decode_event(obj: Any) -> View:
        if not isinstance(obj, dict):
            raise TypeError(f"expected a JSON object, got {type(obj).__name__}")
        ts, page = obj.get("ts"), obj.get("page")
        if type(ts) is not int or not I64_MIN <= ts <= I64_MAX:
            raise ValueError(f"`ts` must be an i64, got {ts!r}")
        if type(page) is not str:
            raise ValueError(f"`page` must be a string, got {page!r}")
        return View(ts, page)

    @classmethod
    def init(cls, params: Params) -> "Sessions":
        params.reject_unknown(["gap_ms"])
        gap_ms = params.get_int("gap_ms", GAP_MS_DEFAULT)
        if gap_ms <= 0:
            raise ParamError("gap_ms", f"must be greater than zero, not {gap_ms}")
        return cls(gap_ms)

    def close_timer(self, session: Session) -> int:
        return session.end + self.gap_ms

    def add(self, open_sessions: Dict[int, Session], sessions: MapState, state: KeyState, view: View) -> None:
        """Adds one view: the sessions within the gap of it (and then of what they merged
        into, for a view that bridges two) are merged with it into one. `open_sessions`
        is the map's content, kept in step with it so that a call decodes it once."""
        merged = Session(view.ts, view.ts, 1, [view.page])
        while True:
            near = [
                (start, s)
                for start, s in open_sessions.items()
                if s.start < merged.end + self.gap_ms and s.end > merged.start - self.gap_ms
            ]
            if not near:
                break
            for start, s in near:
                del open_sessions[start]
                sessions.remove(start)
                state.delete_timer(self.close_timer(s), str(start))
                merged.start = min(merged.start, s.start)
                merged.end = max(merged.end, s.end)
                merged.events += s.events
                merged.pages = sorted(set(merged.pages) | set(s.pages))
        open_sessions[merged.start] = merged
        sessions.put(merged.start, merged)
        state.register_timer(self.close_timer(merged), str(merged.start))

    def process(self, user: str, events: List[Event], state: KeyState) -> List[Closed]:
        sessions = state.map(SESSIONS)
        open_sessions = dict(sessions.entries())
        for event in events:
            self.add(open_sessions, sessions, state, event.value)
        return []

    def handle_expired_timer(self, user: str, timer: Timer, state: KeyState) -> List[Closed]:
        try:
            start = int(timer.name or "")
        except ValueError:
            raise PluginError(f"timer {timer!r} is not one of this plugin's (named by a session start)") from None
        sessions = state.map(SESSIONS)
        session = sessions.get(start)
        if session is None:
            return []
        sessions.remove(start)
        return [Closed(user, session.start, session.end, session.events, len(set(session.pages)))]

    def render_state(self, variable: str, part: str, data: bytes):
        return self.render_declared(variable, part, data)


WitWorld = export(Sessions)
