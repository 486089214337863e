// C helpers for groupstate plugins; see groupstate.h.

#include "groupstate.h"

#include <stdlib.h>
#include <string.h>

// ---- buffers -------------------------------------------------------------------------

static void buf_reserve(gs_buf *buf, size_t more) {
  if (more <= buf->cap - buf->len) return;
  size_t cap = buf->cap ? buf->cap : 64;
  while (cap - buf->len < more) {
    if (cap > SIZE_MAX / 2) abort();
    cap *= 2;
  }
  uint8_t *ptr = realloc(buf->ptr, cap);
  if (!ptr) abort();
  buf->ptr = ptr;
  buf->cap = cap;
}

void gs_buf_bytes(gs_buf *buf, const void *bytes, size_t len) {
  if (len == 0) return;
  buf_reserve(buf, len);
  memcpy(buf->ptr + buf->len, bytes, len);
  buf->len += len;
}

void gs_buf_cstr(gs_buf *buf, const char *text) { gs_buf_bytes(buf, text, strlen(text)); }

void gs_buf_i64(gs_buf *buf, int64_t value) {
  char digits[20];
  size_t n = 0;
  // Negate as unsigned, so that INT64_MIN works.
  uint64_t magnitude = value < 0 ? (uint64_t)0 - (uint64_t)value : (uint64_t)value;
  do {
    digits[n++] = (char)('0' + magnitude % 10);
    magnitude /= 10;
  } while (magnitude);
  if (value < 0) gs_buf_bytes(buf, "-", 1);
  buf_reserve(buf, n);
  while (n) buf->ptr[buf->len++] = (uint8_t)digits[--n];
}

void gs_buf_json_string(gs_buf *buf, const uint8_t *bytes, size_t len) {
  static const char hex[] = "0123456789abcdef";
  gs_buf_bytes(buf, "\"", 1);
  size_t start = 0;
  for (size_t i = 0; i < len; i++) {
    uint8_t c = bytes[i];
    const char *escape = NULL;
    char unicode[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
    switch (c) {
      case '"': escape = "\\\""; break;
      case '\\': escape = "\\\\"; break;
      case '\b': escape = "\\b"; break;
      case '\f': escape = "\\f"; break;
      case '\n': escape = "\\n"; break;
      case '\r': escape = "\\r"; break;
      case '\t': escape = "\\t"; break;
      default:
        if (c >= 0x20) continue;
    }
    gs_buf_bytes(buf, bytes + start, i - start);
    if (escape) {
      gs_buf_cstr(buf, escape);
    } else {
      gs_buf_bytes(buf, unicode, sizeof unicode);
    }
    start = i + 1;
  }
  gs_buf_bytes(buf, bytes + start, len - start);
  gs_buf_bytes(buf, "\"", 1);
}

void gs_buf_into_string(gs_buf *buf, state_function_string_t *out) {
  out->ptr = buf->ptr;
  out->len = buf->len;
  if (buf->len == 0) {  // The post-return function frees only non-empty strings.
    free(buf->ptr);
    out->ptr = NULL;
  }
  *buf = (gs_buf){0};
}

void gs_buf_free(gs_buf *buf) {
  free(buf->ptr);
  *buf = (gs_buf){0};
}

// ---- arithmetic ----------------------------------------------------------------------

int64_t gs_sat_add(int64_t a, int64_t b) {
  int64_t sum;
  if (__builtin_add_overflow(a, b, &sum)) return b > 0 ? INT64_MAX : INT64_MIN;
  return sum;
}

int64_t gs_sat_sub(int64_t a, int64_t b) {
  int64_t diff;
  if (__builtin_sub_overflow(a, b, &diff)) return b < 0 ? INT64_MAX : INT64_MIN;
  return diff;
}

// ---- parameters ----------------------------------------------------------------------

static bool str_is(const state_function_string_t *s, const char *text) {
  size_t len = strlen(text);
  return s->len == len && memcmp(s->ptr, text, len) == 0;
}

bool gs_params_reject_unknown(const state_function_list_tuple2_string_string_t *params, const char *const *known,
                              size_t count, state_function_string_t *err) {
  for (size_t i = 0; i < params->len; i++) {
    const state_function_string_t *name = &params->ptr[i].f0;
    bool found = false;
    for (size_t k = 0; k < count && !found; k++) found = str_is(name, known[k]);
    if (found) continue;
    gs_buf msg = {0};
    gs_buf_cstr(&msg, "parameter `");
    gs_buf_bytes(&msg, name->ptr, name->len);
    gs_buf_cstr(&msg, "` is not a parameter of this plugin (it knows ");
    for (size_t k = 0; k < count; k++) {
      if (k) gs_buf_cstr(&msg, ", ");
      gs_buf_cstr(&msg, known[k]);
    }
    gs_buf_cstr(&msg, "): remove it or fix its name");
    gs_buf_into_string(&msg, err);
    return false;
  }
  return true;
}

// Rust's `i64::from_str`, with its error messages.
static const char *parse_i64(const uint8_t *text, size_t len, int64_t *out) {
  if (len == 0) return "cannot parse integer from empty string";
  size_t i = 0;
  bool negative = false;
  if (text[0] == '+' || text[0] == '-') {
    negative = text[0] == '-';
    i = 1;
    if (len == 1) return "invalid digit found in string";
  }
  uint64_t limit = negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
  uint64_t value = 0;
  const char *overflow = NULL;
  for (; i < len; i++) {
    if (text[i] < '0' || text[i] > '9') return "invalid digit found in string";
    unsigned digit = text[i] - '0';
    if (!overflow && (value > (limit - digit) / 10)) {
      overflow = negative ? "number too small to fit in target type" : "number too large to fit in target type";
    }
    if (!overflow) value = value * 10 + digit;
  }
  if (overflow) return overflow;
  *out = negative ? (int64_t)((uint64_t)0 - value) : (int64_t)value;
  return NULL;
}

bool gs_params_i64(const state_function_list_tuple2_string_string_t *params, const char *name, int64_t fallback,
                   int64_t *out, state_function_string_t *err) {
  const state_function_string_t *text = NULL;
  for (size_t i = 0; i < params->len; i++) {
    if (str_is(&params->ptr[i].f0, name)) text = &params->ptr[i].f1;
  }
  if (!text) {
    *out = fallback;
    return true;
  }
  const char *problem = parse_i64(text->ptr, text->len, out);
  if (!problem) return true;
  gs_buf msg = {0};
  gs_buf_cstr(&msg, "parameter `");
  gs_buf_cstr(&msg, name);
  gs_buf_cstr(&msg, "` is `");
  gs_buf_bytes(&msg, text->ptr, text->len);
  gs_buf_cstr(&msg, "`, not a valid i64 (");
  gs_buf_cstr(&msg, problem);
  gs_buf_cstr(&msg, "): pass --param ");
  gs_buf_cstr(&msg, name);
  gs_buf_cstr(&msg, "=<i64>");
  gs_buf_into_string(&msg, err);
  return false;
}

bool gs_param_error(const char *name, const char *problem, int64_t value, state_function_string_t *err) {
  gs_buf msg = {0};
  gs_buf_cstr(&msg, "parameter `");
  gs_buf_cstr(&msg, name);
  gs_buf_cstr(&msg, "` ");
  gs_buf_cstr(&msg, problem);
  gs_buf_i64(&msg, value);
  gs_buf_into_string(&msg, err);
  return false;
}

// ---- JSON ----------------------------------------------------------------------------

typedef struct {
  const uint8_t *p;
  const uint8_t *end;
  const char *error;
} json_reader;

enum { JSON_DEPTH_MAX = 128 };

static void json_ws(json_reader *r) {
  while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')) r->p++;
}

static bool json_fail(json_reader *r, const char *error) {
  if (!r->error) r->error = error;
  return false;
}

static int hex_digit(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A string literal at r->p (at its opening quote); with `decoded`, its value goes
// there as UTF-8 (lone surrogates are refused, as serde_json does).
static bool json_string(json_reader *r, gs_buf *decoded) {
  r->p++;
  while (r->p < r->end) {
    uint8_t c = *r->p++;
    if (c == '"') return true;
    if (c < 0x20) return json_fail(r, "control character in a string");
    if (c != '\\') {
      if (decoded) gs_buf_bytes(decoded, &c, 1);
      continue;
    }
    if (r->p >= r->end) break;
    uint8_t e = *r->p++;
    const char *simple = NULL;
    switch (e) {
      case '"': simple = "\""; break;
      case '\\': simple = "\\"; break;
      case '/': simple = "/"; break;
      case 'b': simple = "\b"; break;
      case 'f': simple = "\f"; break;
      case 'n': simple = "\n"; break;
      case 'r': simple = "\r"; break;
      case 't': simple = "\t"; break;
      case 'u': break;
      default: return json_fail(r, "invalid escape in a string");
    }
    if (simple) {
      if (decoded) gs_buf_bytes(decoded, simple, 1);
      continue;
    }
    uint32_t code = 0;
    for (int pair = 0; pair < 2; pair++) {
      if (r->end - r->p < 4) return json_fail(r, "invalid \\u escape in a string");
      uint32_t unit = 0;
      for (int k = 0; k < 4; k++) {
        int h = hex_digit(r->p[k]);
        if (h < 0) return json_fail(r, "invalid \\u escape in a string");
        unit = unit * 16 + (uint32_t)h;
      }
      r->p += 4;
      if (pair == 0) {
        if (unit >= 0xDC00 && unit <= 0xDFFF) return json_fail(r, "lone surrogate in a string");
        code = unit;
        if (unit < 0xD800 || unit > 0xDBFF) break;
        if (r->end - r->p < 2 || r->p[0] != '\\' || r->p[1] != 'u') return json_fail(r, "lone surrogate in a string");
        r->p += 2;
      } else {
        if (unit < 0xDC00 || unit > 0xDFFF) return json_fail(r, "lone surrogate in a string");
        code = 0x10000 + ((code - 0xD800) << 10) + (unit - 0xDC00);
      }
    }
    if (decoded) {
      uint8_t utf8[4];
      size_t n;
      if (code < 0x80) {
        utf8[0] = (uint8_t)code, n = 1;
      } else if (code < 0x800) {
        utf8[0] = (uint8_t)(0xC0 | code >> 6), utf8[1] = (uint8_t)(0x80 | (code & 0x3F)), n = 2;
      } else if (code < 0x10000) {
        utf8[0] = (uint8_t)(0xE0 | code >> 12), utf8[1] = (uint8_t)(0x80 | ((code >> 6) & 0x3F));
        utf8[2] = (uint8_t)(0x80 | (code & 0x3F)), n = 3;
      } else {
        utf8[0] = (uint8_t)(0xF0 | code >> 18), utf8[1] = (uint8_t)(0x80 | ((code >> 12) & 0x3F));
        utf8[2] = (uint8_t)(0x80 | ((code >> 6) & 0x3F)), utf8[3] = (uint8_t)(0x80 | (code & 0x3F)), n = 4;
      }
      gs_buf_bytes(decoded, utf8, n);
    }
  }
  return json_fail(r, "unterminated string");
}

static bool json_digits(json_reader *r) {
  const uint8_t *start = r->p;
  while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
  return r->p > start;
}

static bool json_number(json_reader *r) {
  if (*r->p == '-') r->p++;
  if (r->p < r->end && *r->p == '0') {
    r->p++;
  } else if (!json_digits(r)) {
    return json_fail(r, "invalid number");
  }
  if (r->p < r->end && *r->p == '.') {
    r->p++;
    if (!json_digits(r)) return json_fail(r, "invalid number");
  }
  if (r->p < r->end && (*r->p == 'e' || *r->p == 'E')) {
    r->p++;
    if (r->p < r->end && (*r->p == '+' || *r->p == '-')) r->p++;
    if (!json_digits(r)) return json_fail(r, "invalid number");
  }
  return true;
}

static bool json_literal(json_reader *r, const char *word) {
  size_t len = strlen(word);
  if ((size_t)(r->end - r->p) < len || memcmp(r->p, word, len) != 0) return json_fail(r, "expected a JSON value");
  r->p += len;
  return true;
}

static bool json_value(json_reader *r, int depth);

// An object or array at r->p (at its opening bracket), its contents skipped.
static bool json_container(json_reader *r, int depth) {
  if (depth >= JSON_DEPTH_MAX) return json_fail(r, "nested too deeply");
  bool object = *r->p == '{';
  uint8_t close = object ? '}' : ']';
  r->p++;
  json_ws(r);
  if (r->p < r->end && *r->p == close) {
    r->p++;
    return true;
  }
  for (;;) {
    if (object) {
      if (r->p >= r->end || *r->p != '"') return json_fail(r, "expected a field name");
      if (!json_string(r, NULL)) return false;
      json_ws(r);
      if (r->p >= r->end || *r->p != ':') return json_fail(r, "expected `:`");
      r->p++;
    }
    if (!json_value(r, depth + 1)) return false;
    json_ws(r);
    if (r->p < r->end && *r->p == ',') {
      r->p++;
      json_ws(r);
      continue;
    }
    if (r->p < r->end && *r->p == close) {
      r->p++;
      return true;
    }
    return json_fail(r, object ? "expected `,` or `}`" : "expected `,` or `]`");
  }
}

static bool json_value(json_reader *r, int depth) {
  json_ws(r);
  if (r->p >= r->end) return json_fail(r, "expected a JSON value");
  switch (*r->p) {
    case '{':
    case '[': return json_container(r, depth);
    case '"': return json_string(r, NULL);
    case 't': return json_literal(r, "true");
    case 'f': return json_literal(r, "false");
    case 'n': return json_literal(r, "null");
    default:
      if (*r->p == '-' || (*r->p >= '0' && *r->p <= '9')) return json_number(r);
      return json_fail(r, "expected a JSON value");
  }
}

bool gs_json_fields(gs_str json, const char *const *names, size_t count, gs_str *values, gs_buf *why) {
  json_reader r = {json.ptr, json.ptr + json.len, NULL};
  for (size_t i = 0; i < count; i++) values[i] = (gs_str){NULL, 0};
  json_ws(&r);
  if (r.p >= r.end || *r.p != '{') {
    gs_buf_cstr(why, "expected a JSON object");
    return false;
  }
  r.p++;
  json_ws(&r);
  bool ok = true;
  if (r.p < r.end && *r.p == '}') {
    r.p++;
  } else {
    gs_buf name = {0};
    for (;;) {
      if (r.p >= r.end || *r.p != '"') {
        ok = json_fail(&r, "expected a field name");
        break;
      }
      // The field name: raw when it has no escapes (the usual case), else decoded.
      gs_str key = {r.p + 1, 0};
      const uint8_t *quote = memchr(key.ptr, '"', (size_t)(r.end - key.ptr));
      if (quote && !memchr(key.ptr, '\\', (size_t)(quote - key.ptr))) {
        key.len = (size_t)(quote - key.ptr);
        for (size_t k = 0; k < key.len; k++) {
          if (key.ptr[k] < 0x20) ok = json_fail(&r, "control character in a string");
        }
        if (!ok) break;
        r.p = quote + 1;
      } else {
        name.len = 0;
        if (!(ok = json_string(&r, &name))) break;
        key = (gs_str){name.ptr, name.len};
      }
      json_ws(&r);
      if (r.p >= r.end || *r.p != ':') {
        ok = json_fail(&r, "expected `:`");
        break;
      }
      r.p++;
      json_ws(&r);
      const uint8_t *start = r.p;
      if (!(ok = json_value(&r, 1))) break;
      for (size_t i = 0; i < count; i++) {
        size_t len = strlen(names[i]);
        if (key.len != len || memcmp(key.ptr, names[i], len) != 0) continue;
        if (values[i].ptr) {
          gs_buf_cstr(why, "duplicate field `");
          gs_buf_cstr(why, names[i]);
          gs_buf_cstr(why, "`");
          gs_buf_free(&name);
          return false;
        }
        values[i] = (gs_str){start, (size_t)(r.p - start)};
      }
      json_ws(&r);
      if (r.p < r.end && *r.p == ',') {
        r.p++;
        json_ws(&r);
        continue;
      }
      if (r.p < r.end && *r.p == '}') {
        r.p++;
        break;
      }
      ok = json_fail(&r, "expected `,` or `}`");
      break;
    }
    gs_buf_free(&name);
  }
  if (ok) {
    json_ws(&r);
    if (r.p != r.end) ok = json_fail(&r, "trailing characters");
  }
  if (!ok) {
    gs_buf_cstr(why, r.error);
    gs_buf_cstr(why, " at byte ");
    gs_buf_i64(why, (int64_t)(r.p - json.ptr));
  }
  return ok;
}

bool gs_json_i64(gs_str value, int64_t *out) {
  // JSON integers only: no fraction, no exponent, no leading zeros, no `+`.
  if (value.len == 0 || value.ptr[0] == '+') return false;
  if (value.len > 1 && value.ptr[value.ptr[0] == '-'] == '0' && value.len > (size_t)(value.ptr[0] == '-') + 1) {
    return false;
  }
  return parse_i64(value.ptr, value.len, out) == NULL;
}

bool gs_json_string_is(gs_str value, const char *text) {
  if (value.len < 2 || value.ptr[0] != '"') return false;
  size_t len = strlen(text);
  // Fast path: no escapes.
  if (value.len == len + 2 && memcmp(value.ptr + 1, text, len) == 0) return true;
  if (!memchr(value.ptr, '\\', value.len)) return false;
  json_reader r = {value.ptr, value.ptr + value.len, NULL};
  gs_buf decoded = {0};
  bool is = json_string(&r, &decoded) && decoded.len == len && memcmp(decoded.ptr, text, len) == 0;
  gs_buf_free(&decoded);
  return is;
}

#ifndef GS_KEYED
// ---- group state ---------------------------------------------------------------------

bool gs_state_has_timed_out(gs_state state) { return groupstate_plugin_state_method_group_state_has_timed_out(state); }

bool gs_state_get(gs_state state, state_function_list_u8_t *out) {
  return groupstate_plugin_state_method_group_state_get(state, out);
}

void gs_state_remove(gs_state state) { groupstate_plugin_state_method_group_state_remove(state); }

static const char *kind_name(groupstate_plugin_types_timeout_kind_t kind) {
  switch (kind) {
    case GROUPSTATE_PLUGIN_TYPES_TIMEOUT_KIND_NONE: return "none";
    case GROUPSTATE_PLUGIN_TYPES_TIMEOUT_KIND_PROCESSING_TIME: return "processing-time";
    default: return "event-time";
  }
}

// The Rust SDK's message for a refused request; `given` is what the plugin passed.
static bool state_error(const groupstate_plugin_state_state_error_t *error, int64_t given,
                        state_function_string_t *err) {
  gs_buf msg = {0};
  switch (error->tag) {
    case GROUPSTATE_PLUGIN_TYPES_STATE_ERROR_TIMEOUT_KIND_MISMATCH:
      gs_buf_cstr(&msg, "the timeout setter does not match the pipeline's timeout kind `");
      gs_buf_cstr(&msg, kind_name(error->val.timeout_kind_mismatch));
      gs_buf_cstr(&msg,
                  "`: use set_timeout_duration with processing-time, set_timeout_timestamp with event-time, "
                  "neither with none");
      break;
    case GROUPSTATE_PLUGIN_TYPES_STATE_ERROR_NON_POSITIVE_TIMEOUT:
      gs_buf_cstr(&msg, "a timeout must be greater than 0 ms, got ");
      gs_buf_i64(&msg, error->val.non_positive_timeout);
      gs_buf_cstr(&msg, ": pass a positive duration or timestamp");
      break;
    case GROUPSTATE_PLUGIN_TYPES_STATE_ERROR_TIMESTAMP_BEFORE_WATERMARK:
      gs_buf_cstr(&msg, "timeout timestamp ");
      gs_buf_i64(&msg, given);
      gs_buf_cstr(&msg, " is before the current watermark ");
      gs_buf_i64(&msg, error->val.timestamp_before_watermark);
      gs_buf_cstr(&msg, ": pick a timestamp at or after the watermark");
      break;
    default:
      gs_buf_cstr(&msg, "state value of ");
      gs_buf_i64(&msg, given);
      gs_buf_cstr(&msg, " bytes is larger than the pipeline's state_bytes_max of ");
      gs_buf_i64(&msg, (int64_t)error->val.state_too_large);
      gs_buf_cstr(&msg, ": keep less per key, or raise the limit when running the host");
      break;
  }
  gs_buf_into_string(&msg, err);
  return false;
}

bool gs_state_update(gs_state state, const uint8_t *bytes, size_t len, state_function_string_t *err) {
  state_function_list_u8_t value = {(uint8_t *)bytes, len};
  groupstate_plugin_state_state_error_t error;
  if (groupstate_plugin_state_method_group_state_update(state, &value, &error)) return true;
  return state_error(&error, (int64_t)len, err);
}

bool gs_state_set_timeout_timestamp(gs_state state, int64_t timestamp_ms, bool *kind_mismatch,
                                    state_function_string_t *err) {
  groupstate_plugin_state_state_error_t error;
  if (kind_mismatch) *kind_mismatch = false;
  if (groupstate_plugin_state_method_group_state_set_timeout_timestamp(state, timestamp_ms, &error)) return true;
  if (kind_mismatch && error.tag == GROUPSTATE_PLUGIN_TYPES_STATE_ERROR_TIMEOUT_KIND_MISMATCH) {
    *kind_mismatch = true;
    return true;
  }
  return state_error(&error, timestamp_ms, err);
}

#endif

void gs_log(groupstate_plugin_log_level_t level, const char *message) {
  state_function_string_t text = {(uint8_t *)message, strlen(message)};
  groupstate_plugin_log_log(level, &text);
}

#ifndef GS_KEYED
bool gs_export_process(gs_process_fn process, bool initialized, state_function_string_t *key,
                       state_function_list_event_t *events, gs_state state, state_function_list_string_t *ret,
                       state_function_string_t *err) {
  *ret = (state_function_list_string_t){NULL, 0};
  bool ok;
  if (initialized) {
    ok = process(key, events, state, ret, err);
  } else {
    state_function_string_dup(err, "process was called before init succeeded: the host must call init on every "
                                   "new instance");
    ok = false;
  }
  if (!ok) {
    state_function_list_string_free(ret);
    *ret = (state_function_list_string_t){NULL, 0};
  }
  state_function_string_free(key);
  state_function_list_event_free(events);
  return ok;
}
#endif
