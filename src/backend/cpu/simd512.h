/* Small AVX-512 helpers shared by the *_avx512.c files (include only where AVX-512 F is
 * in force). */
#ifndef GB_CPU_SIMD512_H
#define GB_CPU_SIMD512_H

#include <immintrin.h>

/* The first n lanes of 16 (all for n >= 16). */
static inline __mmask16 lanes16(int n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u); }

/* 16 x 16 transpose of 32-bit elements: word j of v[i] <-> word i of v[j]. */
static inline __attribute__((always_inline)) void transpose16_epi32(__m512i v[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) { /* within 128-bit lanes: rows i, i + 1 interleaved */
        t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) { /* u[i + c] lane l: rows i..i+3 of word 4l + c */
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int c = 0; c < 4; c++) { /* lane l of u[c], u[4 + c], u[8 + c], u[12 + c] */
        __m512i a = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88), b = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xdd);
        __m512i a2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88);
        __m512i b2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xdd);
        v[c] = _mm512_shuffle_i32x4(a, a2, 0x88);      /* word c */
        v[8 + c] = _mm512_shuffle_i32x4(a, a2, 0xdd);  /* word 8 + c */
        v[4 + c] = _mm512_shuffle_i32x4(b, b2, 0x88);  /* word 4 + c */
        v[12 + c] = _mm512_shuffle_i32x4(b, b2, 0xdd); /* word 12 + c */
    }
}

#endif
