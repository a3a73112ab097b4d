/* gerbil_hub_pull: ask the hub what a revision holds, keep what gerbil needs, fetch
 * what the cache lacks, then point refs/REVISION at the commit. */
#include "hub/hub.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int path_exists(const char *dir, const char *name) {
    char *p = hub_strf("%s/%s", dir, name);
    struct stat st;
    int ok = p && stat(p, &st) == 0; /* follows the snapshot's symlink to its blob */
    free(p);
    return ok;
}

static uint64_t file_size(const char *path) {
    struct stat st;
    return path && stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* The revision's file list, narrowed to what gerbil needs, each with ETag and size. */
static gerbil_status list_revision(const struct hub_http *h, const struct hub_ref *ref, const gerbil_hub_params *p,
                                   struct hub_revision *rev, char **model_path) {
    char *esc = hub_http_escape(ref->revision, 0);
    char *url = esc ? hub_strf("%s/api/models/%s/revision/%s?blobs=true", h->endpoint, ref->repo, esc) : NULL;
    free(esc);
    if (!url) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    cJSON *doc = NULL;
    gerbil_status st = hub_http_get_json(h, url, ref, &doc);
    if (st == GERBIL_OK) st = hub_revision_from_json(doc, url, rev);
    cJSON_Delete(doc);
    free(url);
    if (st == GERBIL_OK) st = hub_select_files(rev, ref, p, model_path);
    /* without ?blobs=true metadata (older hubs, mirrors) ask each file's headers */
    for (int i = 0; st == GERBIL_OK && i < rev->n_files; i++)
        if (!rev->files[i].etag || rev->files[i].size == HUB_SIZE_UNKNOWN)
            st = hub_http_head_file(h, ref, rev->commit, &rev->files[i]);
    return st;
}

/* Jobs for the files the snapshot lacks; *n = how many. */
static struct hub_fetch_job *plan(const char *repo_dir, const struct hub_revision *rev, int *n) {
    struct hub_fetch_job *jobs = calloc(rev->n_files ? (size_t)rev->n_files : 1, sizeof *jobs);
    char *snap = hub_strf("%s/snapshots/%s", repo_dir, rev->commit);
    *n = 0;
    for (int i = 0; jobs && snap && i < rev->n_files; i++) {
        const struct hub_file *f = &rev->files[i];
        if (path_exists(snap, f->path)) continue;
        char *blob = hub_strf("%s/blobs/%s", repo_dir, f->etag);
        char *tmp = blob ? hub_strf("%s.incomplete", blob) : NULL;
        uint64_t have = file_size(blob) == f->size ? f->size : file_size(tmp);
        if (f->size != HUB_SIZE_UNKNOWN && have > f->size) have = 0;
        jobs[(*n)++] = (struct hub_fetch_job){.file = f, .have = have};
        free(tmp);
        free(blob);
    }
    free(snap);
    return jobs;
}

/* Offline: what the cache holds, or a clear failure. */
static gerbil_status pull_offline(const char *text, const struct hub_ref *ref, const char *repo_dir,
                                  const char *root, char **path) {
    char commit[HUB_COMMIT_LEN + 1];
    char *snap = hub_cache_read_ref(repo_dir, ref->revision, commit) == GERBIL_OK
                     ? hub_strf("%s/snapshots/%s", repo_dir, commit) : NULL;
    char *model = snap ? hub_snapshot_model(snap, ref->select, NULL) : NULL;
    free(snap);
    if (!model)
        return err_set(GERBIL_ERR_NOT_FOUND, "HF_HUB_OFFLINE=1 forbids downloading and %s is not (completely) in the "
                       "cache %s: unset HF_HUB_OFFLINE and run `gerbil pull %s` with network access", text, root, text);
    if (path) *path = model;
    else free(model);
    return GERBIL_OK;
}

static gerbil_status pull_online(const struct hub_ref *ref, const gerbil_hub_params *p, const char *root,
                                 const char *repo_dir, char **path) {
    struct hub_http h;
    struct hub_revision rev = {0};
    char *model_path = NULL;
    GB_TRY(hub_http_init(&h, p));
    gerbil_status st = list_revision(&h, ref, p, &rev, &model_path);
    int n_jobs = 0;
    struct hub_fetch_job *jobs = st == GERBIL_OK ? plan(repo_dir, &rev, &n_jobs) : NULL;
    if (st == GERBIL_OK && !jobs) st = err_set(GERBIL_ERR_NOMEM, "out of memory");
    if (st == GERBIL_OK && n_jobs) st = hub_fetch_all(&h, p, root, ref, rev.commit, jobs, n_jobs);
    if (st == GERBIL_OK) st = hub_cache_write_ref(repo_dir, ref->revision, rev.commit);
    if (st == GERBIL_OK && path) {
        *path = model_path[0] ? hub_strf("%s/snapshots/%s/%s", repo_dir, rev.commit, model_path)
                              : hub_strf("%s/snapshots/%s", repo_dir, rev.commit);
        if (!*path) st = err_set(GERBIL_ERR_NOMEM, "out of memory");
    }
    free(jobs);
    hub_revision_free(&rev);
    hub_http_free(&h);
    return st;
}

gerbil_status gerbil_hub_pull(const char *text, const gerbil_hub_params *p, char **path) {
    if (path) *path = NULL;
    struct hub_ref ref;
    GB_TRY(hub_ref_parse(text, &ref));
    char *root = hub_cache_root(p);
    char *repo_dir = root ? hub_repo_dir(root, ref.repo) : NULL;
    gerbil_status st = repo_dir ? GERBIL_OK : err_set(GERBIL_ERR_NOMEM, "out of memory");
    if (st == GERBIL_OK)
        st = p->offline ? pull_offline(text, &ref, repo_dir, root, path) : pull_online(&ref, p, root, repo_dir, path);
    free(repo_dir);
    free(root);
    return st;
}
