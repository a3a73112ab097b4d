/* gerbil grammar --schema S.json|--gbnf G|--regex R|--json-object --model M (--text T | --file F) [--json]
 * Compiles a constraint, walks the text's tokens through it, reports what it accepts. */
#include "cli.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void help(FILE *f) {
    fprintf(f, "usage: gerbil grammar (--schema S.json | --gbnf G.gbnf | --regex RE | --json-object) --model M\n"
               "                      (--text T | --file F) [--compact] [--json]\n\n"
               "Compiles a constraint for the model's tokenizer, tokenizes the text and walks its tokens\n"
               "through it: whether every token is allowed, the first rejected byte and token, whether\n"
               "the grammar may end after the text, the compile time and the time of each token's\n"
               "mask (p50, p99, max). Exit status 0 whenever it ran, whatever the verdict.\n\noptions:\n"
               "      --schema FILE    a JSON Schema (properties in the order written; whitespace as JSON allows)\n"
               "      --gbnf FILE      a llama.cpp GBNF grammar (start rule \"root\")\n"
               "      --regex RE       an ECMAScript regex the whole text must match\n"
               "      --json-object    any JSON object\n"
               "      --compact        JSON: no whitespace between tokens\n"
               "      --model M        a model folder, tokenizer folder, tokenizer.json, .gguf or repo id\n"
               "      --text T         the text to check\n"
               "      --file F         the text to check, from a file ('-': standard input)\n"
               "      --json           print one JSON object: compiled, error, accepted, complete,\n"
               "                       rejected_at_byte, rejected_at_token, tokens, compile_ms,\n"
               "                       mask_us {p50, p99, max}\n");
}

int cli_grammar_source(const char *flag, const char *value, gerbil_grammar_kind *kind, char **src, size_t *len) {
    *src = NULL;
    *len = 0;
    if (!strcmp(flag, "--regex")) {
        *kind = GERBIL_GRAMMAR_REGEX;
        *src = strdup(value);
        *len = strlen(value);
    } else if (!strcmp(flag, "--json-object")) {
        *kind = GERBIL_GRAMMAR_JSON_OBJECT;
        *src = strdup("");
    } else {
        *kind = !strcmp(flag, "--gbnf") || !strcmp(flag, "--grammar") ? GERBIL_GRAMMAR_GBNF : GERBIL_GRAMMAR_JSON_SCHEMA;
        *src = cli_read_file(value, len);
        if (!*src) { fprintf(stderr, "gerbil: %s: cannot read %s\n", flag, value); return 1; }
    }
    if (!*src) { fprintf(stderr, "gerbil: out of memory\n"); return 1; }
    return 0;
}

int cli_load_tokenizer(const char *model, gerbil_tokenizer_t *tok) {
    char path[4096];
    if (cli_resolve_ref(model, NULL, path, sizeof path)) return 1;
    size_t ml = strlen(path);
    int gguf = ml >= 5 && !strcasecmp(path + ml - 5, ".gguf");
    gerbil_status st = gguf ? gerbil_tokenizer_load_gguf(path, tok) : gerbil_tokenizer_load(path, tok);
    if (st != GERBIL_OK) return cli_fail("cannot load the tokenizer", st);
    return 0;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(const double *v, int n, double p) {
    if (n == 0) return 0;
    int k = (int)(p * (n - 1) + 0.5);
    return v[k];
}

int cmd_grammar(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *file = NULL, *cflag = NULL, *cval = NULL;
    int json = 0;
    gerbil_grammar_params gp = gerbil_grammar_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { help(stdout); return 0; }
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (!strcmp(a, "--compact")) { gp.compact = 1; continue; }
        if (!strcmp(a, "--json-object")) {
            if (cflag) { fprintf(stderr, "gerbil grammar: give one of --schema, --gbnf, --regex, --json-object\n"); return 2; }
            cflag = a;
            cval = "";
            continue;
        }
        if (!strcmp(a, "--schema") || !strcmp(a, "--gbnf") || !strcmp(a, "--regex")) {
            if (cflag) { fprintf(stderr, "gerbil grammar: give one of --schema, --gbnf, --regex, --json-object\n"); return 2; }
            cflag = a;
            if (!(cval = cli_value(argc, argv, &i))) return 2;
            continue;
        }
        if (!strcmp(a, "--model") || !strcmp(a, "-m") || !strcmp(a, "--text") || !strcmp(a, "--file")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v) return 2;
            if (!strcmp(a, "--text")) text = v;
            else if (!strcmp(a, "--file")) file = v;
            else model = v;
            continue;
        }
        fprintf(stderr, "gerbil grammar: unknown argument \"%s\"\n", a);
        help(stderr);
        return 2;
    }
    if (!model && getenv("GERBIL_MODEL") && getenv("GERBIL_MODEL")[0]) model = getenv("GERBIL_MODEL");
    if (!cflag) { fprintf(stderr, "gerbil grammar: give --schema, --gbnf, --regex or --json-object\n"); help(stderr); return 2; }
    if (!model) { fprintf(stderr, "gerbil grammar: --model is required (or set GERBIL_MODEL)\n"); return 2; }
    if (!!text + !!file != 1) { fprintf(stderr, "gerbil grammar: give exactly one of --text, --file\n"); return 2; }

    size_t tlen = 0;
    char *tbuf = NULL;
    if (file) {
        tbuf = !strcmp(file, "-") ? cli_read_all(stdin, &tlen) : cli_read_file(file, &tlen);
        if (!tbuf) { fprintf(stderr, "gerbil grammar: cannot read %s\n", file); return 1; }
        text = tbuf;
    } else {
        tlen = strlen(text);
    }
    gerbil_grammar_kind kind;
    char *src = NULL;
    size_t slen = 0;
    if (cli_grammar_source(cflag, cval, &kind, &src, &slen)) { free(tbuf); return 1; }
    gerbil_tokenizer_t tok = NULL;
    gerbil_grammar_vocab_t voc = NULL;
    gerbil_grammar_t g = NULL;
    gerbil_grammar_state_t s = NULL, sb = NULL;
    int32_t *ids = NULL;
    int n_ids = 0, rc = 1;
    uint64_t *mask = NULL;
    double *times = NULL;
    if (cli_load_tokenizer(model, &tok)) goto done;
    gerbil_status st = gerbil_grammar_vocab_new(tok, 0, NULL, 0, &voc);
    if (st != GERBIL_OK) { cli_fail("grammar vocabulary", st); goto done; }
    st = gerbil_tokenize(tok, text, tlen, 0, &ids, &n_ids);
    if (st != GERBIL_OK) { cli_fail("tokenize", st); goto done; }
    double t0 = now_s();
    st = gerbil_grammar_compile(voc, kind, src, slen, &gp, &g);
    double compile_ms = (now_s() - t0) * 1e3;
    if (st == GERBIL_ERR_NOMEM) { cli_fail("grammar", st); goto done; }
    if (st != GERBIL_OK) {
        const char *msg = gerbil_last_error();
        if (json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddBoolToObject(o, "compiled", 0);
            cJSON_AddStringToObject(o, "error", msg);
            static const char *const nulls[] = {"accepted", "complete", "rejected_at_byte", "rejected_at_token"};
            for (int i = 0; i < 4; i++) cJSON_AddNullToObject(o, nulls[i]);
            cJSON_AddNumberToObject(o, "tokens", n_ids);
            cJSON_AddNumberToObject(o, "compile_ms", compile_ms);
            cJSON_AddNullToObject(o, "mask_us");
            char *t = cJSON_PrintUnformatted(o);
            printf("%s\n", t ? t : "{}");
            free(t);
            cJSON_Delete(o);
        } else {
            printf("compiled: no\nerror: %s\n", msg);
        }
        rc = 0;
        goto done;
    }
    if (gerbil_grammar_state_new(g, &s) != GERBIL_OK || gerbil_grammar_state_new(g, &sb) != GERBIL_OK) goto done;
    int words = gerbil_grammar_mask_words(g);
    mask = malloc((size_t)words * sizeof *mask);
    times = malloc(((size_t)n_ids + 1) * sizeof *times);
    if (!mask || !times) { fprintf(stderr, "gerbil grammar: out of memory\n"); goto done; }
    int rejected_tok = -1, n_t = 0;
    for (int i = 0; i < n_ids; i++) {
        double a = now_s();
        st = gerbil_grammar_mask(s, mask);
        double b = now_s();
        times[n_t++] = (b - a) * 1e6;
        if (st != GERBIL_OK) { cli_fail("grammar mask", st); goto done; }
        int32_t id = ids[i];
        if (!((mask[id >> 6] >> (id & 63)) & 1) || gerbil_grammar_accept_token(s, id) != GERBIL_OK) { rejected_tok = i; break; }
    }
    /* the byte walk over the raw text, independent of tokenization */
    size_t nb = gerbil_grammar_accept_bytes(sb, text, tlen);
    long rejected_byte = nb < tlen ? (long)nb : -1;
    int accepted = rejected_tok < 0;
    int complete = accepted && gerbil_grammar_is_accepting(s);
    qsort(times, (size_t)n_t, sizeof *times, cmp_d);
    double p50 = pct(times, n_t, 0.5), p99 = pct(times, n_t, 0.99), mx = n_t ? times[n_t - 1] : 0;
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "compiled", 1);
        cJSON_AddNullToObject(o, "error");
        cJSON_AddBoolToObject(o, "accepted", accepted);
        cJSON_AddBoolToObject(o, "complete", complete);
        if (rejected_byte >= 0) cJSON_AddNumberToObject(o, "rejected_at_byte", (double)rejected_byte);
        else cJSON_AddNullToObject(o, "rejected_at_byte");
        if (rejected_tok >= 0) cJSON_AddNumberToObject(o, "rejected_at_token", rejected_tok);
        else cJSON_AddNullToObject(o, "rejected_at_token");
        cJSON_AddNumberToObject(o, "tokens", n_ids);
        cJSON_AddNumberToObject(o, "compile_ms", compile_ms);
        cJSON *m = cJSON_AddObjectToObject(o, "mask_us");
        cJSON_AddNumberToObject(m, "p50", p50);
        cJSON_AddNumberToObject(m, "p99", p99);
        cJSON_AddNumberToObject(m, "max", mx);
        char *t = cJSON_PrintUnformatted(o);
        printf("%s\n", t ? t : "{}");
        free(t);
        cJSON_Delete(o);
    } else {
        printf("compiled: yes (%.3f ms)\n", compile_ms);
        printf("tokens: %d\naccepted: %s\n", n_ids, accepted ? "yes" : "no");
        if (rejected_tok >= 0) {
            char *piece = NULL;
            size_t pl = 0;
            gerbil_detokenize(tok, &ids[rejected_tok], 1, 0, &piece, &pl);
            printf("rejected at token %d (id %d, \"%s\")\n", rejected_tok, (int)ids[rejected_tok], piece ? piece : "");
            free(piece);
        }
        if (rejected_byte >= 0) printf("rejected at byte %ld\n", rejected_byte);
        printf("complete: %s\n", complete ? "yes" : "no");
        printf("mask time: p50 %.1f us, p99 %.1f us, max %.1f us\n", p50, p99, mx);
    }
    rc = 0;
done:
    free(times);
    free(mask);
    free(ids);
    gerbil_grammar_state_free(s);
    gerbil_grammar_state_free(sb);
    gerbil_grammar_free(g);
    gerbil_grammar_vocab_free(voc);
    gerbil_tokenizer_free(tok);
    free(src);
    free(tbuf);
    return rc;
}
