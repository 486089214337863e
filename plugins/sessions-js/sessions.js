// Web sessionization on the 0.2 state API, in JavaScript: the same logic, parameters
// and outputs as the Rust `plugins/sessions` and the Python `plugins/sessions-py`.
//
// Events `{"user", "ts", "page"}` keyed by user; a session is the events of one user
// with less than the gap (30 minutes by default, `--param gap_ms=N`) between one and
// the next in event time. An out-of-order event extends the session it falls into,
// starts a new one, or merges the two it bridges. State: map variable `sessions` from a
// session's start (`IntKey`) to the session, and one event-time timer per open session
// at its end plus the gap, named by its start; the timer call emits
// `{"user","start","end","events","pages"}` and removes the session.

import { IntKey, ParamError, PluginError, Variable, exportKeyedPlugin, renderDeclared } from './node_modules/groupstate-sdk/v2.js';

const GAP_MS_DEFAULT = 30 * 60 * 1000;
const SESSIONS = Variable.map('sessions', { key: new IntKey() });

class Sessions {
  static info = { name: 'sessions-js', version: '0.1.0', stateSchemaVersion: 1 };
  static variables = [SESSIONS];
  static eventName = 'View';

  static decodeEvent(json) {
    if (json === null || typeof json !== 'object' || Array.isArray(json)) throw new TypeError('expected a JSON object');
    if (!Number.isSafeInteger(json.ts)) throw new TypeError(`\`ts\` must be an integer, got ${JSON.stringify(json.ts)}`);
    if (typeof json.page !== 'string') throw new TypeError(`\`page\` must be a string, got ${JSON.stringify(json.page)}`);
    return { ts: json.ts, page: json.page };
  }

  static init(params) {
    params.rejectUnknown(['gap_ms']);
    const gapMs = params.getInt('gap_ms', GAP_MS_DEFAULT);
    if (gapMs <= 0) throw new ParamError('gap_ms', `must be greater than zero, not ${gapMs}`);
    return new Sessions(gapMs);
  }

  constructor(gapMs) {
    this.gapMs = gapMs;
  }

  // Adds one view: the sessions within the gap of it (and then of what they merged
  // into, for a view that bridges two) are merged with it into one. `open` is the map's
  // content, kept in step with it so that a call decodes it once.
  add(open, sessions, state, view) {
    const merged = { start: view.ts, end: view.ts, events: 1, pages: [view.page] };
    for (;;) {
      const near = [...open].filter(([, s]) => s.start < merged.end + this.gapMs && s.end > merged.start - this.gapMs);
      if (near.length === 0) break;
      for (const [start, s] of near) {
        open.delete(start);
        sessions.remove(start);
        state.deleteTimer(s.end + this.gapMs, String(start));
        merged.start = Math.min(merged.start, s.start);
        merged.end = Math.max(merged.end, s.end);
        merged.events += s.events;
        merged.pages = [...new Set([...merged.pages, ...s.pages])].sort();
      }
    }
    open.set(merged.start, merged);
    sessions.put(merged.start, merged);
    state.registerTimer(merged.end + this.gapMs, String(merged.start));
  }

  process(user, events, state) {
    const sessions = state.map(SESSIONS);
    const open = new Map(sessions.entries());
    for (const event of events) this.add(open, sessions, state, event.value);
    return [];
  }

  handleExpiredTimer(user, timer, state) {
    const start = Number(timer.name);
    if (timer.name === undefined || !Number.isSafeInteger(start)) {
      throw new PluginError(`timer ${JSON.stringify(timer)} is not one of this plugin's (named by a session start)`);
    }
    const sessions = state.map(SESSIONS);
    const session = sessions.get(start);
    if (session === undefined) return [];
    sessions.remove(start);
    return [{ user, start: session.start, end: session.end, events: session.events, pages: new Set(session.pages).size }];
  }

  renderState(variable, part, bytes) {
    return renderDeclared(Sessions.variables, variable, part, bytes);
  }
}

export const { info, init, process, handleExpiredTimer, handleInitialState, migrateState, renderState } =
  exportKeyedPlugin(Sessions);
