/* Checking a downloaded blob against the hub's metadata before it enters the cache:
 * its size, and its hash where the ETag is one we can recompute: an LFS file's ETag is
 * the sha256 of its content; a small (non-LFS) file's is its git blob id, the sha1 of
 * "blob <size>\0" followed by the content. Any other ETag is not checked, so a correct
 * download never fails. */
#include "hub/hub.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

static int is_hex(const char *s, size_t n) {
    if (strlen(s) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f') || (s[i] >= 'A' && s[i] <= 'F')))
            return 0;
    return 1;
}

/* Hash the file behind fd (size bytes) into hex; git: prefix the git blob header. */
static gerbil_status hash_file(int fd, uint64_t size, int git, const char *path, char *hex, size_t cap) {
    enum { CHUNK = 1 << 20 };
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    char *buf = malloc(CHUNK);
    gerbil_status st = md && buf && EVP_DigestInit_ex(md, git ? EVP_sha1() : EVP_sha256(), NULL)
                           ? GERBIL_OK : err_set(GERBIL_ERR_NOMEM, "cannot initialise the hash (OpenSSL)");
    if (st == GERBIL_OK && git) {
        char hdr[64];
        int n = snprintf(hdr, sizeof hdr, "blob %llu", (unsigned long long)size);
        EVP_DigestUpdate(md, hdr, (size_t)n + 1); /* with the NUL */
    }
    for (off_t off = 0; st == GERBIL_OK;) {
        ssize_t r = pread(fd, buf, CHUNK, off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) st = err_set(GERBIL_ERR_IO, "cannot read %s: %s", path, strerror(errno));
        if (r <= 0) break;
        EVP_DigestUpdate(md, buf, (size_t)r);
        off += r;
    }
    unsigned char dig[EVP_MAX_MD_SIZE];
    unsigned int dn = 0;
    if (st == GERBIL_OK && EVP_DigestFinal_ex(md, dig, &dn) && dn * 2 < cap)
        for (unsigned i = 0; i < dn; i++) snprintf(hex + 2 * i, 3, "%02x", dig[i]);
    EVP_MD_CTX_free(md);
    free(buf);
    return st;
}

gerbil_status hub_verify_blob(const char *path, const struct hub_file *f, const char *repo) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_set(GERBIL_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    gerbil_status s = GERBIL_OK;
    if (fstat(fd, &st) != 0) s = err_set(GERBIL_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
    else if (f->size != HUB_SIZE_UNKNOWN && (uint64_t)st.st_size != f->size)
        s = err_set(GERBIL_ERR_FORMAT, "size mismatch for %s of %s: the hub says %llu bytes, %llu arrived; the "
                    "download was damaged and is deleted: run the pull again", f->path, repo,
                    (unsigned long long)f->size, (unsigned long long)st.st_size);
    int lfs = f->lfs && is_hex(f->etag, 64), git = !f->lfs && is_hex(f->etag, 40);
    char hex[2 * EVP_MAX_MD_SIZE + 1] = {0};
    if (s == GERBIL_OK && (lfs || git)) {
        s = hash_file(fd, (uint64_t)st.st_size, git, path, hex, sizeof hex);
        if (s == GERBIL_OK && strcasecmp(hex, f->etag))
            s = err_set(GERBIL_ERR_FORMAT, "checksum mismatch for %s of %s: expected %s %s, got %s; the download "
                        "was corrupted and is deleted: run the pull again (if it repeats, the server or a proxy "
                        "is altering the file)", f->path, repo, lfs ? "sha256" : "git blob sha1", f->etag, hex);
    }
    close(fd);
    return s;
}
