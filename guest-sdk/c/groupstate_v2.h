// C helpers for the 0.2 state API (`groupstate:plugin@0.2.0`, world
// `keyed-state-function`), over the bindings `wit-bindgen c` generates from wit/v0.2
// (keyed_state_function.h). Build with `build-component.sh --world keyed-state-function`.
// The same concepts as the Rust SDK's `groupstate_sdk::v2`:
//
// - gs_ks_*: the key-state handle of one call: value, list and map variables (values,
//   elements and map keys are bytes the plugin encodes), timers, the batch's times;
//   a refused request fails with the Rust SDK's message in `err`;
// - gs_key_i64 / gs_key_i64_decode: an s64 map key whose bytes keep the keys' order
//   (the Rust SDK's `i64` bytes);
// - gs_variables: the list `init` returns, from a table of declarations;
// - gs_export_keyed_process, gs_export_expired_timer: the bodies of the `process` and
//   `handle-expired-timer` exports; gs_export_no_initial_state and gs_export_no_render
//   the defaults of `handle-initial-state` (refuses, saying the plugin has none) and
//   `render-state` (none: the host shows hex); gs_export_no_migrate the default of
//   `migrate-state` (refuses: the plugin never changed a layout).
//
// The shared helpers of groupstate.h (gs_buf, gs_params_*, gs_json_*, gs_log) work here
// too, with the 0.1 type names mapped onto this world's (state_function_string_t is
// keyed_state_function_string_t). Memory: as in groupstate.h, every string handed back
// to the host must come from malloc; what a gs_ks_* read returns is the caller's to free
// (keyed_state_function_list_u8_free and the like).

#ifndef GROUPSTATE_V2_H
#define GROUPSTATE_V2_H

#ifndef GS_KEYED
#define GS_KEYED 1
#endif
#include "groupstate.h"

// The key-state handle of one call.
typedef keyed_state_function_borrow_key_state_t gs_key_state;
typedef keyed_state_function_string_t gs_string;
typedef keyed_state_function_list_u8_t gs_bytes;

// Value variables. `found` says whether there is a value; `out` is malloc'd (free it).
bool gs_ks_value_get(gs_key_state s, const char *name, gs_bytes *out, bool *found, gs_string *err);
bool gs_ks_value_set(gs_key_state s, const char *name, const uint8_t *bytes, size_t len, gs_string *err);
bool gs_ks_value_clear(gs_key_state s, const char *name, gs_string *err);

// List variables: append without reading, every element in append order, length, clear.
bool gs_ks_list_append(gs_key_state s, const char *name, const uint8_t *bytes, size_t len, gs_string *err);
bool gs_ks_list_get(gs_key_state s, const char *name, keyed_state_function_list_list_u8_t *out, gs_string *err);
bool gs_ks_list_len(gs_key_state s, const char *name, uint64_t *out, gs_string *err);
bool gs_ks_list_clear(gs_key_state s, const char *name, gs_string *err);

// Map variables; entries and keys come in byte order of the keys.
bool gs_ks_map_get(gs_key_state s, const char *name, const uint8_t *key, size_t key_len, gs_bytes *out, bool *found,
                   gs_string *err);
bool gs_ks_map_contains(gs_key_state s, const char *name, const uint8_t *key, size_t key_len, bool *out,
                        gs_string *err);
bool gs_ks_map_put(gs_key_state s, const char *name, const uint8_t *key, size_t key_len, const uint8_t *value,
                   size_t value_len, gs_string *err);
bool gs_ks_map_remove(gs_key_state s, const char *name, const uint8_t *key, size_t key_len, gs_string *err);
bool gs_ks_map_keys(gs_key_state s, const char *name, keyed_state_function_list_list_u8_t *out, gs_string *err);
bool gs_ks_map_entries(gs_key_state s, const char *name, keyed_state_function_list_tuple2_list_u8_list_u8_t *out,
                       gs_string *err);

// Timers; `timer_name` may be NULL (an unnamed timer). See the WIT for when they fire.
bool gs_ks_register_timer(gs_key_state s, int64_t expiry_ms, const char *timer_name, gs_string *err);
bool gs_ks_delete_timer(gs_key_state s, int64_t expiry_ms, const char *timer_name, gs_string *err);
bool gs_ks_timers(gs_key_state s, groupstate_plugin_state_list_timer_t *out, gs_string *err);

groupstate_plugin_state_time_mode_t gs_ks_time_mode(gs_key_state s);
int64_t gs_ks_watermark_ms(gs_key_state s);
int64_t gs_ks_processing_time_ms(gs_key_state s);

// An s64 map key as 8 bytes that sort as the numbers do (big-endian, sign bit flipped).
void gs_key_i64(int64_t key, uint8_t out[8]);
// The key back; false when `len` is not 8.
bool gs_key_i64_decode(const uint8_t *bytes, size_t len, int64_t *out);

// A variable declaration for gs_variables: name, kind (GROUPSTATE_PLUGIN_TYPES_VARIABLE_KIND_*),
// an optional TTL (ttl_ms 0: none; ttl_clock GROUPSTATE_PLUGIN_TYPES_TTL_CLOCK_*) and the
// layout version of its bytes (0 or 1: the first; raise it when the layout changes and
// convert the older ones in the plugin's `migrate-state` export).
typedef struct {
  const char *name;
  groupstate_plugin_types_variable_kind_t kind;
  int64_t ttl_ms;
  groupstate_plugin_types_ttl_clock_t ttl_clock;
  uint32_t schema_version;
} gs_variable_decl;

// Fills `init`'s result with the declared variables (malloc'd, as the host frees it).
void gs_variables(const gs_variable_decl *decls, size_t count, keyed_state_function_list_variable_t *ret);

// A plugin's own `process` and `handle-expired-timer`: outputs appended to `outputs`
// (which starts empty), `false` with `err` set to fail the call. They borrow their
// arguments.
typedef bool (*gs_keyed_process_fn)(const gs_string *key, const keyed_state_function_list_event_t *events,
                                    gs_key_state state, keyed_state_function_list_string_t *outputs, gs_string *err);
typedef bool (*gs_expired_timer_fn)(const gs_string *key, const keyed_state_function_timer_t *timer,
                                    gs_key_state state, keyed_state_function_list_string_t *outputs, gs_string *err);

// The bodies of the exports: call the plugin's function once `init` has succeeded,
// drop the outputs of a failed call, and free the arguments the export owns.
bool gs_export_keyed_process(gs_keyed_process_fn process, bool initialized, gs_string *key,
                             keyed_state_function_list_event_t *events, gs_key_state state,
                             keyed_state_function_list_string_t *ret, gs_string *err);
bool gs_export_expired_timer(gs_expired_timer_fn handle, bool initialized, gs_string *key,
                             keyed_state_function_timer_t *timer, gs_key_state state,
                             keyed_state_function_list_string_t *ret, gs_string *err);
// The defaults: refuses initial state, saying the plugin has none; converts no older
// layout (for a plugin that never raised a schema_version); renders nothing.
bool gs_export_no_initial_state(gs_string *key, gs_string *state_json, gs_string *err);
bool gs_export_no_migrate(gs_string *variable, uint32_t from_version, keyed_state_function_list_u8_t *bytes,
                          gs_string *err);
bool gs_export_no_render(gs_string *variable, keyed_state_function_list_u8_t *bytes, gs_string *ret);

#endif
