/* The hub layer without a network: reference parsing, repo-id validation, the hub's
 * JSON (unsafe paths dropped), which files a pull keeps (format preference, GGUF
 * choice, Mistral's consolidated copy), the cache root from the environment, and
 * finding the model inside a snapshot folder. */
#include "hub/hub.h"
#include "test.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void test_ref_parse(void) {
    struct hub_ref r;
    CHECK(hub_ref_parse("Qwen/Qwen3-0.6B", &r) == GERBIL_OK && !strcmp(r.repo, "Qwen/Qwen3-0.6B") &&
          !strcmp(r.revision, "main") && !r.select[0]);
    CHECK(hub_ref_parse("a/b@v1.0", &r) == GERBIL_OK && !strcmp(r.revision, "v1.0"));
    CHECK(hub_ref_parse("a/b@refs/pr/1", &r) == GERBIL_OK && !strcmp(r.revision, "refs/pr/1"));
    CHECK(hub_ref_parse("a/b:m-Q8_0.gguf", &r) == GERBIL_OK && !strcmp(r.select, "m-Q8_0.gguf") &&
          !strcmp(r.revision, "main"));
    CHECK(hub_ref_parse("a/b@dev:Q4_K_M", &r) == GERBIL_OK && !strcmp(r.revision, "dev") && !strcmp(r.select, "Q4_K_M"));
    CHECK(hub_ref_parse("a/b:Q4_K_M@dev", &r) == GERBIL_OK && !strcmp(r.revision, "dev") && !strcmp(r.select, "Q4_K_M"));
    const char *bad[] = {"", "a", "/a/b", "a/b/c", "./a", "../a", "a/", "/b", "a//b", "a/b@", "a/b:", "a/b@../x",
                         "a/b@/x", "a/b@x y", "a/b:../x.gguf", ".a/b", "a/-b", "a--x/b", "a/b..c", "~/b"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gerbil_status st = hub_ref_parse(bad[i], &r);
        CHECKF(st == GERBIL_ERR_INVALID_ARG, "\"%s\" accepted", bad[i]);
    }
    CHECK(strstr(gerbil_last_error(), "org/name"));
    char long_ref[600];
    memset(long_ref, 'x', sizeof long_ref - 1);
    long_ref[sizeof long_ref - 1] = 0;
    long_ref[3] = '/';
    CHECK(hub_ref_parse(long_ref, &r) == GERBIL_ERR_INVALID_ARG);
    CHECK(hub_is_commit("0123456789abcdef0123456789abcdef01234567"));
    CHECK(!hub_is_commit("0123456789ABCDEF0123456789abcdef01234567"));
    CHECK(!hub_is_commit("main"));
}

/* A revision from JSON text; the caller frees it. */
static gerbil_status revision(const char *json, struct hub_revision *r) {
    cJSON *doc = cJSON_Parse(json);
    gerbil_status st = doc ? hub_revision_from_json(doc, "test", r) : GERBIL_ERR_FORMAT;
    cJSON_Delete(doc);
    return st;
}

#define SHA "\"sha\": \"0123456789abcdef0123456789abcdef01234567\""

static void test_revision_json(void) {
    struct hub_revision r;
    CHECK(revision("{" SHA ", \"siblings\": [{\"rfilename\": \"config.json\", \"size\": 10, \"blobId\": "
                   "\"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\"}, {\"rfilename\": \"m.safetensors\", \"size\": 133, "
                   "\"lfs\": {\"sha256\": \"" "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" "\", "
                   "\"size\": 5000000000}}, {\"rfilename\": \"../evil\"}, {\"rfilename\": \"/etc/passwd\"}, "
                   "{\"rfilename\": \"a/../../b\"}, {\"rfilename\": 7}, {\"rfilename\": \"x/y.gguf\"}]}", &r) == GERBIL_OK);
    CHECK(r.n_files == 3);
    CHECK(r.n_files == 3 && !strcmp(r.files[0].etag, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa") && r.files[0].size == 10 &&
          !r.files[0].lfs);
    CHECK(r.n_files == 3 && r.files[1].lfs && r.files[1].size == 5000000000ull && strlen(r.files[1].etag) == 64);
    CHECK(r.n_files == 3 && !r.files[2].etag && r.files[2].size == HUB_SIZE_UNKNOWN && !strcmp(r.files[2].path, "x/y.gguf"));
    hub_revision_free(&r);
    CHECK(revision("{\"sha\": \"main\", \"siblings\": []}", &r) == GERBIL_ERR_FORMAT);
    CHECK(revision("{" SHA "}", &r) == GERBIL_ERR_FORMAT);
    CHECK(revision("[]", &r) == GERBIL_ERR_FORMAT);
}

static char notice_buf[4096];
static void on_notice(void *user, const char *msg) {
    (void)user;
    snprintf(notice_buf, sizeof notice_buf, "%s", msg);
}

/* Select from a list of names; returns the kept names joined by ',' (static) or NULL. */
static const char *select_names(const char *const *names, int n, const char *ref_text, const char **model) {
    static char out[2048];
    struct hub_revision r = {.commit = "0123456789abcdef0123456789abcdef01234567"};
    r.files = calloc((size_t)n, sizeof *r.files);
    for (int i = 0; i < n; i++) r.files[i].path = strdup(names[i]);
    r.n_files = n;
    struct hub_ref ref;
    gerbil_hub_params p = {.notice = on_notice};
    notice_buf[0] = 0;
    char *mp = NULL;
    const char *res = NULL;
    if (hub_ref_parse(ref_text, &ref) == GERBIL_OK && hub_select_files(&r, &ref, &p, &mp) == GERBIL_OK) {
        out[0] = 0;
        for (int i = 0; i < r.n_files; i++) {
            if (i) strcat(out, ",");
            strcat(out, r.files[i].path);
        }
        if (model) *model = mp[0] ? "gguf" : "folder";
        res = out;
    }
    hub_revision_free(&r);
    return res;
}

static void test_select(void) {
    const char *model = NULL, *s;
    const char *st[] = {"README.md", ".gitattributes", "config.json", "model.safetensors", "tokenizer.json",
                        "vocab.json", "merges.txt", "chat_template.jinja", "onnx/model.safetensors", "m-Q4_K_M.gguf"};
    s = select_names(st, 10, "a/b", &model);
    CHECKF(s && !strcmp(s, "config.json,model.safetensors,tokenizer.json,chat_template.jinja"), "%s", s ? s : "NULL");
    CHECK(model && !strcmp(model, "folder"));
    s = select_names(st, 10, "a/b:Q4_K_M", &model); /* asked for the GGUF: only it */
    CHECKF(s && !strcmp(s, "m-Q4_K_M.gguf") && !strcmp(model, "gguf"), "%s", s ? s : "NULL");

    const char *sharded[] = {"config.json", "consolidated.safetensors", "model-00001-of-00002.safetensors",
                             "model-00002-of-00002.safetensors", "model.safetensors.index.json", "params.json"};
    s = select_names(sharded, 6, "a/b", NULL);
    CHECKF(s && !strcmp(s, "config.json,model-00001-of-00002.safetensors,model-00002-of-00002.safetensors,"
                           "model.safetensors.index.json"), "%s", s ? s : "NULL");

    const char *ggufs[] = {"README.md", "m-Q2_K.gguf", "m-Q4_K.gguf", "m-Q4_K_M.gguf", "m-Q8_0.gguf", "mmproj-f16.gguf"};
    s = select_names(ggufs, 6, "a/b", NULL);
    CHECKF(s && !strcmp(s, "m-Q4_K_M.gguf") && strstr(notice_buf, "using m-Q4_K_M.gguf"), "%s / %s", s, notice_buf);
    s = select_names(ggufs, 6, "a/b:q8_0", NULL);
    CHECKF(s && !strcmp(s, "m-Q8_0.gguf") && !notice_buf[0], "%s", s ? s : "NULL");
    s = select_names(ggufs, 6, "a/b:Q4_K", NULL); /* a whole tag: not Q4_K_M */
    CHECKF(s && !strcmp(s, "m-Q4_K.gguf"), "%s", s ? s : "NULL");
    s = select_names(ggufs, 6, "a/b:mmproj-f16.gguf", NULL); /* by name, even the projector */
    CHECK(s && !strcmp(s, "mmproj-f16.gguf"));
    CHECK(!select_names(ggufs, 6, "a/b:Q3_K", NULL) && strstr(gerbil_last_error(), "no GGUF file matching \"Q3_K\""));

    const char *two[] = {"x-f16.gguf", "x-q8_0.gguf", "mmproj.gguf"};
    CHECK(!select_names(two, 3, "a/b", NULL) && strstr(gerbil_last_error(), "several GGUF files") &&
          strstr(gerbil_last_error(), "x-f16.gguf, x-q8_0.gguf"));
    const char *one[] = {"x-f16.gguf", "mmproj.gguf", "README.md"};
    s = select_names(one, 3, "a/b", NULL);
    CHECK(s && !strcmp(s, "x-f16.gguf") && !notice_buf[0]);
    const char *none[] = {"README.md", "pytorch_model.bin", "config.json"};
    CHECK(!select_names(none, 3, "a/b", NULL) && strstr(gerbil_last_error(), "no weights gerbil can run") &&
          strstr(gerbil_last_error(), "pytorch_model.bin"));
}

static void test_cache_root(void) {
    unsetenv("HF_HUB_CACHE");
    unsetenv("HUGGINGFACE_HUB_CACHE");
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/home/u", 1);
    unsetenv("HF_HOME");
    char *r = hub_cache_root(NULL);
    CHECK(r && !strcmp(r, "/home/u/.cache/huggingface/hub"));
    free(r);
    setenv("XDG_CACHE_HOME", "/x", 1);
    r = hub_cache_root(NULL);
    CHECK(r && !strcmp(r, "/x/huggingface/hub"));
    free(r);
    setenv("HF_HOME", "~/hf", 1);
    r = hub_cache_root(NULL);
    CHECK(r && !strcmp(r, "/home/u/hf/hub"));
    free(r);
    setenv("HF_HUB_CACHE", "/c", 1);
    r = hub_cache_root(NULL);
    CHECK(r && !strcmp(r, "/c"));
    free(r);
    gerbil_hub_params p = {.cache_dir = "/given"};
    r = hub_cache_root(&p);
    CHECK(r && !strcmp(r, "/given"));
    free(r);
    r = hub_repo_dir("/c", "org/name");
    CHECK(r && !strcmp(r, "/c/models--org--name"));
    free(r);
}

static void touch(const char *dir, const char *name, const char *text) {
    char *p = hub_strf("%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    if (f) { fputs(text, f); fclose(f); }
    free(p);
}

static void test_snapshot_model(void) {
    char tmpl[] = "/tmp/gerbil_test_hub_XXXXXX";
    char *dir = mkdtemp(tmpl);
    if (!dir) { CHECK(0); return; }
    const char *fmt = NULL;
    char *m = hub_snapshot_model(dir, "", &fmt);
    CHECK(!m && !fmt); /* empty: incomplete */
    touch(dir, "config.json", "{}");
    CHECK(!(m = hub_snapshot_model(dir, "", NULL))); /* no weights yet */
    touch(dir, "model.safetensors.index.json", "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s2.safetensors\"}}");
    touch(dir, "s1.safetensors", "x");
    CHECK(!(m = hub_snapshot_model(dir, "", NULL))); /* a shard missing */
    touch(dir, "s2.safetensors", "x");
    m = hub_snapshot_model(dir, "", &fmt);
    CHECK(m && !strcmp(m, dir) && fmt && !strcmp(fmt, "safetensors"));
    free(m);
    touch(dir, "w-Q8_0.gguf", "x");
    m = hub_snapshot_model(dir, "Q8_0", &fmt);
    CHECK(m && strstr(m, "/w-Q8_0.gguf") && !strcmp(fmt, "gguf"));
    free(m);
    CHECK(!(m = hub_snapshot_model(dir, "Q4_K_M", NULL)));
    const char *names[] = {"config.json", "model.safetensors.index.json", "s1.safetensors", "s2.safetensors",
                           "w-Q8_0.gguf"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char *p = hub_strf("%s/%s", dir, names[i]);
        unlink(p);
        free(p);
    }
    rmdir(dir);
}

/* refs and snapshot links as huggingface_hub writes them: nested paths get one "../"
 * per folder, refs hold the bare commit, nested ref names (refs/pr/1) work. */
static void test_cache_layout(void) {
    char tmpl[] = "/tmp/gerbil_test_hub_XXXXXX";
    char *root = mkdtemp(tmpl);
    if (!root) { CHECK(0); return; }
    const char *commit = "0123456789abcdef0123456789abcdef01234567";
    char *repo = hub_repo_dir(root, "o/n");
    CHECK(hub_cache_write_ref(repo, "main", commit) == GERBIL_OK);
    CHECK(hub_cache_write_ref(repo, "refs/pr/1", commit) == GERBIL_OK);
    char got[HUB_COMMIT_LEN + 1] = {0};
    CHECK(hub_cache_read_ref(repo, "refs/pr/1", got) == GERBIL_OK && !strcmp(got, commit));
    CHECK(hub_cache_read_ref(repo, "dev", got) == GERBIL_ERR_NOT_FOUND);
    char *ref_path = hub_strf("%s/refs/main", repo);
    FILE *f = fopen(ref_path, "rb");
    char buf[64] = {0};
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    CHECK(n == 40 && !strcmp(buf, commit)); /* no newline, as huggingface_hub writes it */
    CHECK(hub_cache_link(repo, commit, "a/b/c.gguf", "e7") == GERBIL_OK);
    CHECK(hub_cache_link(repo, commit, "top.json", "e8") == GERBIL_OK);
    CHECK(hub_cache_link(repo, commit, "top.json", "e8") == GERBIL_OK); /* again: replaced, no error */
    char *l1 = hub_strf("%s/snapshots/%s/a/b/c.gguf", repo, commit), *l2 = hub_strf("%s/snapshots/%s/top.json", repo, commit);
    char t1[256] = {0}, t2[256] = {0};
    CHECK(readlink(l1, t1, sizeof t1 - 1) > 0 && !strcmp(t1, "../../../../blobs/e7"));
    CHECK(readlink(l2, t2, sizeof t2 - 1) > 0 && !strcmp(t2, "../../blobs/e8"));
    int fd = hub_cache_lock(root, "o/n", "e7");
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    free(l1);
    free(l2);
    free(ref_path);
    free(repo);
    gerbil_hub_params p = {.cache_dir = root};
    CHECK(gerbil_hub_remove("o/n", &p, NULL) == GERBIL_OK);
    CHECK(gerbil_hub_remove("o/n", &p, NULL) == GERBIL_ERR_NOT_FOUND);
    CHECK(gerbil_hub_remove("../x", &p, NULL) == GERBIL_ERR_INVALID_ARG);
    char *locks = hub_strf("%s/.locks", root);
    rmdir(locks);
    free(locks);
    CHECK(rmdir(root) == 0); /* rm left nothing behind */
}

int main(void) {
    test_ref_parse();
    test_revision_json();
    test_select();
    test_cache_root();
    test_snapshot_model();
    test_cache_layout();
    return test_done();
}
