// The 0.2 state API (`groupstate:plugin@0.2.0`, world `keyed-state-function`) in
// JavaScript: what `groupstate_sdk::v2` is for Rust. Named state variables per key —
// value, list and map state — and many timers per key, after Spark's
// `transformWithState`.
//
// - `exportKeyedPlugin(Plugin)` makes the world's exports (`info`, `init`, `process`,
//   `handleExpiredTimer`, `handleInitialState`, `migrateState`, `renderState`) from a
//   plugin class with
//   `static info`, `static variables` (its `Variable`s), `static init(params)`,
//   `static decodeEvent(json)`, and the methods `process(key, events, state)` and
//   `handleExpiredTimer(key, timer, state)`; optionally `handleInitialState(key,
//   stateJson, state)` (default: refuses, saying the plugin has none),
//   `migrateState(variable, part, fromVersion, bytes)` (default: refuses; see
//   `migrateDeclared`) and `renderState(variable, part, bytes)` (default: `undefined`,
//   shown in hex);
// - `Variable.value(name, codec)`, `Variable.list(name, codec)`, `Variable.map(name,
//   { key, value })`, optionally `.withTtl(Ttl.eventTime(ms))` and, once the layout of
//   its values changes, `.withSchemaVersion(n)`; values are encoded by a
//   codec (`JsonCodec` by default), map keys by a key codec whose bytes keep the keys'
//   order (`StrKey`, `IntKey`, `U64Key`, `BytesKey`: the Rust SDK's bytes);
// - `KeyState`, the handle of one call: `value(name)`, `list(name)`, `map(name)`,
//   `registerTimer(expiryMs, name)`, `deleteTimer(expiryMs, name)`, `timers()`,
//   `timeMode()`, `watermarkMs()`, `processingTimeMs()`; times are numbers here
//   (BigInt at the WIT boundary);
// - `KeyStateError` and its subclasses, thrown when the host refuses a request (the
//   request had no effect).
//
// This module imports nothing from the host (so it also loads in Node for tests);
// logging is `v2log.js` (package export `groupstate-sdk/v2/log`). Everything a call changes is applied only when it
// returns; a thrown error fails the call and changes nothing (the timer of a failed
// timer call is gone all the same).

import { JsonCodec, Params, PluginError, StateError, decodeEvents, message, saturatingI64 } from './common.js';

export { JsonCodec, Params, PluginError, StateError, saturatingI64 };
export { ParamError } from './common.js';

const encoder = new TextEncoder();
const decoder = new TextDecoder('utf-8', { fatal: true });
const SIGN = 2n ** 63n;

/** `str` map keys as UTF-8 (the Rust SDK's `String`). */
export class StrKey {
  encode(key) {
    return encoder.encode(key);
  }
  decode(bytes) {
    return decoder.decode(bytes);
  }
}

/** `Uint8Array` map keys as they are (the Rust SDK's `Vec<u8>`). */
export class BytesKey {
  encode(key) {
    return Uint8Array.from(key);
  }
  decode(bytes) {
    return Uint8Array.from(bytes);
  }
}

function word(value, low, high, what) {
  const big = BigInt(value);
  if (big < low || big > high) throw new PluginError(`map key ${value} is outside the ${what} range`);
  return big;
}

function be64(big) {
  const bytes = new Uint8Array(8);
  new DataView(bytes.buffer).setBigUint64(0, big);
  return bytes;
}

function readBe64(bytes) {
  if (bytes.length !== 8) throw new PluginError(`a map key of ${bytes.length} bytes is not 8`);
  return new DataView(Uint8Array.from(bytes).buffer).getBigUint64(0);
}

/** Integer map keys in the `s64` range (numbers or BigInts; decoded as numbers when
 * safe, BigInts otherwise), 8 bytes big-endian with the sign bit flipped so negative
 * keys sort first: the Rust SDK's `i64` bytes. */
export class IntKey {
  encode(key) {
    return be64(word(key, -SIGN, SIGN - 1n, 's64') + SIGN);
  }
  decode(bytes) {
    const big = readBe64(bytes) - SIGN;
    return Number.isSafeInteger(Number(big)) ? Number(big) : big;
  }
}

/** Integer map keys from 0 to 2^64 - 1, 8 bytes big-endian (the Rust SDK's `u64`). */
export class U64Key {
  encode(key) {
    return be64(word(key, 0n, 2n ** 64n - 1n, 'u64'));
  }
  decode(bytes) {
    const big = readBe64(bytes);
    return Number.isSafeInteger(Number(big)) ? Number(big) : big;
  }
}

/** A time-to-live: each value, list element or map entry expires `durationMs` after it
 * was last written, on `clock` (`'processing-time'` or `'event-time'`). */
export class Ttl {
  constructor(durationMs, clock) {
    this.durationMs = durationMs;
    this.clock = clock;
  }
  static processingTime(durationMs) {
    return new Ttl(durationMs, 'processing-time');
  }
  static eventTime(durationMs) {
    return new Ttl(durationMs, 'event-time');
  }
}

/** A state variable a plugin declares (`static variables`): 1 to 64 ASCII letters,
 * digits, `_`, `-` or `.`, unique among the plugin's. */
export class Variable {
  constructor(name, kind, codec, key, ttl, schemaVersion = 1) {
    Object.assign(this, { name, kind, codec: codec || new JsonCodec(), key, ttl, schemaVersion });
  }
  /** A value variable, encoded by `codec` (JSON by default). */
  static value(name, codec) {
    return new Variable(name, 'value', codec);
  }
  /** A list variable, each element encoded by `codec`. */
  static list(name, codec) {
    return new Variable(name, 'list', codec);
  }
  /** A map variable: keys by `key` (`new StrKey()` by default), values by `value`. */
  static map(name, { key, value } = {}) {
    return new Variable(name, 'map', value, key || new StrKey());
  }
  /** The same variable with a time-to-live. */
  withTtl(ttl) {
    return new Variable(this.name, this.kind, this.codec, this.key, ttl, this.schemaVersion);
  }
  /** The same variable with layout version `version` (1 by default; values, list
   * elements and map values, never map keys). Raise it when the layout changes: entries
   * stored under another version go through the plugin's `migrateState` the first time
   * a call reads them. */
  withSchemaVersion(version) {
    return new Variable(this.name, this.kind, this.codec, this.key, this.ttl, version);
  }
}

/** The host refused a `KeyState` request; the request had no effect. `kase` is the WIT
 * case (such as `'too-many-timers'`), `value` what it carries. */
export class KeyStateError extends StateError {
  constructor(what, why, kase, value) {
    super(`${what}: ${why}`);
    this.kase = kase;
    this.value = value;
  }
}
export class UnknownVariable extends KeyStateError {}
export class ValueTooLarge extends KeyStateError {}
export class TooManyEntries extends KeyStateError {}
export class TooManyTimers extends KeyStateError {}
export class TimeModeMismatch extends KeyStateError {}
export class NonPositiveTime extends KeyStateError {}
export class TimerNameTooLong extends KeyStateError {}
export class KeyTooLong extends KeyStateError {}

const REFUSALS = {
  'unknown-variable': [UnknownVariable, (v) => `no variable ${JSON.stringify(v)} of this kind is declared: add it to static variables`],
  'value-too-large': [ValueTooLarge, (v) => `the value is over state_bytes_max (${v} bytes)`],
  'too-many-entries': [TooManyEntries, (v) => `over state_writes_per_call_max (${v}) entries in one call: change or read less per call`],
  'too-many-timers': [TooManyTimers, (v) => `the key holds timers_per_key_max (${v}) timers already`],
  'time-mode-mismatch': [TimeModeMismatch, () => 'the pipeline has no timers: run it with --timeout event-time or processing-time'],
  'non-positive-time': [NonPositiveTime, (v) => `a timer's expiry must be greater than zero, not ${v}`],
  'timer-name-too-long': [TimerNameTooLong, (v) => `a timer name has at most 256 bytes, not ${v}`],
  'key-too-long': [KeyTooLong, (v) => `key, variable and map key take ${v} bytes of store key: use shorter map keys`],
};

/** The typed error for a WIT `state-error` thrown by the bindings (its `payload`). */
function refused(what, thrown) {
  const error = thrown && thrown.payload !== undefined ? thrown.payload : thrown;
  const entry = error && REFUSALS[error.tag];
  if (!entry) return new KeyStateError(what, `the host refused the request: ${String(thrown)}`, 'refused', error);
  const value = typeof error.val === 'bigint' ? Number(error.val) : error.val;
  return new entry[0](what, entry[1](value), error.tag, value);
}

function ask(what, request) {
  try {
    return request();
  } catch (error) {
    throw refused(what, error);
  }
}

function decodeWith(what, codec, bytes) {
  try {
    return codec.decode(bytes);
  } catch (error) {
    throw new PluginError(`${what}: stored value does not decode (${error}): was it written with another type?`);
  }
}

/** A value variable. */
export class ValueState {
  constructor(handle, variable) {
    Object.assign(this, { handle, name: variable.name, codec: variable.codec });
  }
  /** The value, or `undefined`. */
  get() {
    const bytes = ask(this.name, () => this.handle.valueGet(this.name));
    return bytes === undefined || bytes === null ? undefined : decodeWith(this.name, this.codec, bytes);
  }
  /** Sets the value. */
  set(value) {
    const bytes = this.codec.encode(value);
    ask(this.name, () => this.handle.valueSet(this.name, bytes));
  }
  /** Clears the value. */
  clear() {
    ask(this.name, () => this.handle.valueClear(this.name));
  }
}

/** A list variable: elements in append order, each stored on its own. */
export class ListState {
  constructor(handle, variable) {
    Object.assign(this, { handle, name: variable.name, codec: variable.codec });
  }
  /** Appends an element without reading the list. */
  append(value) {
    const bytes = this.codec.encode(value);
    ask(this.name, () => this.handle.listAppend(this.name, bytes));
  }
  /** Every element, in append order. */
  get() {
    return ask(this.name, () => this.handle.listGet(this.name)).map((b) => decodeWith(this.name, this.codec, b));
  }
  /** How many elements the list holds (a number). */
  len() {
    return Number(ask(this.name, () => this.handle.listLen(this.name)));
  }
  /** Whether the list is empty. */
  isEmpty() {
    return this.len() === 0;
  }
  /** Removes every element. */
  clear() {
    ask(this.name, () => this.handle.listClear(this.name));
  }
}

/** A map variable: entries in key order, each stored on its own. */
export class MapState {
  constructor(handle, variable) {
    Object.assign(this, { handle, name: variable.name, codec: variable.codec, key: variable.key || new StrKey() });
  }
  /** The value under `key`, or `undefined`. */
  get(key) {
    const k = this.key.encode(key);
    const bytes = ask(this.name, () => this.handle.mapGet(this.name, k));
    return bytes === undefined || bytes === null ? undefined : decodeWith(this.name, this.codec, bytes);
  }
  /** Whether there is an entry under `key`. */
  has(key) {
    const k = this.key.encode(key);
    return ask(this.name, () => this.handle.mapContains(this.name, k));
  }
  /** Sets the entry under `key`. */
  put(key, value) {
    const k = this.key.encode(key);
    const bytes = this.codec.encode(value);
    ask(this.name, () => this.handle.mapPut(this.name, k, bytes));
  }
  /** Removes the entry under `key`, if any. */
  remove(key) {
    const k = this.key.encode(key);
    ask(this.name, () => this.handle.mapRemove(this.name, k));
  }
  /** The keys, in order. */
  keys() {
    return ask(this.name, () => this.handle.mapKeys(this.name)).map((k) => this.decodeKey(k));
  }
  /** The entries as `[key, value]` pairs, in key order. */
  entries() {
    return ask(this.name, () => this.handle.mapEntries(this.name)).map(([k, v]) => [
      this.decodeKey(k),
      decodeWith(this.name, this.codec, v),
    ]);
  }
  decodeKey(bytes) {
    try {
      return this.key.decode(bytes);
    } catch {
      throw new PluginError(`${this.name}: a stored map key does not decode: was it written with another key type?`);
    }
  }
}

/** A key's variables and timers during one call; only valid during the call. */
export class KeyState {
  constructor(handle, variables) {
    this.handle = handle;
    this.variables = new Map(variables.map((v) => [v.name, v]));
  }
  declared(name, kind) {
    const variable = name instanceof Variable ? name : this.variables.get(name);
    if (!variable || variable.kind !== kind) {
      const shown = name instanceof Variable ? name.name : String(name);
      throw new UnknownVariable(shown, REFUSALS['unknown-variable'][1](shown), 'unknown-variable', shown);
    }
    return variable;
  }
  /** Value variable `name` (or its `Variable`), typed by its declaration. */
  value(name) {
    return new ValueState(this.handle, this.declared(name, 'value'));
  }
  /** List variable `name`. */
  list(name) {
    return new ListState(this.handle, this.declared(name, 'list'));
  }
  /** Map variable `name`. */
  map(name) {
    return new MapState(this.handle, this.declared(name, 'map'));
  }
  /** Registers a timer at `expiryMs` (a number or BigInt) with an optional name. */
  registerTimer(expiryMs, name) {
    const at = saturatingI64(expiryMs);
    ask('register-timer', () => this.handle.registerTimer(at, name ?? undefined));
  }
  /** Deletes the timer (expiry, name), if the key has it. */
  deleteTimer(expiryMs, name) {
    const at = saturatingI64(expiryMs);
    ask('delete-timer', () => this.handle.deleteTimer(at, name ?? undefined));
  }
  /** The key's timers `{ expiryMs, name }` (a number, a string or `undefined`), in
   * (expiry, name) order; the one being handled is not among them. */
  timers() {
    return ask('list-timers', () => this.handle.listTimers()).map((t) => ({
      expiryMs: Number(t.expiryMs),
      name: t.name ?? undefined,
    }));
  }
  /** The pipeline's time mode: `'none'`, `'processing-time'` or `'event-time'`. */
  timeMode() {
    return this.handle.timeMode();
  }
  /** The batch's watermark in epoch milliseconds (a number). */
  watermarkMs() {
    return Number(this.handle.currentWatermarkMs());
  }
  /** The batch's processing time in epoch milliseconds (a number). */
  processingTimeMs() {
    return Number(this.handle.currentProcessingTimeMs());
  }
}

function checkVariables(variables) {
  const seen = new Set();
  for (const v of variables) {
    if (!(v instanceof Variable)) throw new PluginError('static variables holds something that is not a Variable');
    if (seen.has(v.name)) throw new PluginError(`variable ${JSON.stringify(v.name)} is declared twice; give each variable its own name`);
    if (!Number.isInteger(v.schemaVersion) || v.schemaVersion < 1 || v.schemaVersion > 0xffffffff) {
      throw new PluginError(`variable ${JSON.stringify(v.name)}: schemaVersion ${v.schemaVersion} must be a whole number from 1`);
    }
    seen.add(v.name);
  }
}

function witVariable(v) {
  const ttl = v.ttl ? { durationMs: saturatingI64(v.ttl.durationMs), clock: v.ttl.clock } : undefined;
  return { name: v.name, kind: v.kind, ttl, schemaVersion: v.schemaVersion };
}

const NO_INIT = 'was called before init succeeded: the host must call init on every new instance';

/**
 * The world's exports for `Plugin` (see the module comment). Use it as
 * `export const { info, init, process, handleExpiredTimer, handleInitialState, migrateState, renderState } = exportKeyedPlugin(Plugin);`.
 */
export function exportKeyedPlugin(Plugin) {
  const variables = Plugin.variables || [];
  const Decoding = { decodeEvent: Plugin.decodeEvent || ((json) => json), eventName: Plugin.eventName };
  let instance;
  const fail = (error) => {
    // componentize-js turns a thrown value into the `err` of a `result` export.
    throw message(error);
  };
  const ready = (name) => {
    if (instance === undefined) fail(`${name} ${NO_INIT}`);
    return instance;
  };
  const state = (handle) => new KeyState(handle, variables);
  return {
    info() {
      const { name, version, stateSchemaVersion } = Plugin.info;
      return { name, version, stateSchemaVersion };
    },
    init(params) {
      instance = undefined;
      try {
        checkVariables(variables);
        instance = Plugin.init(new Params(params));
      } catch (error) {
        fail(error);
      }
      return variables.map(witVariable);
    },
    process(key, events, handle) {
      const plugin = ready('process');
      try {
        return plugin.process(key, decodeEvents(Decoding, events), state(handle)).map((o) => JSON.stringify(o));
      } catch (error) {
        return fail(error);
      }
    },
    handleExpiredTimer(key, timer, handle) {
      const plugin = ready('handle-expired-timer');
      try {
        const fired = { expiryMs: Number(timer.expiryMs), name: timer.name ?? undefined };
        return plugin.handleExpiredTimer(key, fired, state(handle)).map((o) => JSON.stringify(o));
      } catch (error) {
        return fail(error);
      }
    },
    handleInitialState(key, stateJson, handle) {
      const plugin = ready('handle-initial-state');
      try {
        if (typeof plugin.handleInitialState !== 'function') {
          throw new PluginError(
            'this plugin has no initial-state handler: implement handleInitialState, or run without --initial-state',
          );
        }
        let json;
        try {
          json = JSON.parse(stateJson);
        } catch (error) {
          throw new PluginError(`the initial state is not valid JSON (${error.message}): the host sends the line's \`state\` value`);
        }
        plugin.handleInitialState(key, json, state(handle));
      } catch (error) {
        fail(error);
      }
    },
    migrateState(variable, part, fromVersion, bytes) {
      const plugin = ready('migrate-state');
      try {
        if (typeof plugin.migrateState !== 'function') {
          throw new PluginError(
            `variable ${JSON.stringify(variable)} holds entries of layout ${fromVersion}, and this plugin converts none: implement migrateState`,
          );
        }
        const converted = plugin.migrateState(variable, part, fromVersion, bytes);
        if (!(converted instanceof Uint8Array)) throw new PluginError('migrateState must return a Uint8Array');
        return converted;
      } catch (error) {
        return fail(error);
      }
    },
    renderState(variable, part, bytes) {
      if (instance === undefined || typeof instance.renderState !== 'function') return undefined;
      try {
        const text = instance.renderState(variable, part, bytes);
        return typeof text === 'string' ? text : undefined;
      } catch {
        return undefined;
      }
    },
  };
}

/** `bytes` decoded by the codec `old`, passed through `convert`, and encoded by the
 * codec `variable` is declared with (for a plugin's `migrateState`). */
export function migrateDeclared(variables, variable, bytes, old, convert) {
  const declared = variables.find((v) => v.name === variable);
  if (!declared) throw new PluginError(`variable ${JSON.stringify(variable)} is not declared: nothing to convert it to`);
  return declared.codec.encode(convert(old.decode(bytes)));
}

/** `bytes` of `variable` decoded by its declared codecs, as JSON text (for a plugin's
 * `renderState`); `undefined` when they do not decode. */
export function renderDeclared(variables, variable, part, bytes) {
  const declared = variables.find((v) => v.name === variable);
  if (!declared) return undefined;
  try {
    const value = part === 'map-key' ? declared.key.decode(bytes) : declared.codec.decode(bytes);
    if (value instanceof Uint8Array) return undefined;
    return JSON.stringify(value, (_, v) => (typeof v === 'bigint' ? v.toString() : v));
  } catch {
    return undefined;
  }
}
