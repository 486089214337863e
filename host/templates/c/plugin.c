// The `{{name}}` groupstate plugin. Per key, it counts the events and emits
// {"key":…,"count":…} at every `every`th event (parameter `every`, default 3). With
// event-time timeouts, a key that gets no event for `idle_ms` of event time (default
// 60 000) is forgotten: its count starts again from 0.
//
// The four exports below are the WIT world `state-function` as `wit-bindgen c` spells
// it (state_function.h); groupstate.h is the SDK's helper layer over them.

#include <stdlib.h>

#include "groupstate.h"
#include "state_function.h"

#define STATE_SCHEMA_VERSION 1

// The parameters `init` accepted; `initialized` is false until it succeeds.
static struct {
  bool initialized;
  int64_t every;
  int64_t idle_ms;
} config;

// A key's state between calls, stored as 16 bytes, little endian: count, last_ms.
typedef struct {
  int64_t count;
  int64_t last_ms;
} count_t;

enum { COUNT_BYTES = 16 };

static void put_le(uint8_t *out, uint64_t value) {
  for (int i = 0; i < 8; i++) out[i] = (uint8_t)(value >> (8 * i));
}

static uint64_t get_le(const uint8_t *in) {
  uint64_t value = 0;
  for (int i = 0; i < 8; i++) value |= (uint64_t)in[i] << (8 * i);
  return value;
}

// The key's state into `count` (zero when it has none); a value of the wrong size
// fails the call.
static bool count_load(gs_state state, count_t *count, state_function_string_t *err) {
  state_function_list_u8_t bytes;
  *count = (count_t){0};
  if (!gs_state_get(state, &bytes)) return true;
  bool ok = bytes.len == COUNT_BYTES;
  if (ok) {
    count->count = (int64_t)get_le(bytes.ptr);
    count->last_ms = (int64_t)get_le(bytes.ptr + 8);
  } else {
    state_function_string_dup(err, "cannot decode the stored state (expected 16 bytes): raise the state schema "
                                   "version and implement migrate-state, or start with empty state");
  }
  state_function_list_u8_free(&bytes);
  return ok;
}

void exports_state_function_info(state_function_plugin_info_t *ret) {
  state_function_string_dup(&ret->name, "{{name}}");
  state_function_string_dup(&ret->version, "0.1.0");
  ret->state_schema_version = STATE_SCHEMA_VERSION;
}

bool exports_state_function_init(state_function_list_tuple2_string_string_t *params, state_function_string_t *err) {
  static const char *const known[] = {"every", "idle_ms"};
  int64_t every = 0, idle_ms = 0;
  config.initialized = false;
  bool ok = gs_params_reject_unknown(params, known, 2, err) && gs_params_i64(params, "every", 3, &every, err) &&
            (every > 0 || gs_param_error("every", "must be greater than 0, got ", every, err)) &&
            gs_params_i64(params, "idle_ms", 60000, &idle_ms, err) &&
            (idle_ms > 0 || gs_param_error("idle_ms", "must be greater than 0 ms, got ", idle_ms, err));
  state_function_list_tuple2_string_string_free(params);
  if (ok) {
    config.every = every;
    config.idle_ms = idle_ms;
    config.initialized = true;
  }
  return ok;
}

// Appends {"key":…,"count":…} to `outputs`.
static void emit(const state_function_string_t *key, int64_t count, state_function_list_string_t *outputs) {
  state_function_string_t *grown = realloc(outputs->ptr, (outputs->len + 1) * sizeof *grown);
  if (!grown) abort();
  outputs->ptr = grown;
  gs_buf line = {0};
  gs_buf_cstr(&line, "{\"key\":");
  gs_buf_json_string(&line, key->ptr, key->len);
  gs_buf_cstr(&line, ",\"count\":");
  gs_buf_i64(&line, count);
  gs_buf_cstr(&line, "}");
  gs_buf_into_string(&line, &outputs->ptr[outputs->len++]);
}

static bool process(const state_function_string_t *key, const state_function_list_event_t *events, gs_state state,
                    state_function_list_string_t *outputs, state_function_string_t *err) {
  if (gs_state_has_timed_out(state)) {
    // No event for `idle_ms`: forget the key.
    gs_state_remove(state);
    return true;
  }
  count_t count;
  if (!count_load(state, &count, err)) return false;
  for (size_t i = 0; i < events->len; i++) {
    count.count++;
    if (count.count % config.every == 0) emit(key, count.count, outputs);
    if (events->ptr[i].event_time_ms.is_some && events->ptr[i].event_time_ms.val > count.last_ms) {
      count.last_ms = events->ptr[i].event_time_ms.val;
    }
  }
  uint8_t bytes[COUNT_BYTES];
  put_le(bytes, (uint64_t)count.count);
  put_le(bytes + 8, (uint64_t)count.last_ms);
  // Without event-time timeouts (`--timeout none`) the setter reports a kind mismatch,
  // which is not an error here: keys are then kept for good.
  bool kind_mismatch;
  return gs_state_update(state, bytes, sizeof bytes, err) &&
         gs_state_set_timeout_timestamp(state, gs_sat_add(count.last_ms, config.idle_ms), &kind_mismatch, err);
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
  state_function_string_dup(err, "no migration to state schema version 1: implement migrate-state, or start the "
                                 "pipeline with empty state");
  return false;
}
