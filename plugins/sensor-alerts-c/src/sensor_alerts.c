// The sensor-alerts plugin in C: the same logic and parameters as the Rust one.
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
//
// The exports own their arguments (key, events, params, value) and free them.

#include <stdlib.h>
#include <string.h>

#include "groupstate.h"
#include "state_function.h"

#define GAP_MS_DEFAULT 600000
#define WINDOW_MS_DEFAULT 60000
#define STATE_SCHEMA_VERSION 1

// The parameters `init` accepted; `initialized` is false until it succeeds.
static struct {
  bool initialized;
  int64_t gap_ms;
  int64_t window_ms;
} config;

// A sensor's state between calls: the current episode. Stored as 20 bytes, little
// endian: consecutive_errors (u32), first_error_ts (i64), last_ts (i64).
typedef struct {
  uint32_t consecutive_errors;
  int64_t first_error_ts;
  int64_t last_ts;
} episode_t;

enum { EPISODE_BYTES = 20 };

static void put_le(uint8_t *out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; i++) out[i] = (uint8_t)(value >> (8 * i));
}

static uint64_t get_le(const uint8_t *in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; i++) value |= (uint64_t)in[i] << (8 * i);
  return value;
}

static void episode_encode(const episode_t *episode, uint8_t out[EPISODE_BYTES]) {
  put_le(out, episode->consecutive_errors, 4);
  put_le(out + 4, (uint64_t)episode->first_error_ts, 8);
  put_le(out + 12, (uint64_t)episode->last_ts, 8);
}

// The key's episode into `episode`; whether there is one. A value of the wrong size
// fails the call.
static bool episode_load(gs_state state, episode_t *episode, bool *exists, state_function_string_t *err) {
  state_function_list_u8_t bytes;
  *exists = gs_state_get(state, &bytes);
  if (!*exists) return true;
  bool ok = bytes.len == EPISODE_BYTES;
  if (ok) {
    episode->consecutive_errors = (uint32_t)get_le(bytes.ptr, 4);
    episode->first_error_ts = (int64_t)get_le(bytes.ptr + 4, 8);
    episode->last_ts = (int64_t)get_le(bytes.ptr + 12, 8);
  } else {
    gs_buf msg = {0};
    gs_buf_cstr(&msg, "cannot decode the stored state (");
    gs_buf_i64(&msg, (int64_t)bytes.len);
    gs_buf_cstr(&msg, " bytes, expected 20): raise the state schema version and implement migrate-state, or "
                      "start with empty state");
    gs_buf_into_string(&msg, err);
  }
  state_function_list_u8_free(&bytes);
  return ok;
}

// One decoded event; `index` keeps the sort stable.
typedef struct {
  int64_t ts;
  bool is_error;
  size_t index;
} reading_t;

static int reading_cmp(const void *a, const void *b) {
  const reading_t *x = a, *y = b;
  if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
  return x->index < y->index ? -1 : x->index > y->index;
}

// Decodes event `index` of `count`; on failure the message names it and says why.
static bool reading_decode(const state_function_event_t *event, size_t index, size_t count, reading_t *out,
                           state_function_string_t *err) {
  static const char *const fields[] = {"ts", "status"};
  gs_str values[2];
  gs_buf why = {0};
  gs_str payload = {event->payload.ptr, event->payload.len};
  if (gs_json_fields(payload, fields, 2, values, &why)) {
    if (!values[0].ptr) {
      gs_buf_cstr(&why, "missing field `ts`");
    } else if (!values[1].ptr) {
      gs_buf_cstr(&why, "missing field `status`");
    } else if (!gs_json_i64(values[0], &out->ts)) {
      gs_buf_cstr(&why, "`ts` is not an i64: ");
      gs_buf_bytes(&why, values[0].ptr, values[0].len);
    } else if (gs_json_string_is(values[1], "err")) {
      out->is_error = true;
    } else if (gs_json_string_is(values[1], "ok")) {
      out->is_error = false;
    } else {
      gs_buf_cstr(&why, "unknown variant ");
      gs_buf_bytes(&why, values[1].ptr, values[1].len);
      gs_buf_cstr(&why, ", expected `ok` or `err`");
    }
  }
  out->index = index;
  if (why.len == 0) return true;
  gs_buf msg = {0};
  gs_buf_cstr(&msg, "event ");
  gs_buf_i64(&msg, (int64_t)index);
  gs_buf_cstr(&msg, " of ");
  gs_buf_i64(&msg, (int64_t)count);
  gs_buf_cstr(&msg, ": payload is not a valid Reading (");
  gs_buf_bytes(&msg, why.ptr, why.len);
  gs_buf_cstr(&msg, "): fix the input, or make the plugin accept it");
  gs_buf_free(&why);
  gs_buf_into_string(&msg, err);
  return false;
}

// Expires the state `gap_ms` after the last event. A pipeline without event-time
// timeouts keeps the state (the setter's kind mismatch is not an error here).
static bool set_expiry(gs_state state, int64_t last_ts, state_function_string_t *err) {
  bool kind_mismatch;
  return gs_state_set_timeout_timestamp(state, gs_sat_add(last_ts, config.gap_ms), &kind_mismatch, err);
}

void exports_state_function_info(state_function_plugin_info_t *ret) {
  state_function_string_dup(&ret->name, "sensor-alerts");
  state_function_string_dup(&ret->version, "0.1.0");
  ret->state_schema_version = STATE_SCHEMA_VERSION;
}

bool exports_state_function_init(state_function_list_tuple2_string_string_t *params, state_function_string_t *err) {
  static const char *const known[] = {"gap_ms", "window_ms"};
  int64_t gap_ms = 0, window_ms = 0;
  config.initialized = false;
  bool ok = gs_params_reject_unknown(params, known, 2, err) &&
            gs_params_i64(params, "gap_ms", GAP_MS_DEFAULT, &gap_ms, err) &&
            (gap_ms > 0 || gs_param_error("gap_ms", "must be greater than 0 ms, got ", gap_ms, err)) &&
            gs_params_i64(params, "window_ms", WINDOW_MS_DEFAULT, &window_ms, err) &&
            (window_ms >= 0 || gs_param_error("window_ms", "must be 0 ms or more, got ", window_ms, err));
  state_function_list_tuple2_string_string_free(params);
  if (ok) {
    config.gap_ms = gap_ms;
    config.window_ms = window_ms;
    config.initialized = true;
  }
  return ok;
}

// The alert for the third error at `ts` as one JSON line into `out`.
static void alert_json(const state_function_string_t *sensor_id, int64_t ts, int64_t first_ts,
                       state_function_string_t *out) {
  gs_buf line = {0};
  gs_buf_cstr(&line, "{\"sensor_id\":");
  gs_buf_json_string(&line, sensor_id->ptr, sensor_id->len);
  gs_buf_cstr(&line, ",\"ts\":");
  gs_buf_i64(&line, ts);
  gs_buf_cstr(&line, ",\"first_ts\":");
  gs_buf_i64(&line, first_ts);
  gs_buf_cstr(&line, "}");
  gs_buf_into_string(&line, out);
}

static bool process(const state_function_string_t *sensor_id, const state_function_list_event_t *events,
                    gs_state state, state_function_list_string_t *alerts, state_function_string_t *err) {
  episode_t episode = {0};
  bool exists = false;
  // Checked only without events: a call with data is never a timeout call.
  if (events->len == 0) {
    if (gs_state_has_timed_out(state)) {
      gs_state_remove(state);
      return true;
    }
    if (!episode_load(state, &episode, &exists, err)) return false;
    return !exists || set_expiry(state, episode.last_ts, err);
  }

  reading_t *readings = malloc(events->len * sizeof *readings);
  if (!readings) abort();
  bool sorted = true;
  for (size_t i = 0; i < events->len; i++) {
    if (!reading_decode(&events->ptr[i], i, events->len, &readings[i], err)) {
      free(readings);
      return false;
    }
    sorted = sorted && (i == 0 || readings[i - 1].ts <= readings[i].ts);
  }
  // Stable: (ts, arrival index) orders events with equal `ts` by arrival.
  if (!sorted) qsort(readings, events->len, sizeof *readings, reading_cmp);

  if (!episode_load(state, &episode, &exists, err)) {
    free(readings);
    return false;
  }
  for (size_t i = 0; i < events->len; i++) {
    int64_t ts = readings[i].ts;
    if (!exists || gs_sat_sub(ts, episode.last_ts) > config.gap_ms) episode = (episode_t){0};
    exists = true;
    episode.last_ts = ts;
    if (!readings[i].is_error) {
      episode.consecutive_errors = 0;
      continue;
    }
    if (episode.consecutive_errors < UINT32_MAX) episode.consecutive_errors++;
    if (episode.consecutive_errors == 1) episode.first_error_ts = ts;
    if (episode.consecutive_errors == 3 && gs_sat_sub(ts, episode.first_error_ts) <= config.window_ms) {
      state_function_string_t *grown = realloc(alerts->ptr, (alerts->len + 1) * sizeof *grown);
      if (!grown) abort();
      alerts->ptr = grown;
      alert_json(sensor_id, ts, episode.first_error_ts, &alerts->ptr[alerts->len++]);
    }
  }
  free(readings);

  uint8_t bytes[EPISODE_BYTES];
  episode_encode(&episode, bytes);
  return gs_state_update(state, bytes, sizeof bytes, err) && set_expiry(state, episode.last_ts, err);
}

bool exports_state_function_process(state_function_string_t *key, state_function_list_event_t *events,
                                    state_function_borrow_group_state_t state, state_function_list_string_t *ret,
                                    state_function_string_t *err) {
  return gs_export_process(process, config.initialized, key, events, state, ret, err);
}

bool exports_state_function_migrate_state(uint32_t from_version, state_function_list_u8_t *value,
                                          state_function_list_u8_t *ret, state_function_string_t *err) {
  if (from_version == STATE_SCHEMA_VERSION) {
    *ret = *value;  // Ownership moves to the result.
    return true;
  }
  state_function_list_u8_free(value);
  gs_buf msg = {0};
  gs_buf_cstr(&msg, "no migration from state schema version ");
  gs_buf_i64(&msg, from_version);
  gs_buf_cstr(&msg, " to 1: implement migrate-state, or start the pipeline with empty state");
  gs_buf_into_string(&msg, err);
  return false;
}
