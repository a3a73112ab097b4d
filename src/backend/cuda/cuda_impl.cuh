/* What the CUDA backend's files share (internal to src/backend/cuda/). */
#ifndef GB_CUDA_IMPL_CUH
#define GB_CUDA_IMPL_CUH

#define _Static_assert static_assert /* quant.h is C11 */
extern "C" {
#include "backend/backend.h"
#include "base/status.h"
#include "tensor/quant.h"
}
#undef _Static_assert
#include "backend/cuda/cuda.h"

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

/* A CUDA call that must not fail: a failure is a bug or a lost device, never a result. */
void cu_fatal(const char *what, cudaError_t e, const char *file, int line);
#define CU(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) cu_fatal(#x, e_, __FILE__, __LINE__); } while (0)
#define CU_LAUNCHED() CU(cudaGetLastError())

/* A segment as the kernels read it: the host gb_seg with its block table at blk in the
 * batch's concatenated tables. */
struct cu_seg {
    int row0, n_rows, pos0, state, blk;
};

/* A weight as the matmul kernels read it (device pointers). */
struct cu_w {
    const uint8_t *data;
    const void *sc, *bi; /* MLX */
    long long row_bytes;
    int n_in, n_out, bits, gs, sbt; /* sbt: 0 f32, 1 f16, 2 bf16 */
    /* matmul_id: bytes from one expert to the next in data, sc and bi */
    long long e_data, e_sb;
    int n_mat;
};

struct cuda_region {
    const void *host;
    size_t bytes;
    void *dev;
};

struct cuda_backend {
    struct backend base;
    int dev;
    cudaStream_t st;
    /* weights uploaded at load, by host address (a tied embedding is bound twice) */
    struct cuda_region *regions;
    int n_regions, cap_regions;
    gerbil_status load_err;
    /* the batch's host arrays (batch_begin) and their device copies */
    const void *h_tok, *h_kv, *h_pos, *h_segof, *h_span, *h_segs;
    int n_rows, n_segs, max_seg_rows;
    const int32_t *d_tok, *d_kv, *d_pos, *d_segof, *d_span, *d_blocks;
    const struct cu_seg *d_segs;
    char *batch_dev, *batch_host;
    size_t batch_cap;
    /* staging for host arrays an op gets outside a batch's (tests) */
    char *stage;
    size_t stage_cap, stage_off;
    /* scratch for overlapping copies */
    void *tmp;
    size_t tmp_cap;
};

static inline struct cuda_backend *cu_of(struct backend *be) { return (struct cuda_backend *)be; }

/* Host array h (bytes) as device memory: the batch's copy when it is one of the batch's
 * arrays, else a staged copy valid for the op being run. */
const void *cu_dev_array(struct cuda_backend *cb, const void *h, size_t bytes);
/* Segments as device cu_segs (with their block tables). */
const struct cu_seg *cu_dev_segs(struct cuda_backend *cb, const struct gb_seg *segs, int n_segs,
                                 const int32_t **blocks);

/* cuda_matmul.cu */
int cu_weight_supported(const struct gb_weight *w, char *why, size_t cap);
void cu_matmul(struct cuda_backend *cb, float *y, const float *x, const struct gb_weight *w, const float *bias,
               struct gb_rows r);
void cu_matmul_id(struct cuda_backend *cb, float *y, const float *x, int x_per_slot, const struct gb_weight *stack,
                  int n_mat, const int32_t *ids, int n_sel, int n);
void cu_get_rows(struct cuda_backend *cb, float *y, const struct gb_weight *table, const int32_t *ids, int n);

#endif
