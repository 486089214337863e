// The parts of the JavaScript SDK that both state APIs share (`groupstate.js` for
// 0.1, `v2.js` for 0.2) and that import nothing from the host: errors, the JSON codec,
// parameters, event decoding. Plugins import them from either module.

export const I64_MIN = -(2n ** 63n);
export const I64_MAX = 2n ** 63n - 1n;

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

export function message(error) {
  if (error instanceof PluginError) return error.message;
  if (error instanceof Error) return `${error.name}: ${error.message}`;
  return String(error);
}

export function decodeEvents(Plugin, events) {
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

