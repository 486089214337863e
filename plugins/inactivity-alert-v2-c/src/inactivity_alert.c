// The inactivity-alert plugin on the 0.2 state API, in C: the same logic, parameters and
// outputs as plugins/inactivity-alert-v2 (Rust). Per key, it counts the events seen
// since the key last became active; when no event has arrived for more than
// `timeout_ms` of processing time (default 60000), it emits
// {"key":…,"last_seen_ms":…,"events":…} once and forgets the key.
//
// State: value variable `activity` (16 bytes: last_seen_ms and events, little endian)
// and one unnamed processing-time timer at last_seen_ms + timeout_ms + 1, which each
// data call moves (0.2 timers fire at expiry <= processing time, 0.1 timeouts strictly
// after their deadline: the + 1 keeps the 0.1 plugin's alerts).

#include <stdlib.h>
#include <string.h>

#include "groupstate_v2.h"

static struct {
  bool initialized;
  int64_t timeout_ms;
} config;

static const char ACTIVITY[] = "activity";

typedef struct {
  int64_t last_seen_ms;
  uint64_t events;
} activity;

static void put_u64(uint8_t *out, uint64_t v) {
  for (int i = 0; i < 8; i++) out[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64(const uint8_t *in) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | in[i];
  return v;
}

static int64_t deadline(const activity *a) { return gs_sat_add(gs_sat_add(a->last_seen_ms, config.timeout_ms), 1); }

// The key's activity; `found` false when it has none.
static bool load(gs_key_state state, activity *a, bool *found, gs_string *err) {
  gs_bytes bytes;
  if (!gs_ks_value_get(state, ACTIVITY, &bytes, found, err)) return false;
  *a = (activity){0, 0};
  if (!*found) return true;
  bool ok = bytes.len == 16;
  if (ok) {
    a->last_seen_ms = (int64_t)get_u64(bytes.ptr);
    a->events = get_u64(bytes.ptr + 8);
  }
  keyed_state_function_list_u8_free(&bytes);
  if (!ok) keyed_state_function_string_dup(err, "activity: the stored value is not 16 bytes: was it written by another plugin?");
  return ok;
}

void exports_keyed_state_function_info(keyed_state_function_plugin_info_t *ret) {
  keyed_state_function_string_dup(&ret->name, "inactivity-alert-v2-c");
  keyed_state_function_string_dup(&ret->version, "0.1.0");
  ret->state_schema_version = 1;
}

bool exports_keyed_state_function_init(keyed_state_function_list_tuple2_string_string_t *params,
                                       keyed_state_function_list_variable_t *ret, gs_string *err) {
  static const char *const known[] = {"timeout_ms"};
  config.initialized = false;
  bool ok = gs_params_reject_unknown(params, known, 1, err) &&
            gs_params_i64(params, "timeout_ms", 60000, &config.timeout_ms, err) &&
            (config.timeout_ms > 0 || gs_param_error("timeout_ms", "must be greater than 0 ms, got ", config.timeout_ms, err));
  keyed_state_function_list_tuple2_string_string_free(params);
  if (!ok) return false;
  static const gs_variable_decl variables[] = {{ACTIVITY, GROUPSTATE_PLUGIN_TYPES_VARIABLE_KIND_VALUE, 0, 0, 1}};
  gs_variables(variables, 1, ret);
  config.initialized = true;
  return true;
}

static bool process(const gs_string *key, const keyed_state_function_list_event_t *events, gs_key_state state,
                    keyed_state_function_list_string_t *outputs, gs_string *err) {
  activity a;
  bool found;
  if (!load(state, &a, &found, err)) return false;
  if (found && !gs_ks_delete_timer(state, deadline(&a), NULL, err)) return false;
  a.events += events->len;
  a.last_seen_ms = gs_ks_processing_time_ms(state);
  uint8_t bytes[16];
  put_u64(bytes, (uint64_t)a.last_seen_ms);
  put_u64(bytes + 8, a.events);
  return gs_ks_value_set(state, ACTIVITY, bytes, sizeof bytes, err) &&
         gs_ks_register_timer(state, deadline(&a), NULL, err);
}

static bool expired(const gs_string *key, const keyed_state_function_timer_t *timer, gs_key_state state,
                    keyed_state_function_list_string_t *outputs, gs_string *err) {
  activity a;
  bool found;
  if (!load(state, &a, &found, err)) return false;
  if (!found) return true;
  if (!gs_ks_value_clear(state, ACTIVITY, err)) return false;
  gs_buf out = {0};
  gs_buf_cstr(&out, "{\"key\":");
  gs_buf_json_string(&out, key->ptr, key->len);
  gs_buf_cstr(&out, ",\"last_seen_ms\":");
  gs_buf_i64(&out, a.last_seen_ms);
  gs_buf_cstr(&out, ",\"events\":");
  gs_buf_i64(&out, (int64_t)a.events);
  gs_buf_cstr(&out, "}");
  outputs->ptr = malloc(sizeof *outputs->ptr);
  if (!outputs->ptr) abort();
  outputs->len = 1;
  gs_buf_into_string(&out, &outputs->ptr[0]);
  return true;
}

bool exports_keyed_state_function_process(gs_string *key, keyed_state_function_list_event_t *events,
                                          gs_key_state state, keyed_state_function_list_string_t *ret,
                                          gs_string *err) {
  return gs_export_keyed_process(process, config.initialized, key, events, state, ret, err);
}

bool exports_keyed_state_function_handle_expired_timer(gs_string *key, keyed_state_function_timer_t *timer,
                                                       gs_key_state state, keyed_state_function_list_string_t *ret,
                                                       gs_string *err) {
  return gs_export_expired_timer(expired, config.initialized, key, timer, state, ret, err);
}

bool exports_keyed_state_function_handle_initial_state(gs_string *key, gs_string *state_json, gs_key_state state,
                                                       gs_string *err) {
  return gs_export_no_initial_state(key, state_json, err);
}

bool exports_keyed_state_function_migrate_state(gs_string *variable, keyed_state_function_state_part_t part,
                                                uint32_t from_version, keyed_state_function_list_u8_t *bytes,
                                                keyed_state_function_list_u8_t *ret, gs_string *err) {
  (void)part;
  (void)ret;
  return gs_export_no_migrate(variable, from_version, bytes, err);
}

bool exports_keyed_state_function_render_state(gs_string *variable, keyed_state_function_state_part_t part,
                                               keyed_state_function_list_u8_t *bytes, gs_string *ret) {
  return gs_export_no_render(variable, bytes, ret);
}
