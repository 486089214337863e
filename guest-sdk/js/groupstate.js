// JavaScript helpers for groupstate plugins: what the Rust `groupstate-sdk` crate is for Rust.
//
// componentize-js maps the WIT world `state-function` onto ES module exports and
// imports. The raw bindings pass state as bytes, `s64` values as BigInt, and report a
// refused request by throwing an error whose `payload` is a WIT variant. This module
// wraps them:
//
// - `exportPlugin(Plugin)` makes the four world exports (`info`, `init`, `process`,
//   `migrateState`) from a plugin class with static `info`, `init(params)` and
//   `decodeEvent(json)`, and a `process(key, events, state)` method;
// - `GroupState` is the typed state handle: `get()` returns the plugin's state object
//   (or `undefined`), `update(value)` stores one, encoded by a codec (`JsonCodec` by
//   default: opaque bytes to the host); timeouts take plain numbers;
// - `Params` has typed getters and refuses unknown names;
// - throw a `PluginError` (or a subclass) to fail the call with its message; the host
//   then keeps the key's state as before the call. Any other exception escaping
//   `process` fails the call too, with its message prefixed by its name.

import { log as hostLog } from 'groupstate:plugin/log@0.1.0';

const I64_MIN = -(2n ** 63n);
const I64_MAX = 2n ** 63n - 1n;

/** Fails the `process` (or `init`, `migrateState`) call with this message. */
export class PluginError extends Error {}

/** A parameter was missing, unknown or did not parse; the message names it. */
export class ParamError extends PluginError {
  constructor(name, problem) {
    super(`parameter \`${name}\` ${problem}`);
    this.paramName = name;
  }
}

/** The host refused a `GroupState` request; the request had no effect. */
export class StateError extends PluginError {}

/** The timeout setter does not match the pipeline's timeout kind (`pipelineKind`). */
export class TimeoutKindMismatch extends StateError {
  constructor(pipelineKind) {
    super(
      `the timeout setter does not match the pipeline's timeout kind \`${pipelineKind}\`: ` +
        'use set_timeout_duration with processing-time, set_timeout_timestamp with ' +
        'event-time, neither with none',
    );
    this.pipelineKind = pipelineKind;
  }
}

/** A timeout duration or timestamp must be greater than zero. */
export class NonPositiveTimeout extends StateError {
  constructor(valueMs) {
    super(`a timeout must be greater than 0 ms, got ${valueMs}: pass a positive duration or timestamp`);
    this.valueMs = valueMs;
  }
}

/** An event-time timeout must not be earlier than the current watermark. */
export class TimestampBeforeWatermark extends StateError {
  constructor(timestampMs, watermarkMs) {
    super(
      `timeout timestamp ${timestampMs} is before the current watermark ${watermarkMs}: ` +
        'pick a timestamp at or after the watermark',
    );
    this.timestampMs = timestampMs;
    this.watermarkMs = watermarkMs;
  }
}

/** The encoded state is larger than the pipeline's `state_bytes_max`. */
export class StateTooLarge extends StateError {
  constructor(stateBytes, stateBytesMax) {
    super(
      `state value of ${stateBytes} bytes is larger than the pipeline's state_bytes_max of ` +
        `${stateBytesMax}: keep less per key, or raise the limit when running the host`,
    );
    this.stateBytes = stateBytes;
    this.stateBytesMax = stateBytesMax;
  }
}

/** The typed error for a WIT `state-error` thrown by the bindings; `given` is what the plugin passed. */
function stateError(thrown, given) {
  const error = thrown && thrown.payload !== undefined ? thrown.payload : thrown;
  switch (error && error.tag) {
    case 'timeout-kind-mismatch':
      return new TimeoutKindMismatch(error.val);
    case 'non-positive-timeout':
      return new NonPositiveTimeout(error.val);
    case 'timestamp-before-watermark':
      return new TimestampBeforeWatermark(given, error.val);
    case 'state-too-large':
      return new StateTooLarge(given, error.val);
    default:
      return new StateError(`the host refused the request: ${String(thrown)}`);
  }
}

/** `value` (a number or BigInt) as an `s64` BigInt, clamped like Rust's saturating arithmetic. */
export function saturatingI64(value) {
  const big = typeof value === 'bigint' ? value : BigInt(Math.trunc(value));
  return big < I64_MIN ? I64_MIN : big > I64_MAX ? I64_MAX : big;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** State as compact JSON; `fromJson` rebuilds the plugin's object from the parsed value. */
export class JsonCodec {
  constructor(fromJson = (value) => value) {
    this.fromJson = fromJson;
  }
  encode(value) {
    return encoder.encode(JSON.stringify(value));
  }
  decode(bytes) {
    return this.fromJson(JSON.parse(decoder.decode(bytes)));
  }
}

/**
 * The state of one key during one call (Spark's `GroupState`), typed through a codec.
 * Wraps the WIT `group-state` handle, which is only valid during the call; the host
 * stages every change and applies it only when the call succeeds.
 */
export class GroupState {
  constructor(handle, codec) {
    this.handle = handle;
    this.codec = codec;
  }
  /** Whether the key has a state value (as staged so far in this call). */
  exists() {
    return this.handle.exists();
  }
  /** The key's state value, or `undefined`; a `PluginError` if it cannot be decoded. */
  get() {
    const bytes = this.handle.get();
    if (bytes === undefined || bytes === null) return undefined;
    try {
      return this.codec.decode(bytes);
    } catch (error) {
      throw new PluginError(
        `cannot decode the stored state (${error}): raise the plugin's stateSchemaVersion and ` +
          'implement migrateState, or start with empty state',
      );
    }
  }
  /** Replaces the key's state value; `StateTooLarge` if it exceeds the pipeline's limit. */
  update(value) {
    const bytes = this.codec.encode(value);
    try {
      this.handle.update(bytes);
    } catch (error) {
      throw stateError(error, bytes.length);
    }
  }
  /** Removes the key's state value. */
  remove() {
    this.handle.remove();
  }
  /** True when this call was made because the key's timeout expired (it has no events). */
  hasTimedOut() {
    return this.handle.hasTimedOut();
  }
  /** A processing-time timeout `durationMs` after the batch's processing time. */
  setTimeoutDuration(durationMs) {
    const value = saturatingI64(durationMs);
    try {
      this.handle.setTimeoutDuration(value);
    } catch (error) {
      throw stateError(error, value);
    }
  }
  /** An event-time timeout at `timestampMs` (epoch ms, at or after the watermark). */
  setTimeoutTimestamp(timestampMs) {
    const value = saturatingI64(timestampMs);
    try {
      this.handle.setTimeoutTimestamp(value);
    } catch (error) {
      throw stateError(error, value);
    }
  }
  /** The pipeline's timeout kind: `none`, `processing-time` or `event-time`. */
  timeoutKind() {
    return this.handle.timeoutKind();
  }
  /** The batch's watermark in epoch milliseconds (a number; constant within a batch). */
  currentWatermarkMs() {
    return Number(this.handle.currentWatermarkMs());
  }
  /** The batch's processing time in epoch milliseconds (a number; constant within a batch). */
  currentProcessingTimeMs() {
    return Number(this.handle.currentProcessingTimeMs());
  }
}

const INT = /^[+-]?[0-9]+$/;
const INT_RANGES = {
  i64: [I64_MIN, I64_MAX],
  i32: [-(2n ** 31n), 2n ** 31n - 1n],
  u32: [0n, 2n ** 32n - 1n],
};

/** The pipeline's `--param name=value` pairs given to `init`; the last of a name wins. */
export class Params {
  constructor(pairs) {
    this.pairs = pairs;
  }
  /** The raw text of parameter `name`, or `undefined` when it was not given. */
  getStr(name) {
    for (let i = this.pairs.length - 1; i >= 0; i--) {
      if (this.pairs[i][0] === name) return this.pairs[i][1];
    }
    return undefined;
  }
  /**
   * Parameter `name` as an integer of Rust type `ty` (i64, i32, u32), as a number, or
   * `defaultValue`. JavaScript numbers hold integers exactly up to 2^53 - 1; a larger
   * value is refused rather than rounded.
   */
  getInt(name, defaultValue, ty = 'i64') {
    const text = this.getStr(name);
    if (text === undefined) return defaultValue;
    const [low, high] = INT_RANGES[ty];
    let problem;
    if (text === '') {
      problem = 'cannot parse integer from empty string';
    } else if (!INT.test(text) || (ty.startsWith('u') && text.startsWith('-'))) {
      problem = 'invalid digit found in string';
    } else if (BigInt(text) > high) {
      problem = 'number too large to fit in target type';
    } else if (BigInt(text) < low) {
      problem = 'number too small to fit in target type';
    } else if (!Number.isSafeInteger(Number(text))) {
      throw new ParamError(name, `is \`${text}\`, beyond what this JavaScript plugin holds exactly (±2^53 - 1)`);
    } else {
      return Number(text);
    }
    throw new ParamError(name, `is \`${text}\`, not a valid ${ty} (${problem}): pass --param ${name}=<${ty}>`);
  }
  /** Fails on the first parameter whose name is not in `known` (a typo, say). */
  rejectUnknown(known) {
    for (const [name] of this.pairs) {
      if (!known.includes(name)) {
        throw new ParamError(
          name,
          `is not a parameter of this plugin (it knows ${known.join(', ')}): remove it or fix its name`,
        );
      }
    }
  }
}

/** Writes `message` to the host's log at `level` (`trace`, `debug`, `info`, `warn`, `error`). */
export function log(level, message) {
  hostLog(level, String(message));
}

function message(error) {
  if (error instanceof PluginError) return error.message;
  if (error instanceof Error) return `${error.name}: ${error.message}`;
  return String(error);
}

function decodeEvents(Plugin, events) {
  const count = events.length;
  const decoded = new Array(count);
  for (let index = 0; index < count; index++) {
    const event = events[index];
    let value;
    try {
      value = Plugin.decodeEvent(JSON.parse(event.payload));
    } catch (error) {
      throw new PluginError(
        `event ${index} of ${count}: payload is not a valid ${Plugin.eventName || 'event'} ` +
          `(${error instanceof Error ? error.message : String(error)}): fix the input, or make the ` +
          "plugin's decodeEvent accept it",
      );
    }
    const timeMs = event.eventTimeMs === undefined || event.eventTimeMs === null ? undefined : Number(event.eventTimeMs);
    decoded[index] = { timeMs, value };
  }
  return decoded;
}

/**
 * The world's exports for `Plugin`, a class with:
 * - `static info = { name, version, stateSchemaVersion }`;
 * - `static codec` (default `new JsonCodec()`), `static eventName` (for messages);
 * - `static decodeEvent(json)`: one parsed payload to the plugin's event value; throws
 *   on a bad event (the call then fails with "event i of n: payload is not a valid ...");
 * - `static init(params)`: an instance from a `Params`, or throws a `ParamError`;
 * - `process(key, events, state)`: `events` are `{ timeMs, value }` in arrival order,
 *   `state` a `GroupState`; returns the outputs (each written as JSON);
 * - optionally `static migrateState(fromVersion, bytes)`: an old state value to a new one.
 *
 * Use it as `export const { info, init, process, migrateState } = exportPlugin(Plugin);`.
 */
export function exportPlugin(Plugin) {
  const codec = Plugin.codec || new JsonCodec();
  const decodeEvent = Plugin.decodeEvent || ((json) => json);
  const Decoding = { decodeEvent, eventName: Plugin.eventName };
  let instance;
  const fail = (error) => {
    // componentize-js turns a thrown value into the `err` of a `result` export.
    throw message(error);
  };
  return {
    info() {
      const { name, version, stateSchemaVersion } = Plugin.info;
      return { name, version, stateSchemaVersion };
    },
    init(params) {
      instance = undefined;
      try {
        instance = Plugin.init(new Params(params));
      } catch (error) {
        fail(error);
      }
    },
    process(key, events, handle) {
      if (instance === undefined) {
        fail('process was called before init succeeded: the host must call init on every new instance');
      }
      try {
        const outputs = instance.process(key, decodeEvents(Decoding, events), new GroupState(handle, codec));
        return outputs.map((output) => JSON.stringify(output));
      } catch (error) {
        return fail(error);
      }
    },
    migrateState(fromVersion, bytes) {
      const current = Plugin.info.stateSchemaVersion;
      if (fromVersion === current) return bytes;
      try {
        if (!Plugin.migrateState) {
          throw new PluginError(
            `no migration from state schema version ${fromVersion} to ${current}: implement ` +
              'static migrateState, or start the pipeline with empty state',
          );
        }
        return codec.encode(Plugin.migrateState(fromVersion, bytes));
      } catch (error) {
        return fail(error);
      }
    },
  };
}
