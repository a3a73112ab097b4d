/* JSON through cJSON: file loading with clear errors, typed getters with defaults. */
#ifndef GB_JSON_H
#define GB_JSON_H

#include "gerbil.h"
#include <cjson/cJSON.h>
#include <stdint.h>

/* Parse a whole file; on failure the message names the file and the byte offset. */
gerbil_status json_load_file(const char *path, cJSON **out);
/* Parse a buffer (not NUL-terminated); what names the source in messages. */
gerbil_status json_parse(const char *buf, size_t len, const char *what, cJSON **out);

/* Getters: the default when the key is absent or null. */
double json_get_num(const cJSON *obj, const char *key, double def);
int64_t json_get_int(const cJSON *obj, const char *key, int64_t def);
int json_get_bool(const cJSON *obj, const char *key, int def);
const char *json_get_str(const cJSON *obj, const char *key, const char *def);
/* Key present and not null. */
int json_has(const cJSON *obj, const char *key);

#endif
