/* What the cache holds (gerbil list) and removing a repo from it (gerbil rm). Repos
 * written by huggingface_hub are listed the same way as ours. */
#include "hub/hub.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

/* Visit every non-folder under dir (depth first); folders are visited after their
 * contents when post_dirs, for removal. follow: stat through symlinks (then a depth
 * limit guards against symlink loops; removal never follows links). */
enum { WALK_MAX_DEPTH = 32 };
struct walk {
    int follow, post_dirs;
    uint64_t bytes;
    int failed;
};

static void walk_visit(const char *path, const struct stat *st, int is_dir, struct walk *w) {
    if (w->post_dirs) {
        if ((is_dir ? rmdir(path) : unlink(path)) != 0 && errno != ENOENT) w->failed = errno;
        return;
    }
    if (!is_dir) w->bytes += (uint64_t)st->st_size;
}

static void walk(const char *dir, struct walk *w, int depth) {
    DIR *d = depth < WALK_MAX_DEPTH ? opendir(dir) : NULL;
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char *p = hub_strf("%s/%s", dir, de->d_name);
        struct stat st;
        if (p && (w->follow ? stat(p, &st) : lstat(p, &st)) == 0) {
            if (S_ISDIR(st.st_mode)) walk(p, w, depth + 1);
            walk_visit(p, &st, S_ISDIR(st.st_mode), w);
        } else if (p && w->post_dirs) {
            unlink(p); /* a dangling entry */
        }
        free(p);
    }
    closedir(d);
}

/* ---- list ---- */

struct ref_pair {
    char *name, commit[HUB_COMMIT_LEN + 1];
};

/* refs/ may hold nested names (refs/pr/1): collect name -> commit pairs. */
static void read_refs(const char *refs_dir, const char *prefix, struct ref_pair **refs, int *n, int depth) {
    if (depth > 8) return; /* refs/pr/1 is 2 deep; more is a loop */
    char *dir = prefix[0] ? hub_strf("%s/%s", refs_dir, prefix) : strdup(refs_dir);
    DIR *d = dir ? opendir(dir) : NULL;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.' || strstr(de->d_name, ".tmp.")) continue;
        char *name = prefix[0] ? hub_strf("%s/%s", prefix, de->d_name) : strdup(de->d_name);
        char *full = name ? hub_strf("%s/%s", refs_dir, name) : NULL;
        struct stat st;
        struct ref_pair *r = NULL;
        if (full && stat(full, &st) == 0 && S_ISDIR(st.st_mode)) read_refs(refs_dir, name, refs, n, depth + 1);
        else if (full && (r = realloc(*refs, ((size_t)*n + 1) * sizeof *r))) {
            *refs = r;
            char *parent = hub_strf("%s/..", refs_dir);
            if (parent && hub_cache_read_ref(parent, name, r[*n].commit) == GERBIL_OK) {
                r[*n].name = name;
                name = NULL;
                (*n)++;
            }
            free(parent);
        }
        free(full);
        free(name);
    }
    if (d) closedir(d);
    free(dir);
}

static char *join_refs(const struct ref_pair *refs, int n, const char *commit) {
    size_t len = 1;
    for (int i = 0; i < n; i++) len += strlen(refs[i].name) + 1;
    char *s = calloc(1, len);
    for (int i = 0; s && i < n; i++) {
        if (strcmp(refs[i].commit, commit)) continue;
        if (s[0]) strcat(s, ",");
        strcat(s, refs[i].name);
    }
    return s;
}

static gerbil_status add_entry(gerbil_hub_entry **v, int *n, const char *repo, const char *snap_dir,
                               const char *commit, const struct ref_pair *refs, int n_refs) {
    gerbil_hub_entry *e = realloc(*v, ((size_t)*n + 1) * sizeof *e);
    if (!e) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    *v = e;
    e = &e[*n];
    memset(e, 0, sizeof *e);
    const char *format = NULL;
    char *model = hub_snapshot_model(snap_dir, "", &format);
    free(model);
    struct walk w = {.follow = 1};
    walk(snap_dir, &w, 0);
    e->repo = strdup(repo);
    e->commit = strdup(commit);
    e->revisions = join_refs(refs, n_refs, commit);
    e->format = format ? format : "incomplete";
    e->bytes = w.bytes;
    (*n)++;
    if (!e->repo || !e->commit || !e->revisions) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    return GERBIL_OK;
}

static gerbil_status list_repo(const char *root, const char *folder, gerbil_hub_entry **v, int *n) {
    /* models--org--name -> org/name (huggingface_hub joins the parts with '/') */
    char repo[HUB_REPO_MAX];
    const char *sep = strstr(folder + 8, "--");
    if (!sep || snprintf(repo, sizeof repo, "%.*s/%s", (int)(sep - folder - 8), folder + 8, sep + 2) >= (int)sizeof repo)
        return GERBIL_OK;
    char *dir = hub_strf("%s/%s", root, folder);
    char *refs_dir = dir ? hub_strf("%s/refs", dir) : NULL;
    char *snaps = dir ? hub_strf("%s/snapshots", dir) : NULL;
    struct ref_pair *refs = NULL;
    int n_refs = 0;
    gerbil_status st = snaps ? GERBIL_OK : err_set(GERBIL_ERR_NOMEM, "out of memory");
    if (st == GERBIL_OK) read_refs(refs_dir, "", &refs, &n_refs, 0);
    DIR *d = snaps ? opendir(snaps) : NULL;
    struct dirent *de;
    while (st == GERBIL_OK && d && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char *snap = hub_strf("%s/%s", snaps, de->d_name);
        st = snap ? add_entry(v, n, repo, snap, de->d_name, refs, n_refs) : err_set(GERBIL_ERR_NOMEM, "out of memory");
        free(snap);
    }
    if (d) closedir(d);
    for (int i = 0; i < n_refs; i++) free(refs[i].name);
    free(refs);
    free(snaps);
    free(refs_dir);
    free(dir);
    return st;
}

static int cmp_entry(const void *a, const void *b) {
    const gerbil_hub_entry *x = a, *y = b;
    int c = strcasecmp(x->repo, y->repo);
    return c ? c : strcmp(x->commit, y->commit);
}

gerbil_status gerbil_hub_list(const gerbil_hub_params *p, gerbil_hub_entry **entries, int *n) {
    *entries = NULL;
    *n = 0;
    char *root = hub_cache_root(p);
    if (!root) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    DIR *d = opendir(root);
    gerbil_status st = GERBIL_OK;
    struct dirent *de;
    while (d && st == GERBIL_OK && (de = readdir(d)))
        if (!strncmp(de->d_name, "models--", 8)) st = list_repo(root, de->d_name, entries, n);
    if (d) closedir(d);
    free(root);
    if (st != GERBIL_OK) {
        gerbil_hub_list_free(*entries, *n);
        *entries = NULL;
        *n = 0;
        return st;
    }
    if (*n > 1) qsort(*entries, (size_t)*n, sizeof **entries, cmp_entry);
    return GERBIL_OK;
}

void gerbil_hub_list_free(gerbil_hub_entry *entries, int n) {
    for (int i = 0; i < n; i++) {
        free(entries[i].repo);
        free(entries[i].revisions);
        free(entries[i].commit);
    }
    free(entries);
}

/* ---- remove ---- */

static gerbil_status remove_tree(const char *dir) {
    struct walk w = {.post_dirs = 1};
    walk(dir, &w, 0);
    if (!w.failed && rmdir(dir) != 0 && errno != ENOENT) w.failed = errno;
    return w.failed ? err_set(GERBIL_ERR_IO, "cannot remove %s: %s", dir, strerror(w.failed)) : GERBIL_OK;
}

gerbil_status gerbil_hub_remove(const char *repo, const gerbil_hub_params *p, uint64_t *freed) {
    if (freed) *freed = 0;
    if (!hub_repo_id_valid(repo))
        return err_set(GERBIL_ERR_INVALID_ARG, "\"%s\" is not a repo id (expected org/name, without @revision or "
                       ":FILE: the whole repo is removed)", repo);
    char *root = hub_cache_root(p);
    char *dir = root ? hub_repo_dir(root, repo) : NULL;
    const char *slash = strchr(repo, '/');
    char *locks = root ? hub_strf("%s/.locks/models--%.*s--%s", root, (int)(slash - repo), repo, slash + 1) : NULL;
    char *blobs = dir ? hub_strf("%s/blobs", dir) : NULL;
    struct stat st;
    gerbil_status s = blobs && locks ? GERBIL_OK : err_set(GERBIL_ERR_NOMEM, "out of memory");
    if (s == GERBIL_OK && stat(dir, &st) != 0)
        s = err_set(GERBIL_ERR_NOT_FOUND, "%s is not in the cache %s (`gerbil list` shows what is)", repo, root);
    if (s == GERBIL_OK) {
        struct walk w = {0};
        walk(blobs, &w, 0);
        if (freed) *freed = w.bytes;
        s = remove_tree(dir);
        if (s == GERBIL_OK) remove_tree(locks);
    }
    free(blobs);
    free(locks);
    free(dir);
    free(root);
    return s;
}
