// The `{{name}}` groupstate plugin. Per key, it counts the events and emits
// `{"key":…,"count":…}` at every `every`th event (parameter `every`, default 3). With
// event-time timeouts, a key that gets no event for `idle_ms` of event time (default
// 60 000) is forgotten: its count starts again from 0.

// componentize-js resolves no package names: import the SDK by its path.
import { exportPlugin, JsonCodec, ParamError, TimeoutKindMismatch } from './node_modules/groupstate-sdk/groupstate.js';

class Plugin {
  static info = { name: '{{name}}', version: '0.1.0', stateSchemaVersion: 1 };
  // A key's state between calls, `{ count, lastMs }`, stored as JSON.
  static codec = new JsonCodec();

  static init(params) {
    params.rejectUnknown(['every', 'idle_ms']);
    const every = params.getInt('every', 3);
    if (every <= 0) throw new ParamError('every', `must be greater than 0, got ${every}`);
    const idleMs = params.getInt('idle_ms', 60000);
    if (idleMs <= 0) throw new ParamError('idle_ms', `must be greater than 0 ms, got ${idleMs}`);
    return new Plugin(every, idleMs);
  }

  constructor(every, idleMs) {
    this.every = every;
    this.idleMs = idleMs;
  }

  process(key, events, state) {
    if (state.hasTimedOut()) {
      // No event for `idle_ms`: forget the key.
      state.remove();
      return [];
    }
    const count = state.get() ?? { count: 0, lastMs: 0 };
    const outputs = [];
    for (const event of events) {
      count.count += 1;
      if (count.count % this.every === 0) outputs.push({ key, count: count.count });
      if (event.timeMs !== undefined) count.lastMs = Math.max(count.lastMs, event.timeMs);
    }
    state.update(count);
    try {
      state.setTimeoutTimestamp(count.lastMs + this.idleMs);
    } catch (error) {
      // Without event-time timeouts (`--timeout none`), keys are kept for good.
      if (!(error instanceof TimeoutKindMismatch)) throw error;
    }
    return outputs;
  }
}

export const { info, init, process, migrateState } = exportPlugin(Plugin);
