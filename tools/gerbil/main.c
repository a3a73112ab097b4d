/* gerbil: the command-line program. One file per subcommand. */
#include "cli.h"

#include <string.h>

#define GERBIL_VERSION "0.1.0"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"run", cmd_run, "generate text (or ids) from a prompt"},
    {"chat", cmd_chat, "an interactive conversation through the chat template"},
    {"logits", cmd_logits, "print the logits of a prompt as JSON"},
    {"embed", cmd_embed, "text embeddings (sentence-transformers models) as JSON"},
    {"info", cmd_info, "describe a model: architecture, parameters, dtypes, memory"},
    {"bench", cmd_bench, "measure prompt-processing and generation speed"},
    {"tokenize", cmd_tokenize, "text to token ids, or ids to text, with the model's tokenizer"},
    {"template", cmd_template, "render a chat template for a conversation"},
    {"pull", cmd_pull, "download a model from the Hugging Face hub (org/name[@revision][:FILE.gguf])"},
    {"list", cmd_list, "list the models in the Hugging Face cache"},
    {"rm", cmd_rm, "remove a model from the Hugging Face cache"},
    {"serve", cmd_serve, "an OpenAI-compatible HTTP server with continuous batching and a chat page"},
    {"grammar", cmd_grammar, "check text against a JSON Schema / GBNF / regex constraint; mask timings"},
    {"transcribe", cmd_transcribe, "speech to text (Moonshine) from an audio file"},
    {"quantize", cmd_quantize, "convert a Hugging Face folder to GGUF (f16, q8_0, k-quants) or MLX 4/8-bit"},
};

static void usage(FILE *f) {
    fprintf(f, "gerbil %s — local inference engine\n\nusage: gerbil COMMAND [options]\n\ncommands:\n",
            GERBIL_VERSION);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "  %-8s %s\n", "version", "print the version (also --version, -v)");
    fprintf(f, "\nA model (--model M) is a folder, a .gguf file or a Hugging Face repo id such as\n"
               "Qwen/Qwen3-0.6B, downloaded on first use; run and chat default to %s.\n"
               "'gerbil COMMAND --help' describes each command's options.\n", CLI_DEFAULT_MODEL);
}

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 2; }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) { usage(stdout); return 0; }
    /* --version, -v and version print the same (as ollama -v); -v after a command is --verbose */
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-v") || !strcmp(cmd, "version")) {
        printf("gerbil %s\n", GERBIL_VERSION);
        return 0;
    }
    const char *names[sizeof commands / sizeof commands[0]];
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (!strcmp(cmd, commands[i].name)) {
            if (commands[i].fn == cmd_run || commands[i].fn == cmd_chat) return commands[i].fn(argc - 1, argv + 1);
            /* the others get --flag=value and -n5 split too (run and chat split them themselves) */
            struct cli_args a;
            if (cli_args_expand(argc - 1, argv + 1, &a)) return 1;
            int rc = commands[i].fn(a.argc, a.argv);
            cli_args_free(&a);
            return rc;
        }
        names[i] = commands[i].name;
    }
    const char *near = cli_nearest(cmd, names, (int)(sizeof names / sizeof names[0]));
    fprintf(stderr, "gerbil: unknown command \"%s\"", cmd);
    if (near) fprintf(stderr, "; did you mean %s?", near);
    fprintf(stderr, "\n\n");
    usage(stderr);
    return 2;
}
