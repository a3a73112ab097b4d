#include "tensor/dtype.h"
#include "base/fp16.h"
#include "base/status.h"
#include "tensor/quant.h"
#include "tensor/quant_ref.h"

#include <string.h>

#define QUANT(nm, blk, st) {.name = nm, .block_size = blk, .type_size = sizeof(st), .is_quant = 1}

static const struct gb_type_traits traits[GB_TYPE_COUNT] = {
    [GB_TYPE_F32]  = {.name = "F32",  .block_size = 1, .type_size = 4, .is_float = 1},
    [GB_TYPE_F16]  = {.name = "F16",  .block_size = 1, .type_size = 2, .is_float = 1},
    [GB_TYPE_BF16] = {.name = "BF16", .block_size = 1, .type_size = 2, .is_float = 1},
    [GB_TYPE_I32]  = {.name = "I32",  .block_size = 1, .type_size = 4},
    [GB_TYPE_U32]  = {.name = "U32",  .block_size = 1, .type_size = 4},
    [GB_TYPE_U8]   = {.name = "U8",   .block_size = 1, .type_size = 1},
    [GB_TYPE_I8]   = {.name = "I8",   .block_size = 1, .type_size = 1},
    [GB_TYPE_I64]  = {.name = "I64",  .block_size = 1, .type_size = 8},
    [GB_TYPE_Q8_0] = QUANT("Q8_0", QK8_0, block_q8_0),
    [GB_TYPE_Q4_0] = QUANT("Q4_0", QK4_0, block_q4_0),
    [GB_TYPE_Q4_1] = QUANT("Q4_1", QK4_1, block_q4_1),
    [GB_TYPE_Q5_0] = QUANT("Q5_0", QK5_0, block_q5_0),
    [GB_TYPE_Q5_1] = QUANT("Q5_1", QK5_1, block_q5_1),
    [GB_TYPE_Q2_K] = QUANT("Q2_K", QK_K, block_q2_K),
    [GB_TYPE_Q3_K] = QUANT("Q3_K", QK_K, block_q3_K),
    [GB_TYPE_Q4_K] = QUANT("Q4_K", QK_K, block_q4_K),
    [GB_TYPE_Q5_K] = QUANT("Q5_K", QK_K, block_q5_K),
    [GB_TYPE_Q6_K] = QUANT("Q6_K", QK_K, block_q6_K),
    [GB_TYPE_Q8_K] = QUANT("Q8_K", QK_K, block_q8_K),
};
_Static_assert(GB_TYPE_COUNT == 19, "add the new type to the traits table");

/* enum ggml_type of ggml.h. Ids 4, 5 (Q4_2, Q4_3), 31-33 (Q4_0_4_4 ...) and 36-38
 * (IQ4_NL_4_4 ...) were retired from GGUF files; they read as "unknown". */
static const char *const ggml_names[] = {
    [0] = "F32",      [1] = "F16",     [2] = "Q4_0",    [3] = "Q4_1",
    [6] = "Q5_0",     [7] = "Q5_1",    [8] = "Q8_0",    [9] = "Q8_1",
    [10] = "Q2_K",    [11] = "Q3_K",   [12] = "Q4_K",   [13] = "Q5_K",
    [14] = "Q6_K",    [15] = "Q8_K",   [16] = "IQ2_XXS", [17] = "IQ2_XS",
    [18] = "IQ3_XXS", [19] = "IQ1_S",  [20] = "IQ4_NL", [21] = "IQ3_S",
    [22] = "IQ2_S",   [23] = "IQ4_XS", [24] = "I8",     [25] = "I16",
    [26] = "I32",     [27] = "I64",    [28] = "F64",    [29] = "IQ1_M",
    [30] = "BF16",    [34] = "TQ1_0",  [35] = "TQ2_0",  [39] = "MXFP4",
    [40] = "NVFP4",   [41] = "Q1_0",
};
enum { N_GGML_NAMES = sizeof(ggml_names) / sizeof(ggml_names[0]) };

/* GGML id -> gb_type, +1 so that 0 means "not supported". */
static const unsigned char ggml_to_gb[N_GGML_NAMES] = {
    [0] = GB_TYPE_F32 + 1,   [1] = GB_TYPE_F16 + 1,   [30] = GB_TYPE_BF16 + 1,
    [2] = GB_TYPE_Q4_0 + 1,  [3] = GB_TYPE_Q4_1 + 1,  [6] = GB_TYPE_Q5_0 + 1,
    [7] = GB_TYPE_Q5_1 + 1,  [8] = GB_TYPE_Q8_0 + 1,  [10] = GB_TYPE_Q2_K + 1,
    [11] = GB_TYPE_Q3_K + 1, [12] = GB_TYPE_Q4_K + 1, [13] = GB_TYPE_Q5_K + 1,
    [14] = GB_TYPE_Q6_K + 1, [15] = GB_TYPE_Q8_K + 1, [24] = GB_TYPE_I8 + 1,
    [26] = GB_TYPE_I32 + 1,  [27] = GB_TYPE_I64 + 1,
};

const struct gb_type_traits *type_traits(enum gb_type t) {
    GB_ASSERT((unsigned)t < GB_TYPE_COUNT);
    return &traits[t];
}

const char *type_name(enum gb_type t) {
    return (unsigned)t < GB_TYPE_COUNT ? traits[t].name : "?";
}

int type_from_safetensors(const char *s, enum gb_type *out) {
    for (int t = 0; t < GB_TYPE_COUNT; t++)
        if (!traits[t].is_quant && strcmp(s, traits[t].name) == 0) { *out = (enum gb_type)t; return 0; }
    return -1;
}

int type_from_ggml(uint32_t ggml_type, enum gb_type *out) {
    if (ggml_type >= N_GGML_NAMES || ggml_to_gb[ggml_type] == 0) return -1;
    *out = (enum gb_type)(ggml_to_gb[ggml_type] - 1);
    return 0;
}

const char *ggml_type_name(uint32_t ggml_type) {
    if (ggml_type >= N_GGML_NAMES || !ggml_names[ggml_type]) return "unknown";
    return ggml_names[ggml_type];
}

size_t type_row_size(enum gb_type t, int64_t n) {
    const struct gb_type_traits *tt = type_traits(t);
    return (size_t)(n / tt->block_size) * tt->type_size;
}

void type_to_f32(enum gb_type t, const void *src, float *dst, int64_t n) {
    switch (t) {
    case GB_TYPE_F32: memcpy(dst, src, (size_t)n * 4); return;
    case GB_TYPE_F16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++) dst[i] = f16_to_f32(s[i]);
        return;
    }
    case GB_TYPE_BF16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
        return;
    }
    default: {
        struct gb_quant_fns f = quant_fns(t);
        GB_ASSERT(f.to_float && "type_to_f32: not a float or GGML block type");
        GB_ASSERT(n % traits[t].block_size == 0);
        f.to_float(src, dst, n);
    }
    }
}
