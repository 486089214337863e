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

import {
  JsonCodec,
  ParamError,
  Params,
  PluginError,
  StateError,
  decodeEvents,
  message,
  saturatingI64,
} from './common.js';

export { JsonCodec, ParamError, Params, PluginError, StateError, saturatingI64 };

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

/** Writes `message` to the host's log at `level` (`trace`, `debug`, `info`, `warn`, `error`). */
export function log(level, message) {
  hostLog(level, String(message));
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
