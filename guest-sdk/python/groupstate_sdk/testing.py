"""Run a 0.2 `KeyedFunction` natively, in plain Python, with the host's rules: `KeyedDriver`.

What `groupstate_sdk::testing::KeyedDriver` is for Rust plugins. It keeps every key's
variables and timers in memory and runs batches as the host does:

- a batch's watermark is the given one, or the host's: the largest event time of the
  earlier batches minus the watermark delay, never moving back, 0 at first; events
  strictly below it are late (`BatchResult.late`) and reach no call;
- `process` is called once per key with data, its events in arrival order, keys in the
  order of their first event;
- then `handle_expired_timer` once per timer the key held before the batch whose expiry
  is at or below the threshold (the watermark in `"event-time"` pipelines, the
  processing time in `"processing-time"` ones, none with `"none"`), by expiry, then key,
  then name, at most `timeouts_per_batch_max`; a timer that an earlier call of the batch
  deleted does not fire, one registered in the batch fires in a later one at the
  earliest; the timer is removed with its call, whatever the result;
- a call's changes are applied only when it returns; after a failed call the instance
  is replaced by a fresh one from `init` and the batch goes on (`--on-error skip`);
- requests are checked as the host checks them, with its default limits unless given.

- variables with a TTL: each value, list element and map entry expires at its write
  time plus the TTL (processing time, or the call's event time: its latest event or the
  watermark if later; the watermark in a timer call; the processing time for initial
  state), is invisible from the first batch whose threshold on its clock reaches the
  expiry and is removed then; TTL'd writes stage their index entries against
  `state_writes_per_call_max` as the host's do, and `list_len` reads a TTL'd list.

Outputs are JSON text, exactly as the host writes them.

    from groupstate_sdk.testing import Batch, KeyedDriver

    driver = KeyedDriver(Sessions, time_mode="event-time", watermark_delay_ms=600_000)
    result = driver.run(Batch().event_at("u1", 1_000, {"user": "u1", "ts": 1_000, "page": "/"}))
    assert result.outputs() == []
    assert driver.timers("u1") == [Timer(1_000 + 1_800_000, "1000")]
    driver.key_state("u1", lambda s: s.map("sessions").keys())    # [1000]

Run a plugin's tests with `python3 -m unittest` (the standard library only).
"""

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from groupstate_sdk import Err, Params, _message
from groupstate_sdk.v2 import (
    LIST,
    MAP,
    TIME_MODES,
    VALUE,
    KeyedFunction,
    KeyState,
    Timer,
    _check_variables,
    run_expired_timer,
    run_initial_state,
    run_process,
)

KEY_BYTES_MAX = 4096
TIMER_NAME_BYTES_MAX = 256
VARIABLE_NAME_BYTES_MAX = 64


# Stand-ins for the WIT's `state-error` cases, named as componentize-py names them.
@dataclass
class StateError_UnknownVariable:  # noqa: N801 - the bindings' naming
    value: str


@dataclass
class StateError_ValueTooLarge:  # noqa: N801
    value: int


@dataclass
class StateError_TooManyEntries:  # noqa: N801
    value: int


@dataclass
class StateError_TooManyTimers:  # noqa: N801
    value: int


@dataclass
class StateError_TimeModeMismatch:  # noqa: N801
    value: int


@dataclass
class StateError_NonPositiveTime:  # noqa: N801
    value: int


@dataclass
class StateError_TimerNameTooLong:  # noqa: N801
    value: int


@dataclass
class StateError_KeyTooLong:  # noqa: N801
    value: int


# A stored value, list element or map entry: (the plugin's bytes, its expiry), the
# expiry (event_time, at_ms) for a variable with a TTL, else None.
_Stored = Tuple[bytes, Optional[Tuple[bool, int]]]


@dataclass
class _List:
    next: int = 0
    elements: Dict[int, _Stored] = field(default_factory=dict)


@dataclass
class _KeyData:
    values: Dict[str, _Stored] = field(default_factory=dict)
    lists: Dict[str, _List] = field(default_factory=dict)
    maps: Dict[str, Dict[bytes, _Stored]] = field(default_factory=dict)
    timers: set = field(default_factory=set)

    def remove_expired(self, expired: Callable[[Tuple[bool, int]], bool]) -> None:
        """Removes the entries `expired` says are, as the host does at a batch's start."""
        gone = lambda stored: stored[1] is not None and expired(stored[1])  # noqa: E731
        self.values = {n: v for n, v in self.values.items() if not gone(v)}
        for lst in self.lists.values():
            lst.elements = {i: e for i, e in lst.elements.items() if not gone(e)}
        self.lists = {n: l for n, l in self.lists.items() if l.elements}
        self.maps = {n: {k: v for k, v in m.items() if not gone(v)} for n, m in self.maps.items()}
        self.maps = {n: m for n, m in self.maps.items() if m}

    def copy(self) -> "_KeyData":
        return _KeyData(
            dict(self.values),
            {n: _List(l.next, dict(l.elements)) for n, l in self.lists.items()},
            {n: dict(m) for n, m in self.maps.items()},
            set(self.timers),
        )

    def is_empty(self) -> bool:
        return (
            not self.values
            and all(not l.elements for l in self.lists.values())
            and all(not m for m in self.maps.values())
            and not self.timers
        )


@dataclass
class _Limits:
    state_bytes_max: int = 1 << 20
    state_writes_per_call_max: int = 10_000
    timers_per_key_max: int = 1_000
    timeouts_per_batch_max: int = 100_000


@dataclass
class _Wit_Timer:  # noqa: N801 - what the bindings pass to handle_expired_timer
    expiry_ms: int
    name: Optional[str]


@dataclass
class _Wit_Event:  # noqa: N801 - what the bindings pass to process
    event_time_ms: Optional[int]
    payload: str


class TestCall:
    """The key-state handle of one driver call: the raw WIT methods over the key's data,
    refusing as the host refuses (raising `Err` with a `state-error` stand-in)."""

    def __init__(self, key: str, data: _KeyData, variables: Sequence[Any], ctx: Dict[str, Any], limits: _Limits) -> None:
        self.key = key
        self.data = data
        self.touched: set = set()
        self._kinds = {v.name: v.kind for v in variables}
        self._ttls = {v.name: v.ttl for v in variables}
        self._ctx = ctx
        self._limits = limits

    # Checks.
    def _check(self, name: str, kind: str) -> Any:
        """Checks that `name` is a declared variable of `kind`; its TTL."""
        if self._kinds.get(name) != kind:
            raise Err(StateError_UnknownVariable(name))
        return self._ttls.get(name)

    def _expired(self, expiry: Tuple[bool, int]) -> bool:
        event_time, at_ms = expiry
        return at_ms <= (self._ctx["watermark_ms"] if event_time else self._ctx["processing_time_ms"])

    def _live(self, stored: _Stored) -> bool:
        return stored[1] is None or not self._expired(stored[1])

    def _expiry_of(self, ttl: Any) -> Optional[Tuple[bool, int]]:
        if ttl is None:
            return None
        if ttl.clock == "event-time":
            return (True, min(self._ctx["event_time_ms"] + ttl.duration_ms, 2**63 - 1))
        return (False, min(self._ctx["processing_time_ms"] + ttl.duration_ms, 2**63 - 1))

    @staticmethod
    def _entry_ids(entry: Tuple, ttl: Any, old: Optional[_Stored], new: Any) -> List[Tuple]:
        """The entries writing (`new`: the new expiry, or None; `False`: a removal) entry
        stages: with a TTL the removal of the old index entry and the new one."""
        ids = []
        if ttl is not None and old is not None and old[1] is not None:
            ids.append(("i", old[1], entry))
        if new is not False and new is not None:
            ids.append(("i", new, entry))
        ids.append(entry)
        return ids

    def _stage_all(self, ids: List[Tuple]) -> None:
        new = len(set(ids) - self.touched)
        if len(self.touched) + new > self._max():
            raise Err(StateError_TooManyEntries(self._max()))
        self.touched.update(ids)

    @staticmethod
    def _entry_len(length: int, ttl: Any) -> None:
        TestCall._key_len(length + (19 if ttl is not None else 0))

    def _prefix_bytes(self) -> int:
        return len(self.key.encode()) + sum(1 for c in self.key if c in "\0\x01") + 1

    @staticmethod
    def _key_len(length: int) -> None:
        if length > KEY_BYTES_MAX:
            raise Err(StateError_KeyTooLong(length))

    def _value(self, value: bytes) -> None:
        if len(value) > self._limits.state_bytes_max:
            raise Err(StateError_ValueTooLarge(self._limits.state_bytes_max))

    def _max(self) -> int:
        return self._limits.state_writes_per_call_max

    def _stage(self, entry: Tuple) -> None:
        self._stage_all([entry])

    def _read(self, count: int) -> None:
        if count > self._max():
            raise Err(StateError_TooManyEntries(self._max()))

    def _map_key(self, name: str, key: bytes, ttl: Any) -> None:
        if len(key) > self._limits.state_bytes_max:
            raise Err(StateError_ValueTooLarge(self._limits.state_bytes_max))
        self._entry_len(self._prefix_bytes() + 2 + len(name) + 2 * len(key), ttl)

    # Value variables.
    def value_get(self, name: str) -> Optional[bytes]:
        self._check(name, VALUE)
        stored = self.data.values.get(name)
        return stored[0] if stored is not None and self._live(stored) else None

    def value_set(self, name: str, value: bytes) -> None:
        ttl = self._check(name, VALUE)
        self._value(value)
        self._entry_len(self._prefix_bytes() + 1 + len(name), ttl)
        expiry = self._expiry_of(ttl)
        self._stage_all(self._entry_ids(("v", name), ttl, self.data.values.get(name), expiry))
        self.data.values[name] = (bytes(value), expiry)

    def value_clear(self, name: str) -> None:
        ttl = self._check(name, VALUE)
        self._entry_len(self._prefix_bytes() + 1 + len(name), ttl)
        self._stage_all(self._entry_ids(("v", name), ttl, self.data.values.get(name), False))
        self.data.values.pop(name, None)

    # List variables.
    def list_append(self, name: str, value: bytes) -> None:
        ttl = self._check(name, LIST)
        self._value(value)
        lst = self.data.lists.get(name, _List())
        self._entry_len(self._prefix_bytes() + 2 + len(name) + 16, ttl)
        expiry = self._expiry_of(ttl)
        self._stage_all(self._entry_ids(("l", name, lst.next), ttl, None, expiry) + [("n", name)])
        lst.elements[lst.next] = (bytes(value), expiry)
        lst.next += 1
        self.data.lists[name] = lst

    def _list_live(self, name: str) -> List[bytes]:
        lst = self.data.lists.get(name, _List())
        self._read(len(lst.elements))
        return [lst.elements[i][0] for i in sorted(lst.elements) if self._live(lst.elements[i])]

    def list_get(self, name: str) -> List[bytes]:
        self._check(name, LIST)
        return self._list_live(name)

    def list_len(self, name: str) -> int:
        if self._check(name, LIST) is not None:
            return len(self._list_live(name))  # With a TTL the host reads the list.
        return len(self.data.lists.get(name, _List()).elements)

    def list_clear(self, name: str) -> None:
        self._check(name, LIST)
        elements = self.data.lists.get(name, _List()).elements
        self._read(len(elements))
        ids: List[Tuple] = []
        for i in sorted(elements):
            if elements[i][1] is not None:
                ids.append(("i", elements[i][1], ("l", name, i)))
            ids.append(("l", name, i))
        self._stage_all(ids + [("n", name)])
        self.data.lists.pop(name, None)

    # Map variables.
    def map_get(self, name: str, key: bytes) -> Optional[bytes]:
        ttl = self._check(name, MAP)
        self._map_key(name, key, ttl)
        stored = self.data.maps.get(name, {}).get(bytes(key))
        return stored[0] if stored is not None and self._live(stored) else None

    def map_contains(self, name: str, key: bytes) -> bool:
        return self.map_get(name, key) is not None

    def map_put(self, name: str, key: bytes, value: bytes) -> None:
        ttl = self._check(name, MAP)
        self._map_key(name, key, ttl)
        self._value(value)
        expiry = self._expiry_of(ttl)
        old = self.data.maps.get(name, {}).get(bytes(key))
        self._stage_all(self._entry_ids(("m", name, bytes(key)), ttl, old, expiry))
        self.data.maps.setdefault(name, {})[bytes(key)] = (bytes(value), expiry)

    def map_remove(self, name: str, key: bytes) -> None:
        ttl = self._check(name, MAP)
        self._map_key(name, key, ttl)
        old = self.data.maps.get(name, {}).get(bytes(key))
        self._stage_all(self._entry_ids(("m", name, bytes(key)), ttl, old, False))
        self.data.maps.get(name, {}).pop(bytes(key), None)

    def map_entries(self, name: str) -> List[Tuple[bytes, bytes]]:
        self._check(name, MAP)
        entries = sorted(self.data.maps.get(name, {}).items())
        self._read(len(entries))
        return [(k, v[0]) for k, v in entries if self._live(v)]

    def map_keys(self, name: str) -> List[bytes]:
        return [k for k, _ in self.map_entries(name)]

    # Timers.
    def register_timer(self, expiry_ms: int, name: Optional[str]) -> None:
        if self._ctx["time_mode"] == "none":
            raise Err(StateError_TimeModeMismatch(0))
        if expiry_ms <= 0:
            raise Err(StateError_NonPositiveTime(expiry_ms))
        name_bytes = 0 if name is None else len(name.encode())
        if name_bytes > TIMER_NAME_BYTES_MAX:
            raise Err(StateError_TimerNameTooLong(name_bytes))
        self._key_len(self._prefix_bytes() + 18 + 2 * name_bytes)
        timer = Timer(expiry_ms, name)
        if timer in self.data.timers:
            return
        held = len(self.data.timers)
        if held >= self._limits.timers_per_key_max or held > self._max():
            raise Err(StateError_TooManyTimers(self._limits.timers_per_key_max))
        self._stage(("t", timer))
        self.data.timers.add(timer)

    def delete_timer(self, expiry_ms: int, name: Optional[str]) -> None:
        timer = Timer(expiry_ms, name)
        if timer not in self.data.timers:
            return  # Also every timer whose name is too long: none can exist.
        self._stage(("t", timer))
        self.data.timers.discard(timer)

    def list_timers(self) -> List[Timer]:
        self._read(len(self.data.timers))
        return sorted(self.data.timers)

    def time_mode(self) -> int:
        return TIME_MODES.index(self._ctx["time_mode"])

    def current_watermark_ms(self) -> int:
        return self._ctx["watermark_ms"]

    def current_processing_time_ms(self) -> int:
        return self._ctx["processing_time_ms"]


class Batch:
    """One micro-batch: events of any keys in arrival order; optionally its watermark
    (never below the previous batch's) and processing time (kept for later batches)."""

    def __init__(self, watermark_ms: Optional[int] = None, processing_time_ms: Optional[int] = None) -> None:
        self.events: List[Tuple[str, Optional[int], str]] = []
        self.watermark_ms = watermark_ms
        self.processing_time_ms = processing_time_ms

    def event(self, key: str, payload: Any) -> "Batch":
        """Adds an event of `key` without event time; `payload` is a dict or JSON text."""
        return self._add(key, None, payload)

    def event_at(self, key: str, time_ms: int, payload: Any) -> "Batch":
        """Adds an event of `key` with event time `time_ms` (the pipeline's time field)."""
        return self._add(key, time_ms, payload)

    def _add(self, key: str, time_ms: Optional[int], payload: Any) -> "Batch":
        text = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
        self.events.append((key, time_ms, text))
        return self


@dataclass
class Call:
    """One plugin call: its key, the timer of a timer call (`None` for a data call), and
    its outputs (JSON text) or its error."""

    key: str
    timer: Optional[Timer]
    outputs: Optional[List[str]]
    error: Optional[str]


@dataclass
class BatchResult:
    """What a batch did: its watermark and processing time, every call in order (data
    calls, then timer calls), and the late events (key, time, payload)."""

    watermark_ms: int
    processing_time_ms: int
    calls: List[Call]
    late: List[Tuple[str, Optional[int], str]]

    def outputs(self) -> List[str]:
        """The outputs of the calls that succeeded, in call order (the host's output lines)."""
        return [o for c in self.calls if c.outputs is not None for o in c.outputs]

    def output_values(self) -> List[Any]:
        """The outputs parsed as JSON."""
        return [json.loads(o) for o in self.outputs()]

    def errors(self) -> List[Tuple[str, str]]:
        """The failed calls: (key, error)."""
        return [(c.key, c.error) for c in self.calls if c.error is not None]

    def timer_calls(self) -> List[Tuple[str, Timer]]:
        """The timer calls: (key, timer)."""
        return [(c.key, c.timer) for c in self.calls if c.timer is not None]


def _check_names(variables: Sequence[Any]) -> None:
    for v in variables:
        name = v.name
        ok = 0 < len(name) <= VARIABLE_NAME_BYTES_MAX and all(c.isascii() and (c.isalnum() or c in "_-.") for c in name)
        if not ok:
            raise ValueError(
                f"init declared a variable named {name!r}: a name has 1 to {VARIABLE_NAME_BYTES_MAX} ASCII letters, digits, '_', '-' or '.'"
            )


class KeyedDriver:
    """Runs `cls` (a `KeyedFunction`) over batches with the host's rules (see the module doc).

    `time_mode` is `"event-time"`, `"processing-time"` or `"none"`; the limits default to
    the host's (`state_bytes_max` 1 MiB, `state_writes_per_call_max` 10 000,
    `timers_per_key_max` 1 000, `timeouts_per_batch_max` 100 000). `init` failing, or
    variables the host would refuse, raise `ValueError` with the message."""

    def __init__(
        self,
        cls: type,
        params: Sequence[Tuple[str, str]] = (),
        time_mode: str = "event-time",
        watermark_delay_ms: int = 0,
        **limits: int,
    ) -> None:
        if time_mode not in TIME_MODES:
            raise ValueError(f"time_mode is {time_mode!r}: use one of {', '.join(TIME_MODES)}")
        self.cls = cls
        self.params = list(params)
        self.time_mode = time_mode
        self.watermark_delay_ms = watermark_delay_ms
        self.limits = _Limits(**limits)
        variables = list(cls.variables)
        _check_names(variables)
        try:
            _check_variables(variables)
        except Exception as error:  # noqa: BLE001
            raise ValueError(_message(error)) from None
        self.variables = variables
        self.function = self._init()
        self._keys: Dict[str, _KeyData] = {}
        self._watermark_ms = 0
        self._processing_time_ms = 0

    def _init(self) -> KeyedFunction:
        try:
            return self.cls.init(Params(self.params))
        except Exception as error:  # noqa: BLE001 - init's failure is the test's
            raise ValueError(_message(error)) from None

    @property
    def watermark_ms(self) -> int:
        """The watermark the next batch gets unless it sets one (0 before any event time)."""
        return self._watermark_ms

    def _context(self, event_time_ms: Optional[int] = None) -> Dict[str, Any]:
        return {
            "time_mode": self.time_mode,
            "watermark_ms": self._watermark_ms,
            "processing_time_ms": self._processing_time_ms,
            "event_time_ms": self._watermark_ms if event_time_ms is None else event_time_ms,
        }

    def run(self, batch: Batch) -> BatchResult:
        """Runs one batch. `AssertionError` if its watermark is below the previous one's."""
        watermark = self._watermark_ms if batch.watermark_ms is None else batch.watermark_ms
        assert watermark >= self._watermark_ms, (
            f"batch watermark {watermark} is below the previous one, {self._watermark_ms}: the host's never moves back"
        )
        self._watermark_ms = watermark
        if batch.processing_time_ms is not None:
            self._processing_time_ms = batch.processing_time_ms
        result = BatchResult(watermark, self._processing_time_ms, [], [])

        groups: Dict[str, List[_Wit_Event]] = {}
        max_time: Optional[int] = None
        for key, time_ms, payload in batch.events:
            if time_ms is not None and time_ms < watermark:
                result.late.append((key, time_ms, payload))
                continue
            if time_ms is not None:
                max_time = time_ms if max_time is None else max(max_time, time_ms)
            groups.setdefault(key, []).append(_Wit_Event(time_ms, payload))
        self._remove_expired_entries()
        expired = self._expired_timers()

        for key, events in groups.items():
            # The call's write time on the event-time clock: its latest event, or the watermark.
            written = max([watermark] + [e.event_time_ms for e in events if e.event_time_ms is not None])
            result.calls.append(self._call(key, None, lambda f, handle, k=key, e=events: run_process(f, k, e, handle), written))
        for key, timer in expired:
            if timer not in self._keys.get(key, _KeyData()).timers:
                continue  # Deleted by an earlier call of this batch.
            wit_timer = _Wit_Timer(timer.expiry_ms, timer.name)
            result.calls.append(self._call(key, timer, lambda f, handle, k=key, t=wit_timer: run_expired_timer(f, k, t, handle), watermark))

        if max_time is not None:
            self._watermark_ms = max(self._watermark_ms, max_time - self.watermark_delay_ms)
        return result

    def _remove_expired_entries(self) -> None:
        """Removes the entries of TTL'd variables this batch's thresholds reach (all of
        them: `ttl_expirations_per_batch_max` is not modelled, which no read can tell)."""
        probe = TestCall("", _KeyData(), self.variables, self._context(), self.limits)
        for data in self._keys.values():
            data.remove_expired(probe._expired)
        self._keys = {k: d for k, d in self._keys.items() if not d.is_empty()}

    def _expired_timers(self) -> List[Tuple[str, Timer]]:
        if self.time_mode == "none":
            return []
        threshold = self._watermark_ms if self.time_mode == "event-time" else self._processing_time_ms
        expired = [
            (t.expiry_ms, key.encode(), 0 if t.name is None else 1, (t.name or "").encode(), key, t)
            for key, data in self._keys.items()
            for t in data.timers
            if t.expiry_ms <= threshold
        ]
        expired.sort(key=lambda e: e[:4])
        return [(e[4], e[5]) for e in expired[: self.limits.timeouts_per_batch_max]]

    def _call(self, key: str, timer: Optional[Timer], run: Callable[[KeyedFunction, TestCall], List[str]], written: int) -> Call:
        before = self._keys.get(key, _KeyData()).copy()
        if timer is not None:
            before.timers.discard(timer)
        call = TestCall(key, before.copy(), self.variables, self._context(written), self.limits)
        if timer is not None:
            call.touched.add(("t", timer))
        try:
            outputs = run(self.function, call)
        except Err as error:
            self._store(key, before)
            self.function = self._init()  # The host replaces the instance after a failed call.
            return Call(key, timer, None, str(error.value))
        self._store(key, call.data)
        return Call(key, timer, outputs, None)

    def _store(self, key: str, data: _KeyData) -> None:
        if data.is_empty():
            self._keys.pop(key, None)
        else:
            self._keys[key] = data

    def key_state(self, key: str, f: Callable[[KeyState], Any]) -> Any:
        """Runs `f(key_state)` over `key`'s variables and timers outside any batch, with
        no per-call write limit: to read them typed (`lambda s: s.map("sessions").keys()`)
        or to set state up. Changes are kept when `f` returns; its exception propagates."""
        limits = _Limits(**{**self.limits.__dict__, "state_writes_per_call_max": 2**62})
        call = TestCall(key, self._keys.get(key, _KeyData()).copy(), self.variables, self._context(), limits)
        value = f(KeyState(call, self.variables))
        self._store(key, call.data)
        return value

    def initial_state(self, key: str, state_json: Any) -> Optional[str]:
        """Calls `handle_initial_state` for `key` with `state_json` (a value, or JSON text),
        at watermark 0; returns `None`, or the call's error (nothing is then kept)."""
        text = state_json if isinstance(state_json, str) else json.dumps(state_json)
        # No watermark before the first batch: an event-time TTL counts from the processing time.
        ctx = {**self._context(self._processing_time_ms), "watermark_ms": 0}
        call = TestCall(key, self._keys.get(key, _KeyData()).copy(), self.variables, ctx, self.limits)
        try:
            run_initial_state(self.function, key, text, call)
        except Err as error:
            return str(error.value)
        self._store(key, call.data)
        return None

    def render_state(self, variable: str, part: str, data: bytes) -> Optional[str]:
        """What `render_state` answers (`part`: "value", "list-element", "map-key", "map-value")."""
        return self.function.render_state(variable, part, data)

    def timers(self, key: str) -> List[Timer]:
        """`key`'s timers in (expiry, name) order."""
        return sorted(self._keys.get(key, _KeyData()).timers)

    def all_timers(self) -> List[Tuple[str, Timer]]:
        """Every key's timers in firing order: by expiry, then key, then name."""
        every = [(t.expiry_ms, key.encode(), t.order(), key, t) for key, d in self._keys.items() for t in d.timers]
        every.sort(key=lambda e: e[:3])
        return [(e[3], e[4]) for e in every]

    def keys(self) -> List[str]:
        """The keys holding a value, a list element, a map entry or a timer, in byte order."""
        return sorted(self._keys, key=str.encode)
