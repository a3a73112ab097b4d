/* Model references: parsing "org/name[@revision][:FILE]" and resolving a reference to
 * a local path, from the cache first and through a pull only when it is missing. */
#include "hub/hub.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

static int name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
}

/* One side of org/name: 1..96 name characters, starting with a letter or digit. */
static int name_part_valid(const char *s, size_t n) {
    if (n == 0 || n > 96 || s[0] == '.' || s[0] == '-' || s[n - 1] == '.') return 0;
    for (size_t i = 0; i < n; i++) {
        if (!name_char(s[i])) return 0;
        if (i && (s[i] == '-' || s[i] == '.') && s[i - 1] == s[i]) return 0; /* "--" or ".." */
    }
    return 1;
}

int hub_repo_id_valid(const char *repo) {
    const char *slash = strchr(repo, '/');
    if (!slash) return 0;
    return name_part_valid(repo, (size_t)(slash - repo)) && name_part_valid(slash + 1, strlen(slash + 1));
}

int hub_is_commit(const char *s) {
    size_t n = 0;
    for (; s[n]; n++)
        if (!((s[n] >= '0' && s[n] <= '9') || (s[n] >= 'a' && s[n] <= 'f'))) return 0;
    return n == HUB_COMMIT_LEN;
}

/* A git ref name, also a relative path under refs/: no "..", no leading '/', no
 * spaces or control characters. */
static int revision_valid(const char *r) {
    if (!r[0] || r[0] == '/' || r[strlen(r) - 1] == '/' || strstr(r, "..") || strstr(r, "//")) return 0;
    for (const char *p = r; *p; p++)
        if ((unsigned char)*p <= ' ' || *p == '\\' || *p == '~' || *p == '^' || *p == '?' || *p == '*') return 0;
    return 1;
}

static int copy_part(char *dst, size_t cap, const char *src, size_t n) {
    if (n >= cap) return 0;
    memcpy(dst, src, n);
    dst[n] = 0;
    return 1;
}

gerbil_status hub_ref_parse(const char *text, struct hub_ref *out) {
    memset(out, 0, sizeof *out);
    strcpy(out->revision, "main");
    size_t repo_len = strcspn(text, "@:");
    if (!copy_part(out->repo, sizeof out->repo, text, repo_len) || !hub_repo_id_valid(out->repo))
        return err_set(GERBIL_ERR_INVALID_ARG, "\"%s\" is not a model reference: expected a folder, a .gguf file "
                       "or a Hugging Face repo id org/name[@revision][:FILE.gguf]", text);
    const char *p = text + repo_len;
    while (*p) {
        char kind = *p++;
        /* a revision ends at ':'; a file selector at '@' (neither appears in the other) */
        size_t n = strcspn(p, kind == '@' ? ":" : "@");
        int ok = kind == '@' ? copy_part(out->revision, sizeof out->revision, p, n) && revision_valid(out->revision)
                             : copy_part(out->select, sizeof out->select, p, n) && n > 0 && !strstr(out->select, "..");
        if (!ok)
            return err_set(GERBIL_ERR_INVALID_ARG, "\"%s\": bad %s after '%c' (expected org/name@revision or "
                           "org/name:FILE.gguf)", text, kind == '@' ? "revision" : "file name", kind);
        p += n;
    }
    return GERBIL_OK;
}

static int env_true(const char *name) {
    const char *v = getenv(name);
    return v && (!strcmp(v, "1") || !strcasecmp(v, "on") || !strcasecmp(v, "yes") || !strcasecmp(v, "true"));
}

static const char *env_nonempty(const char *name) {
    const char *v = getenv(name);
    return v && v[0] ? v : NULL;
}

gerbil_hub_params gerbil_hub_default_params(void) {
    gerbil_hub_params p = {0};
    p.endpoint = env_nonempty("HF_ENDPOINT");
    p.token = env_nonempty("HF_TOKEN");
    if (!p.token) p.token = env_nonempty("HUGGING_FACE_HUB_TOKEN");
    p.cache_dir = NULL; /* resolved by hub_cache_root, which reads the environment */
    p.offline = env_true("HF_HUB_OFFLINE");
    p.n_parallel = 4;
    return p;
}

int gerbil_hub_is_repo_ref(const char *ref) {
    struct stat st;
    struct hub_ref r;
    if (!ref || stat(ref, &st) == 0) return 0;
    return hub_ref_parse(ref, &r) == GERBIL_OK;
}

char *gerbil_hub_cache_dir(const gerbil_hub_params *p) { return hub_cache_root(p); }

/* The cached model for ref, or GERBIL_ERR_NOT_FOUND (no message set). */
static gerbil_status find_cached(const char *root, const struct hub_ref *ref, char **path) {
    char *repo_dir = hub_repo_dir(root, ref->repo);
    if (!repo_dir) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    char commit[HUB_COMMIT_LEN + 1];
    gerbil_status st = hub_cache_read_ref(repo_dir, ref->revision, commit);
    char *snap = st == GERBIL_OK ? hub_strf("%s/snapshots/%s", repo_dir, commit) : NULL;
    *path = snap ? hub_snapshot_model(snap, ref->select, NULL) : NULL;
    free(snap);
    free(repo_dir);
    return *path ? GERBIL_OK : GERBIL_ERR_NOT_FOUND;
}

gerbil_status gerbil_hub_resolve(const char *ref, const gerbil_hub_params *p, char **path) {
    *path = NULL;
    if (!gerbil_hub_is_repo_ref(ref)) {
        /* a local path (the loaders report it when it does not exist) */
        *path = strdup(ref);
        return *path ? GERBIL_OK : err_set(GERBIL_ERR_NOMEM, "out of memory");
    }
    struct hub_ref r;
    GB_TRY(hub_ref_parse(ref, &r));
    char *root = hub_cache_root(p);
    if (!root) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    gerbil_status st = find_cached(root, &r, path);
    if (st == GERBIL_ERR_NOT_FOUND && p->offline)
        st = err_set(GERBIL_ERR_NOT_FOUND, "%s is not (completely) in the cache %s and HF_HUB_OFFLINE=1 forbids "
                     "downloading it: run `gerbil pull %s` with network access, or unset HF_HUB_OFFLINE",
                     ref, root, ref);
    else if (st == GERBIL_ERR_NOT_FOUND)
        st = gerbil_hub_pull(ref, p, path);
    free(root);
    return st;
}
