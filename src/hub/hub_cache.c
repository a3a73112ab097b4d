/* The huggingface_hub cache layout, so models downloaded by Python tools are found
 * and ours are usable by them:
 *   CACHE/models--org--name/blobs/ETAG                 the file contents, by ETag
 *   CACHE/models--org--name/snapshots/COMMIT/PATH       -> ../../blobs/ETAG (relative)
 *   CACHE/models--org--name/refs/REVISION               the commit, no newline
 *   CACHE/.locks/models--org--name/ETAG.lock            flock'ed while a blob is written */
#include "hub/hub.h"

#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *env_nonempty(const char *name) {
    const char *v = getenv(name);
    return v && v[0] ? v : NULL;
}

static const char *home_dir(void) {
    const char *h = env_nonempty("HOME");
    if (h) return h;
    struct passwd *pw = getpwuid(getuid());
    return pw && pw->pw_dir ? pw->pw_dir : "/tmp";
}

/* "~/x" -> "$HOME/x", as huggingface_hub expands its variables. */
static char *expand_home(const char *path, const char *suffix) {
    if (path[0] == '~' && (path[1] == '/' || !path[1])) return hub_strf("%s%s%s", home_dir(), path + 1, suffix);
    return hub_strf("%s%s", path, suffix);
}

char *hub_cache_root(const gerbil_hub_params *p) {
    const char *v;
    if (p && p->cache_dir && p->cache_dir[0]) return expand_home(p->cache_dir, "");
    if ((v = env_nonempty("HF_HUB_CACHE")) || (v = env_nonempty("HUGGINGFACE_HUB_CACHE"))) return expand_home(v, "");
    if ((v = env_nonempty("HF_HOME"))) return expand_home(v, "/hub");
    if ((v = env_nonempty("XDG_CACHE_HOME"))) return expand_home(v, "/huggingface/hub");
    return hub_strf("%s/.cache/huggingface/hub", home_dir());
}

char *hub_repo_dir(const char *root, const char *repo) {
    const char *slash = strchr(repo, '/');
    if (!slash) return NULL;
    return hub_strf("%s/models--%.*s--%s", root, (int)(slash - repo), repo, slash + 1);
}

gerbil_status hub_cache_read_ref(const char *repo_dir, const char *revision, char commit[HUB_COMMIT_LEN + 1]) {
    if (hub_is_commit(revision)) {
        memcpy(commit, revision, HUB_COMMIT_LEN + 1);
        return GERBIL_OK;
    }
    char *path = hub_strf("%s/refs/%s", repo_dir, revision);
    if (!path) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    FILE *f = fopen(path, "rb");
    free(path);
    if (!f) return GERBIL_ERR_NOT_FOUND;
    char buf[128] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) buf[--n] = 0;
    if (!hub_is_commit(buf)) return GERBIL_ERR_NOT_FOUND;
    memcpy(commit, buf, HUB_COMMIT_LEN + 1);
    return GERBIL_OK;
}

/* Write text to path through a temporary file and rename(2): readers see the old or
 * the new content, never a part. */
static gerbil_status write_atomic(const char *path, const char *text) {
    char *tmp = hub_strf("%s.tmp.%ld", path, (long)getpid());
    if (!tmp) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    FILE *f = fopen(tmp, "wb");
    int ok = f && fputs(text, f) >= 0;
    if (f && fclose(f) != 0) ok = 0;
    if (ok && rename(tmp, path) == 0) {
        free(tmp);
        return GERBIL_OK;
    }
    gerbil_status st = err_set(GERBIL_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    unlink(tmp);
    free(tmp);
    return st;
}

/* mkdir -p of the folder holding path. */
static gerbil_status mkdirs_parent(const char *path) {
    char *dir = strdup(path);
    if (!dir) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    char *slash = strrchr(dir, '/');
    gerbil_status st = GERBIL_OK;
    if (slash && slash != dir) {
        *slash = 0;
        st = hub_mkdirs(dir);
    }
    free(dir);
    return st;
}

gerbil_status hub_cache_write_ref(const char *repo_dir, const char *revision, const char *commit) {
    if (hub_is_commit(revision)) return GERBIL_OK; /* a commit needs no ref */
    char *path = hub_strf("%s/refs/%s", repo_dir, revision);
    if (!path) return err_set(GERBIL_ERR_NOMEM, "out of memory");
    gerbil_status st = mkdirs_parent(path);
    if (st == GERBIL_OK) st = write_atomic(path, commit);
    free(path);
    return st;
}

gerbil_status hub_cache_link(const char *repo_dir, const char *commit, const char *path, const char *etag) {
    /* from snapshots/COMMIT/a/b/FILE up to the repo folder: one "../" per folder */
    int depth = 2;
    for (const char *s = path; *s; s++) depth += *s == '/';
    size_t tcap = (size_t)depth * 3 + strlen(etag) + 8;
    char *target = malloc(tcap);
    char *link = hub_strf("%s/snapshots/%s/%s", repo_dir, commit, path);
    char *tmp = link ? hub_strf("%s.tmp.%ld", link, (long)getpid()) : NULL;
    gerbil_status st = target && tmp ? GERBIL_OK : err_set(GERBIL_ERR_NOMEM, "out of memory");
    if (st == GERBIL_OK) {
        target[0] = 0;
        for (int i = 0; i < depth; i++) strcat(target, "../");
        strcat(target, "blobs/");
        strcat(target, etag);
        st = mkdirs_parent(link);
    }
    if (st == GERBIL_OK) {
        unlink(tmp);
        if (symlink(target, tmp) != 0 || rename(tmp, link) != 0) {
            st = err_set(GERBIL_ERR_IO, "cannot link %s to %s: %s", link, target, strerror(errno));
            unlink(tmp);
        }
    }
    free(tmp);
    free(link);
    free(target);
    return st;
}

int hub_cache_lock(const char *root, const char *repo, const char *etag) {
    const char *slash = strchr(repo, '/');
    char *dir = hub_strf("%s/.locks/models--%.*s--%s", root, (int)(slash - repo), repo, slash + 1);
    char *path = dir ? hub_strf("%s/%s.lock", dir, etag) : NULL;
    int fd = -1;
    if (!path) err_set(GERBIL_ERR_NOMEM, "out of memory");
    else if (hub_mkdirs(dir) == GERBIL_OK) {
        fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) err_set(GERBIL_ERR_IO, "cannot open lock file %s: %s", path, strerror(errno));
        while (fd >= 0 && flock(fd, LOCK_EX) != 0) {
            if (errno == EINTR) continue;
            err_set(GERBIL_ERR_IO, "cannot lock %s: %s", path, strerror(errno));
            close(fd);
            fd = -1;
        }
    }
    free(path);
    free(dir);
    return fd;
}
