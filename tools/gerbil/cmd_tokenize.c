/* gerbil tokenize: placeholder until the text layer lands. */
#include "cli.h"

int cmd_tokenize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "gerbil tokenize: not implemented yet\n");
    return 2;
}
