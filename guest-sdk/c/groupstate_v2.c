// C helpers for the 0.2 state API; see groupstate_v2.h.

#include "groupstate_v2.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static gs_string borrowed(const char *text) { return (gs_string){(uint8_t *)text, strlen(text)}; }
static gs_bytes borrowed_bytes(const uint8_t *bytes, size_t len) { return (gs_bytes){(uint8_t *)bytes, len}; }

// The Rust SDK's message for a refused request: "<what>: <why>".
static bool refused(const char *what, groupstate_plugin_state_state_error_t *error, gs_string *err) {
  char why[512];
  switch (error->tag) {
  case GROUPSTATE_PLUGIN_TYPES_STATE_ERROR_UNKNOWN_VARIABLE:
    snprintf(why, sizeof why, "no variable \"%.*s\" of this kind is declared: add it to the variables init returns",
             (int)error->val.unknown_variable.len, (const char *)error->val.unknown_variable.ptr);
    break;
  case GROUPSTATE_PLUGIN_TYPES_STATE_ERROR_VALUE_TOO_LARGE:
    snprintf(why, sizeof why, "the value is over state_bytes_max (%llu bytes)",
             (unsigned long long)error->val.value_too_large);
    break;
  case GROUPSTATE_PLUGIN_TYPES_STATE_ERROR_TOO_MANY_ENTRIES:
    snprintf(why, sizeof why,
             "over state_writes_per_call_max (%lu) entries in one call: change or read less per call",
             (unsigned long)error->val.too_many_entries);
    break;
  case GROUPSTATE_PLUGIN_TYPES_STATE_ERROR_TOO_MANY_TIMERS:
    snprintf(why, sizeof why, "the key holds timers_per_key_max (%lu) timers already",
             (unsigned long)error->val.too_many_timers);
    break;
  case GROUPSTATE_PLUGIN_TYPES_STATE_ERROR_TIME_MODE_MISMATCH:
    snprintf(why, sizeof why, "the pipeline has no timers: run it with --timeout event-time or processing-time");
    break;
  case GROUPSTATE_PLUGIN_TYPES_STATE_ERROR_NON_POSITIVE_TIME:
    snprintf(why, sizeof why, "a timer's expiry must be greater than zero, not %lld",
             (long long)error->val.non_positive_time);
    break;
  case GROUPSTATE_PLUGIN_TYPES_STATE_ERROR_TIMER_NAME_TOO_LONG:
    snprintf(why, sizeof why, "a timer name has at most 256 bytes, not %lu",
             (unsigned long)error->val.timer_name_too_long);
    break;
  case GROUPSTATE_PLUGIN_TYPES_STATE_ERROR_KEY_TOO_LONG:
    snprintf(why, sizeof why, "key, variable and map key take %lu bytes of store key: use shorter map keys",
             (unsigned long)error->val.key_too_long);
    break;
  default:
    snprintf(why, sizeof why, "the host refused the request (case %d)", (int)error->tag);
  }
  groupstate_plugin_state_state_error_free(error);
  gs_buf buf = {0};
  gs_buf_cstr(&buf, what);
  gs_buf_cstr(&buf, ": ");
  gs_buf_cstr(&buf, why);
  gs_buf_into_string(&buf, err);
  return false;
}

#define ASK(what, call)                                                                                              \
  do {                                                                                                               \
    groupstate_plugin_state_state_error_t error_;                                                                    \
    if (!(call)) return refused((what), &error_, err);                                                               \
  } while (0)
#define ERR (&error_)

bool gs_ks_value_get(gs_key_state s, const char *name, gs_bytes *out, bool *found, gs_string *err) {
  gs_string n = borrowed(name);
  keyed_state_function_option_list_u8_t value;
  ASK(name, groupstate_plugin_state_method_key_state_value_get(s, &n, &value, ERR));
  *found = value.is_some;
  *out = value.is_some ? value.val : (gs_bytes){NULL, 0};
  return true;
}

bool gs_ks_value_set(gs_key_state s, const char *name, const uint8_t *bytes, size_t len, gs_string *err) {
  gs_string n = borrowed(name);
  gs_bytes v = borrowed_bytes(bytes, len);
  ASK(name, groupstate_plugin_state_method_key_state_value_set(s, &n, &v, ERR));
  return true;
}

bool gs_ks_value_clear(gs_key_state s, const char *name, gs_string *err) {
  gs_string n = borrowed(name);
  ASK(name, groupstate_plugin_state_method_key_state_value_clear(s, &n, ERR));
  return true;
}

bool gs_ks_list_append(gs_key_state s, const char *name, const uint8_t *bytes, size_t len, gs_string *err) {
  gs_string n = borrowed(name);
  gs_bytes v = borrowed_bytes(bytes, len);
  ASK(name, groupstate_plugin_state_method_key_state_list_append(s, &n, &v, ERR));
  return true;
}

bool gs_ks_list_get(gs_key_state s, const char *name, keyed_state_function_list_list_u8_t *out, gs_string *err) {
  gs_string n = borrowed(name);
  ASK(name, groupstate_plugin_state_method_key_state_list_get(s, &n, out, ERR));
  return true;
}

bool gs_ks_list_len(gs_key_state s, const char *name, uint64_t *out, gs_string *err) {
  gs_string n = borrowed(name);
  ASK(name, groupstate_plugin_state_method_key_state_list_len(s, &n, out, ERR));
  return true;
}

bool gs_ks_list_clear(gs_key_state s, const char *name, gs_string *err) {
  gs_string n = borrowed(name);
  ASK(name, groupstate_plugin_state_method_key_state_list_clear(s, &n, ERR));
  return true;
}

bool gs_ks_map_get(gs_key_state s, const char *name, const uint8_t *key, size_t key_len, gs_bytes *out, bool *found,
                   gs_string *err) {
  gs_string n = borrowed(name);
  gs_bytes k = borrowed_bytes(key, key_len);
  keyed_state_function_option_list_u8_t value;
  ASK(name, groupstate_plugin_state_method_key_state_map_get(s, &n, &k, &value, ERR));
  *found = value.is_some;
  *out = value.is_some ? value.val : (gs_bytes){NULL, 0};
  return true;
}

bool gs_ks_map_contains(gs_key_state s, const char *name, const uint8_t *key, size_t key_len, bool *out,
                        gs_string *err) {
  gs_string n = borrowed(name);
  gs_bytes k = borrowed_bytes(key, key_len);
  ASK(name, groupstate_plugin_state_method_key_state_map_contains(s, &n, &k, out, ERR));
  return true;
}

bool gs_ks_map_put(gs_key_state s, const char *name, const uint8_t *key, size_t key_len, const uint8_t *value,
                   size_t value_len, gs_string *err) {
  gs_string n = borrowed(name);
  gs_bytes k = borrowed_bytes(key, key_len);
  gs_bytes v = borrowed_bytes(value, value_len);
  ASK(name, groupstate_plugin_state_method_key_state_map_put(s, &n, &k, &v, ERR));
  return true;
}

bool gs_ks_map_remove(gs_key_state s, const char *name, const uint8_t *key, size_t key_len, gs_string *err) {
  gs_string n = borrowed(name);
  gs_bytes k = borrowed_bytes(key, key_len);
  ASK(name, groupstate_plugin_state_method_key_state_map_remove(s, &n, &k, ERR));
  return true;
}

bool gs_ks_map_keys(gs_key_state s, const char *name, keyed_state_function_list_list_u8_t *out, gs_string *err) {
  gs_string n = borrowed(name);
  ASK(name, groupstate_plugin_state_method_key_state_map_keys(s, &n, out, ERR));
  return true;
}

bool gs_ks_map_entries(gs_key_state s, const char *name, keyed_state_function_list_tuple2_list_u8_list_u8_t *out,
                       gs_string *err) {
  gs_string n = borrowed(name);
  ASK(name, groupstate_plugin_state_method_key_state_map_entries(s, &n, out, ERR));
  return true;
}

bool gs_ks_register_timer(gs_key_state s, int64_t expiry_ms, const char *timer_name, gs_string *err) {
  gs_string n = timer_name ? borrowed(timer_name) : (gs_string){NULL, 0};
  ASK("register-timer",
      groupstate_plugin_state_method_key_state_register_timer(s, expiry_ms, timer_name ? &n : NULL, ERR));
  return true;
}

bool gs_ks_delete_timer(gs_key_state s, int64_t expiry_ms, const char *timer_name, gs_string *err) {
  gs_string n = timer_name ? borrowed(timer_name) : (gs_string){NULL, 0};
  ASK("delete-timer", groupstate_plugin_state_method_key_state_delete_timer(s, expiry_ms, timer_name ? &n : NULL, ERR));
  return true;
}

bool gs_ks_timers(gs_key_state s, groupstate_plugin_state_list_timer_t *out, gs_string *err) {
  ASK("list-timers", groupstate_plugin_state_method_key_state_list_timers(s, out, ERR));
  return true;
}

groupstate_plugin_state_time_mode_t gs_ks_time_mode(gs_key_state s) {
  return groupstate_plugin_state_method_key_state_time_mode(s);
}
int64_t gs_ks_watermark_ms(gs_key_state s) { return groupstate_plugin_state_method_key_state_current_watermark_ms(s); }
int64_t gs_ks_processing_time_ms(gs_key_state s) {
  return groupstate_plugin_state_method_key_state_current_processing_time_ms(s);
}

void gs_key_i64(int64_t key, uint8_t out[8]) {
  uint64_t word = (uint64_t)key ^ ((uint64_t)1 << 63);
  for (int i = 7; i >= 0; i--) {
    out[i] = (uint8_t)(word & 0xff);
    word >>= 8;
  }
}

bool gs_key_i64_decode(const uint8_t *bytes, size_t len, int64_t *out) {
  if (len != 8) return false;
  uint64_t word = 0;
  for (size_t i = 0; i < 8; i++) word = (word << 8) | bytes[i];
  *out = (int64_t)(word ^ ((uint64_t)1 << 63));
  return true;
}

void gs_variables(const gs_variable_decl *decls, size_t count, keyed_state_function_list_variable_t *ret) {
  ret->len = count;
  ret->ptr = count ? calloc(count, sizeof *ret->ptr) : NULL;
  if (count && !ret->ptr) abort();
  for (size_t i = 0; i < count; i++) {
    keyed_state_function_string_dup(&ret->ptr[i].name, decls[i].name);
    ret->ptr[i].kind = decls[i].kind;
    ret->ptr[i].ttl.is_some = decls[i].ttl_ms > 0;
    ret->ptr[i].ttl.val.duration_ms = decls[i].ttl_ms;
    ret->ptr[i].ttl.val.clock = decls[i].ttl_clock;
    ret->ptr[i].schema_version = decls[i].schema_version ? decls[i].schema_version : 1;
  }
}

static const char NO_INIT[] = " was called before init succeeded: the host must call init on every new instance";

static bool not_initialized(const char *what, gs_string *err) {
  gs_buf buf = {0};
  gs_buf_cstr(&buf, what);
  gs_buf_cstr(&buf, NO_INIT);
  gs_buf_into_string(&buf, err);
  return false;
}

bool gs_export_keyed_process(gs_keyed_process_fn process, bool initialized, gs_string *key,
                             keyed_state_function_list_event_t *events, gs_key_state state,
                             keyed_state_function_list_string_t *ret, gs_string *err) {
  *ret = (keyed_state_function_list_string_t){NULL, 0};
  bool ok = initialized ? process(key, events, state, ret, err) : not_initialized("process", err);
  if (!ok) {
    keyed_state_function_list_string_free(ret);
    *ret = (keyed_state_function_list_string_t){NULL, 0};
  }
  keyed_state_function_string_free(key);
  keyed_state_function_list_event_free(events);
  return ok;
}

bool gs_export_expired_timer(gs_expired_timer_fn handle, bool initialized, gs_string *key,
                             keyed_state_function_timer_t *timer, gs_key_state state,
                             keyed_state_function_list_string_t *ret, gs_string *err) {
  *ret = (keyed_state_function_list_string_t){NULL, 0};
  bool ok = initialized ? handle(key, timer, state, ret, err) : not_initialized("handle-expired-timer", err);
  if (!ok) {
    keyed_state_function_list_string_free(ret);
    *ret = (keyed_state_function_list_string_t){NULL, 0};
  }
  keyed_state_function_string_free(key);
  keyed_state_function_timer_free(timer);
  return ok;
}

bool gs_export_no_initial_state(gs_string *key, gs_string *state_json, gs_string *err) {
  keyed_state_function_string_free(key);
  keyed_state_function_string_free(state_json);
  keyed_state_function_string_dup(err, "this plugin has no initial-state handler: implement handle-initial-state, "
                                       "or run without --initial-state");
  return false;
}

bool gs_export_no_migrate(gs_string *variable, uint32_t from_version, keyed_state_function_list_u8_t *bytes,
                          gs_string *err) {
  gs_buf buf = {0};
  gs_buf_cstr(&buf, "variable ");
  gs_buf_bytes(&buf, (const char *)variable->ptr, variable->len);
  gs_buf_cstr(&buf, " holds entries of layout ");
  gs_buf_i64(&buf, from_version);
  gs_buf_cstr(&buf, ", and this plugin converts none: implement migrate-state");
  keyed_state_function_string_free(variable);
  keyed_state_function_list_u8_free(bytes);
  gs_buf_into_string(&buf, err);
  return false;
}

bool gs_export_no_render(gs_string *variable, keyed_state_function_list_u8_t *bytes, gs_string *ret) {
  keyed_state_function_string_free(variable);
  keyed_state_function_list_u8_free(bytes);
  (void)ret;
  return false;
}
