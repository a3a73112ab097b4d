/* Read-only memory maps of whole files. */
#ifndef GB_MMAP_H
#define GB_MMAP_H

#include "gerbil.h"
#include <stddef.h>

struct mapped_file {
    char *path;        /* owned copy, for error messages */
    const void *data;  /* NULL for an empty file */
    size_t size;
    int anonymous;     /* data is a private copy in anonymous memory, not the file's pages */
};

/* Progress of a long load: done of total bytes of path. */
typedef void (*load_progress_fn)(void *user, const char *path, size_t done, size_t total);

/* Map path read-only. On failure *out is zeroed and the message names the path. */
gerbil_status mapped_file_open(const char *path, struct mapped_file *out);
void mapped_file_close(struct mapped_file *mf);
/* Replace the file mapping by a copy in anonymous memory. Measured on the 2-core
 * x86 machines we develop on: decode of a 1.2 GB bf16 model reads weights ~2.4x
 * faster from anonymous pages than from the page-cache mapping (21 vs 8.7 tok/s,
 * one thread), so the model loader copies by default (`--mmap` keeps the mapping). */
gerbil_status mapped_file_copy_to_memory(struct mapped_file *mf, load_progress_fn progress, void *user);
/* The copy stays writable (the model loader rearranges some weights in place) until this
 * makes it read-only; nothing for a file mapping. */
void mapped_file_seal(struct mapped_file *mf);

#endif
