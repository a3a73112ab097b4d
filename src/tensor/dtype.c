#include "tensor/dtype.h"
#include "base/fp16.h"
#include "base/status.h"

#include <string.h>

static const struct gb_type_traits traits[GB_TYPE_COUNT] = {
    [GB_TYPE_F32]  = {.name = "F32",  .block_size = 1, .type_size = 4, .is_float = 1},
    [GB_TYPE_F16]  = {.name = "F16",  .block_size = 1, .type_size = 2, .is_float = 1},
    [GB_TYPE_BF16] = {.name = "BF16", .block_size = 1, .type_size = 2, .is_float = 1},
    [GB_TYPE_I32]  = {.name = "I32",  .block_size = 1, .type_size = 4},
    [GB_TYPE_U32]  = {.name = "U32",  .block_size = 1, .type_size = 4},
    [GB_TYPE_U8]   = {.name = "U8",   .block_size = 1, .type_size = 1},
    [GB_TYPE_I8]   = {.name = "I8",   .block_size = 1, .type_size = 1},
    [GB_TYPE_I64]  = {.name = "I64",  .block_size = 1, .type_size = 8},
};
_Static_assert(GB_TYPE_COUNT == 8, "add the new type to the traits table");

const struct gb_type_traits *type_traits(enum gb_type t) {
    GB_ASSERT((unsigned)t < GB_TYPE_COUNT);
    return &traits[t];
}

const char *type_name(enum gb_type t) {
    return (unsigned)t < GB_TYPE_COUNT ? traits[t].name : "?";
}

int type_from_safetensors(const char *s, enum gb_type *out) {
    for (int t = 0; t < GB_TYPE_COUNT; t++)
        if (strcmp(s, traits[t].name) == 0) { *out = (enum gb_type)t; return 0; }
    return -1;
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
    default: GB_ASSERT(!"type_to_f32: not a float type");
    }
}
