/* Block layouts of the GGML quantized types, as GGUF files store them. One header
 * for every backend (CPU and, later, CUDA). Values are little-endian; f16 fields are
 * IEEE half bits. QK_K = 256 elements per k-quant super-block. */
#ifndef GB_QUANT_H
#define GB_QUANT_H

#include <stdint.h>

typedef uint16_t gb_half;

enum { QK4_0 = 32, QK4_1 = 32, QK5_0 = 32, QK5_1 = 32, QK8_0 = 32, QK_K = 256, K_SCALE_SIZE = 12 };

typedef struct { gb_half d; uint8_t qs[QK4_0 / 2]; } block_q4_0;        /* x = (q - 8) d; low nibbles 0..15, high 16..31 */
typedef struct { gb_half d, m; uint8_t qs[QK4_1 / 2]; } block_q4_1;     /* x = q d + m */
typedef struct { gb_half d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0; /* x = (q - 16) d; bit 5 from qh */
typedef struct { gb_half d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } block_q5_1;
typedef struct { gb_half d; int8_t qs[QK8_0]; } block_q8_0;             /* x = q d */
typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; gb_half d, dmin; } block_q2_K;
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; gb_half d; } block_q3_K;
typedef struct { gb_half d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; } block_q4_K;
typedef struct { gb_half d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; gb_half d; } block_q6_K;
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K; /* activations for k-quant dots */

_Static_assert(sizeof(block_q4_0) == 18, "block_q4_0");
_Static_assert(sizeof(block_q4_1) == 20, "block_q4_1");
_Static_assert(sizeof(block_q5_0) == 22, "block_q5_0");
_Static_assert(sizeof(block_q5_1) == 24, "block_q5_1");
_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0");
_Static_assert(sizeof(block_q2_K) == 84, "block_q2_K");
_Static_assert(sizeof(block_q3_K) == 110, "block_q3_K");
_Static_assert(sizeof(block_q4_K) == 144, "block_q4_K");
_Static_assert(sizeof(block_q5_K) == 176, "block_q5_K");
_Static_assert(sizeof(block_q6_K) == 210, "block_q6_K");
_Static_assert(sizeof(block_q8_K) == 292, "block_q8_K");

#endif
