/* The context API for schedulers and prefix caches (gerbil.h): block ids, extra references,
 * attaching shared blocks to a new sequence, and recurrent-state snapshots, on stories260K:
 * a sequence that attaches another's first two blocks (after that one is freed, the blocks
 * kept by a retain) and evaluates the rest gives the same logits, bit for bit, as one that
 * evaluated everything with the same chunks; refcounts and free counts follow; bad
 * attaches are refused with nothing changed. */
#include "gerbil.h"
#include "test.h"

#include <string.h>
#include <sys/stat.h>

static gerbil_status eval(gerbil_context_t cx, int32_t seq, const int32_t *t, int n) {
    int32_t seqs[64];
    for (int i = 0; i < n; i++) seqs[i] = seq;
    gerbil_batch b = {.n_rows = n, .tokens = t, .seq = seqs};
    return gerbil_context_eval(cx, &b);
}

int main(void) {
    const char *path = "../shared/data/models/stories260K/hf";
    struct stat st;
    if (stat(path, &st) != 0) SKIP("%s not found", path);
    gerbil_model_t m;
    gerbil_model_params mp = gerbil_model_default_params();
    mp.n_threads = 1;
    CHECK(gerbil_model_load(path, &mp, &m) == GERBIL_OK);
    const int V = gerbil_model_n_vocab(m);
    gerbil_context_params cp = gerbil_context_default_params();
    cp.n_ctx = 256;
    cp.n_seq_max = 4;
    cp.n_batch = 64;
    gerbil_context_t cx;
    CHECK(gerbil_context_new(m, &cp, &cx) == GERBIL_OK);
    CHECK(gerbil_context_has_recurrent(cx) == 0 && gerbil_context_state_bytes(cx) == 0);
    CHECK(gerbil_context_n_blocks(cx) == 16 && gerbil_context_n_free_blocks(cx) == 16);
    CHECK(gerbil_model_kv_bytes_per_token(m, GERBIL_KV_F16) == 5 * 2 * 4 * 8 * 2);
    int32_t tok[40];
    for (int i = 0; i < 40; i++) tok[i] = 1 + (i * 37) % (V - 1);

    /* reference: one sequence, chunks [0, 32) and [32, 40) */
    int32_t ref;
    CHECK(gerbil_seq_new(cx, &ref) == GERBIL_OK);
    CHECK(gerbil_seq_blocks_needed(cx, ref, 32) == 2);
    CHECK(eval(cx, ref, tok, 32) == GERBIL_OK);
    CHECK(eval(cx, ref, tok + 32, 8) == GERBIL_OK);
    float want[512];
    memcpy(want, gerbil_context_logits(cx, 0), sizeof(float) * (size_t)V);
    gerbil_seq_free(cx, ref);

    /* a sequence computes [0, 32); its blocks are kept by a retain after it is freed */
    int32_t a, blocks[4];
    CHECK(gerbil_seq_new(cx, &a) == GERBIL_OK);
    CHECK(eval(cx, a, tok, 32) == GERBIL_OK);
    CHECK(gerbil_seq_blocks(cx, a, blocks, 4) == 2);
    for (int i = 0; i < 2; i++) gerbil_kv_block_retain(cx, blocks[i]);
    CHECK(gerbil_kv_block_refs(cx, blocks[0]) == 2);
    gerbil_seq_free(cx, a);
    CHECK(gerbil_kv_block_refs(cx, blocks[0]) == 1 && gerbil_context_n_free_blocks(cx) == 14);

    /* b attaches them and evaluates the rest: the same logits */
    int32_t b;
    CHECK(gerbil_seq_new(cx, &b) == GERBIL_OK);
    CHECK(gerbil_seq_attach(cx, b, blocks, 2, NULL) == GERBIL_OK);
    CHECK(gerbil_seq_len(cx, b) == 32 && gerbil_kv_block_refs(cx, blocks[1]) == 2);
    CHECK(gerbil_seq_attach(cx, b, blocks, 2, NULL) == GERBIL_ERR_INVALID_ARG); /* not empty */
    CHECK(gerbil_seq_blocks_needed(cx, b, 8) == 1);
    CHECK(eval(cx, b, tok + 32, 8) == GERBIL_OK);
    CHECKF(!memcmp(gerbil_context_logits(cx, 0), want, sizeof(float) * (size_t)V),
           "attached blocks + the rest differ from evaluating everything");
    /* a fork of b shares its full blocks; a sequence may not attach a free block */
    int32_t c;
    CHECK(gerbil_seq_new(cx, &c) == GERBIL_OK);
    int32_t bad = -1;
    for (int32_t i = 0; i < 16; i++)
        if (gerbil_kv_block_refs(cx, i) == 0) { bad = i; break; }
    CHECK(bad >= 0 && gerbil_seq_attach(cx, c, &bad, 1, NULL) == GERBIL_ERR_INVALID_ARG);
    CHECK(gerbil_seq_len(cx, c) == 0);
    gerbil_seq_free(cx, b);
    gerbil_seq_free(cx, c);
    for (int i = 0; i < 2; i++) gerbil_kv_block_release(cx, blocks[i]);
    CHECK(gerbil_context_n_free_blocks(cx) == 16);
    gerbil_context_free(cx);
    gerbil_model_free(m);
    return test_done();
}
