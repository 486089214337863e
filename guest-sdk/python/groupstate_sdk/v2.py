"""The 0.2 state API (`groupstate:plugin@0.2.0`, world `keyed-state-function`) in Python.

What `groupstate_sdk::v2` is for Rust: named state variables per key — value, list and
map state — and many timers per key, after Spark's `transformWithState`.

- `KeyedFunction`, the base class of a plugin: class attributes `name`, `version`,
  `state_schema_version` and `variables` (the `Variable`s it declares), and the methods
  `init(params)`, `process(key, events, state)`, `handle_expired_timer(key, timer,
  state)`, optionally `handle_initial_state(key, state_json, state)` (default: refuses,
  saying the plugin has none), `migrate_state(variable, part, from_version, data)`
  (default: refuses; `migrate_declared` converts through a function of decoded values)
  and `render_state(variable, part, data)` (default: `None`);
- `Variable.value(name, codec)`, `Variable.list(name, codec)`, `Variable.map(name, key,
  value)`, each optionally `.with_ttl(Ttl.event_time(ms))` or `Ttl.processing_time(ms)`,
  and `.with_schema_version(n)` once the layout of its values changes;
  values are encoded by a `Codec` (JSON by default, `JsonCodec(MyDataclass)` for
  dataclasses), map keys by a `MapKey` whose bytes keep the keys' order (`StrKey`,
  `IntKey`, `U64Key`, `BytesKey`);
- `KeyState`, the handle of one call: `value(name)`, `list(name)`, `map(name)` give
  `ValueState`, `ListState` and `MapState` typed by the declaration;
  `register_timer(expiry_ms, name=None)`, `delete_timer(...)`, `timers()`,
  `time_mode()`, `watermark_ms()`, `processing_time_ms()`;
- `KeyStateError` and its subclasses, raised when the host refuses a request (the
  request had no effect);
- `export(cls)`, the `WitWorld` class componentize-py looks for;
  `groupstate_sdk.wit_path("0.2")` the WIT to build against.

The host calls `process` once per key with data in a batch, then, after every data
call of the batch, `handle_expired_timer` once per timer whose expiry the batch's
watermark (event-time pipelines) or processing time (processing-time pipelines) has
reached (`expiry <= threshold`). A timer registered in a batch fires in a later batch
at the earliest; a timer deleted in a data call does not fire. Everything a call
changes is applied only when it returns normally; an exception fails the call and
changes nothing (the timer of a failed timer call is gone all the same).

`groupstate_sdk.testing.KeyedDriver` runs a `KeyedFunction` natively, with these rules.
"""

import builtins
import json
import struct
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

from groupstate_sdk import (
    Codec,
    Err,
    Event,
    JsonCodec,
    Params,
    PluginError,
    StateError,
    _decode_events,
    _message,
    _to_json,
    _wit_types,
    saturating_i64,
    wit_world,
)

VALUE = "value"
LIST = "list"
MAP = "map"

TIME_MODES = ("none", "processing-time", "event-time")
STATE_PARTS = ("value", "list-element", "map-key", "map-value")


class MapKey:
    """Turns map keys into bytes and back so that the byte order of the encodings is the
    order of the keys (`MapState.entries()` comes in key order)."""

    def encode(self, key: Any) -> bytes:
        raise NotImplementedError

    def decode(self, data: bytes) -> Any:
        raise NotImplementedError


class StrKey(MapKey):
    """`str` keys as UTF-8 (the Rust SDK's `String`)."""

    def encode(self, key: str) -> bytes:
        return key.encode()

    def decode(self, data: bytes) -> str:
        return data.decode()


class BytesKey(MapKey):
    """`bytes` keys as they are (the Rust SDK's `Vec<u8>`)."""

    def encode(self, key: bytes) -> bytes:
        return bytes(key)

    def decode(self, data: bytes) -> bytes:
        return data


class IntKey(MapKey):
    """`int` keys in the `s64` range, 8 bytes big-endian with the sign bit flipped, so
    negative keys sort first (the Rust SDK's `i64`: the same bytes)."""

    def encode(self, key: int) -> bytes:
        if not -(2**63) <= key < 2**63:
            raise PluginError(f"map key {key} is outside the s64 range")
        return struct.pack(">Q", (key + 2**63) % 2**64)

    def decode(self, data: bytes) -> int:
        (word,) = struct.unpack(">Q", data)
        return word - 2**63


class U64Key(MapKey):
    """`int` keys from 0 to 2**64 - 1, 8 bytes big-endian (the Rust SDK's `u64`)."""

    def encode(self, key: int) -> bytes:
        if not 0 <= key < 2**64:
            raise PluginError(f"map key {key} is outside the u64 range")
        return struct.pack(">Q", key)

    def decode(self, data: bytes) -> int:
        return struct.unpack(">Q", data)[0]


@dataclass(frozen=True)
class Ttl:
    """A time-to-live: each value, list element or map entry expires `duration_ms` after
    it was last written, on `clock` (`"processing-time"` or `"event-time"`, against the
    watermark). Reading does not renew an entry; an expired entry is invisible at once
    and the host removes it without calling the plugin (the WIT's `ttl` has the rules)."""

    duration_ms: int
    clock: str

    @staticmethod
    def processing_time(duration_ms: int) -> "Ttl":
        return Ttl(duration_ms, "processing-time")

    @staticmethod
    def event_time(duration_ms: int) -> "Ttl":
        return Ttl(duration_ms, "event-time")


@dataclass(frozen=True)
class Variable:
    """A state variable, declared in `KeyedFunction.variables`: its name (1 to 64 ASCII
    letters, digits, `_`, `-` or `.`, unique among the plugin's), kind, codecs and TTL."""

    name: str
    kind: str
    codec: Codec
    key: Optional[MapKey] = None
    ttl: Optional[Ttl] = None
    schema_version: int = 1

    @staticmethod
    def value(name: str, codec: Optional[Codec] = None) -> "Variable":
        """A value variable, its value encoded by `codec` (JSON by default)."""
        return Variable(name, VALUE, codec or JsonCodec())

    @staticmethod
    def list(name: str, codec: Optional[Codec] = None) -> "Variable":
        """A list variable, each element encoded by `codec` (JSON by default)."""
        return Variable(name, LIST, codec or JsonCodec())

    @staticmethod
    def map(name: str, key: Optional[MapKey] = None, value: Optional[Codec] = None) -> "Variable":
        """A map variable, keys encoded by `key` (`StrKey()` by default), values by
        `value` (JSON by default)."""
        return Variable(name, MAP, value or JsonCodec(), key or StrKey())

    def with_ttl(self, ttl: Ttl) -> "Variable":
        """The same variable with a time-to-live."""
        return Variable(self.name, self.kind, self.codec, self.key, ttl, self.schema_version)

    def with_schema_version(self, version: int) -> "Variable":
        """The same variable with layout version `version` (1 by default; values, list
        elements and map values, never map keys). Raise it when the layout changes:
        entries stored under another version go through `KeyedFunction.migrate_state`
        the first time a call reads them."""
        return Variable(self.name, self.kind, self.codec, self.key, self.ttl, version)


@dataclass(frozen=True)
class Timer:
    """A timer of a key: its expiry (epoch ms, event or processing time per the pipeline)
    and an optional name. A key holds at most one timer per (expiry, name); timers sort
    as the host orders them: by expiry, then unnamed before named, then by name's bytes."""

    expiry_ms: int
    name: Optional[str] = None

    def order(self) -> Tuple[int, int, bytes]:
        """The sort key of the host's (expiry, name) order."""
        return (self.expiry_ms, 0 if self.name is None else 1, (self.name or "").encode())

    def __lt__(self, other: "Timer") -> bool:
        return self.order() < other.order()


class KeyStateError(StateError):
    """The host refused a `KeyState` request; the request had no effect. `case` is the
    WIT case (such as `"too-many-timers"`) and `value` what it carries."""

    case = "refused"

    def __init__(self, what: str, why: str, value: Any) -> None:
        super().__init__(f"{what}: {why}")
        self.value = value


class UnknownVariable(KeyStateError):
    case = "unknown-variable"


class ValueTooLarge(KeyStateError):
    case = "value-too-large"


class TooManyEntries(KeyStateError):
    case = "too-many-entries"


class TooManyTimers(KeyStateError):
    case = "too-many-timers"


class TimeModeMismatch(KeyStateError):
    case = "time-mode-mismatch"


class NonPositiveTime(KeyStateError):
    case = "non-positive-time"


class TimerNameTooLong(KeyStateError):
    case = "timer-name-too-long"


class KeyTooLong(KeyStateError):
    case = "key-too-long"


def _refused(what: str, error: Any) -> KeyStateError:
    """The typed error for a WIT `state-error` (its class is named `StateError_<Case>`),
    with the Rust SDK's message."""
    case = type(error).__name__.rsplit("_", 1)[-1]
    value = getattr(error, "value", None)
    if case == "UnknownVariable":
        return UnknownVariable(what, f"no variable {value!r} of this kind is declared: add it to KeyedFunction.variables", value)
    if case == "ValueTooLarge":
        return ValueTooLarge(what, f"the value is over state_bytes_max ({value} bytes)", value)
    if case == "TooManyEntries":
        return TooManyEntries(what, f"over state_writes_per_call_max ({value}) entries in one call: change or read less per call", value)
    if case == "TooManyTimers":
        return TooManyTimers(what, f"the key holds timers_per_key_max ({value}) timers already", value)
    if case == "TimeModeMismatch":
        return TimeModeMismatch(what, "the pipeline has no timers: run it with --timeout event-time or processing-time", value)
    if case == "NonPositiveTime":
        return NonPositiveTime(what, f"a timer's expiry must be greater than zero, not {value}", value)
    if case == "TimerNameTooLong":
        return TimerNameTooLong(what, f"a timer name has at most 256 bytes, not {value}", value)
    if case == "KeyTooLong":
        return KeyTooLong(what, f"key, variable and map key take {value} bytes of store key: use shorter map keys", value)
    return KeyStateError(what, f"the host refused the request: {error!r}", value)


def _ask(what: str, request: Callable[[], Any]) -> Any:
    try:
        return request()
    except Err as error:
        raise _refused(what, error.value) from None


def _decode(what: str, codec: Codec, data: bytes) -> Any:
    try:
        return codec.decode(data)
    except Exception as error:  # noqa: BLE001 - any decoding failure is reported the same way
        raise PluginError(
            f"{what}: stored value does not decode ({type(error).__name__}: {error}): was it written with another type?"
        ) from None


class ValueState:
    """A value variable."""

    def __init__(self, handle: Any, variable: Variable) -> None:
        self._handle, self._name, self._codec = handle, variable.name, variable.codec

    def get(self) -> Any:
        """The value, or `None` if the variable has none."""
        data = _ask(self._name, lambda: self._handle.value_get(self._name))
        return None if data is None else _decode(self._name, self._codec, data)

    def set(self, value: Any) -> None:
        """Sets the value."""
        data = self._codec.encode(value)
        _ask(self._name, lambda: self._handle.value_set(self._name, data))

    def clear(self) -> None:
        """Clears the value."""
        _ask(self._name, lambda: self._handle.value_clear(self._name))


class ListState:
    """A list variable: elements in append order, each stored on its own."""

    def __init__(self, handle: Any, variable: Variable) -> None:
        self._handle, self._name, self._codec = handle, variable.name, variable.codec

    def append(self, value: Any) -> None:
        """Appends an element without reading the list."""
        data = self._codec.encode(value)
        _ask(self._name, lambda: self._handle.list_append(self._name, data))

    def get(self) -> List[Any]:
        """Every element, in append order."""
        items = _ask(self._name, lambda: self._handle.list_get(self._name))
        return [_decode(self._name, self._codec, item) for item in items]

    def len(self) -> int:
        """How many elements the list holds."""
        return _ask(self._name, lambda: self._handle.list_len(self._name))

    def is_empty(self) -> bool:
        """Whether the list is empty."""
        return self.len() == 0

    def clear(self) -> None:
        """Removes every element."""
        _ask(self._name, lambda: self._handle.list_clear(self._name))


class MapState:
    """A map variable: entries in key order, each stored on its own."""

    def __init__(self, handle: Any, variable: Variable) -> None:
        self._handle, self._name, self._codec = handle, variable.name, variable.codec
        self._key: MapKey = variable.key or StrKey()

    def get(self, key: Any) -> Any:
        """The value under `key`, or `None`."""
        k = self._key.encode(key)
        data = _ask(self._name, lambda: self._handle.map_get(self._name, k))
        return None if data is None else _decode(self._name, self._codec, data)

    def contains(self, key: Any) -> bool:
        """Whether there is an entry under `key` (also `key in map_state`)."""
        k = self._key.encode(key)
        return _ask(self._name, lambda: self._handle.map_contains(self._name, k))

    __contains__ = contains

    def put(self, key: Any, value: Any) -> None:
        """Sets the entry under `key`."""
        k, data = self._key.encode(key), self._codec.encode(value)
        _ask(self._name, lambda: self._handle.map_put(self._name, k, data))

    def remove(self, key: Any) -> None:
        """Removes the entry under `key`, if any."""
        k = self._key.encode(key)
        _ask(self._name, lambda: self._handle.map_remove(self._name, k))

    def keys(self) -> List[Any]:
        """The keys, in order."""
        return [self._decode_key(k) for k in _ask(self._name, lambda: self._handle.map_keys(self._name))]

    def entries(self) -> List[Tuple[Any, Any]]:
        """The entries, in key order."""
        entries = _ask(self._name, lambda: self._handle.map_entries(self._name))
        return [(self._decode_key(k), _decode(self._name, self._codec, v)) for k, v in entries]

    def _decode_key(self, data: bytes) -> Any:
        try:
            return self._key.decode(data)
        except Exception:  # noqa: BLE001 - any decoding failure is reported the same way
            raise PluginError(f"{self._name}: a stored map key does not decode: was it written with another key type?") from None


def _enum_name(value: Any, names: Sequence[str]) -> str:
    index = getattr(value, "value", value)
    return names[index] if isinstance(index, int) and 0 <= index < len(names) else str(value)


class KeyState:
    """A key's variables and timers during one call; only valid during the call."""

    def __init__(self, handle: Any, variables: Sequence[Variable]) -> None:
        self._handle = handle
        self._variables = {v.name: v for v in variables}

    def _declared(self, name: Any, kind: str) -> Variable:
        variable = name if isinstance(name, Variable) else self._variables.get(name)
        if variable is None or variable.kind != kind:
            raise UnknownVariable(
                str(getattr(name, "name", name)),
                f"no variable {getattr(name, 'name', name)!r} of this kind is declared: add it to KeyedFunction.variables",
                name,
            )
        return variable

    def value(self, name: Any) -> ValueState:
        """Value variable `name` (or a `Variable`), typed by its declaration."""
        return ValueState(self._handle, self._declared(name, VALUE))

    def list(self, name: Any) -> ListState:
        """List variable `name`."""
        return ListState(self._handle, self._declared(name, LIST))

    def map(self, name: Any) -> MapState:
        """Map variable `name`."""
        return MapState(self._handle, self._declared(name, MAP))

    def register_timer(self, expiry_ms: int, name: Optional[str] = None) -> None:
        """Registers a timer (see the module doc for when it fires). Registering one the
        key has already changes nothing."""
        expiry_ms = saturating_i64(expiry_ms)
        _ask("register-timer", lambda: self._handle.register_timer(expiry_ms, name))

    def delete_timer(self, expiry_ms: int, name: Optional[str] = None) -> None:
        """Deletes the timer (expiry, name) if the key has it."""
        expiry_ms = saturating_i64(expiry_ms)
        _ask("delete-timer", lambda: self._handle.delete_timer(expiry_ms, name))

    def timers(self) -> List[Timer]:
        """The key's timers in (expiry, name) order; the one being handled is not among them."""
        return [Timer(t.expiry_ms, t.name) for t in _ask("list-timers", self._handle.list_timers)]

    def time_mode(self) -> str:
        """The pipeline's time mode: `"none"`, `"processing-time"` or `"event-time"`."""
        return _enum_name(self._handle.time_mode(), TIME_MODES)

    def watermark_ms(self) -> int:
        """The batch's watermark (epoch milliseconds), constant within the batch."""
        return self._handle.current_watermark_ms()

    def processing_time_ms(self) -> int:
        """The batch's processing time (epoch milliseconds), constant within the batch."""
        return self._handle.current_processing_time_ms()


class KeyedFunction:
    """The base class of a 0.2 plugin. Set the class attributes, override `init`,
    `process` and `handle_expired_timer`.

    - `name`, `version`, `state_schema_version`: what `info` reports;
    - `variables`: the `Variable`s the plugin declares (the same at every instantiation);
    - `decode_event(obj)`, `event_name`: as for the 0.1 `StateFunction`.
    """

    name = "unnamed"
    version = "0.0.0"
    state_schema_version = 1
    variables: Sequence[Variable] = ()
    event_name = "event"

    @staticmethod
    def decode_event(obj: Any) -> Any:
        return obj

    @classmethod
    def init(cls, params: Params) -> "KeyedFunction":
        params.reject_unknown([])
        return cls()

    def process(self, key: str, events: List[Event], state: KeyState) -> List[Any]:
        raise NotImplementedError

    def handle_expired_timer(self, key: str, timer: Timer, state: KeyState) -> List[Any]:
        raise NotImplementedError

    def handle_initial_state(self, key: str, state_json: Any, state: KeyState) -> None:
        """Writes a key's initial state from one line of the host's `--initial-state FILE`
        (`state_json` is its parsed `state` value). The default refuses."""
        raise PluginError(
            "this plugin has no initial-state handler: implement KeyedFunction.handle_initial_state, "
            "or run without --initial-state"
        )

    def migrate_state(self, variable: str, part: str, from_version: int, data: bytes) -> bytes:
        """Converts bytes `variable` stored under its older layout `from_version` (`part`:
        `"value"`, `"list-element"` or `"map-value"`) into the layout of its declared
        `schema_version`. The host calls it, on an instance of its own, the first time a
        call reads such an entry, and writes the result back with the call's changes; it
        must depend on its arguments only. The default refuses."""
        raise PluginError(
            f"variable {variable!r} holds entries of layout {from_version}, and this plugin converts none: "
            "implement KeyedFunction.migrate_state"
        )

    def migrate_declared(self, variable: str, data: bytes, old: Codec, convert: Callable[[Any], Any]) -> bytes:
        """`data` decoded by `old`, passed through `convert`, and encoded by the codec
        `variable` is declared with: the body of a typical `migrate_state`."""
        declared = {v.name: v for v in type(self).variables}.get(variable)
        if declared is None:
            raise PluginError(f"variable {variable!r} is not declared: nothing to convert it to")
        return declared.codec.encode(convert(old.decode(data)))

    def render_state(self, variable: str, part: str, data: bytes) -> Optional[str]:
        """Renders stored bytes of `variable` (`part`: `"value"`, `"list-element"`,
        `"map-key"` or `"map-value"`) as JSON text for `groupstate state`; `None` (the
        default) shows them in hex. `render_declared` renders through the declared codecs."""
        return None

    def render_declared(self, variable: str, part: str, data: bytes) -> Optional[str]:
        """`data` decoded by the codec `variable` was declared with, as JSON; `None` when
        it does not decode or is not JSON-serializable."""
        declared = {v.name: v for v in type(self).variables}.get(variable)
        if declared is None:
            return None
        try:
            if part == "map-key":
                value = (declared.key or StrKey()).decode(data)
                if isinstance(value, bytes):
                    return None
            else:
                value = declared.codec.decode(data)
            return _to_json(value)
        except Exception:  # noqa: BLE001 - the host shows hex instead
            return None


def _check_variables(variables: Sequence[Variable]) -> None:
    seen = set()
    for v in variables:
        if v.kind not in (VALUE, LIST, MAP):
            raise PluginError(f"variable {v.name!r} has kind {v.kind!r}: use Variable.value, Variable.list or Variable.map")
        if v.name in seen:
            raise PluginError(f"variable {v.name!r} is declared twice; give each variable its own name")
        if v.ttl is not None and (v.ttl.clock not in ("processing-time", "event-time") or v.ttl.duration_ms <= 0):
            raise PluginError(f"variable {v.name!r}: a TTL needs a duration over 0 ms and clock processing-time or event-time")
        if not isinstance(v.schema_version, int) or not 1 <= v.schema_version < 2**32:
            raise PluginError(f"variable {v.name!r}: schema_version {v.schema_version!r} must be a whole number from 1")
        seen.add(v.name)


def _wit_variable(v: Variable) -> Any:
    if _wit_types is None:
        return (v.name, v.kind, None if v.ttl is None else (v.ttl.duration_ms, v.ttl.clock), v.schema_version)
    kind = {VALUE: _wit_types.VariableKind.VALUE, LIST: _wit_types.VariableKind.LIST, MAP: _wit_types.VariableKind.MAP}[v.kind]
    ttl = None
    if v.ttl is not None:
        clock = _wit_types.TtlClock.EVENT_TIME if v.ttl.clock == "event-time" else _wit_types.TtlClock.PROCESSING_TIME
        ttl = _wit_types.Ttl(v.ttl.duration_ms, clock)
    return _wit_types.Variable(v.name, kind, ttl, v.schema_version)


def run_process(instance: KeyedFunction, key: str, events: Sequence[Any], handle: Any) -> List[str]:
    """`process` as the host calls it: `events` with `event_time_ms` and `payload` (JSON
    text); returns the outputs as JSON text. Raises `Err(message)` on failure."""
    cls = type(instance)
    try:
        outputs = instance.process(key, _decode_events(cls, events), KeyState(handle, cls.variables))
        return [_to_json(output) for output in outputs]
    except Exception as error:  # noqa: BLE001 - every failure becomes the call's error
        raise Err(_message(error)) from None


def run_expired_timer(instance: KeyedFunction, key: str, timer: Any, handle: Any) -> List[str]:
    """`handle-expired-timer` as the host calls it."""
    cls = type(instance)
    try:
        fired = Timer(timer.expiry_ms, timer.name)
        outputs = instance.handle_expired_timer(key, fired, KeyState(handle, cls.variables))
        return [_to_json(output) for output in outputs]
    except Exception as error:  # noqa: BLE001 - every failure becomes the call's error
        raise Err(_message(error)) from None


def run_initial_state(instance: KeyedFunction, key: str, state_json: str, handle: Any) -> None:
    """`handle-initial-state` as the host calls it."""
    cls = type(instance)
    try:
        try:
            value = json.loads(state_json)
        except ValueError as error:
            raise PluginError(f"the initial state is not valid JSON ({error}): the host sends the line's `state` value") from None
        instance.handle_initial_state(key, value, KeyState(handle, cls.variables))
    except Exception as error:  # noqa: BLE001 - every failure becomes the call's error
        raise Err(_message(error)) from None


class _Slot:
    """The instance `init` made; one per component instance (a module global)."""

    instance: Optional[KeyedFunction] = None


_NO_INIT = "was called before init succeeded: the host must call init on every new instance"


def export(cls: type) -> type:
    """The `WitWorld` class for componentize-py: `WitWorld = export(MyPlugin)`."""
    base = wit_world.WitWorld if wit_world is not None else object
    slot = _Slot()

    def instance(export_name: str) -> KeyedFunction:
        if slot.instance is None:
            raise Err(f"{export_name} {_NO_INIT}")
        return slot.instance

    class WitWorld(base):  # type: ignore[misc, valid-type]
        def info(self):
            if _wit_types is None:
                return (cls.name, cls.version, cls.state_schema_version)
            return _wit_types.PluginInfo(cls.name, cls.version, cls.state_schema_version)

        def init(self, params: List[Tuple[str, str]]) -> List[Any]:
            try:
                _check_variables(cls.variables)
                slot.instance = cls.init(Params(params))
            except Exception as error:  # noqa: BLE001 - every failure becomes the call's error
                slot.instance = None
                raise Err(_message(error)) from None
            return [_wit_variable(v) for v in cls.variables]

        def process(self, key: str, events: List[Any], state: Any) -> List[str]:
            return run_process(instance("process"), key, events, state)

        def handle_expired_timer(self, key: str, timer: Any, state: Any) -> List[str]:
            return run_expired_timer(instance("handle-expired-timer"), key, timer, state)

        def handle_initial_state(self, key: str, state_json: str, state: Any) -> None:
            run_initial_state(instance("handle-initial-state"), key, state_json, state)

        def migrate_state(self, variable: str, part: Any, from_version: int, bytes: bytes) -> bytes:  # noqa: A002
            try:
                converted = instance("migrate-state").migrate_state(
                    variable, _enum_name(part, STATE_PARTS), from_version, bytes
                )
                if not isinstance(converted, (builtins.bytes, bytearray)):
                    raise PluginError(f"migrate_state returned {type(converted).__name__}, not bytes")
                return builtins.bytes(converted)
            except Err:
                raise
            except Exception as error:  # noqa: BLE001 - every failure becomes the call's error
                raise Err(_message(error)) from None

        def render_state(self, variable: str, part: Any, bytes: bytes) -> Optional[str]:  # noqa: A002 - the WIT's name
            if slot.instance is None:
                return None
            try:
                return slot.instance.render_state(variable, _enum_name(part, STATE_PARTS), bytes)
            except Exception:  # noqa: BLE001 - the host shows hex instead
                return None

    return WitWorld
