/* The transfers of a pull: a few worker threads take files from a shared list; each
 * file is downloaded under its blob's lock into blobs/ETAG.incomplete (resumed with an
 * HTTP Range when part of it is there), checked (hub_verify.c), renamed to blobs/ETAG
 * and linked into the snapshot. The calling thread reports progress meanwhile. */
#include "hub/hub.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

enum { MAX_ATTEMPTS = 5, MAX_THREADS = 16 };

struct fetch {
    const struct hub_http *h;
    const gerbil_hub_params *p;
    const char *root, *commit;
    const struct hub_ref *ref;
    char *repo_dir;
    struct hub_fetch_job *jobs;
    int n_jobs;
    pthread_mutex_t mu;
    int next, n_done;               /* under mu */
    gerbil_status err;              /* the first failure, under mu */
    char err_msg[1024];
    atomic_int abort;               /* set on the first failure: the other transfers stop */
    atomic_int n_exited;            /* workers finished */
    atomic_uint_least64_t bytes;    /* received in this pull */
};

/* One transfer into an open .incomplete file. */
struct xfer {
    struct fetch *f;
    CURL *curl;
    int fd;
    uint64_t offset;                /* bytes in the file */
    int started, discard;
    gerbil_status werr;             /* a write failure (message set) */
};

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *user) {
    struct xfer *x = user;
    size_t n = size * nmemb;
    if (!x->started) {
        x->started = 1;
        long code = 0;
        curl_easy_getinfo(x->curl, CURLINFO_RESPONSE_CODE, &code);
        if (code == 200 && x->offset > 0) { /* the server ignored the Range: start over */
            if (ftruncate(x->fd, 0) != 0 || lseek(x->fd, 0, SEEK_SET) != 0) {
                x->werr = err_set(GERBIL_ERR_IO, "cannot truncate a partial download: %s", strerror(errno));
                return 0;
            }
            x->offset = 0;
        }
        x->discard = code != 200 && code != 206; /* an error page, checked after */
    }
    if (x->discard) return n;
    for (size_t done = 0; done < n;) {
        ssize_t w = write(x->fd, ptr + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
            int e = errno;
            char *cache = hub_cache_root(x->f->p);
            x->werr = e == ENOSPC || e == EDQUOT
                          ? err_set(GERBIL_ERR_IO, "disk full (%s) while downloading into %s: free some space "
                                    "(gerbil rm, gerbil list) or point HF_HUB_CACHE at a bigger disk, then run the "
                                    "command again to resume", strerror(e), cache ? cache : "the cache")
                          : err_set(GERBIL_ERR_IO, "cannot write the download: %s", strerror(e));
            free(cache);
            return 0;
        }
        done += (size_t)w;
    }
    x->offset += n;
    atomic_fetch_add(&x->f->bytes, n);
    return n;
}

static int on_xferinfo(void *user, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un) {
    (void)dt, (void)dn, (void)ut, (void)un;
    return atomic_load(&((struct fetch *)user)->abort) ? 1 : 0;
}

/* One GET of the file from *have on. *progress = bytes written. GERBIL_OK when the body
 * arrived complete (verification follows). */
static gerbil_status get_once(struct fetch *f, const struct hub_file *file, int fd, uint64_t have,
                              uint64_t *progress) {
    char *path = hub_http_escape(file->path, 1);
    char *url = path ? hub_strf("%s/%s/resolve/%s/%s", f->h->endpoint, f->ref->repo, f->commit, path) : NULL;
    free(path);
    struct hub_http_reply reply;
    CURL *c = url ? hub_http_easy(f->h, url, &reply) : NULL;
    free(url);
    if (!c) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    struct xfer x = {.f = f, .curl = c, .fd = fd, .offset = have};
    char errbuf[CURL_ERROR_SIZE] = {0}, range[32];
    snprintf(range, sizeof range, "%llu-", (unsigned long long)have);
    if (have > 0) curl_easy_setopt(c, CURLOPT_RANGE, range);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &x);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_xferinfo);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, f);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    CURLcode rc = curl_easy_perform(c);
    curl_easy_cleanup(c);
    *progress = x.offset > have ? x.offset - have : 0;
    if (x.werr != GERBIL_OK) return x.werr;
    if (rc == CURLE_ABORTED_BY_CALLBACK) return err_set(GERBIL_ERR_NETWORK, "cancelled");
    if (rc == CURLE_OK && reply.code == 416) { /* our partial file is not a prefix of theirs */
        if (ftruncate(fd, 0) != 0) return err_set(GERBIL_ERR_IO, "cannot truncate: %s", strerror(errno));
        *progress = 1; /* worth another attempt from zero */
        return err_set(GERBIL_ERR_NETWORK, "the server refused to resume %s", file->path);
    }
    return hub_http_check(rc, errbuf, &reply, f->h, f->ref, file->path);
}

/* Download into tmp until complete, resuming after dropped connections as long as
 * each attempt makes progress. */
static gerbil_status download(struct fetch *f, const struct hub_file *file, const char *tmp) {
    gerbil_status st = GERBIL_OK;
    for (int attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
        int fd = open(tmp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd < 0) return err_set(GERBIL_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
        struct stat sb;
        uint64_t have = fstat(fd, &sb) == 0 ? (uint64_t)sb.st_size : 0;
        if (file->size != HUB_SIZE_UNKNOWN && have > file->size) { /* not ours to trust: start over */
            if (ftruncate(fd, 0) != 0) {
                close(fd);
                return err_set(GERBIL_ERR_IO, "cannot truncate %s: %s", tmp, strerror(errno));
            }
            have = 0;
        }
        uint64_t progress = 0;
        st = file->size != HUB_SIZE_UNKNOWN && have == file->size ? GERBIL_OK
                                                                  : get_once(f, file, fd, have, &progress);
        close(fd);
        if (st != GERBIL_ERR_NETWORK || !progress || atomic_load(&f->abort)) break;
    }
    return st;
}

static gerbil_status fetch_file(struct fetch *f, const struct hub_file *file) {
    char *blob = hub_strf("%s/blobs/%s", f->repo_dir, file->etag);
    char *tmp = blob ? hub_strf("%s.incomplete", blob) : NULL;
    if (!tmp) { free(blob); return err_set(GERBIL_ERR_NOMEM, "out of memory"); }
    int lock = hub_cache_lock(f->root, f->ref->repo, file->etag);
    gerbil_status st = lock < 0 ? GERBIL_ERR_IO : GERBIL_OK;
    struct stat sb;
    int present = st == GERBIL_OK && stat(blob, &sb) == 0 &&
                  (file->size == HUB_SIZE_UNKNOWN || (uint64_t)sb.st_size == file->size);
    if (st == GERBIL_OK && !present) { /* another process may have fetched it while we waited */
        st = download(f, file, tmp);
        if (st == GERBIL_OK) st = hub_verify_blob(tmp, file, f->ref->repo);
        if (st == GERBIL_ERR_FORMAT) unlink(tmp);
        if (st == GERBIL_OK && rename(tmp, blob) != 0)
            st = err_set(GERBIL_ERR_IO, "cannot rename %s to %s: %s", tmp, blob, strerror(errno));
    }
    if (lock >= 0) close(lock);
    if (st == GERBIL_OK) st = hub_cache_link(f->repo_dir, f->commit, file->path, file->etag);
    free(tmp);
    free(blob);
    return st;
}

static void *worker(void *arg) {
    struct fetch *f = arg;
    for (;;) {
        pthread_mutex_lock(&f->mu);
        int i = atomic_load(&f->abort) ? f->n_jobs : f->next++;
        pthread_mutex_unlock(&f->mu);
        if (i >= f->n_jobs) break;
        gerbil_status st = fetch_file(f, f->jobs[i].file);
        pthread_mutex_lock(&f->mu);
        if (st != GERBIL_OK && f->err == GERBIL_OK) {
            f->err = st;
            snprintf(f->err_msg, sizeof f->err_msg, "%s", gerbil_last_error());
            atomic_store(&f->abort, 1);
        }
        if (st == GERBIL_OK) f->n_done++;
        pthread_mutex_unlock(&f->mu);
    }
    atomic_fetch_add(&f->n_exited, 1);
    return NULL;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void report(struct fetch *f, gerbil_hub_progress *pr, double t0, int done) {
    if (!f->p->progress) return;
    pthread_mutex_lock(&f->mu);
    pr->n_files_done = f->n_done;
    pthread_mutex_unlock(&f->mu);
    uint64_t b = atomic_load(&f->bytes);
    pr->bytes_done = done || b > pr->bytes_total ? pr->bytes_total : b;
    pr->elapsed_s = now_s() - t0;
    pr->done = done;
    f->p->progress(f->p->user, pr);
}

/* Fail early, before any transfer, when the disk cannot hold the files. */
static gerbil_status check_space(const char *dir, uint64_t need) {
    struct statvfs vfs;
    if (statvfs(dir, &vfs) != 0) return GERBIL_OK; /* unknown: the writes will tell */
    uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
    if (avail >= need) return GERBIL_OK;
    char a[32], b[32];
    return err_set(GERBIL_ERR_IO, "disk full (ENOSPC): the download needs %s but %s has %s free; free some space "
                   "(gerbil list, gerbil rm) or point HF_HUB_CACHE at a bigger disk", hub_fmt_bytes(need, a, sizeof a),
                   dir, hub_fmt_bytes(avail, b, sizeof b));
}

static gerbil_status run_workers(struct fetch *f, gerbil_hub_progress *pr) {
    int n_threads = f->p->n_parallel > 0 ? f->p->n_parallel : 4;
    if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;
    if (n_threads > f->n_jobs) n_threads = f->n_jobs;
    pthread_t th[MAX_THREADS];
    int started = 0;
    double t0 = now_s();
    report(f, pr, t0, 0);
    for (; started < n_threads; started++)
        if (pthread_create(&th[started], NULL, worker, f) != 0) break;
    if (started == 0) worker(f); /* no threads to be had: one at a time, here */
    const struct timespec tick = {0, 100 * 1000 * 1000};
    while (atomic_load(&f->n_exited) < started) {
        nanosleep(&tick, NULL);
        report(f, pr, t0, 0);
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    if (f->err != GERBIL_OK) return err_set(f->err, "%s", f->err_msg);
    report(f, pr, t0, 1);
    return GERBIL_OK;
}

gerbil_status hub_fetch_all(const struct hub_http *h, const gerbil_hub_params *p, const char *root,
                            const struct hub_ref *ref, const char *commit, struct hub_fetch_job *jobs, int n_jobs) {
    struct fetch f = {.h = h, .p = p, .root = root, .commit = commit, .ref = ref, .jobs = jobs, .n_jobs = n_jobs};
    f.repo_dir = hub_repo_dir(root, ref->repo);
    char *blobs = f.repo_dir ? hub_strf("%s/blobs", f.repo_dir) : NULL;
    if (!blobs) { free(f.repo_dir); return err_set(GERBIL_ERR_NOMEM, "out of memory"); }
    gerbil_hub_progress pr = {.repo = ref->repo, .revision = ref->revision, .commit = commit, .n_files = n_jobs};
    for (int i = 0; i < n_jobs; i++)
        if (jobs[i].file->size != HUB_SIZE_UNKNOWN) pr.bytes_total += jobs[i].file->size - jobs[i].have;
    gerbil_status st = hub_mkdirs(blobs);
    if (st == GERBIL_OK) st = check_space(blobs, pr.bytes_total);
    if (st == GERBIL_OK) {
        pthread_mutex_init(&f.mu, NULL);
        st = run_workers(&f, &pr);
        pthread_mutex_destroy(&f.mu);
    }
    free(blobs);
    free(f.repo_dir);
    return st;
}
