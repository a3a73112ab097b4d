/* LoRA adapters on a loaded model (lora.c): loading (PEFT, mlx-lm, llama.cpp GGUF), the
 * model's table of adapter ids, and their application after each adapted linear of a
 * forward, per run of batch rows that share an adapter (backend.h lora). */
#ifndef GB_LORA_H
#define GB_LORA_H

#include "backend/backend.h"
#include "gerbil.h"

struct gerbil_model;
struct gerbil_context;
struct fwd;

/* The linears an adapter may adapt, per layer. */
enum lora_target {
    LT_Q, LT_K, LT_V, LT_O,                                /* attention */
    LT_GATE, LT_UP, LT_DOWN,                               /* dense feed-forward */
    LT_DN_QKV, LT_DN_Z, LT_DN_B, LT_DN_A, LT_DN_OUT,       /* Gated DeltaNet (unfused) */
    LT_COUNT
};

enum { LORA_MAX_PARTS = 8 }; /* adapters summed on one id */

/* One forward's rows by adapter: runs of consecutive (internal) rows with one id. */
struct lora_run {
    int row0, n_rows;
    int32_t id;
};
struct lora_fwd {
    int n_runs, cap;
    struct lora_run *runs; /* [cap] */
    struct lora_seg *segs; /* [cap * LORA_MAX_PARTS] */
};

void lora_registry_free(struct gerbil_model *m);
/* GERBIL_ERR_INVALID_ARG naming the row when an id is not a loaded adapter. */
gerbil_status lora_check_id(struct gerbil_model *m, int row, int32_t id);
/* The runs of this batch (row_user[t]: the caller's row of internal row t); *out = NULL
 * when no row has an adapter. Called with the model's lock held; GERBIL_ERR_INVALID_ARG
 * for an id that is not loaded. */
gerbil_status lora_plan(struct gerbil_context *cx, const gerbil_batch *ub, const int32_t *row_user, int n,
                        const struct lora_fwd **out);
/* y ([rows][n_out]) += each row's adapters' B (A x) for target t of layer l, x the linear's input. */
void lora_apply(const struct fwd *f, int layer, enum lora_target t, float *y, const float *x);

#endif
