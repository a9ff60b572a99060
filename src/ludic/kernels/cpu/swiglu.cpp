// A gated MLP's elementwise part on AVX-512, forward and backward, one pass over memory each.
//
// Built and loaded by native.py, called by swiglu.py (see its docstring for why and for the
// measurements). With s = sigmoid(g) = 1 / (1 + exp(-g)) and a = silu(g) = g * s:
//
//     forward     p = a * u
//     backward    p = a * u                                  (the down projection's weight gradient reads it)
//                 du = dp * a
//                 dg = dp * u * s * (1 + g * (1 - s))        (aten's silu_backward, times u)
//
// PyTorch runs these as separate ops (silu, mul; silu, mul, mul, mul_, silu_backward), each a pass over
// [rows, intermediate] tensors that do not fit in cache. Here each element is read and written once.
// The exponential is simd_exp.h's (about 1 ulp), so values match PyTorch's to fp32 rounding, not bit for bit.
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include "simd_exp.h"

namespace {

constexpr int64_t kLanes = 16;

inline __mmask16 tail_mask(int64_t left) {
    return left >= kLanes ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

}  // namespace

extern "C" {

// p[i] = silu(g[i]) * u[i] for i < n; threads take contiguous runs of 16-float blocks.
void ludic_swiglu(const float* g, const float* u, float* p, int64_t n, int threads) {
    const int64_t blocks = (n + kLanes - 1) / kLanes;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t i = b * kLanes;
        const __mmask16 m = tail_mask(n - i);
        const __m512 gv = _mm512_maskz_loadu_ps(m, g + i), uv = _mm512_maskz_loadu_ps(m, u + i);
        _mm512_mask_storeu_ps(p + i, m, _mm512_mul_ps(_mm512_mul_ps(gv, ludic::sigmoid16(gv)), uv));
    }
}

// p = silu(g) * u, du = dp * silu(g), dg = dp * u * s * (1 + g * (1 - s)) for i < n. ``dg`` may be ``dp``
// (each element is read before it is written); ``p`` may be null (not wanted).
void ludic_swiglu_backward(const float* g, const float* u, const float* dp, float* p, float* du, float* dg,
                           int64_t n, int threads) {
    const int64_t blocks = (n + kLanes - 1) / kLanes;
    const __m512 one = _mm512_set1_ps(1.0f);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t i = b * kLanes;
        const __mmask16 m = tail_mask(n - i);
        const __m512 gv = _mm512_maskz_loadu_ps(m, g + i), uv = _mm512_maskz_loadu_ps(m, u + i);
        const __m512 dv = _mm512_maskz_loadu_ps(m, dp + i);
        const __m512 s = ludic::sigmoid16(gv), a = _mm512_mul_ps(gv, s);
        if (p != nullptr) _mm512_mask_storeu_ps(p + i, m, _mm512_mul_ps(a, uv));
        _mm512_mask_storeu_ps(du + i, m, _mm512_mul_ps(dv, a));
        // (dp * u) * s * (1 + g * (1 - s)), in aten's order: x * s * (1 + g * (1 - s))
        const __m512 x = _mm512_mul_ps(dv, uv);
        const __m512 slope = _mm512_fmadd_ps(gv, _mm512_sub_ps(one, s), one);
        _mm512_mask_storeu_ps(dg + i, m, _mm512_mul_ps(_mm512_mul_ps(x, s), slope));
    }
}

}  // extern "C"
