/* Tokenizers against Hugging Face: every expected value in tests/tokenizer/expected.json
 * came from the `tokenizers` library (and transformers' AutoTokenizer), produced by
 * scripts/gen_tokenizer_expected.py. Checks, per tokenizer: ids without and with special
 * tokens, decode, decode with skip_special_tokens, decode of random id lists, that the
 * streaming detokenizer's pieces are valid UTF-8 and concatenate to the full decode,
 * the llama.cpp vocab vectors, a ~1 MB text (count + hash of ids) and load / encode speed. */
#include "test.h"
#include "gerbil.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[n] = 0;
    if (b && len) *len = (size_t)n;
    return b;
}

static int exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* ---- fixture strings: "text" or {"hex": "..."} ---- */
typedef struct str {
    char *p;
    size_t n;
} str;

static str get_str(const cJSON *v) {
    str s = {0};
    if (cJSON_IsString(v)) {
        s.n = strlen(v->valuestring);
        s.p = malloc(s.n + 1);
        memcpy(s.p, v->valuestring, s.n + 1);
    } else if (cJSON_IsObject(v)) {
        const char *h = cJSON_GetObjectItem(v, "hex")->valuestring;
        s.n = strlen(h) / 2;
        s.p = malloc(s.n + 1);
        for (size_t i = 0; i < s.n; i++) {
            unsigned x;
            sscanf(h + 2 * i, "%2x", &x);
            s.p[i] = (char)x;
        }
        s.p[s.n] = 0;
    }
    return s;
}

static int32_t *get_ids(const cJSON *a, int *n) {
    *n = cJSON_GetArraySize(a);
    int32_t *v = malloc(((size_t)*n + 1) * sizeof *v);
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, a) v[i++] = (int32_t)x->valuedouble;
    return v;
}

static int ids_eq(const int32_t *a, int na, const int32_t *b, int nb) {
    return na == nb && (na == 0 || !memcmp(a, b, (size_t)na * sizeof *a));
}

static void print_ids(const char *what, const int32_t *v, int n) {
    fprintf(stderr, "    %s (%d):", what, n);
    for (int i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", v[i]);
    fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

static int valid_utf8(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t l = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        if (!l || i + l > n) return 0;
        for (size_t k = 1; k < l; k++)
            if (((unsigned char)s[i + k] & 0xC0) != 0x80) return 0;
        i += l;
    }
    return 1;
}

/* ---- per-tokenizer tallies ---- */
typedef struct tally {
    int pass, fail;
} tally;

static void tally_check(tally *t, int ok) {
    if (ok) t->pass++, test_pass_++;
    else t->fail++, test_fail_++;
}

static void check_decode(gerbil_tokenizer_t tok, const char *name, const int32_t *ids, int n, int skip, const str *want,
                         tally *t, const char *what, int idx) {
    char *got = NULL;
    size_t len = 0;
    gerbil_status st = gerbil_detokenize(tok, ids, n, skip, &got, &len);
    int ok = st == GERBIL_OK && len == want->n && !memcmp(got, want->p, len);
    tally_check(t, ok);
    if (!ok && t->fail <= 8)
        fprintf(stderr, "  %s case %d %s: got \"%.*s\" want \"%.*s\"\n", name, idx, what, (int)(len > 200 ? 200 : len),
                got ? got : "", (int)(want->n > 200 ? 200 : want->n), want->p);
    free(got);
}

/* The streaming pieces are valid UTF-8 and concatenate to the full decode. */
static void check_stream(gerbil_tokenizer_t tok, const char *name, const int32_t *ids, int n, int skip, tally *t, int idx) {
    char *full = NULL;
    size_t flen = 0;
    if (gerbil_detokenize(tok, ids, n, skip, &full, &flen) != GERBIL_OK) {
        tally_check(t, 0);
        return;
    }
    gerbil_detok_t d;
    if (gerbil_detok_new(tok, skip, &d) != GERBIL_OK) {
        free(full);
        tally_check(t, 0);
        return;
    }
    char *cat = malloc(flen * 2 + 64);
    size_t cn = 0, cap = flen * 2 + 64;
    int ok = 1;
    for (int i = 0; i <= n && ok; i++) {
        const char *p;
        size_t pl;
        gerbil_status st = i < n ? gerbil_detok_push(d, ids[i], &p, &pl) : gerbil_detok_flush(d, &p, &pl);
        if (st != GERBIL_OK || !valid_utf8(p, pl)) { ok = 0; break; }
        if (cn + pl > cap) {
            cap = (cn + pl) * 2;
            cat = realloc(cat, cap);
        }
        memcpy(cat + cn, p, pl);
        cn += pl;
    }
    ok = ok && cn == flen && !memcmp(cat, full, flen);
    tally_check(t, ok);
    if (!ok && t->fail <= 8)
        fprintf(stderr, "  %s case %d stream(skip=%d): got \"%.*s\" want \"%.*s\"\n", name, idx, skip, (int)(cn > 200 ? 200 : cn),
                cat, (int)(flen > 200 ? 200 : flen), full);
    gerbil_detok_free(d);
    free(cat);
    free(full);
}

/* Primed with the first half of the ids, the pieces of the second half are the full
 * decode minus the first half's decode (when that is a prefix of it: a cut inside a
 * character or a byte-fallback run has no such answer). */
static void check_prime(gerbil_tokenizer_t tok, const char *name, const int32_t *ids, int n, int skip, tally *t, int idx) {
    int k = n / 2;
    char *full = NULL, *head = NULL;
    size_t flen = 0, hlen = 0;
    if (gerbil_detokenize(tok, ids, n, skip, &full, &flen) != GERBIL_OK ||
        gerbil_detokenize(tok, ids, k, skip, &head, &hlen) != GERBIL_OK) {
        tally_check(t, 0);
        free(full);
        free(head);
        return;
    }
    if (hlen > flen || memcmp(full, head, hlen)) {
        free(full);
        free(head);
        return;
    }
    gerbil_detok_t d;
    int ok = gerbil_detok_new(tok, skip, &d) == GERBIL_OK && gerbil_detok_prime(d, ids, k) == GERBIL_OK;
    char *cat = malloc(flen + 64);
    size_t cn = 0;
    for (int i = k; i <= n && ok; i++) {
        const char *p;
        size_t pl;
        gerbil_status st = i < n ? gerbil_detok_push(d, ids[i], &p, &pl) : gerbil_detok_flush(d, &p, &pl);
        if (st != GERBIL_OK || cn + pl > flen - hlen) { ok = 0; break; }
        memcpy(cat + cn, p, pl);
        cn += pl;
    }
    ok = ok && cn == flen - hlen && !memcmp(cat, full + hlen, cn);
    tally_check(t, ok);
    if (!ok && t->fail <= 8)
        fprintf(stderr, "  %s case %d prime(skip=%d): got \"%.*s\" want \"%.*s\"\n", name, idx, skip, (int)(cn > 200 ? 200 : cn),
                cat, (int)(flen - hlen > 200 ? 200 : flen - hlen), full + hlen);
    gerbil_detok_free(d);
    free(cat);
    free(full);
    free(head);
}

static void run_cases(gerbil_tokenizer_t tok, const char *name, const cJSON *cases, const cJSON *texts, tally *t,
                      int *lossless) {
    int idx = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        idx++;
        if (!cJSON_GetObjectItem(c, "ids")) continue; /* HF raised: nothing to compare */
        str text = get_str(cJSON_GetArrayItem(texts, cJSON_GetObjectItem(c, "t")->valueint));
        int n0, nsp = 0;
        int32_t *want = get_ids(cJSON_GetObjectItem(c, "ids"), &n0), *want_sp;
        const cJSON *full_sp = cJSON_GetObjectItem(c, "ids_special"), *pre = cJSON_GetObjectItem(c, "sp_pre");
        if (full_sp) {
            want_sp = get_ids(full_sp, &nsp);
        } else if (pre) {
            int np, nq;
            int32_t *a = get_ids(pre, &np), *b = get_ids(cJSON_GetObjectItem(c, "sp_post"), &nq);
            nsp = np + n0 + nq;
            want_sp = malloc(((size_t)nsp + 1) * sizeof *want_sp);
            memcpy(want_sp, a, (size_t)np * sizeof *a);
            memcpy(want_sp + np, want, (size_t)n0 * sizeof *want);
            memcpy(want_sp + np + n0, b, (size_t)nq * sizeof *b);
            free(a);
            free(b);
        } else {
            nsp = n0;
            want_sp = malloc(((size_t)n0 + 1) * sizeof *want_sp);
            memcpy(want_sp, want, (size_t)n0 * sizeof *want);
        }
        for (int sp = 0; sp < 2; sp++) {
            int32_t *got = NULL;
            int ng = 0;
            gerbil_status st = gerbil_tokenize(tok, text.p, text.n, sp, &got, &ng);
            int ok = st == GERBIL_OK && (sp ? ids_eq(got, ng, want_sp, nsp) : ids_eq(got, ng, want, n0));
            tally_check(t, ok);
            if (!ok && t->fail <= 8) {
                fprintf(stderr, "  %s case %d (special=%d) \"%.*s\": %s\n", name, idx, sp, (int)(text.n > 80 ? 80 : text.n),
                        text.p, st ? gerbil_last_error() : "ids differ");
                print_ids("got ", got, ng);
                print_ids("want", sp ? want_sp : want, sp ? nsp : n0);
            }
            free(got);
        }
        const cJSON *dj = cJSON_GetObjectItem(c, "decode");
        str dec = dj ? get_str(dj) : text;
        if (!dj && lossless) (*lossless)++;
        check_decode(tok, name, want, n0, 0, &dec, t, "decode", idx);
        const cJSON *d1j = cJSON_GetObjectItem(c, "decode_special"), *d2j = cJSON_GetObjectItem(c, "decode_skip");
        str d1 = d1j ? get_str(d1j) : dec, d2 = d2j ? get_str(d2j) : dec;
        check_decode(tok, name, want_sp, nsp, 0, &d1, t, "decode(special)", idx);
        check_decode(tok, name, want_sp, nsp, 1, &d2, t, "decode(special, skip)", idx);
        check_stream(tok, name, want_sp, nsp, 0, t, idx);
        if (!SANITIZED) check_stream(tok, name, want_sp, nsp, 1, t, idx);
        check_prime(tok, name, want_sp, nsp, 1, t, idx);
        if (d1j) free(d1.p);
        if (d2j) free(d2.p);
        if (dj) free(dec.p);
        free(text.p);
        free(want);
        free(want_sp);
    }
}

static void run_random(gerbil_tokenizer_t tok, const char *name, const cJSON *rnd, tally *t) {
    int idx = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, rnd) {
        idx++;
        if (!cJSON_GetObjectItem(c, "decode")) continue;
        int n;
        int32_t *ids = get_ids(cJSON_GetObjectItem(c, "ids"), &n);
        str d = get_str(cJSON_GetObjectItem(c, "decode")), ds = get_str(cJSON_GetObjectItem(c, "decode_skip"));
        check_decode(tok, name, ids, n, 0, &d, t, "random decode", idx);
        check_decode(tok, name, ids, n, 1, &ds, t, "random decode(skip)", idx);
        check_stream(tok, name, ids, n, 0, t, 1000 + idx);
        check_stream(tok, name, ids, n, 1, t, 1000 + idx); /* random ids: skipped specials mid-stream */
        free(d.p);
        free(ds.p);
        free(ids);
    }
}

/* ---- synthetic tokenizers: base file + overrides, written to a temporary folder ---- */
static char tmpdir[64];

/* Print non-integral numbers as the shortest string that reads back the same, as
 * Python's json.dumps (which wrote what HF read); cJSON's %.17g could read back the
 * same here but not through serde_json's float parsing. */
static void shortest_numbers(cJSON *node) {
    cJSON *c = node->child;
    while (c) {
        cJSON *next = c->next;
        if (cJSON_IsNumber(c) && c->valuedouble != (double)(long long)c->valuedouble) {
            char buf[40];
            for (int p = 1; p <= 17; p++) {
                snprintf(buf, sizeof buf, "%.*g", p, c->valuedouble);
                if (strtod(buf, NULL) == c->valuedouble) break;
            }
            cJSON_ReplaceItemViaPointer(node, c, cJSON_CreateRaw(buf));
        } else if (c->child) {
            shortest_numbers(c);
        }
        c = next;
    }
}

static char *write_variant(const char *base, const cJSON *ov) {
    char path[512];
    if (!strncmp(base, "../", 3)) snprintf(path, sizeof path, "%s", base);
    else snprintf(path, sizeof path, "tests/tokenizer/%s", base);
    char *src = read_file(path, NULL);
    if (!src) return NULL;
    cJSON *j = cJSON_Parse(src);
    free(src);
    if (!j) return NULL;
    const cJSON *it;
    cJSON_ArrayForEach(it, ov) {
        if (!strcmp(it->string, "model")) {
            cJSON *m = cJSON_GetObjectItem(j, "model");
            const cJSON *k;
            cJSON_ArrayForEach(k, it) cJSON_ReplaceItemInObject(m, k->string, cJSON_Duplicate(k, 1));
        } else if (!strcmp(it->string, "added_tokens_extra")) {
            cJSON *list = cJSON_GetObjectItem(j, "added_tokens");
            const cJSON *a;
            cJSON_ArrayForEach(a, it) {
                int id = cJSON_GetObjectItem(a, "id")->valueint;
                for (int i = cJSON_GetArraySize(list) - 1; i >= 0; i--)
                    if (cJSON_GetObjectItem(cJSON_GetArrayItem(list, i), "id")->valueint == id) cJSON_DeleteItemFromArray(list, i);
                cJSON_AddItemToArray(list, cJSON_Duplicate(a, 1));
            }
        } else if (cJSON_GetObjectItem(j, it->string)) {
            cJSON_ReplaceItemInObject(j, it->string, cJSON_Duplicate(it, 1));
        } else {
            cJSON_AddItemToObject(j, it->string, cJSON_Duplicate(it, 1));
        }
    }
    shortest_numbers(j);
    char *out = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    char *file = malloc(strlen(tmpdir) + 32);
    sprintf(file, "%s/tokenizer.json", tmpdir);
    FILE *f = fopen(file, "wb");
    fputs(out, f);
    fclose(f);
    free(out);
    return file;
}

/* ---- llama.cpp vectors ---- */
static void run_llamacpp(gerbil_tokenizer_t tok, const char *name, const char *vocab, tally *t) {
    char pin[512], pout[512];
    snprintf(pin, sizeof pin, "../shared/data/tokenizers/llamacpp_vocab_tests/ggml-vocab-%s.gguf.inp", vocab);
    snprintf(pout, sizeof pout, "../shared/data/tokenizers/llamacpp_vocab_tests/ggml-vocab-%s.gguf.out", vocab);
    size_t ni, no;
    char *in = read_file(pin, &ni), *out = read_file(pout, &no);
    if (!in || !out) {
        fprintf(stderr, "  %s: llama.cpp vectors %s not found, skipped\n", name, vocab);
        free(in);
        free(out);
        return;
    }
    const char *sep = "\n__ggml_vocab_test__\n";
    char *p = in, *line = out;
    int idx = 0, pass0 = t->pass;
    while (p && *line) {
        char *e = strstr(p, sep);
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        int32_t want[4096];
        int nw = 0;
        for (char *q = line; *q && nw < 4096;) {
            char *end;
            long v = strtol(q, &end, 10);
            if (end == q) break;
            want[nw++] = (int32_t)v;
            q = end;
        }
        int32_t *got;
        int ng;
        int ok = gerbil_tokenize(tok, p, len, 0, &got, &ng) == GERBIL_OK && ids_eq(got, ng, want, nw);
        tally_check(t, ok);
        if (!ok) fprintf(stderr, "  %s llama.cpp %s vector %d differs: \"%.*s\"\n", name, vocab, idx, (int)len, p);
        free(got);
        idx++;
        if (!e || !nl) break;
        p = e + strlen(sep);
        line = nl + 1;
    }
    printf("  %-12s llama.cpp %-10s %d/%d vectors\n", name, vocab, t->pass - pass0, idx);
    free(in);
    free(out);
}

static uint32_t fnv_ids(const int32_t *ids, int n) {
    uint32_t h = 2166136261u;
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)ids[i]) * 16777619u;
    return h;
}

/* The ~1 MB text: "\n".join(corpus) repeated, joined by "\n". */
static void run_big(gerbil_tokenizer_t tok, const char *name, const cJSON *rec, const cJSON *texts, tally *t) {
    int nc = cJSON_GetObjectItem(rec, "n_corpus")->valueint;
    size_t want_bytes = (size_t)cJSON_GetObjectItem(rec, "big_bytes")->valuedouble;
    char *unit = malloc(1 << 20);
    size_t un = 0;
    for (int i = 0; i < nc; i++) {
        str s = get_str(cJSON_GetArrayItem(texts, i));
        if (i) unit[un++] = '\n';
        memcpy(unit + un, s.p, s.n);
        un += s.n;
        free(s.p);
    }
    size_t reps = 1 + ((size_t)1 << 20) / un, bn = 0;
    char *big = malloc(reps * (un + 1));
    for (size_t r = 0; r < reps; r++) {
        if (r) big[bn++] = '\n';
        memcpy(big + bn, unit, un);
        bn += un;
    }
    int32_t *ids;
    int n;
    double t0 = now_s();
    gerbil_status st = gerbil_tokenize(tok, big, bn, 0, &ids, &n);
    double dt = now_s() - t0;
    int ok = st == GERBIL_OK && bn == want_bytes && n == cJSON_GetObjectItem(rec, "big_n_ids")->valueint &&
             fnv_ids(ids, n) == (uint32_t)cJSON_GetObjectItem(rec, "big_fnv")->valuedouble;
    tally_check(t, ok);
    if (!ok) fprintf(stderr, "  %s: 1 MB text: %d ids (hash %u), want %d (hash %u), %zu/%zu bytes\n", name, n, fnv_ids(ids, n),
                     cJSON_GetObjectItem(rec, "big_n_ids")->valueint, (uint32_t)cJSON_GetObjectItem(rec, "big_fnv")->valuedouble,
                     bn, want_bytes);
    printf("  %-12s encode %.2f MB in %.3f s: %.1f MB/s (%d ids)\n", name, bn / 1e6, dt, bn / 1e6 / dt, n);
    if (st == GERBIL_OK) free(ids);
    free(big);
    free(unit);
}

struct job {
    gerbil_tokenizer_t tok;
    const cJSON *texts;
    int bad;
    pthread_mutex_t lock;
};

/* Encode the first corpus texts twice in a row; the results must agree. */
static void *encode_all(void *arg) {
    struct job *j = arg;
    for (int i = 0; i < 40 && i < cJSON_GetArraySize(j->texts); i++) {
        str s = get_str(cJSON_GetArrayItem(j->texts, i));
        int32_t *a = NULL, *b = NULL;
        int na = 0, nb = 0;
        int ok = gerbil_tokenize(j->tok, s.p, s.n, 0, &a, &na) == GERBIL_OK &&
                 gerbil_tokenize(j->tok, s.p, s.n, 0, &b, &nb) == GERBIL_OK && ids_eq(a, na, b, nb);
        if (!ok) {
            pthread_mutex_lock(&j->lock);
            j->bad++;
            pthread_mutex_unlock(&j->lock);
        }
        free(a);
        free(b);
        free(s.p);
    }
    return NULL;
}

static const char *real_path(const char *name) {
    if (!strcmp(name, "stories260K")) return "../shared/data/models/stories260K/hf";
    static char p[256];
    snprintf(p, sizeof p, "../shared/data/tokenizers/%s", name);
    return p;
}

int main(void) {
    size_t flen;
    char *fx = read_file("tests/tokenizer/expected.json", &flen);
    if (!fx) SKIP("tests/tokenizer/expected.json not found (run from the repository root)");
    cJSON *e = cJSON_Parse(fx);
    free(fx);
    if (!e) SKIP("tests/tokenizer/expected.json does not parse");
    const cJSON *texts = cJSON_GetObjectItem(e, "texts");
    snprintf(tmpdir, sizeof tmpdir, "/tmp/gerbil_tok_XXXXXX");
    if (!mkdtemp(tmpdir)) SKIP("cannot make a temporary folder");

    double t_sec = now_s();
    gerbil_tokenizer_t qwen = NULL;
    /* real tokenizers, as tokenizer.json files (HF tokenizers semantics) */
    const cJSON *rec;
    cJSON_ArrayForEach(rec, cJSON_GetObjectItem(e, "real")) {
        const char *name = rec->string;
        char file[300];
        snprintf(file, sizeof file, "%s/tokenizer.json", real_path(name));
        if (!exists(file)) {
            printf("  %-12s not found at %s: skipped\n", name, file);
            continue;
        }
        gerbil_tokenizer_t tok;
        double t0 = now_s();
        gerbil_status st = gerbil_tokenizer_load(file, &tok);
        double dt = now_s() - t0;
        CHECKF(st == GERBIL_OK, "%s: %s", file, gerbil_last_error());
        if (st) continue;
        CHECK(gerbil_tokenizer_n_vocab(tok) == cJSON_GetObjectItem(rec, "vocab_size")->valueint);
        tally t = {0};
        int lossless = 0;
        run_cases(tok, name, cJSON_GetObjectItem(rec, "cases"), texts, &t, &lossless);
        run_random(tok, name, cJSON_GetObjectItem(rec, "random_ids"), &t);
        if (!strcmp(name, "qwen3")) run_llamacpp(tok, name, "qwen2", &t);
        if (!strcmp(name, "llama3")) run_llamacpp(tok, name, "llama-bpe", &t);
        if (!strcmp(name, "gemma3")) run_llamacpp(tok, name, "gemma-4", &t);
        if (!SANITIZED || !strcmp(name, "qwen3")) run_big(tok, name, rec, texts, &t);
        printf("  %-12s load %.3f s; %d passed, %d failed (%d texts decode back exactly)\n", name, dt, t.pass, t.fail, lossless);
        if (!strcmp(name, "qwen3")) qwen = tok; /* kept for the thread and invalid-UTF-8 checks */
        else gerbil_tokenizer_free(tok);
    }

    printf("  [%s: %.2f s]\n", "real tokenizers", now_s() - t_sec);
    t_sec = now_s();
    /* synthetic tokenizers (Unigram, WordPiece, BPE variants, every component) */
    cJSON_ArrayForEach(rec, cJSON_GetObjectItem(e, "synth")) {
        const char *name = rec->string;
        const char *base = cJSON_GetObjectItem(rec, "base")->valuestring;
        if (!strncmp(base, "../", 3) && !exists(base)) {
            printf("  %-24s base %s not found: skipped\n", name, base);
            continue;
        }
        if (SANITIZED && strstr(base, "llama3")) continue; /* 9 MB through cJSON: slow under ASan */
        if (cJSON_GetObjectItem(rec, "load_error")) continue;
        char *file = write_variant(base, cJSON_GetObjectItem(rec, "override"));
        CHECKF(file != NULL, "%s: cannot build the variant", name);
        if (!file) continue;
        gerbil_tokenizer_t tok;
        gerbil_status st = gerbil_tokenizer_load(file, &tok);
        CHECKF(st == GERBIL_OK, "%s: %s", name, gerbil_last_error());
        if (st == GERBIL_OK) {
            CHECKF(gerbil_tokenizer_n_vocab(tok) == cJSON_GetObjectItem(rec, "vocab_size")->valueint, "%s: n_vocab %d",
                   name, gerbil_tokenizer_n_vocab(tok));
            tally t = {0};
            run_cases(tok, name, cJSON_GetObjectItem(rec, "cases"), texts, &t, NULL);
            run_random(tok, name, cJSON_GetObjectItem(rec, "random_ids"), &t);
            printf("  %-24s %d passed, %d failed\n", name, t.pass, t.fail);
            gerbil_tokenizer_free(tok);
        }
        unlink(file);
        free(file);
    }

    printf("  [%s: %.2f s]\n", "synthetic tokenizers", now_s() - t_sec);
    t_sec = now_s();
    /* folders, as transformers' AutoTokenizer loads them */
    cJSON_ArrayForEach(rec, cJSON_GetObjectItem(e, "auto")) {
        const char *name = rec->string;
        const char *dir = real_path(name);
        if (!exists(dir)) continue;
        if (SANITIZED && (!strcmp(name, "llama3") || !strcmp(name, "gemma3"))) continue; /* keep ASan runs short */
        gerbil_tokenizer_t tok;
        gerbil_status st = gerbil_tokenizer_load(dir, &tok);
        CHECKF(st == GERBIL_OK, "%s: %s", dir, gerbil_last_error());
        if (st) continue;
        const cJSON *b = cJSON_GetObjectItem(rec, "bos_token_id"), *eo = cJSON_GetObjectItem(rec, "eos_token_id");
        CHECKF(gerbil_tokenizer_bos(tok) == (cJSON_IsNumber(b) ? b->valueint : -1), "%s: bos %d", name, gerbil_tokenizer_bos(tok));
        CHECKF(gerbil_tokenizer_eos(tok) == (cJSON_IsNumber(eo) ? eo->valueint : -1), "%s: eos %d", name, gerbil_tokenizer_eos(tok));
        if (strcmp(name, "stories260K")) /* the others' tokenizer_config.json carry one */
            CHECKF(gerbil_tokenizer_chat_template(tok, NULL) != NULL, "%s: no chat template", name);
        tally t = {0};
        int idx = 0;
        const cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(rec, "cases")) {
            idx++;
            str text = get_str(cJSON_GetArrayItem(texts, cJSON_GetObjectItem(c, "t")->valueint));
            for (int sp = 0; sp < 2; sp++) {
                int nw;
                int32_t *want = get_ids(cJSON_GetObjectItem(c, sp ? "ids_special" : "ids"), &nw), *got = NULL;
                int ng = 0;
                int ok = gerbil_tokenize(tok, text.p, text.n, sp, &got, &ng) == GERBIL_OK && ids_eq(got, ng, want, nw);
                tally_check(&t, ok);
                if (!ok && t.fail <= 8) {
                    fprintf(stderr, "  auto %s case %d (special=%d) \"%.*s\"\n", name, idx, sp, (int)(text.n > 60 ? 60 : text.n), text.p);
                    print_ids("got ", got, ng);
                    print_ids("want", want, nw);
                }
                if (sp) {
                    str d = get_str(cJSON_GetObjectItem(c, "decode")), ds = get_str(cJSON_GetObjectItem(c, "decode_skip"));
                    check_decode(tok, name, want, nw, 0, &d, &t, "auto decode", idx);
                    check_decode(tok, name, want, nw, 1, &ds, &t, "auto decode(skip)", idx);
                    free(d.p);
                    free(ds.p);
                }
                free(want);
                free(got);
            }
            free(text.p);
        }
        printf("  %-12s AutoTokenizer folder: %d passed, %d failed\n", name, t.pass, t.fail);
        gerbil_tokenizer_free(tok);
    }

    printf("  [%s: %.2f s]\n", "folders", now_s() - t_sec);
    t_sec = now_s();
    /* errors are values with the file and the culprit named */
    {
        char *file = malloc(strlen(tmpdir) + 32);
        sprintf(file, "%s/tokenizer.json", tmpdir);
        FILE *f = fopen(file, "wb");
        fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, \"normalizer\": {\"type\": \"Frobnicate\"}}", f);
        fclose(f);
        gerbil_tokenizer_t tok = NULL;
        gerbil_status st = gerbil_tokenizer_load(file, &tok);
        CHECK(st == GERBIL_ERR_UNSUPPORTED && strstr(gerbil_last_error(), "Frobnicate") && strstr(gerbil_last_error(), file));
        f = fopen(file, "wb");
        fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}", f);
        fclose(f);
        st = gerbil_tokenizer_load(file, &tok);
        CHECK(st == GERBIL_ERR_FORMAT && strstr(gerbil_last_error(), "ab"));
        f = fopen(file, "wb");
        fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0", f);
        fclose(f);
        st = gerbil_tokenizer_load(file, &tok);
        CHECK(st == GERBIL_ERR_FORMAT);
        CHECK(gerbil_tokenizer_load("/nonexistent/tokenizer.json", &tok) == GERBIL_ERR_IO);
        unlink(file);
        free(file);
    }
    printf("  [%s: %.2f s]\n", "errors", now_s() - t_sec);
    t_sec = now_s();
    /* one tokenizer shared by threads (the BPE word cache is locked) */
    if (qwen) {
        struct job j = {.lock = PTHREAD_MUTEX_INITIALIZER, .tok = qwen, .texts = texts};
        pthread_t th[3];
        for (int k = 0; k < 3; k++) pthread_create(&th[k], NULL, encode_all, &j);
        for (int k = 0; k < 3; k++) pthread_join(th[k], NULL);
        CHECKF(j.bad == 0, "%d encodings differed between threads", j.bad);
    }
    printf("  [%s: %.2f s]\n", "threads", now_s() - t_sec);
    t_sec = now_s();
    /* invalid UTF-8 encodes as if each maximal invalid subpart were U+FFFD */
    if (qwen) {
        const char bad[] = "a\xff\xe2\x82 b\xf0\x9f\xa6", good[] = "a\xef\xbf\xbd\xef\xbf\xbd b\xef\xbf\xbd";
        int32_t *x, *y;
        int nx, ny;
        CHECK(gerbil_tokenize(qwen, bad, sizeof bad - 1, 0, &x, &nx) == GERBIL_OK);
        CHECK(gerbil_tokenize(qwen, good, sizeof good - 1, 0, &y, &ny) == GERBIL_OK);
        CHECK(ids_eq(x, nx, y, ny));
        free(x);
        free(y);
        CHECK(gerbil_tokenize(qwen, NULL, 0, 1, &x, &nx) == GERBIL_OK && nx == 0);
        free(x);
        gerbil_tokenizer_free(qwen);
    }
    printf("  [%s: %.2f s]\n", "invalid UTF-8", now_s() - t_sec);
    t_sec = now_s();
    /* a folder: chat templates (named list, chat_template.jinja wins), bos/eos given as
     * {"content": ...}, add_bos_token/add_eos_token rebuilding the post-processor */
    {
        char p1[128], p2[128], p3[128];
        snprintf(p1, sizeof p1, "%s/tokenizer.json", tmpdir);
        snprintf(p2, sizeof p2, "%s/tokenizer_config.json", tmpdir);
        snprintf(p3, sizeof p3, "%s/chat_template.jinja", tmpdir);
        char *src = read_file("tests/tokenizer/synth_unigram.json", NULL);
        FILE *f = fopen(p1, "wb");
        fputs(src, f);
        fclose(f);
        free(src);
        f = fopen(p2, "wb");
        fputs("{\"bos_token\": {\"content\": \"<s>\", \"__type\": \"AddedToken\"}, \"eos_token\": \"</s>\","
              " \"add_bos_token\": false, \"add_eos_token\": true,"
              " \"chat_template\": [{\"name\": \"default\", \"template\": \"D\"}, {\"name\": \"tool_use\", \"template\": \"T\"}]}", f);
        fclose(f);
        gerbil_tokenizer_t tok;
        CHECK(gerbil_tokenizer_load(tmpdir, &tok) == GERBIL_OK);
        if (tok) {
            int32_t bos = gerbil_tokenizer_bos(tok), eos = gerbil_tokenizer_eos(tok);
            CHECK(bos >= 0 && eos >= 0 && bos != eos);
            const char *d = gerbil_tokenizer_chat_template(tok, NULL), *tu = gerbil_tokenizer_chat_template(tok, "tool_use");
            CHECK(d && !strcmp(d, "D") && tu && !strcmp(tu, "T") && !gerbil_tokenizer_chat_template(tok, "nope"));
            int32_t *x;
            int nx;
            CHECK(gerbil_tokenize(tok, "hello", 5, 1, &x, &nx) == GERBIL_OK && nx >= 2 && x[nx - 1] == eos && x[0] != bos);
            free(x);
            gerbil_tokenizer_free(tok);
        }
        f = fopen(p3, "wb");
        fputs("{{ J }}", f);
        fclose(f);
        CHECK(gerbil_tokenizer_load(tmpdir, &tok) == GERBIL_OK);
        if (tok) {
            const char *d = gerbil_tokenizer_chat_template(tok, NULL);
            CHECK(d && !strcmp(d, "{{ J }}") && gerbil_tokenizer_chat_template(tok, "tool_use"));
            gerbil_tokenizer_free(tok);
        }
        /* truncated files fail cleanly wherever they are cut */
        size_t n;
        char *full = read_file("tests/tokenizer/synth_bpe.json", &n);
        int clean = 1;
        for (size_t cut = 0; cut < n; cut += 1 + cut / 3) {
            f = fopen(p1, "wb");
            fwrite(full, 1, cut, f);
            fclose(f);
            gerbil_status st = gerbil_tokenizer_load(p1, &tok);
            if (st == GERBIL_OK) gerbil_tokenizer_free(tok);
            clean &= st == GERBIL_ERR_FORMAT || st == GERBIL_ERR_IO;
        }
        CHECK(clean);
        /* random byte damage: any status, never a crash (ASan watches) */
        unsigned long long seed = 0x5eed;
        for (int k = 0; k < (SANITIZED ? 20 : 200); k++) {
            char *dmg = malloc(n);
            memcpy(dmg, full, n);
            for (int j = 0; j < 1 + k % 8; j++) {
                size_t at = (size_t)(test_rand_u64(&seed) % n);
                dmg[at] = "{}[]\",:0\\ax\xff"[test_rand_u64(&seed) % 13];
            }
            f = fopen(p1, "wb");
            fwrite(dmg, 1, n, f);
            fclose(f);
            free(dmg);
            if (gerbil_tokenizer_load(p1, &tok) == GERBIL_OK) {
                int32_t *x;
                int nx;
                if (gerbil_tokenize(tok, "Hello <mask> world 123", 22, 1, &x, &nx) == GERBIL_OK) free(x);
                gerbil_tokenizer_free(tok);
            }
        }
        CHECK(1);
        free(full);
        unlink(p1);
        unlink(p2);
        unlink(p3);
    }
    printf("  [folder config, damaged files: %.2f s]\n", now_s() - t_sec);
    rmdir(tmpdir);
    cJSON_Delete(e);
    return test_done();
}
