/* gerbil template: placeholder until the text layer lands. */
#include "cli.h"

int cmd_template(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "gerbil template: not implemented yet\n");
    return 2;
}
