/* Mixture-of-experts ops of the CPU backend: the router (softmax, top-k), the matmuls of
 * the rows routed to each expert, and the weighted combination of their outputs.
 *
 * matmul_id keeps a row's result independent of the other rows: each expert's rows are
 * gathered and go through cpu_matmul with, as their span, the number of rows of their own
 * segment routed to that expert (the rows of one sequence's chunk an expert sees), the
 * segments in ascending order of it. A sequence alone thus computes exactly what it
 * computes inside a batch. */
#include "backend/cpu/cpu.h"
#include "base/status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct seg_count {
    int32_t seg, count, first; /* first: where the segment's rows start in the expert's list */
};
_Static_assert(sizeof(struct seg_count) == CPU_SEG_COUNT_BYTES, "cpu_backend.h sizes id_segs with it");

static int by_count(const void *pa, const void *pb) {
    const struct seg_count *a = pa, *b = pb;
    if (a->count != b->count) return a->count < b->count ? -1 : 1;
    return a->seg < b->seg ? -1 : a->seg > b->seg;
}

static int by_key(const void *pa, const void *pb) {
    const int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    return a < b ? -1 : a > b;
}

void cpu_matmul_id(struct backend *be, float *y, const float *x, int x_per_slot, const struct gb_weight *stack,
                   int n_mat, const int32_t *ids, int n_sel, const struct gb_batch *b, int n) {
    struct cpu_backend *cb = cpu_of(be);
    const size_t total = (size_t)n * (size_t)n_sel;
    GB_ASSERT(total <= cb->id_rows_cap && n <= b->n_rows && (size_t)b->n_segs <= cb->id_rows_cap);
    /* the (row, slot) entries by expert, in row order within one (so grouped by segment):
     * one sort, not a pass over all entries per expert */
    int64_t *keys = cb->id_keys;
    for (size_t f = 0; f < total; f++) {
        GB_ASSERT(ids[f] >= 0 && ids[f] < n_mat);
        keys[f] = (int64_t)ids[f] << 32 | (int64_t)f;
    }
    qsort(keys, total, sizeof *keys, by_key);
    struct seg_count *segc = (struct seg_count *)cb->id_segs; /* the segments an expert sees */
    for (size_t i0 = 0, i1; i0 < total; i0 = i1) {
        const int e = (int)(keys[i0] >> 32);
        const struct gb_weight *w = &stack[e];
        const size_t n_in = (size_t)w->n_in, n_out = (size_t)w->n_out;
        int n_sc = 0;
        for (i1 = i0; i1 < total && (int)(keys[i1] >> 32) == e; i1++) {
            const int32_t seg = b->seg_of[(size_t)(keys[i1] & 0xffffffff) / (size_t)n_sel];
            if (!n_sc || segc[n_sc - 1].seg != seg) segc[n_sc++] = (struct seg_count){seg, 0, (int32_t)(i1 - i0)};
            segc[n_sc - 1].count++;
        }
        qsort(segc, (size_t)n_sc, sizeof *segc, by_count);
        int k = 0;
        for (int s = 0; s < n_sc; s++)
            for (int r = 0; r < segc[s].count; r++, k++) {
                const int32_t f = (int32_t)(keys[i0 + (size_t)segc[s].first + (size_t)r] & 0xffffffff);
                cb->id_rows[k] = f;
                cb->id_span[k] = segc[s].count;
                memcpy(cb->id_x + (size_t)k * n_in, x + (x_per_slot ? (size_t)f : (size_t)f / (size_t)n_sel) * n_in,
                       n_in * sizeof(float));
            }
        be->ops->matmul(be, cb->id_y, cb->id_x, w, NULL, (struct gb_rows){k, cb->id_span});
        for (int r = 0; r < k; r++)
            memcpy(y + (size_t)cb->id_rows[r] * n_out, cb->id_y + (size_t)r * n_out, n_out * sizeof(float));
    }
}

void cpu_moe_route(struct backend *be, int32_t *ids, float *wsel, float *logits, int n, int n_expert, int k,
                   int norm) {
    (void)be;
    for (int t = 0; t < n; t++) {
        float *p = logits + (size_t)t * n_expert;
        float mx = p[0], sum = 0.0f;
        for (int e = 1; e < n_expert; e++) mx = p[e] > mx ? p[e] : mx;
        for (int e = 0; e < n_expert; e++) {
            p[e] = expf(p[e] - mx);
            sum += p[e];
        }
        for (int e = 0; e < n_expert; e++) p[e] /= sum;
        int32_t *sel = ids + (size_t)t * k;
        float *ws = wsel + (size_t)t * k, wsum = 0.0f;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < n_expert; e++)
                if (p[e] != -1.0f && (best < 0 || p[e] > p[best])) best = e;
            sel[j] = best;
            ws[j] = p[best];
            wsum += p[best];
            p[best] = -1.0f; /* taken */
        }
        if (norm)
            for (int j = 0; j < k; j++) ws[j] /= wsum;
    }
}

/* Experts added in ascending id, as transformers accumulates them (expert by expert). */
void cpu_moe_combine(struct backend *be, float *out, const float *y, const int32_t *ids, const float *wsel, int n,
                     int k, int width) {
    (void)be;
    for (int t = 0; t < n; t++) {
        int order[64];
        GB_ASSERT(k <= 64);
        for (int s = 0; s < k; s++) { /* insertion by id, stable */
            int i = s;
            while (i > 0 && ids[(size_t)t * k + order[i - 1]] > ids[(size_t)t * k + s]) {
                order[i] = order[i - 1];
                i--;
            }
            order[i] = s;
        }
        float *o = out + (size_t)t * width;
        for (int j = 0; j < width; j++) o[j] = 0.0f;
        for (int i = 0; i < k; i++) {
            const int s = order[i];
            const float *ys = y + ((size_t)t * k + s) * width, w = wsel[(size_t)t * k + s];
            for (int j = 0; j < width; j++) o[j] += ys[j] * w;
        }
    }
}

void cpu_gated_add_rows(struct backend *be, float *out, const float *a, const float *y, const float *g, int n_rows,
                        int n) {
    (void)be;
    for (int t = 0; t < n_rows; t++) {
        const float sg = 1.0f / (1.0f + expf(-g[t]));
        const float *at = a + (size_t)t * n, *yt = y + (size_t)t * n;
        float *o = out + (size_t)t * n;
        for (int j = 0; j < n; j++) o[j] = at[j] + sg * yt[j];
    }
}
