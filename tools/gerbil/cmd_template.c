/* gerbil template --model DIR --messages messages.json [--tools tools.json]
 *                 [--add-generation-prompt] [--template FILE.jinja] [--var NAME=JSON ...]
 * prints the chat template rendered as transformers' apply_chat_template(tokenize=False)
 * renders it, with no newline added. */
#include "cli.h"
#include "io/json.h"
#include "textgen.h"
#include <sys/stat.h>

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { MAX_VARS = 64 };

static void help(FILE *f) {
    fprintf(f, "usage: gerbil template --model DIR --messages messages.json [options]\n\n"
               "Renders the model's chat template over the messages and prints the prompt exactly\n"
               "(no newline added), as transformers' apply_chat_template(tokenize=False) does.\n\noptions:\n"
               "      --model M                folder with tokenizer_config.json and/or chat_template.jinja,\n"
               "                               or a Hugging Face repo id org/name\n"
               "      --messages FILE          JSON array of messages ({\"role\", \"content\", ...})\n"
               "      --tools FILE             JSON array of tool definitions\n"
               "      --add-generation-prompt  end with the assistant turn header\n"
               "      --template FILE          use this Jinja template instead of the model's\n"
               "      --var NAME=JSON          extra template variable, e.g. enable_thinking=false\n"
               "                               or date_string='\"26 Jul 2024\"' (repeatable)\n");
}

/* Read a JSON file, check it parses (and is an array when want_array), return its text. */
static char *json_file(const char *what, const char *path, int want_array) {
    size_t n;
    char *text = cli_read_file(path, &n);
    if (!text) { fprintf(stderr, "gerbil template: cannot read %s file %s\n", what, path); return NULL; }
    cJSON *doc;
    gerbil_status st = json_parse(text, n, path, &doc);
    if (st != GERBIL_OK) { cli_fail("bad JSON", st); free(text); return NULL; }
    int ok = !want_array || cJSON_IsArray(doc);
    cJSON_Delete(doc);
    if (!ok) { fprintf(stderr, "gerbil template: %s must hold a JSON array of %s\n", path, what); free(text); return NULL; }
    return text;
}

int cmd_template(int argc, char **argv) {
    const char *model = NULL, *messages = NULL, *tools = NULL, *tfile = NULL, *vars[MAX_VARS];
    int nvars = 0, agp = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { help(stdout); return 0; }
        if (!strcmp(a, "--add-generation-prompt")) { agp = 1; continue; }
        const char **dst = !strcmp(a, "--model") || !strcmp(a, "-m") ? &model : !strcmp(a, "--messages") ? &messages
                         : !strcmp(a, "--tools") ? &tools : !strcmp(a, "--template") ? &tfile : NULL;
        if (dst) {
            if (!(*dst = cli_value(argc, argv, &i))) return 2;
            continue;
        }
        if (!strcmp(a, "--var")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v) return 2;
            if (nvars == MAX_VARS) { fprintf(stderr, "gerbil template: more than %d --var\n", MAX_VARS); return 2; }
            const char *eq = strchr(v, '=');
            if (!eq || eq == v) { fprintf(stderr, "gerbil template: --var wants NAME=JSON, got \"%s\"\n", v); return 2; }
            vars[nvars++] = v;
            continue;
        }
        fprintf(stderr, "gerbil template: unknown option \"%s\"\n", a);
        help(stderr);
        return 2;
    }
    if (!messages) { fprintf(stderr, "gerbil template: --messages is required\n"); help(stderr); return 2; }
    if (!model && !tfile && getenv("GERBIL_MODEL") && getenv("GERBIL_MODEL")[0]) model = getenv("GERBIL_MODEL");
    if (!model && !tfile) { fprintf(stderr, "gerbil template: --model or --template is required (or set GERBIL_MODEL)\n"); return 2; }

    int rc = 1;
    gerbil_chat_template_t ct = NULL;
    char *msgs = NULL, *tls = NULL, *out = NULL;
    const char *names[MAX_VARS], *values[MAX_VARS];
    char name_buf[MAX_VARS][128];
    char path[4096];
    if (model && cli_resolve_ref(model, NULL, path, sizeof path)) return 1;
    if (model) model = path;
    gerbil_status st = GERBIL_OK;
    struct stat sb;
    const int is_file = model && stat(model, &sb) == 0 && S_ISREG(sb.st_mode);
    if (is_file) {
        /* a GGUF file: its tokenizer.chat_template, read as run and chat read it */
        struct textgen tg = {.template_file = tfile};
        if (textgen_load_text(&tg, model)) goto done;
        gerbil_tokenizer_free(tg.tok);
        ct = tg.tmpl;
    } else {
        st = gerbil_chat_template_load(model, tfile, &ct);
    }
    if (st != GERBIL_OK) { cli_fail("cannot load the chat template", st); goto done; }
    if (!ct) {
        if (is_file)
            fprintf(stderr, "gerbil template: %s has no chat template (no tokenizer.chat_template in the GGUF "
                            "metadata); pass --template FILE\n", model);
        else
            fprintf(stderr, "gerbil template: %s has no chat template (no chat_template.jinja, no \"chat_template\" "
                            "in tokenizer_config.json); pass --template FILE\n", model);
        goto done;
    }
    if (!(msgs = json_file("messages", messages, 1))) goto done;
    if (tools && !(tls = json_file("tools", tools, 1))) goto done;
    for (int k = 0; k < nvars; k++) {
        const char *eq = strchr(vars[k], '=');
        snprintf(name_buf[k], sizeof name_buf[k], "%.*s", (int)(eq - vars[k]), vars[k]);
        names[k] = name_buf[k];
        values[k] = eq + 1;
    }
    st = gerbil_chat_template_apply(ct, msgs, tls, agp, names, values, nvars, &out);
    if (st != GERBIL_OK) {
        cli_fail(st == GERBIL_ERR_INVALID_ARG && !strstr(gerbil_last_error(), "template variable")
                     ? "the template raised an exception" : "template error", st);
        goto done;
    }
    fwrite(out, 1, strlen(out), stdout);
    rc = fflush(stdout) ? 1 : 0;
done:
    free(out);
    free(tls);
    free(msgs);
    gerbil_chat_template_free(ct);
    return rc;
}
