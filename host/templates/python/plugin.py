"""The `{{name}}` groupstate plugin.

Per key, it counts the events and emits `{"key":…,"count":…}` at every `every`th event
(parameter `every`, default 3). With event-time timeouts, a key that gets no event for
`idle_ms` of event time (default 60 000) is forgotten: its count starts again from 0.
"""

from dataclasses import dataclass
from typing import Any, List

from groupstate_sdk import Event, GroupState, JsonCodec, ParamError, Params, StateFunction, TimeoutKindMismatch, export


@dataclass
class Count:
    """A key's state between calls (stored as JSON)."""

    count: int = 0
    last_ms: int = 0


class Plugin(StateFunction[Count, Any]):
    name = "{{name}}"
    version = "0.1.0"
    state_schema_version = 1
    codec = JsonCodec(Count)

    def __init__(self, every: int, idle_ms: int) -> None:
        self.every = every
        self.idle_ms = idle_ms

    @classmethod
    def init(cls, params: Params) -> "Plugin":
        params.reject_unknown(["every", "idle_ms"])
        every = params.get_int("every", 3)
        if every <= 0:
            raise ParamError("every", f"must be greater than 0, got {every}")
        idle_ms = params.get_int("idle_ms", 60_000)
        if idle_ms <= 0:
            raise ParamError("idle_ms", f"must be greater than 0 ms, got {idle_ms}")
        return cls(every, idle_ms)

    def process(self, key: str, events: List[Event[Any]], state: GroupState[Count]) -> List[Any]:
        if state.has_timed_out():
            # No event for `idle_ms`: forget the key.
            state.remove()
            return []
        count = state.get() or Count()
        outputs = []
        for event in events:
            count.count += 1
            if count.count % self.every == 0:
                outputs.append({"key": key, "count": count.count})
            if event.time_ms is not None:
                count.last_ms = max(count.last_ms, event.time_ms)
        state.update(count)
        try:
            state.set_timeout_timestamp(count.last_ms + self.idle_ms)
        except TimeoutKindMismatch:
            pass  # Without event-time timeouts (`--timeout none`), keys are kept for good.
        return outputs


WitWorld = export(Plugin)
