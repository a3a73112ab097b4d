#include "io/json.h"
#include "base/status.h"
#include "io/mmap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* JSON allows whitespace around the value; safetensors writers also pad the header
 * with spaces, and some pad with NULs, so both count as harmless trailing bytes. */
static int is_trailing_pad(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\0';
}

/* How deeply arrays and objects nest in buf (strings skipped); stops counting past limit. */
static int json_depth(const char *buf, size_t len, int limit) {
    int depth = 0, max = 0, in_str = 0;
    for (size_t i = 0; i < len && max <= limit; i++) {
        char ch = buf[i];
        if (in_str) {
            if (ch == '\\') i++;
            else if (ch == '"') in_str = 0;
        } else if (ch == '"') {
            in_str = 1;
        } else if (ch == '[' || ch == '{') {
            if (++depth > max) max = depth;
        } else if (ch == ']' || ch == '}') {
            depth--;
        }
    }
    return max;
}

gerbil_status json_parse(const char *buf, size_t len, const char *what, cJSON **out) {
    *out = NULL;
    if (len == 0 || !buf) return err_set(GERBIL_ERR_FORMAT, "%s: empty, expected JSON", what);

    /* require_null_terminated = 0: the buffer is usually a slice of an mmap with no
     * NUL after it. The end pointer (rather than cJSON_GetErrorPtr, a process-wide
     * global) gives the error position, so parsing from several threads is safe. */
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    if (!root) {
        size_t off = (end && end >= buf && end <= buf + len) ? (size_t)(end - buf) : 0;
        if (json_depth(buf, len, CJSON_NESTING_LIMIT) > CJSON_NESTING_LIMIT)
            return err_set(GERBIL_ERR_FORMAT, "%s: JSON nested too deeply (more than %d levels of arrays and objects)",
                           what, CJSON_NESTING_LIMIT);
        return err_set(GERBIL_ERR_FORMAT, "%s: malformed JSON near byte %zu", what, off);
    }
    /* cJSON stops after the first value; anything but padding after it is a second
     * value or garbage, which a well-formed file never has. */
    size_t off = (end && end >= buf && end <= buf + len) ? (size_t)(end - buf) : len;
    for (size_t i = off; i < len; i++) {
        if (!is_trailing_pad(buf[i])) {
            cJSON_Delete(root);
            return err_set(GERBIL_ERR_FORMAT, "%s: malformed JSON: unexpected data at byte %zu "
                           "after the top-level value", what, i);
        }
    }
    *out = root;
    return GERBIL_OK;
}

gerbil_status json_load_file(const char *path, cJSON **out) {
    *out = NULL;
    struct mapped_file mf;
    GB_TRY(mapped_file_open(path, &mf));
    gerbil_status s = json_parse(mf.data, mf.size, path, out);
    mapped_file_close(&mf);
    return s;
}

/* The item for key, or NULL when absent or JSON null (both mean "use the default"). */
static const cJSON *get_item(const cJSON *obj, const char *key) {
    if (!obj || !cJSON_IsObject(obj)) return NULL;
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    return (it && !cJSON_IsNull(it)) ? it : NULL;
}

double json_get_num(const cJSON *obj, const char *key, double def) {
    const cJSON *it = get_item(obj, key);
    return (it && cJSON_IsNumber(it)) ? it->valuedouble : def;
}

int64_t json_get_int(const cJSON *obj, const char *key, int64_t def) {
    const cJSON *it = get_item(obj, key);
    if (!it || !cJSON_IsNumber(it)) return def;
    double v = it->valuedouble;
    /* Converting an out-of-range double to an integer is undefined behaviour, so clamp
     * first. 9223372036854775808.0 is 2^63, exactly representable. */
    if (isnan(v)) return def;
    if (v >= 9223372036854775808.0) return INT64_MAX;
    if (v < -9223372036854775808.0) return INT64_MIN;
    return (int64_t)v;
}

int json_get_bool(const cJSON *obj, const char *key, int def) {
    const cJSON *it = get_item(obj, key);
    if (!it) return def;
    if (cJSON_IsBool(it)) return cJSON_IsTrue(it) ? 1 : 0;
    /* Some configs write flags as 0/1. */
    if (cJSON_IsNumber(it)) return it->valuedouble != 0.0;
    return def;
}

const char *json_get_str(const cJSON *obj, const char *key, const char *def) {
    const cJSON *it = get_item(obj, key);
    return (it && cJSON_IsString(it) && it->valuestring) ? it->valuestring : def;
}

int json_has(const cJSON *obj, const char *key) {
    return get_item(obj, key) != NULL;
}
