/* AVX2/FMA inner loops of the CPU LoRA op (cpu_lora.c), called after the run-time check. */
#include <immintrin.h>

/* sum_i a[i] x[i]: four 8-lane FMA accumulators over 32-element steps, then 8-element
 * steps into the first, a fixed tree, then the scalar tail. */
float lora_dot_avx2(const float *a, const float *x, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(x + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(x + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(x + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(x + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(x + i), s0);
    __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    float t = _mm_cvtss_f32(q);
    for (; i < n; i++) t += a[i] * x[i];
    return t;
}

/* z[i] += h * b[i] (one fused multiply-add per element). */
void lora_axpy_avx2(float *z, float h, const float *b, int n) {
    const __m256 hv = _mm256_set1_ps(h);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(z + i, _mm256_fmadd_ps(hv, _mm256_loadu_ps(b + i), _mm256_loadu_ps(z + i)));
    for (; i < n; i++) z[i] = __builtin_fmaf(h, b[i], z[i]);
}
