// A gated MLP's elementwise part on 16 lanes (simd16.h: AVX-512 or AVX2), forward and backward, one pass over memory each.
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
#include <omp.h>
#include <stdint.h>

#include "simd_exp.h"

namespace {

using namespace ludic;

constexpr int64_t kLanes = 16;

}  // namespace

extern "C" {

// p[i] = silu(g[i]) * u[i] for i < n; threads take contiguous runs of 16-float blocks.
void ludic_swiglu(const float* g, const float* u, float* p, int64_t n, int threads) {
    const int64_t blocks = (n + kLanes - 1) / kLanes;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t i = b * kLanes;
        const Mask m = tail_mask(n - i);
        const V gv = load(m, g + i), uv = load(m, u + i);
        store(p + i, m, mul(mul(gv, sigmoid16(gv)), uv));
    }
}

// p = silu(g) * u, du = dp * silu(g), dg = dp * u * s * (1 + g * (1 - s)) for i < n. ``dg`` may be ``dp``
// (each element is read before it is written); ``p`` may be null (not wanted).
void ludic_swiglu_backward(const float* g, const float* u, const float* dp, float* p, float* du, float* dg,
                           int64_t n, int threads) {
    const int64_t blocks = (n + kLanes - 1) / kLanes;
    const V one = set1(1.0f);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t i = b * kLanes;
        const Mask m = tail_mask(n - i);
        const V gv = load(m, g + i), uv = load(m, u + i);
        const V dv = load(m, dp + i);
        const V s = sigmoid16(gv), a = mul(gv, s);
        if (p != nullptr) store(p + i, m, mul(a, uv));
        store(du + i, m, mul(dv, a));
        // (dp * u) * s * (1 + g * (1 - s)), in aten's order: x * s * (1 + g * (1 - s))
        const V x = mul(dv, uv);
        const V slope = fmadd(gv, sub(one, s), one);
        store(dg + i, m, mul(mul(x, s), slope));
    }
}

}  // extern "C"
