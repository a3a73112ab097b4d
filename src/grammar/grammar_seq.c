/* GERBIL_GRAMMAR_SEQUENCE: repeated, wrapped items built from literals, JSON Schema values
 * and regexes. The server's forced tool calls use it: "<tool_call>\n" + a call object whose
 * arguments follow the function's parameters schema + "\n</tool_call>", one or more times. */
#include "base/status.h"
#include "grammar/grammar.h"

#include <cjson/cJSON.h>
#include <string.h>

static gerbil_status parts_rule(gir *g, const cJSON *parts, const gschema_opts *o, int depth, int *out);

static gerbil_status part_rule(gir *g, const cJSON *part, const gschema_opts *o, int depth, int *out) {
    if (cJSON_IsString(part)) {
        *out = gir_rule_lit(g, part->valuestring, strlen(part->valuestring));
        return GERBIL_OK;
    }
    const cJSON *v;
    if (!cJSON_IsObject(part)) return err_set(GERBIL_ERR_FORMAT, "grammar sequence: a part must be a string or an object");
    if ((v = cJSON_GetObjectItemCaseSensitive(part, "schema"))) {
        GB_TRY(gir_from_schema(g, v, o));
        *out = g->root;
        return GERBIL_OK;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(part, "regex"))) {
        if (!cJSON_IsString(v)) return err_set(GERBIL_ERR_FORMAT, "grammar sequence: \"regex\" must be a string");
        return gir_from_regex(g, v->valuestring, strlen(v->valuestring), GRX_PLAIN, 0, out);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(part, "optional"))) {
        int body;
        GB_TRY(parts_rule(g, v, o, depth + 1, &body));
        *out = gir_repeat(g, body, 0, 1);
        return GERBIL_OK;
    }
    return err_set(GERBIL_ERR_FORMAT, "grammar sequence: a part object needs \"schema\", \"regex\" or \"optional\"");
}

static gerbil_status parts_rule(gir *g, const cJSON *parts, const gschema_opts *o, int depth, int *out) {
    if (depth > 16) return err_set(GERBIL_ERR_FORMAT, "grammar sequence: parts nested too deeply");
    if (!cJSON_IsArray(parts)) return err_set(GERBIL_ERR_FORMAT, "grammar sequence: parts must be an array");
    gseq s = {0};
    const cJSON *p;
    cJSON_ArrayForEach(p, parts) {
        int r;
        gerbil_status st = part_rule(g, p, o, depth, &r);
        if (st != GERBIL_OK) { gseq_free(&s); return st; }
        gseq_rule(&s, r);
    }
    *out = gir_rule(g, NULL);
    gir_alt(g, *out, &s);
    gseq_free(&s);
    return GERBIL_OK;
}

static const char *str_field(const cJSON *o, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsString(v) ? v->valuestring : "";
}

gerbil_status gir_from_sequence(gir *g, const cJSON *spec, const gschema_opts *o) {
    if (!cJSON_IsObject(spec)) return err_set(GERBIL_ERR_FORMAT, "grammar sequence: the spec must be an object");
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(spec, "items");
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(spec, "min"), *mx = cJSON_GetObjectItemCaseSensitive(spec, "max");
    const int min = cJSON_IsNumber(mn) ? mn->valueint : 1, max = cJSON_IsNumber(mx) ? mx->valueint : 1;
    if (!cJSON_IsArray(items) || cJSON_GetArraySize(items) == 0)
        return err_set(GERBIL_ERR_FORMAT, "grammar sequence: \"items\" must be a non-empty array");
    if (min < 0 || (max >= 0 && max < (min > 1 ? min : 1)) || min > 64 || max > 64)
        return err_set(GERBIL_ERR_FORMAT, "grammar sequence: bad min/max (%d, %d)", min, max);
    /* item ::= alternative_1 | alternative_2 | ... */
    const int item = gir_rule(g, NULL);
    const cJSON *alt;
    cJSON_ArrayForEach(alt, items) {
        int r;
        GB_TRY(parts_rule(g, alt, o, 0, &r));
        gseq s = {0};
        gseq_rule(&s, r);
        gir_alt(g, item, &s);
        gseq_free(&s);
    }
    /* list ::= item (separator item){min-1 .. max-1} */
    const char *sep = str_field(spec, "separator");
    gseq s = {0};
    gseq_lit(g, &s, sep, strlen(sep));
    gseq_rule(&s, item);
    const int more = gir_rule(g, NULL);
    gir_alt(g, more, &s);
    gseq_free(&s);
    const int lo = min > 1 ? min - 1 : 0, hi = max < 0 ? -1 : max - 1;
    gseq_rule(&s, item);
    gseq_rule(&s, gir_repeat(g, more, lo, hi));
    const int list = gir_rule(g, NULL);
    gir_alt(g, list, &s);
    gseq_free(&s);
    /* root ::= open list close | (min 0) open close */
    const char *open = str_field(spec, "open"), *close = str_field(spec, "close");
    const int root = gir_rule(g, NULL);
    gseq_lit(g, &s, open, strlen(open));
    gseq_rule(&s, list);
    gseq_lit(g, &s, close, strlen(close));
    gir_alt(g, root, &s);
    gseq_free(&s);
    if (min == 0) {
        gseq_lit(g, &s, open, strlen(open));
        gseq_lit(g, &s, close, strlen(close));
        gir_alt(g, root, &s);
        gseq_free(&s);
    }
    if (g->oom) return err_set(GERBIL_ERR_NOMEM, "grammar sequence: out of memory");
    g->root = root;
    return GERBIL_OK;
}
