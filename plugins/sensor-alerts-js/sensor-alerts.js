// The sensor-alerts plugin in JavaScript: the same logic and parameters as the Rust one.
//
// Per sensor (key = `sensor_id`), each call's events are processed in `ts` order:
//
// - an event more than `gap_ms` (default 10 minutes) after the sensor's last event
//   starts a new episode: the state is reset first;
// - `"err"` counts one more consecutive error (the first one's `ts` is remembered),
//   `"ok"` sets the count back to 0; any other status fails the call;
// - when the count becomes exactly 3 and the third error is at most `window_ms`
//   (default 1 minute) after the first, it emits
//   `{"sensor_id":…,"ts":<3rd>,"first_ts":<1st>}`;
// - the state expires through an event-time timeout `gap_ms` after the sensor's last
//   event (skipped in pipelines without event-time timeouts); the timed-out call
//   removes it and emits nothing.

import { exportPlugin, JsonCodec, ParamError, TimeoutKindMismatch } from './node_modules/groupstate-sdk/groupstate.js';

const GAP_MS_DEFAULT = 600000;
const WINDOW_MS_DEFAULT = 60000;

/** A sensor's state between calls, stored as JSON. */
function newEpisode() {
  return { consecutive_errors: 0, first_error_ts: 0, last_ts: 0 };
}

class SensorAlerts {
  static info = { name: 'sensor-alerts', version: '0.1.0', stateSchemaVersion: 1 };
  static codec = new JsonCodec();
  static eventName = 'Reading';

  /** One input line to `{ ts, isError }`; only `ts` and `status` are needed. */
  static decodeEvent(json) {
    if (json === null || typeof json !== 'object' || Array.isArray(json)) {
      throw new TypeError('expected a JSON object');
    }
    const { ts, status } = json;
    if (ts === undefined) throw new TypeError('missing field `ts`');
    if (status === undefined) throw new TypeError('missing field `status`');
    // Epoch milliseconds; JavaScript numbers hold integers exactly up to 2^53 - 1.
    if (!Number.isSafeInteger(ts)) throw new TypeError(`\`ts\` must be an integer, got ${JSON.stringify(ts)}`);
    if (status !== 'ok' && status !== 'err') {
      throw new TypeError(`unknown variant \`${status}\`, expected \`ok\` or \`err\``);
    }
    return { ts, isError: status === 'err' };
  }

  static init(params) {
    params.rejectUnknown(['gap_ms', 'window_ms']);
    const gapMs = params.getInt('gap_ms', GAP_MS_DEFAULT);
    if (gapMs <= 0) throw new ParamError('gap_ms', `must be greater than 0 ms, got ${gapMs}`);
    const windowMs = params.getInt('window_ms', WINDOW_MS_DEFAULT);
    if (windowMs < 0) throw new ParamError('window_ms', `must be 0 ms or more, got ${windowMs}`);
    return new SensorAlerts(gapMs, windowMs);
  }

  constructor(gapMs, windowMs) {
    this.gapMs = gapMs;
    this.windowMs = windowMs;
  }

  process(sensorId, events, state) {
    // Checked only without events: a call with data is never a timeout call.
    if (events.length === 0) {
      if (state.hasTimedOut()) {
        state.remove();
      } else {
        const episode = state.get();
        if (episode !== undefined) this.setExpiry(state, episode.last_ts);
      }
      return [];
    }

    let episode = state.get();
    const alerts = [];
    // Array.prototype.sort is stable: events with equal `ts` keep their arrival order.
    const readings = events.map((event) => event.value).sort((a, b) => a.ts - b.ts);
    for (const { ts, isError } of readings) {
      if (episode === undefined || ts - episode.last_ts > this.gapMs) episode = newEpisode();
      episode.last_ts = ts;
      if (!isError) {
        episode.consecutive_errors = 0;
        continue;
      }
      episode.consecutive_errors += 1;
      if (episode.consecutive_errors === 1) episode.first_error_ts = ts;
      if (episode.consecutive_errors === 3 && ts - episode.first_error_ts <= this.windowMs) {
        alerts.push({ sensor_id: sensorId, ts, first_ts: episode.first_error_ts });
      }
    }

    state.update(episode);
    this.setExpiry(state, episode.last_ts);
    return alerts;
  }

  /** Expires the state `gap_ms` after the last event; kept without event-time timeouts. */
  setExpiry(state, lastTs) {
    try {
      state.setTimeoutTimestamp(BigInt(lastTs) + BigInt(this.gapMs));
    } catch (error) {
      if (!(error instanceof TimeoutKindMismatch)) throw error;
    }
  }
}

export const { info, init, process, migrateState } = exportPlugin(SensorAlerts);
