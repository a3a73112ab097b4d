/* Read-only memory maps of whole files. */
#ifndef GB_MMAP_H
#define GB_MMAP_H

#include "gerbil.h"
#include <stddef.h>

struct mapped_file {
    char *path;        /* owned copy, for error messages */
    const void *data;  /* NULL for an empty file */
    size_t size;
};

/* Map path read-only. On failure *out is zeroed and the message names the path. */
gerbil_status mapped_file_open(const char *path, struct mapped_file *out);
void mapped_file_close(struct mapped_file *mf);

#endif
