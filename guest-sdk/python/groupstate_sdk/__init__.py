"""Python helpers for groupstate plugins: what the Rust `groupstate-sdk` crate is for Rust.

componentize-py turns the WIT world `state-function` into the module `wit_world`, whose
raw bindings pass state as bytes, report failures as `componentize_py_types.Err`
carrying a WIT variant, and give `s64` values no range check. This module wraps them:

- `StateFunction`, the base class of a plugin: `info`, `init(params)`,
  `process(key, events, state)` and optionally `migrate_state(from_version, data)`;
- `GroupState`, the typed state handle: `get()` returns the plugin's state object (or
  `None`), `update(value)` stores one; values are encoded with a `Codec` (JSON of a
  dataclass by default, `JsonCodec`), opaque bytes to the host;
- `Params`, typed parameter getters that refuse unknown names;
- `PluginError` and its subclasses: raise one to fail the call with its message (the
  host then keeps the key's state as before the call);
- `export(cls)`, which makes the `WitWorld` class componentize-py looks for;
- `wit_path()`, the package's copy of the WIT contract, for componentize-py's
  `--wit-path` (also `python3 -m groupstate_sdk wit-path`); `wit_path("0.2")` that of
  the 0.2 state API, whose layer is `groupstate_sdk.v2` (named value, list and map
  variables, many timers per key), with `groupstate_sdk.testing` to run it natively.

Install it with pip from a checkout (`pip install --target DIR <checkout>/guest-sdk/python`)
and give componentize-py that folder with `-p`.

Any other exception escaping `process` fails the call too, its message prefixed by the
exception's type name.
"""

import dataclasses
import json
import os
import re
import typing
from typing import Any, Callable, Generic, Iterable, List, Optional, Sequence, Tuple, TypeVar

try:  # Inside the component: the bindings componentize-py generates.
    import wit_world
    from componentize_py_types import Err
    from wit_world.imports import types as _wit_types
except ImportError:  # Natively (tests, type checkers): no bindings, same shapes.
    wit_world = None
    _wit_types = None

    class Err(Exception):  # type: ignore[no-redef]
        """What the bindings raise for a WIT `err`: `value` is the error."""

        def __init__(self, value: Any) -> None:
            super().__init__(value)
            self.value = value


S = TypeVar("S")
E = TypeVar("E")

I64_MIN = -(2**63)
I64_MAX = 2**63 - 1


def saturating_i64(value: int) -> int:
    """`value` clamped to the `s64` range, as Rust's saturating arithmetic does."""
    return max(I64_MIN, min(I64_MAX, value))


class PluginError(Exception):
    """Fails the `process` (or `init`, `migrate_state`) call with this message."""

    @property
    def message(self) -> str:
        return str(self)


class ParamError(PluginError):
    """A parameter was missing, unknown or did not parse; the message names it."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"parameter `{name}` {problem}")
        self.name = name


class StateError(PluginError):
    """The host refused a `GroupState` request; the request had no effect."""


class TimeoutKindMismatch(StateError):
    """The timeout setter does not match the pipeline's timeout kind (`pipeline_kind`)."""

    def __init__(self, pipeline_kind: str) -> None:
        super().__init__(
            f"the timeout setter does not match the pipeline's timeout kind `{pipeline_kind}`: "
            "use set_timeout_duration with processing-time, set_timeout_timestamp with "
            "event-time, neither with none"
        )
        self.pipeline_kind = pipeline_kind


class NonPositiveTimeout(StateError):
    """A timeout duration or timestamp must be greater than zero."""

    def __init__(self, value_ms: int) -> None:
        super().__init__(f"a timeout must be greater than 0 ms, got {value_ms}: pass a positive duration or timestamp")
        self.value_ms = value_ms


class TimestampBeforeWatermark(StateError):
    """An event-time timeout must not be earlier than the current watermark."""

    def __init__(self, timestamp_ms: int, watermark_ms: int) -> None:
        super().__init__(
            f"timeout timestamp {timestamp_ms} is before the current watermark {watermark_ms}: "
            "pick a timestamp at or after the watermark"
        )
        self.timestamp_ms = timestamp_ms
        self.watermark_ms = watermark_ms


class StateTooLarge(StateError):
    """The encoded state is larger than the pipeline's `state_bytes_max`."""

    def __init__(self, state_bytes: int, state_bytes_max: int) -> None:
        super().__init__(
            f"state value of {state_bytes} bytes is larger than the pipeline's state_bytes_max of "
            f"{state_bytes_max}: keep less per key, or raise the limit when running the host"
        )
        self.state_bytes = state_bytes
        self.state_bytes_max = state_bytes_max


_TIMEOUT_KINDS = ("none", "processing-time", "event-time")


def _kind_name(kind: Any) -> str:
    """A WIT `timeout-kind` (an enum member, or its index) as the host spells it."""
    index = getattr(kind, "value", kind)
    return _TIMEOUT_KINDS[index] if isinstance(index, int) and 0 <= index < 3 else str(kind)


def _state_error(error: Any, given: int = 0) -> StateError:
    """The typed error for a WIT `state-error` value; `given` is what the plugin passed."""
    case = type(error).__name__.rsplit("_", 1)[-1]
    value = getattr(error, "value", None)
    if case == "TimeoutKindMismatch":
        return TimeoutKindMismatch(_kind_name(value))
    if case == "NonPositiveTimeout":
        return NonPositiveTimeout(value)
    if case == "TimestampBeforeWatermark":
        return TimestampBeforeWatermark(given, value)
    if case == "StateTooLarge":
        return StateTooLarge(given, value)
    return StateError(f"the host refused the request: {error!r}")


class Codec(Generic[S]):
    """Turns state values into bytes and back; the host stores the bytes as they are."""

    def encode(self, value: S) -> bytes:
        raise NotImplementedError

    def decode(self, data: bytes) -> S:
        raise NotImplementedError


def wit_path(version: str = "0.1") -> str:
    """The folder of the WIT contract this package was made for (its own copy): `"0.1"`
    (world `state-function`) or `"0.2"` (world `keyed-state-function`, see `v2`)."""
    base = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wit")
    if version == "0.1":
        return base
    if version == "0.2":
        return os.path.join(base, "v0.2")
    raise ValueError(f"no WIT version {version!r} in this package: use 0.1 or 0.2")


def _from_plain(hint: Any, plain: Any) -> Any:
    """`plain` (parsed JSON) as the type `hint`: dataclasses rebuilt field by field, at
    any depth, also inside `List`, `Tuple`, `Dict` and `Optional`; other values as is."""
    if plain is None:
        return None
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        hints = typing.get_type_hints(hint)
        fields = {f.name: _from_plain(hints.get(f.name, Any), plain[f.name]) for f in dataclasses.fields(hint) if f.name in plain}
        return hint(**fields)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (list, List, Sequence) and args:
        return [_from_plain(args[0], item) for item in plain]
    if origin is tuple and args:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_from_plain(args[0], item) for item in plain)
        return tuple(_from_plain(arg, item) for arg, item in zip(args, plain))
    if origin is dict and len(args) == 2:
        return {key: _from_plain(args[1], item) for key, item in plain.items()}
    if origin is typing.Union:
        # Optional[X] and other unions: the first dataclass-bearing member that fits.
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _from_plain(arg, plain)
            except (TypeError, KeyError, AttributeError):
                continue
    return plain


class JsonCodec(Codec[S]):
    """State as compact JSON: a dataclass as an object of its fields (nested dataclasses,
    and lists, tuples, dicts and optionals of them, included), anything else as is."""

    def __init__(self, state_type: Optional[Callable[..., S]] = None) -> None:
        self._type = state_type

    def encode(self, value: S) -> bytes:
        plain = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value  # type: ignore[arg-type]
        return json.dumps(plain, separators=(",", ":")).encode()

    def decode(self, data: bytes) -> S:
        plain = json.loads(data)
        if self._type is None:
            return plain
        return _from_plain(self._type, plain)


class GroupState(Generic[S]):
    """The state of one key during one call (Spark's `GroupState`), typed through a codec.

    Wraps the WIT `group-state` handle, which is only valid during the call. Staged by the
    host: nothing is applied unless the call returns normally.
    """

    def __init__(self, handle: Any, codec: Codec[S]) -> None:
        self._handle = handle
        self._codec = codec

    def exists(self) -> bool:
        """Whether the key has a state value (as staged so far in this call)."""
        return self._handle.exists()

    def get(self) -> Optional[S]:
        """The key's state value, or `None`; a `PluginError` if it cannot be decoded."""
        data = self._handle.get()
        if data is None:
            return None
        try:
            return self._codec.decode(data)
        except Exception as error:  # noqa: BLE001 - any decoding failure is reported the same way
            raise PluginError(
                f"cannot decode the stored state ({type(error).__name__}: {error}): raise the "
                "plugin's state_schema_version and implement migrate_state, or start with empty state"
            ) from error

    def update(self, value: S) -> None:
        """Replaces the key's state value; `StateTooLarge` if it exceeds the pipeline's limit."""
        data = self._codec.encode(value)
        try:
            self._handle.update(data)
        except Err as error:
            raise _state_error(error.value, len(data)) from None

    def remove(self) -> None:
        """Removes the key's state value."""
        self._handle.remove()

    def has_timed_out(self) -> bool:
        """True when this call was made because the key's timeout expired (it has no events)."""
        return self._handle.has_timed_out()

    def set_timeout_duration(self, duration_ms: int) -> None:
        """A processing-time timeout `duration_ms` after the batch's processing time."""
        duration_ms = saturating_i64(duration_ms)
        try:
            self._handle.set_timeout_duration(duration_ms)
        except Err as error:
            raise _state_error(error.value, duration_ms) from None

    def set_timeout_timestamp(self, timestamp_ms: int) -> None:
        """An event-time timeout at `timestamp_ms` (epoch ms, at or after the watermark)."""
        timestamp_ms = saturating_i64(timestamp_ms)
        try:
            self._handle.set_timeout_timestamp(timestamp_ms)
        except Err as error:
            raise _state_error(error.value, timestamp_ms) from None

    def timeout_kind(self) -> str:
        """The pipeline's timeout kind: `none`, `processing-time` or `event-time`."""
        return _kind_name(self._handle.timeout_kind())

    def current_watermark_ms(self) -> int:
        """The batch's watermark in epoch milliseconds (constant within a batch)."""
        return self._handle.current_watermark_ms()

    def current_processing_time_ms(self) -> int:
        """The batch's processing time in epoch milliseconds (constant within a batch)."""
        return self._handle.current_processing_time_ms()


_INT = re.compile(r"[+-]?[0-9]+")
_INT_RANGES = {"i64": (I64_MIN, I64_MAX), "i32": (-(2**31), 2**31 - 1), "u32": (0, 2**32 - 1), "u64": (0, 2**64 - 1)}


class Params:
    """The pipeline's `--param name=value` pairs given to `init`; the last of a name wins."""

    def __init__(self, pairs: Iterable[Tuple[str, str]]) -> None:
        self._pairs = list(pairs)

    def get_str(self, name: str) -> Optional[str]:
        """The raw text of parameter `name`, or `None` when it was not given."""
        for given, value in reversed(self._pairs):
            if given == name:
                return value
        return None

    def get_int(self, name: str, default: int, ty: str = "i64") -> int:
        """Parameter `name` as an integer of Rust type `ty` (i64, i32, u32, u64), or `default`."""
        text = self.get_str(name)
        if text is None:
            return default
        low, high = _INT_RANGES[ty]
        if text == "":
            problem = "cannot parse integer from empty string"
        elif not _INT.fullmatch(text) or (ty.startswith("u") and text.startswith("-")):
            problem = "invalid digit found in string"
        elif int(text) > high:
            problem = "number too large to fit in target type"
        elif int(text) < low:
            problem = "number too small to fit in target type"
        else:
            return int(text)
        raise ParamError(name, f"is `{text}`, not a valid {ty} ({problem}): pass --param {name}=<{ty}>")

    def reject_unknown(self, known: Sequence[str]) -> None:
        """Fails on the first parameter whose name is not in `known` (a typo, say)."""
        for name, _ in self._pairs:
            if name not in known:
                raise ParamError(
                    name,
                    f"is not a parameter of this plugin (it knows {', '.join(known)}): remove it or fix its name",
                )

    def __iter__(self):
        return iter(self._pairs)


class Event(Generic[E]):
    """One event of a key's group: its event time (or `None`) and its decoded payload."""

    __slots__ = ("time_ms", "value")

    def __init__(self, time_ms: Optional[int], value: E) -> None:
        self.time_ms = time_ms
        self.value = value


class StateFunction(Generic[S, E]):
    """The base class of a plugin. Set the class attributes, override `init` and `process`.

    - `name`, `version`, `state_schema_version`: what `info` reports;
    - `codec`: how state values are stored (`JsonCodec(MyStateDataclass)`);
    - `decode_event(obj)`: turns one parsed JSON payload into the plugin's event value; it
      raises `ValueError`, `TypeError` or `KeyError` on a bad event (the call then fails
      with "event i of n: payload is not a valid ...").
    """

    name = "unnamed"
    version = "0.0.0"
    state_schema_version = 1
    codec: Codec = JsonCodec()
    event_name = "event"

    @staticmethod
    def decode_event(obj: Any) -> Any:
        return obj

    @classmethod
    def init(cls, params: Params) -> "StateFunction":
        params.reject_unknown([])
        return cls()

    def process(self, key: str, events: List[Event[E]], state: GroupState[S]) -> List[Any]:
        raise NotImplementedError

    @classmethod
    def migrate_state(cls, from_version: int, data: bytes) -> S:
        raise PluginError(
            f"no migration from state schema version {from_version} to {cls.state_schema_version}: "
            "implement StateFunction.migrate_state, or start the pipeline with empty state"
        )


def _message(error: Exception) -> str:
    if isinstance(error, PluginError):
        return str(error)
    return f"{type(error).__name__}: {error}"


def _to_json(value: Any) -> str:
    plain = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return json.dumps(plain, separators=(",", ":"), ensure_ascii=False)


def _decode_events(cls: type, events: Sequence[Any]) -> List[Event]:
    decoded = []
    count = len(events)
    for index, event in enumerate(events):
        try:
            value = cls.decode_event(json.loads(event.payload))
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            why = str(error) if type(error) is ValueError else f"{type(error).__name__}: {error}"
            raise PluginError(
                f"event {index} of {count}: payload is not a valid {cls.event_name} ({why}): "
                "fix the input, or make the plugin's decode_event accept it"
            ) from None
        decoded.append(Event(event.event_time_ms, value))
    return decoded


class _Slot:
    """The instance `init` made; one per component instance (a module global)."""

    instance: Optional[StateFunction] = None


def export(cls: type) -> type:
    """The `WitWorld` class for componentize-py: `WitWorld = export(MyPlugin)`."""
    base = wit_world.WitWorld if wit_world is not None else object
    slot = _Slot()

    class WitWorld(base):  # type: ignore[misc, valid-type]
        def info(self):
            if _wit_types is None:
                return (cls.name, cls.version, cls.state_schema_version)
            return _wit_types.PluginInfo(cls.name, cls.version, cls.state_schema_version)

        def init(self, params: List[Tuple[str, str]]) -> None:
            try:
                slot.instance = cls.init(Params(params))
            except Exception as error:  # noqa: BLE001 - every failure becomes the call's error
                slot.instance = None
                raise Err(_message(error)) from None

        def process(self, key: str, events: List[Any], state: Any) -> List[str]:
            instance = slot.instance
            if instance is None:
                raise Err("process was called before init succeeded: the host must call init on every new instance")
            try:
                outputs = instance.process(key, _decode_events(cls, events), GroupState(state, cls.codec))
                return [_to_json(output) for output in outputs]
            except Exception as error:  # noqa: BLE001 - every failure becomes the call's error
                raise Err(_message(error)) from None

        def migrate_state(self, from_version: int, value: bytes) -> bytes:
            if from_version == cls.state_schema_version:
                return value
            try:
                return cls.codec.encode(cls.migrate_state(from_version, value))
            except Exception as error:  # noqa: BLE001 - every failure becomes the call's error
                raise Err(_message(error)) from None

    return WitWorld
