/* Post-processors (tokenizers/src/processors) for one sequence: what
 * add_special_tokens=True puts around the ids. Offsets/type ids are not kept. */
#include "text/tok_internal.h"

#include <stdlib.h>
#include <string.h>

enum { PP_TEMPLATE, PP_BERT, PP_ROBERTA, PP_BYTELEVEL, PP_SEQ };

typedef struct pp_item {
    int is_seq;
    int32_t *ids;
    int n;
} pp_item;

struct tk_post {
    int type;
    tk_post **kids;
    int n_kids;
    pp_item *items;
    int n_items;
    int32_t cls, sep;
};

static const char *str_or_null(const cJSON *x) { return cJSON_IsString(x) ? x->valuestring : NULL; }

void tk_post_free(tk_post *p) {
    if (!p) return;
    for (int i = 0; i < p->n_kids; i++) tk_post_free(p->kids[i]);
    free(p->kids);
    for (int i = 0; i < p->n_items; i++) free(p->items[i].ids);
    free(p->items);
    free(p);
}

static gerbil_status parse_pair(const cJSON *j, const char *key, int32_t *id, const char *path) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    const cJSON *n = cJSON_IsArray(v) ? cJSON_GetArrayItem(v, 1) : NULL;
    if (!cJSON_IsNumber(n) || n->valuedouble < 0)
        return err_set(GERBIL_ERR_FORMAT, "%s: post_processor.%s must be [token, id]", path, key);
    *id = (int32_t)n->valuedouble;
    return GERBIL_OK;
}

static gerbil_status parse_template(tk_post *p, const cJSON *j, const char *path) {
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(j, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(j, "special_tokens");
    if (!cJSON_IsArray(single))
        return err_set(GERBIL_ERR_UNSUPPORTED, "%s: TemplateProcessing \"single\" must be a list of pieces", path);
    p->items = calloc((size_t)cJSON_GetArraySize(single) + 1, sizeof *p->items);
    if (!p->items) return GERBIL_ERR_NOMEM;
    const cJSON *it;
    cJSON_ArrayForEach(it, single) {
        pp_item *item = &p->items[p->n_items++];
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(it, "Sequence");
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
        if (seq) {
            item->is_seq = 1;
            continue;
        }
        const char *name = sp ? str_or_null(cJSON_GetObjectItemCaseSensitive(sp, "id")) : NULL;
        if (!name) return err_set(GERBIL_ERR_FORMAT, "%s: TemplateProcessing piece is neither Sequence nor SpecialToken", path);
        const cJSON *def = cJSON_GetObjectItemCaseSensitive(specials, name);
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(def, "ids");
        if (!cJSON_IsArray(ids))
            return err_set(GERBIL_ERR_FORMAT, "%s: TemplateProcessing special token \"%s\" is not in special_tokens", path, name);
        item->n = cJSON_GetArraySize(ids);
        item->ids = calloc((size_t)item->n + 1, sizeof *item->ids);
        if (!item->ids) return GERBIL_ERR_NOMEM;
        int k = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, ids) {
            if (!cJSON_IsNumber(x) || x->valuedouble < 0)
                return err_set(GERBIL_ERR_FORMAT, "%s: TemplateProcessing special token \"%s\": bad id", path, name);
            item->ids[k++] = (int32_t)x->valuedouble;
        }
    }
    return GERBIL_OK;
}

gerbil_status tk_post_parse(const cJSON *j, const char *path, tk_post **out) {
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return GERBIL_OK;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(ty)) return err_set(GERBIL_ERR_FORMAT, "%s: post_processor without a \"type\"", path);
    const char *t = ty->valuestring;
    tk_post *p = calloc(1, sizeof *p);
    if (!p) return GERBIL_ERR_NOMEM;
    gerbil_status st = GERBIL_OK;
    if (!strcmp(t, "TemplateProcessing")) {
        p->type = PP_TEMPLATE;
        st = parse_template(p, j, path);
    } else if (!strcmp(t, "BertProcessing") || !strcmp(t, "RobertaProcessing")) {
        p->type = t[0] == 'B' ? PP_BERT : PP_ROBERTA;
        st = parse_pair(j, "cls", &p->cls, path);
        if (!st) st = parse_pair(j, "sep", &p->sep, path);
    } else if (!strcmp(t, "ByteLevel")) {
        p->type = PP_BYTELEVEL;
    } else if (!strcmp(t, "Sequence")) {
        p->type = PP_SEQ;
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "processors");
        if (!cJSON_IsArray(list)) {
            st = err_set(GERBIL_ERR_FORMAT, "%s: Sequence post_processor without a \"processors\" list", path);
        } else {
            p->kids = calloc((size_t)cJSON_GetArraySize(list) + 1, sizeof *p->kids);
            if (!p->kids) st = GERBIL_ERR_NOMEM;
            const cJSON *it;
            cJSON_ArrayForEach(it, list) {
                if (st) break;
                st = tk_post_parse(it, path, &p->kids[p->n_kids]);
                if (p->kids[p->n_kids]) p->n_kids++;
            }
        }
    } else {
        st = err_set(GERBIL_ERR_UNSUPPORTED, "%s: unknown post_processor type \"%s\"", path, t);
    }
    if (st != GERBIL_OK) {
        tk_post_free(p);
        return st;
    }
    *out = p;
    return GERBIL_OK;
}

gerbil_status tk_post_bos_eos(int32_t bos, int32_t eos, tk_post **out) {
    tk_post *p = calloc(1, sizeof *p);
    if (!p || !(p->items = calloc(3, sizeof *p->items))) {
        free(p);
        return GERBIL_ERR_NOMEM;
    }
    p->type = PP_TEMPLATE;
    int32_t ends[2] = {bos, eos};
    for (int k = 0; k < 3; k++) {
        if (k == 1) {
            p->items[p->n_items++].is_seq = 1;
            continue;
        }
        int32_t id = ends[k / 2];
        if (id < 0) continue;
        pp_item *it = &p->items[p->n_items++];
        if (!(it->ids = malloc(sizeof *it->ids))) {
            tk_post_free(p);
            return GERBIL_ERR_NOMEM;
        }
        it->ids[0] = id;
        it->n = 1;
    }
    *out = p;
    return GERBIL_OK;
}

gerbil_status tk_post_apply(const tk_post *p, tk_ids *ids, int add_special) {
    if (!p || !add_special) return GERBIL_OK;
    if (p->type == PP_SEQ) {
        for (int k = 0; k < p->n_kids; k++) GB_TRY(tk_post_apply(p->kids[k], ids, add_special));
        return GERBIL_OK;
    }
    if (p->type == PP_BYTELEVEL) return GERBIL_OK;
    tk_ids out = {0};
    int rc = 0;
    if (p->type == PP_TEMPLATE) {
        for (int i = 0; i < p->n_items && !rc; i++) {
            const pp_item *it = &p->items[i];
            if (it->is_seq)
                for (size_t k = 0; k < ids->n && !rc; k++) rc = tk_ids_push(&out, ids->v[k]);
            else
                for (int k = 0; k < it->n && !rc; k++) rc = tk_ids_push(&out, it->ids[k]);
        }
    } else { /* Bert, Roberta: [cls] A [sep] */
        rc = tk_ids_push(&out, p->cls);
        for (size_t k = 0; k < ids->n && !rc; k++) rc = tk_ids_push(&out, ids->v[k]);
        if (!rc) rc = tk_ids_push(&out, p->sep);
    }
    if (rc) {
        tk_ids_free(&out);
        return GERBIL_ERR_NOMEM;
    }
    tk_ids_free(ids);
    *ids = out;
    return GERBIL_OK;
}

int32_t tk_post_first_special(const tk_post *p) {
    if (!p) return -1;
    switch (p->type) {
    case PP_SEQ:
        for (int k = 0; k < p->n_kids; k++) {
            int32_t r = tk_post_first_special(p->kids[k]);
            if (r >= 0) return r;
        }
        return -1;
    case PP_TEMPLATE: return (p->n_items && !p->items[0].is_seq && p->items[0].n) ? p->items[0].ids[0] : -1;
    case PP_BERT:
    case PP_ROBERTA: return p->cls;
    default: return -1;
    }
}

int32_t tk_post_last_special(const tk_post *p) {
    if (!p) return -1;
    switch (p->type) {
    case PP_SEQ:
        for (int k = p->n_kids; k-- > 0;) {
            int32_t r = tk_post_last_special(p->kids[k]);
            if (r >= 0) return r;
        }
        return -1;
    case PP_TEMPLATE: {
        const pp_item *l = p->n_items ? &p->items[p->n_items - 1] : NULL;
        return (l && !l->is_seq && l->n) ? l->ids[l->n - 1] : -1;
    }
    case PP_BERT:
    case PP_ROBERTA: return p->sep;
    default: return -1;
    }
}
