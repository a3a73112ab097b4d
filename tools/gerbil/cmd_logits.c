/* gerbil logits --model M --ids 1,17,300 [--all]
 * prints {"n_vocab": V, "logits": [[...], ...]}: the last position, or every one.
 * With --audio FILE (a speech-to-text model): the decoder's logits for decoder ids --ids
 * over the encoding of the audio. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

static void help(FILE *f) {
    fprintf(f, "usage: gerbil logits --model M --ids 1,17,300 [--all] [options]\n\n"
               "Runs the ids through the model and prints JSON {\"n_vocab\": V, \"logits\": [[...]]}:\n"
               "the logits of the last position, or of every position with --all.\n\noptions:\n"
               "      --ids LIST       comma-separated token ids\n"
               "      --all            print the logits of every position\n"
               "      --audio FILE     a speech-to-text model (Moonshine): --ids are decoder ids, the logits\n"
               "                       the decoder's over FILE's encoding (16 kHz mono; one window)\n");
    cli_print_model_opts_help(f);
}

static void print_rows(const float *logits, int rows, int V) {
    printf("{\"n_vocab\": %d, \"logits\": [", V);
    for (int r = 0; r < rows; r++) {
        printf(r ? ", [" : "[");
        for (int i = 0; i < V; i++) printf(i ? ", %.9g" : "%.9g", logits[(size_t)r * V + i]);
        printf("]");
    }
    printf("]}\n");
}

static int logits_audio(struct cli_model_opts *o, const char *file, const int32_t *ids, int n, int all) {
    float *pcm;
    int64_t ns;
    gerbil_status st = gerbil_audio_read_file(file, 16000, &pcm, &ns, NULL);
    if (st != GERBIL_OK) return cli_fail("cannot read the audio", st);
    if (!o->backend) o->backend = "cpu"; /* Moonshine's ops are not on CUDA yet */
    gerbil_model_t m;
    if (cli_open(o, &m, NULL)) { gerbil_audio_free(pcm); return 1; }
    int rc = 0;
    if (!gerbil_model_is_stt(m)) {
        fprintf(stderr, "gerbil logits: --audio needs a speech-to-text model (MoonshineForConditionalGeneration); "
                        "%s is not one\n", o->ref ? o->ref : o->model);
        rc = 1;
    } else {
        const int V = gerbil_model_n_vocab(m);
        float *lg = malloc((size_t)n * V * sizeof *lg);
        st = lg ? gerbil_stt_logits(m, pcm, ns, ids, n, lg) : GERBIL_ERR_NOMEM;
        if (st != GERBIL_OK) rc = cli_fail("evaluation failed", st);
        else print_rows(all ? lg : lg + (size_t)(n - 1) * V, all ? n : 1, V);
        free(lg);
    }
    gerbil_model_free(m);
    gerbil_audio_free(pcm);
    return rc;
}

int cmd_logits(int argc, char **argv) {
    struct cli_model_opts o = {.lora_ok = 1};
    const char *ids_arg = NULL;
    int all = 0;
    const char *audio = NULL;
    for (int i = 1; i < argc; i++) {
        int r = cli_parse_model_opt(argc, argv, &i, &o);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { help(stdout); return 0; }
        if (!strcmp(argv[i], "--all")) { all = 1; continue; }
        if (!strcmp(argv[i], "--audio")) {
            if (!(audio = cli_value(argc, argv, &i))) return 2;
            continue;
        }
        if (!strcmp(argv[i], "--ids")) {
            if (!(ids_arg = cli_value(argc, argv, &i))) return 2;
            continue;
        }
        fprintf(stderr, "gerbil logits: unknown option \"%s\"\n", argv[i]);
        help(stderr);
        return 2;
    }
    if (!ids_arg) { fprintf(stderr, "gerbil logits: --ids is required\n"); return 2; }
    int32_t *ids;
    int n;
    if (cli_parse_ids(ids_arg, &ids, &n)) return 2;

    gerbil_model_t m;
    gerbil_session_t s;
    if (audio) {
        int rc = logits_audio(&o, audio, ids, n, all);
        free(ids);
        return rc;
    }
    if (cli_open(&o, &m, &s)) { free(ids); return 1; }
    const int V = gerbil_model_n_vocab(m);
    const int rows = all ? n : 1;
    float *logits = malloc((size_t)rows * V * sizeof(float));
    gerbil_status st = logits ? gerbil_session_eval(s, ids, n, logits, all) : GERBIL_ERR_NOMEM;
    int rc = 0;
    if (st != GERBIL_OK) {
        rc = cli_fail("evaluation failed", st);
    } else {
        printf("{\"n_vocab\": %d, \"logits\": [", V);
        for (int r = 0; r < rows; r++) {
            printf(r ? ", [" : "[");
            for (int i = 0; i < V; i++) printf(i ? ", %.9g" : "%.9g", logits[(size_t)r * V + i]);
            printf("]");
        }
        printf("]}\n");
    }
    free(logits);
    free(ids);
    gerbil_session_free(s);
    gerbil_model_free(m);
    return rc;
}
