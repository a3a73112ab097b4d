/* The hub layer's internals: model references, the huggingface_hub cache layout,
 * HTTP through libcurl, and the transfer of a revision's files. The public face is
 * the gerbil_hub_* API in gerbil.h. */
#ifndef GB_HUB_H
#define GB_HUB_H

#include "base/status.h"

#include <cjson/cJSON.h>
#include <stdint.h>

enum { HUB_REPO_MAX = 256, HUB_REV_MAX = 256, HUB_SELECT_MAX = 512, HUB_COMMIT_LEN = 40 };
#define HUB_DEFAULT_ENDPOINT "https://huggingface.co"
#define HUB_SIZE_UNKNOWN UINT64_MAX

/* ---- hub_ref.c: "org/name[@revision][:FILE.gguf|:QUANT]" ---- */
struct hub_ref {
    char repo[HUB_REPO_MAX];       /* "org/name" */
    char revision[HUB_REV_MAX];    /* "main" when not given */
    char select[HUB_SELECT_MAX];   /* a .gguf path or a quantization tag; "" for none */
};
/* Parse text; GERBIL_ERR_INVALID_ARG with a message when it is not a repo reference. */
gerbil_status hub_ref_parse(const char *text, struct hub_ref *out);
/* org/name with org and name of [A-Za-z0-9._-], neither starting with '.' or '-'
 * nor holding "--" or "..": safe as a path component once '/' becomes "--". */
int hub_repo_id_valid(const char *repo);
int hub_is_commit(const char *s); /* 40 lowercase hex digits */

/* ---- hub_util.c ---- */
char *hub_strf(const char *fmt, ...) GB_PRINTF(1, 2); /* malloc'd; NULL: no memory */
gerbil_status hub_mkdirs(const char *path);   /* mkdir -p */
/* "1.2 GiB", "340.0 MiB" into buf. */
const char *hub_fmt_bytes(uint64_t n, char *buf, size_t cap);
int hub_ends_with(const char *s, const char *suffix); /* case-insensitive */

/* ---- hub_cache.c: CACHE/models--org--name/{blobs,snapshots,refs}, CACHE/.locks ---- */
char *hub_cache_root(const gerbil_hub_params *p);
char *hub_repo_dir(const char *root, const char *repo);         /* malloc'd */
/* The commit a revision points at: revision itself when it is a commit, else refs/REV.
 * GERBIL_ERR_NOT_FOUND when there is no such ref. */
gerbil_status hub_cache_read_ref(const char *repo_dir, const char *revision, char commit[HUB_COMMIT_LEN + 1]);
gerbil_status hub_cache_write_ref(const char *repo_dir, const char *revision, const char *commit);
/* snapshots/COMMIT/PATH -> ../../blobs/ETAG (relative, replaced atomically). */
gerbil_status hub_cache_link(const char *repo_dir, const char *commit, const char *path, const char *etag);
/* Exclusive flock on CACHE/.locks/models--org--name/ETAG.lock, the file huggingface_hub
 * locks too. Returns the descriptor (close it to unlock) or -1 with a message. */
int hub_cache_lock(const char *root, const char *repo, const char *etag);

/* ---- hub_select.c: which files of a repo gerbil needs ---- */
struct hub_file {
    char *path;                    /* path in the repo ("rfilename") */
    char *etag;                    /* blob name: LFS sha256 or git blob sha1; NULL until known */
    uint64_t size;                 /* HUB_SIZE_UNKNOWN until known */
    int lfs;                       /* etag is the sha256 of the content (else a git blob sha1) */
};
struct hub_revision {
    char commit[HUB_COMMIT_LEN + 1];
    struct hub_file *files;
    int n_files;
};
void hub_revision_free(struct hub_revision *r);
/* The API's JSON ({"sha", "siblings": [{"rfilename", "size", "blobId", "lfs"}]}) -> r.
 * Entries with unsafe paths ("..", absolute) are dropped. */
gerbil_status hub_revision_from_json(const cJSON *doc, const char *what, struct hub_revision *r);
/* Keep only the files gerbil needs, in place; *model_path = "" (the folder) or the
 * chosen .gguf path (static or pointing into r). Reports a default GGUF choice through
 * p->notice. GERBIL_ERR_UNSUPPORTED / GERBIL_ERR_NOT_FOUND with the files listed. */
gerbil_status hub_select_files(struct hub_revision *r, const struct hub_ref *ref, const gerbil_hub_params *p,
                               char **model_path);
/* The model inside a snapshot folder when everything to run it is there: the folder
 * itself (config.json + every safetensors shard) or the chosen .gguf file. malloc'd
 * path, or NULL when incomplete. *format = "safetensors" / "gguf" (may be NULL). */
char *hub_snapshot_model(const char *snapshot_dir, const char *select, const char **format);

/* ---- hub_http.c: libcurl ---- */
struct hub_http_reply {
    long code;                     /* of the last response */
    char error_code[64];           /* X-Error-Code of the last response */
    char etag[128];                /* ETag of the first response (the hub's) */
    char linked_etag[128];         /* X-Linked-Etag */
    uint64_t linked_size;          /* X-Linked-Size, HUB_SIZE_UNKNOWN when absent */
    uint64_t content_length;       /* of the first response, HUB_SIZE_UNKNOWN when absent */
};
struct hub_http {
    char *endpoint;
    char *token;
    void *headers;                 /* struct curl_slist * (Authorization) */
};
gerbil_status hub_http_init(struct hub_http *h, const gerbil_hub_params *p);
void hub_http_free(struct hub_http *h);
/* A curl easy handle with the common options (user agent, token, redirects, timeouts)
 * and the header parser writing into reply. NULL when out of memory. */
void *hub_http_easy(const struct hub_http *h, const char *url, struct hub_http_reply *reply);
/* url-escaped copy of s (each '/' kept when keep_slash). malloc'd. */
char *hub_http_escape(const char *s, int keep_slash);
/* The status for a finished request: curl's result (int CURLcode) and the reply's HTTP
 * code, with a message naming what (repo, revision, file) and what to do. */
gerbil_status hub_http_check(int curl_rc, const char *curl_err, const struct hub_http_reply *reply,
                             const struct hub_http *h, const struct hub_ref *ref, const char *file);
/* GET url and parse the body as JSON. */
gerbil_status hub_http_get_json(const struct hub_http *h, const char *url, const struct hub_ref *ref, cJSON **out);
/* HEAD a file's resolve URL (no redirects) for its ETag and size. */
gerbil_status hub_http_head_file(const struct hub_http *h, const struct hub_ref *ref, const char *commit,
                                 struct hub_file *f);

/* ---- hub_verify.c ---- */
/* Size and hash of a finished download against f (see the file comment). */
gerbil_status hub_verify_blob(const char *path, const struct hub_file *f, const char *repo);

/* ---- hub_fetch.c: the transfers ---- */
struct hub_fetch_job {
    const struct hub_file *file;
    uint64_t have;                 /* bytes already in blobs/ETAG.incomplete at planning */
};
/* Download every job's blob (in parallel, resumably, verified) and link it into
 * snapshots/COMMIT. Progress goes to p->progress from this thread. */
gerbil_status hub_fetch_all(const struct hub_http *h, const gerbil_hub_params *p, const char *root,
                            const struct hub_ref *ref, const char *commit, struct hub_fetch_job *jobs, int n_jobs);

#endif
