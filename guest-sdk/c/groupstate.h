// C helpers for groupstate plugins, over the bindings `wit-bindgen c` generates from wit/
// (state_function.h). The raw bindings hand over owned strings and lists, report a
// refused state request as a WIT variant, and leave JSON to the plugin; these helpers
// cover the awkward parts:
//
// - gs_buf: a growing byte buffer that ends up as a WIT string (an output or an error);
// - gs_params_*: the pipeline's parameters, with the Rust SDK's checks and messages;
// - gs_json_*: the top-level fields of one JSON object (an event payload), validated;
// - gs_state_*: the group-state handle with errors turned into messages.
//
// Memory: every string handed back to the host (outputs, errors, info) must come from
// malloc, since the generated post-return functions free it. Allocation failure traps.

#ifndef GROUPSTATE_H
#define GROUPSTATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef GS_KEYED
// The 0.2 world (`keyed-state-function`, built with `build-component.sh --world
// keyed-state-function`, see groupstate_v2.h). The shared helpers below are written with
// the 0.1 world's type names; the 0.2 bindings have the same types under their world's
// prefix, so the names are mapped onto them.
#include "keyed_state_function.h"
#define state_function_string_t keyed_state_function_string_t
#define state_function_list_u8_t keyed_state_function_list_u8_t
#define state_function_list_string_t keyed_state_function_list_string_t
#define state_function_list_event_t keyed_state_function_list_event_t
#define state_function_list_tuple2_string_string_t keyed_state_function_list_tuple2_string_string_t
#define state_function_string_dup keyed_state_function_string_dup
#define state_function_string_free keyed_state_function_string_free
#define state_function_list_string_free keyed_state_function_list_string_free
#define state_function_list_event_free keyed_state_function_list_event_free
#else
#include "state_function.h"
#endif

// A view of bytes (not NUL-terminated), such as a JSON value inside a payload.
typedef struct {
  const uint8_t *ptr;
  size_t len;
} gs_str;

// A growing byte buffer; zero-initialize it (`gs_buf b = {0};`).
typedef struct {
  uint8_t *ptr;
  size_t len;
  size_t cap;
} gs_buf;

void gs_buf_bytes(gs_buf *buf, const void *bytes, size_t len);
void gs_buf_cstr(gs_buf *buf, const char *text);
void gs_buf_i64(gs_buf *buf, int64_t value);
// `bytes` as a JSON string literal, escaped as serde_json does.
void gs_buf_json_string(gs_buf *buf, const uint8_t *bytes, size_t len);
// Moves the buffer into a WIT string (the buffer is empty afterwards).
void gs_buf_into_string(gs_buf *buf, state_function_string_t *out);
void gs_buf_free(gs_buf *buf);

// Saturating i64 arithmetic, as the Rust plugin uses.
int64_t gs_sat_add(int64_t a, int64_t b);
int64_t gs_sat_sub(int64_t a, int64_t b);

// Fails when a parameter's name is not one of `known` (`count` names):
// "parameter `gap-ms` is not a parameter of this plugin (it knows gap_ms, window_ms): ...".
bool gs_params_reject_unknown(const state_function_list_tuple2_string_string_t *params, const char *const *known,
                              size_t count, state_function_string_t *err);
// Parameter `name` as an i64 (the last value given wins), or `fallback` when absent.
bool gs_params_i64(const state_function_list_tuple2_string_string_t *params, const char *name, int64_t fallback,
                   int64_t *out, state_function_string_t *err);
// "parameter `name` <problem>" as the error.
bool gs_param_error(const char *name, const char *problem, int64_t value, state_function_string_t *err);

// Finds the top-level fields `names[0..count)` of the JSON object `json`: `values[i]`
// is the raw text of field i's value, or `ptr == NULL` when absent. Validates the whole
// document (one object, no duplicate wanted field, nesting at most 128 deep). On
// failure, appends why to `why` and returns false.
bool gs_json_fields(gs_str json, const char *const *names, size_t count, gs_str *values, gs_buf *why);
// A raw JSON value as an i64 (an integer literal in range); false otherwise.
bool gs_json_i64(gs_str value, int64_t *out);
// Whether a raw JSON value is the string `text` (escapes decoded).
bool gs_json_string_is(gs_str value, const char *text);

#ifndef GS_KEYED
// The group-state handle. Values are bytes; the plugin encodes its own state.
typedef state_function_borrow_group_state_t gs_state;

bool gs_state_has_timed_out(gs_state state);
// The value into `out` (malloc'd; free it), and whether there is one.
bool gs_state_get(gs_state state, state_function_list_u8_t *out);
void gs_state_remove(gs_state state);
// Refused requests fail with the Rust SDK's message in `err`; `kind_mismatch` (may be
// NULL) is set instead of failing when the pipeline's timeout kind does not match.
bool gs_state_update(gs_state state, const uint8_t *bytes, size_t len, state_function_string_t *err);
bool gs_state_set_timeout_timestamp(gs_state state, int64_t timestamp_ms, bool *kind_mismatch,
                                    state_function_string_t *err);

// A plugin's own `process`: the key, its events and the state handle in, outputs
// appended to `outputs` (which starts empty), and `false` with `err` set to refuse the
// key. It borrows its arguments.
typedef bool (*gs_process_fn)(const state_function_string_t *key, const state_function_list_event_t *events,
                              gs_state state, state_function_list_string_t *outputs, state_function_string_t *err);

// The body of `exports_state_function_process`: calls `process` once `init` has
// succeeded (`initialized`), drops the outputs of a refused call, and frees the key and
// the events, which the export owns. Every plugin's export is this one call:
//
//   bool exports_state_function_process(state_function_string_t *key, state_function_list_event_t *events,
//                                       gs_state state, state_function_list_string_t *ret,
//                                       state_function_string_t *err) {
//     return gs_export_process(process, config.initialized, key, events, state, ret, err);
//   }
bool gs_export_process(gs_process_fn process, bool initialized, state_function_string_t *key,
                       state_function_list_event_t *events, gs_state state, state_function_list_string_t *ret,
                       state_function_string_t *err);

#endif

// Writes one message to the host's log.
void gs_log(groupstate_plugin_log_level_t level, const char *message);

#endif
