/* Which files of a repo gerbil needs: the config, tokenizer and template files and the
 * weights of one format. Safetensors win when the repo has config.json and them; else
 * one GGUF file: the one asked for (":FILE.gguf" or a tag such as ":Q8_0"), the only
 * one, or, among several, the Q4_K_M one (said through the notice callback). The same
 * rules pick the model inside a cached snapshot. */
#include "hub/hub.h"
#include "io/json.h"

#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#define DEFAULT_GGUF_TAG "Q4_K_M"

static const char *const side_files[] = {
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "chat_template.jinja", "chat_template.json",
};

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static int is_side_file(const char *path) {
    for (size_t i = 0; i < sizeof side_files / sizeof side_files[0]; i++)
        if (!strcmp(path, side_files[i])) return 1;
    return 0;
}

static int is_top_safetensors(const char *path) {
    return !strchr(path, '/') && hub_ends_with(path, ".safetensors");
}

/* GGUF weights, not the vision projector some repos ship beside them. */
static int is_model_gguf(const char *path) {
    return hub_ends_with(path, ".gguf") && strncasecmp(base_name(path), "mmproj", 6) != 0;
}

/* A tag matches a whole dash/dot/underscore-delimited run of the base name:
 * "Q4_K" matches "m-Q4_K.gguf" but not "m-Q4_K_M.gguf". */
static int tag_matches(const char *path, const char *tag) {
    const char *name = base_name(path);
    size_t n = strlen(tag);
    for (const char *s = name; *s; s++) {
        if (strncasecmp(s, tag, n)) continue;
        int start_ok = s == name || s[-1] == '-' || s[-1] == '.' || s[-1] == '_';
        if (start_ok && (s[n] == '.' || s[n] == '-')) return 1;
    }
    return 0;
}

static int gguf_matches(const char *path, const char *select) {
    if (!is_model_gguf(path) && !hub_ends_with(select, ".gguf")) return 0;
    if (hub_ends_with(select, ".gguf")) return !strcmp(path, select) || !strcmp(base_name(path), select);
    return tag_matches(path, select);
}

/* Pick a GGUF among names[0..n): returns its index, -1 when none fits, -2 when several
 * do. *defaulted = 1 when several were there and the default tag chose. */
static int choose_gguf(char *const *names, int n, const char *select, int *defaulted) {
    int found = -1, count = 0;
    *defaulted = 0;
    const char *want = select && select[0] ? select : NULL;
    for (int pass = 0; pass < 2 && count != 1; pass++) {
        found = -1;
        count = 0;
        for (int i = 0; i < n; i++) {
            int ok = want ? gguf_matches(names[i], want) : is_model_gguf(names[i]);
            if (ok) { found = found < 0 ? i : found; count++; }
        }
        if (want || count <= 1) break;
        want = DEFAULT_GGUF_TAG; /* several and none asked for: try the default */
        *defaulted = 1;
    }
    if (count == 1) return found;
    if (*defaulted && count == 0) { *defaulted = 0; return -2; }
    return count == 0 ? -1 : -2;
}

/* "a, b, c" of the names that pass keep (all when keep is NULL), at most ~1 KiB. */
static void list_names(char *const *names, int n, int (*keep)(const char *), char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < n && len + 8 < cap; i++) {
        if (keep && !keep(names[i])) continue;
        int w = snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", names[i]);
        if (w < 0 || (size_t)w >= cap - len) { strcpy(buf + (cap > 5 ? cap - 5 : 0), "..."); break; }
        len += (size_t)w;
    }
    if (!buf[0]) snprintf(buf, cap, "(none)");
}

/* ---- the hub's JSON ---- */

void hub_revision_free(struct hub_revision *r) {
    for (int i = 0; i < r->n_files; i++) {
        free(r->files[i].path);
        free(r->files[i].etag);
    }
    free(r->files);
    r->files = NULL;
    r->n_files = 0;
}

/* Repo paths come from the network: they must stay inside the snapshot folder. */
static int safe_repo_path(const char *p) {
    if (!p[0] || p[0] == '/' || strlen(p) > 1000) return 0;
    for (const char *s = p; *s; s++)
        if ((unsigned char)*s < ' ' || *s == '\\') return 0;
    for (const char *s = p; s; s = strchr(s, '/'), s = s ? s + 1 : NULL)
        if (!strncmp(s, "..", 2) && (s[2] == '/' || !s[2])) return 0;
    return !strstr(p, "//") && p[strlen(p) - 1] != '/';
}

static int hex_of_len(const char *s, size_t n) {
    if (!s || strlen(s) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isxdigit((unsigned char)s[i])) return 0;
    return 1;
}

static gerbil_status file_from_json(const cJSON *e, struct hub_file *f) {
    memset(f, 0, sizeof *f);
    f->size = HUB_SIZE_UNKNOWN;
    const char *name = json_get_str(e, "rfilename", NULL);
    const cJSON *lfs = cJSON_GetObjectItemCaseSensitive(e, "lfs");
    const char *etag = NULL;
    double size = json_get_num(e, "size", -1);
    if (cJSON_IsObject(lfs) && hex_of_len(json_get_str(lfs, "sha256", NULL), 64)) {
        etag = json_get_str(lfs, "sha256", NULL);
        size = json_get_num(lfs, "size", size);
        f->lfs = 1;
    } else if (hex_of_len(json_get_str(e, "blobId", NULL), 40)) {
        etag = json_get_str(e, "blobId", NULL);
    }
    if (size >= 0 && size < 9.0e15) f->size = (uint64_t)size;
    f->path = name ? strdup(name) : NULL;
    f->etag = etag ? strdup(etag) : NULL;
    if (f->etag)
        for (char *s = f->etag; *s; s++) *s = (char)tolower((unsigned char)*s);
    return f->path && (!etag || f->etag) ? GERBIL_OK : err_set(GERBIL_ERR_NOMEM, "out of memory");
}

gerbil_status hub_revision_from_json(const cJSON *doc, const char *what, struct hub_revision *r) {
    memset(r, 0, sizeof *r);
    const char *sha = json_get_str(doc, "sha", NULL);
    const cJSON *sib = cJSON_GetObjectItemCaseSensitive(doc, "siblings");
    if (!sha || !hub_is_commit(sha) || !cJSON_IsArray(sib))
        return err_set(GERBIL_ERR_FORMAT, "%s: the hub's reply has no commit \"sha\" or \"siblings\" list "
                       "(is HF_ENDPOINT a Hugging Face hub?)", what);
    memcpy(r->commit, sha, HUB_COMMIT_LEN + 1);
    int n = cJSON_GetArraySize(sib);
    r->files = calloc(n > 0 ? (size_t)n : 1, sizeof *r->files);
    if (!r->files) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    const cJSON *e;
    cJSON_ArrayForEach(e, sib) {
        const char *name = json_get_str(e, "rfilename", NULL);
        if (!name || !safe_repo_path(name)) continue;
        struct hub_file *f = &r->files[r->n_files++];
        if (file_from_json(e, f) != GERBIL_OK) { hub_revision_free(r); return GERBIL_ERR_NOMEM; }
    }
    return GERBIL_OK;
}

/* ---- choosing from the hub's list ---- */

static int want_safetensors(const char *path, int has_index, int has_single) {
    if (!strcmp(path, "model.safetensors.index.json")) return has_index;
    if (!is_top_safetensors(path)) return 0;
    if (has_index) return strncmp(path, "consolidated", 12) != 0; /* Mistral's duplicate copy */
    return !has_single || !strcmp(path, "model.safetensors");
}

static void keep_files(struct hub_revision *r, const int *keep) {
    int k = 0;
    for (int i = 0; i < r->n_files; i++) {
        if (keep[i]) { r->files[k++] = r->files[i]; continue; }
        free(r->files[i].path);
        free(r->files[i].etag);
    }
    r->n_files = k;
}

static gerbil_status gguf_error(char *const *names, int n, int rc, const struct hub_ref *ref) {
    char list[1024];
    list_names(names, n, is_model_gguf, list, sizeof list);
    if (rc == -1 && ref->select[0])
        return err_set(GERBIL_ERR_NOT_FOUND, "%s@%s has no GGUF file matching \"%s\"; its GGUF files: %s", ref->repo,
                       ref->revision, ref->select, list);
    return err_set(GERBIL_ERR_INVALID_ARG, "%s@%s has several GGUF files%s%s%s; pick one with %s:FILE.gguf "
                   "(or a tag such as %s:Q8_0): %s", ref->repo, ref->revision, ref->select[0] ? " matching \"" : "",
                   ref->select, ref->select[0] ? "\"" : "", ref->repo, ref->repo, list);
}

gerbil_status hub_select_files(struct hub_revision *r, const struct hub_ref *ref, const gerbil_hub_params *p,
                               char **model_path) {
    int has_config = 0, has_index = 0, has_single = 0, n_st = 0;
    char **names = malloc((r->n_files ? (size_t)r->n_files : 1) * sizeof *names);
    int *keep = calloc(r->n_files ? (size_t)r->n_files : 1, sizeof *keep);
    if (!names || !keep) { free(names); free(keep); return err_set(GERBIL_ERR_NOMEM, "out of memory"); }
    for (int i = 0; i < r->n_files; i++) {
        const char *f = names[i] = r->files[i].path;
        has_config |= !strcmp(f, "config.json");
        has_index |= !strcmp(f, "model.safetensors.index.json");
        has_single |= !strcmp(f, "model.safetensors");
        n_st += is_top_safetensors(f);
    }
    gerbil_status st = GERBIL_OK;
    if (!ref->select[0] && has_config && n_st > 0) {
        for (int i = 0; i < r->n_files; i++)
            keep[i] = is_side_file(names[i]) || want_safetensors(names[i], has_index, has_single);
        *model_path = "";
    } else {
        int defaulted, g = choose_gguf(names, r->n_files, ref->select, &defaulted);
        if (g >= 0) {
            keep[g] = 1;
            *model_path = r->files[g].path;
            if (defaulted && p->notice) {
                char msg[2600], list[1024];
                list_names(names, r->n_files, is_model_gguf, list, sizeof list);
                snprintf(msg, sizeof msg, "%s has several GGUF files; using %s (pick another with %s:FILE.gguf): %s",
                         ref->repo, names[g], ref->repo, list);
                p->notice(p->user, msg);
            }
        } else if (g == -1 && !ref->select[0]) {
            char list[1024];
            list_names(names, r->n_files, NULL, list, sizeof list);
            st = err_set(GERBIL_ERR_UNSUPPORTED, "%s@%s has no weights gerbil can run (config.json with *.safetensors, "
                         "or a .gguf file); its files: %s", ref->repo, ref->revision, list);
        } else {
            st = gguf_error(names, r->n_files, g, ref);
        }
    }
    if (st == GERBIL_OK) keep_files(r, keep);
    free(names);
    free(keep);
    return st;
}

/* ---- choosing inside a cached snapshot ---- */

static int exists(const char *dir, const char *name) {
    char *p = hub_strf("%s/%s", dir, name);
    struct stat st;
    int ok = p && stat(p, &st) == 0 && S_ISREG(st.st_mode); /* follows the blob symlink */
    free(p);
    return ok;
}

/* Every shard the index names is there (the loader reads exactly those). */
static int shards_present(const char *dir) {
    char *path = hub_strf("%s/model.safetensors.index.json", dir);
    cJSON *doc = NULL;
    int ok = path && json_load_file(path, &doc) == GERBIL_OK;
    const cJSON *map = ok ? cJSON_GetObjectItemCaseSensitive(doc, "weight_map") : NULL;
    const cJSON *e;
    ok = cJSON_IsObject(map) && cJSON_GetArraySize(map) > 0;
    cJSON_ArrayForEach(e, map) ok = ok && cJSON_IsString(e) && !strchr(e->valuestring, '/') && exists(dir, e->valuestring);
    cJSON_Delete(doc);
    free(path);
    err_clear();
    return ok;
}

/* File names (relative, one folder deep at most) under dir, for the GGUF choice. */
static int list_dir(const char *dir, const char *prefix, char ***names, int *n, int depth) {
    char *path = prefix[0] ? hub_strf("%s/%s", dir, prefix) : strdup(dir);
    DIR *d = path ? opendir(path) : NULL;
    free(path);
    if (!d) return 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char *rel = prefix[0] ? hub_strf("%s/%s", prefix, de->d_name) : strdup(de->d_name);
        char **nn = rel ? realloc(*names, ((size_t)*n + 1) * sizeof *nn) : NULL;
        if (!nn) { free(rel); break; }
        *names = nn;
        if (exists(dir, rel)) { (*names)[(*n)++] = rel; continue; }
        if (depth > 0) list_dir(dir, rel, names, n, depth - 1);
        free(rel);
    }
    closedir(d);
    return 1;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* config.json and the safetensors the loader will open: the index's shards, or
 * model.safetensors, or any top-level *.safetensors. */
static int safetensors_complete(const char *dir) {
    if (!exists(dir, "config.json")) return 0;
    if (exists(dir, "model.safetensors.index.json")) return shards_present(dir);
    char **names = NULL;
    int n = 0, ok = 0;
    list_dir(dir, "", &names, &n, 0);
    for (int i = 0; i < n; i++) {
        ok |= is_top_safetensors(names[i]);
        free(names[i]);
    }
    free(names);
    return ok;
}

char *hub_snapshot_model(const char *dir, const char *select, const char **format) {
    if (format) *format = NULL;
    if (!select[0] && safetensors_complete(dir)) {
        if (format) *format = "safetensors";
        return strdup(dir);
    }
    char **names = NULL, *out = NULL;
    int n = 0, defaulted;
    list_dir(dir, "", &names, &n, 1);
    if (n) qsort(names, (size_t)n, sizeof *names, cmp_str);
    int g = choose_gguf(names, n, select, &defaulted);
    if (g >= 0) {
        out = hub_strf("%s/%s", dir, names[g]);
        if (format) *format = "gguf";
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    return out;
}
