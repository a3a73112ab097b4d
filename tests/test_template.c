/* Chat templates: every case of tests/templates/expected.json (real model templates over
 * a set of conversations, small templates for each construct, malformed templates),
 * whose expectations come from Python jinja2 configured as transformers configures it
 * (scripts/gen_template_expected.py). Outputs must match byte for byte;
 * raise_exception must give GERBIL_ERR_INVALID_ARG with exactly its message; any other
 * Python error must be an error here too, naming the template line. */
#include "gerbil.h"
#include "io/json.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) { free(p); p = NULL; }
    if (p) p[n] = 0;
    fclose(f);
    return p;
}

/* Per template file: passed / total, for the summary. */
struct tally { char name[96]; int pass, total; };
static struct tally tallies[64];
static int ntallies;

static void count(const char *case_name, int ok) {
    char group[96];
    const char *slash = strchr(case_name, '/');
    size_t n = slash ? (size_t)(slash - case_name) : strlen(case_name);
    if (n >= sizeof group) n = sizeof group - 1;
    memcpy(group, case_name, n);
    group[n] = 0;
    int k;
    for (k = 0; k < ntallies; k++)
        if (!strcmp(tallies[k].name, group)) break;
    if (k == ntallies && ntallies < 64) snprintf(tallies[ntallies++].name, sizeof tallies[0].name, "%s", group);
    if (k < 64) { tallies[k].total++; tallies[k].pass += ok; }
}

static void show_diff(const char *want, const char *got) {
    size_t i = 0;
    while (want[i] && want[i] == got[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "    first difference at byte %zu\n    want: %.100s\n    got:  %.100s\n", i, want + from, got + from);
}

static void run_case(const cJSON *tc) {
    const char *name = json_get_str(tc, "name", "?");
    const char *inline_src = json_get_str(tc, "template", NULL);
    const char *file = json_get_str(tc, "template_file", NULL);
    const char *ctx = json_get_str(tc, "context", "{}");
    char *src = NULL;
    if (file) {
        char path[512];
        snprintf(path, sizeof path, "tests/templates/%s", file);
        src = read_file(path);
        if (!src) { CHECKF(0, "%s: cannot read %s", name, path); count(name, 0); return; }
    }
    char *out = NULL;
    gerbil_status st = gerbil_template_render(file ? src : inline_src, ctx, &out);
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(tc, "error");
    int ok;
    if (!err) {
        ok = st == GERBIL_OK && out && !strcmp(out, json_get_str(tc, "output", ""));
        CHECKF(ok, "%s: %s", name, st == GERBIL_OK ? "output differs" : gerbil_last_error());
        if (!ok && st == GERBIL_OK && out) show_diff(json_get_str(tc, "output", ""), out);
    } else {
        const char *type = json_get_str(err, "type", "");
        const char *msg = json_get_str(err, "message", "");
        if (!strcmp(type, "TemplateError")) { /* raise_exception(msg) */
            ok = st == GERBIL_ERR_INVALID_ARG && !strcmp(gerbil_last_error(), msg);
            CHECKF(ok, "%s: want raise_exception \"%s\", got status %d \"%s\"", name, msg, st,
                   st ? gerbil_last_error() : "(rendered)");
        } else {
            ok = st == GERBIL_ERR_FORMAT && !strncmp(gerbil_last_error(), "template line ", 14);
            CHECKF(ok, "%s: want an error like Python's %s \"%s\", got status %d \"%s\"", name, type, msg, st,
                   st ? gerbil_last_error() : out);
            /* syntax errors: the same line as Jinja reports */
            if (ok && json_has(err, "line")) {
                char want[32];
                snprintf(want, sizeof want, "template line %d:", (int)json_get_int(err, "line", 0));
                ok = !strncmp(gerbil_last_error(), want, strlen(want));
                CHECKF(ok, "%s: want \"%s\", got \"%s\"", name, want, gerbil_last_error());
            }
        }
    }
    count(name, ok);
    free(out);
    free(src);
}

/* Inputs that must fail cleanly (no crash, no hang) without a Python reference. */
static void robustness(void) {
    static const char *bad[] = {
        "{% if %}", "{% for %}", "{{", "{%", "{#", "}}", "{{ {{ }}", "{% endraw %}", "{% raw %}",
        "{{ ((((( }}", "{{ [1, 2 }}", "{{ {'a' 1} }}", "{% macro %}", "{% call %}{% endcall %}",
        "{% set x = %}", "{{ x | }}", "{{ x is }}", "{{ 'a' ~ }}", "{{ a[ }}", "{{ a. }}",
        "{% for x in y %}{% endif %}", "{% break %}", "{{ 1 if }}", "\xff\xfe{{ 'x' }}",
        "{{ '\\u12' }}", "{{ 99999999999999999999999 }}", "{% filter %}{% endfilter %}",
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char *out = NULL;
        gerbil_status st = gerbil_template_render(bad[k], "{}", &out);
        CHECKF(st != GERBIL_OK || out, "bad template %zu", k);
        free(out);
    }
    /* deep nesting: parser and evaluator limits give errors, not stack overflows */
    size_t n = 20000;
    char *deep = malloc(n * 2 + 16);
    strcpy(deep, "{{ ");
    for (size_t i = 0; i < n; i++) strcat(deep + 3 + i, "(");
    char *out = NULL;
    CHECK(gerbil_template_render(deep, "{}", &out) == GERBIL_ERR_FORMAT);
    free(out);
    out = NULL;
    size_t m = 0;
    for (size_t i = 0; i < 3000; i++) m += (size_t)sprintf(deep + m, "{%% if 1 %%}");
    CHECK(gerbil_template_render(deep, "{}", &out) == GERBIL_ERR_FORMAT);
    free(out);
    free(deep);
    /* output growth is capped */
    out = NULL;
    CHECK(gerbil_template_render("{% for i in range(100000) %}{% for j in range(100000) %}{{ 'x' * 100000 }}{% endfor %}{% endfor %}",
                                 "{}", &out) != GERBIL_OK);
    free(out);
    out = NULL;
    CHECK(gerbil_template_render("{{ 'x' * 1000000000 }}", "{}", &out) != GERBIL_OK);
    free(out);
    /* bad contexts */
    out = NULL;
    CHECK(gerbil_template_render("x", "[1]", &out) == GERBIL_ERR_INVALID_ARG);
    CHECK(gerbil_template_render("x", "{\"a\": ", &out) == GERBIL_ERR_FORMAT);
    CHECK(gerbil_template_render("x", NULL, &out) == GERBIL_OK && out && !strcmp(out, "x"));
    free(out);
}

int main(void) {
    cJSON *doc;
    if (json_load_file("tests/templates/expected.json", &doc) != GERBIL_OK)
        SKIP("tests/templates/expected.json: %s", gerbil_last_error());
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(doc, "cases"), *tc;
    cJSON_ArrayForEach(tc, cases) run_case(tc);
    cJSON_Delete(doc);
    for (int k = 0; k < ntallies; k++)
        printf("%-40s %3d / %3d\n", tallies[k].name, tallies[k].pass, tallies[k].total);
    robustness();
    return test_done();
}
