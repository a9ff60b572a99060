// RMSNorm on 16 lanes (simd16.h: AVX-512 or AVX2), forward and backward, one pass over each row's memory.
//
// Built and loaded by native.py, called by rms_norm.py (see its docstring for why and for the
// measurements). For a row x of H values and the weight w, with r = 1 / sqrt(mean(x^2) + eps), n = x * r:
//
//     forward     y = w * n                     (r kept per row for the backward)
//     backward    dn = dy * w
//                 dx = r * (dn - n * mean(dn * n))
//                 dw = sum over rows of dy * n
//
// A row (H floats: 576 at SmolLM2-135M) stays in L1 between its two sweeps (the sums, then the outputs), so
// x and dy come from memory once and dx goes back once. Threads take contiguous runs of rows; dw is summed per
// thread and the threads' sums added in thread order (the same bits for the same thread count).
#include <omp.h>
#include <stdint.h>

#include <cmath>
#include <vector>

#include "simd16.h"

namespace {

using namespace ludic;

constexpr int64_t kLanes = 16;

}  // namespace

extern "C" {

// y[i] = w * x[i] * r[i], r[i] = 1 / sqrt(mean(x[i]^2) + eps) for rows i < rows of H values.
void ludic_rms_norm(const float* x, const float* w, float* y, float* r, int64_t rows, int64_t H, float eps,
                    int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
        const float* xi = x + i * H;
        V acc = zero();
        for (int64_t k = 0; k < H; k += kLanes) {
            const V v = load(tail_mask(H - k), xi + k);
            acc = fmadd(v, v, acc);
        }
        const float ri = 1.0f / std::sqrt(sum(acc) / static_cast<float>(H) + eps);
        r[i] = ri;
        const V rv = set1(ri);
        for (int64_t k = 0; k < H; k += kLanes) {
            const Mask m = tail_mask(H - k);
            const V n = mul(load(m, xi + k), rv);
            store(y + i * H + k, m, mul(load(m, w + k), n));
        }
    }
}

// dx (may be null) and dw (may be null, else overwritten) of the forward above, from x, w, r and dy.
void ludic_rms_norm_backward(const float* x, const float* w, const float* r, const float* dy, float* dx, float* dw,
                             int64_t rows, int64_t H, int threads) {
    const int T = threads > 0 ? threads : 1;
    std::vector<float> partial(dw != nullptr ? static_cast<size_t>(T) * H : 0, 0.0f);
#pragma omp parallel num_threads(T)
    {
        const int t = omp_get_thread_num(), team = omp_get_num_threads();
        const int64_t begin = rows * t / team, end = rows * (t + 1) / team;
        float* dw_t = dw != nullptr ? partial.data() + static_cast<size_t>(t) * H : nullptr;
        for (int64_t i = begin; i < end; ++i) {
            const float *xi = x + i * H, *dyi = dy + i * H;
            const V rv = set1(r[i]);
            V dot = zero();
            for (int64_t k = 0; k < H; k += kLanes) {
                const Mask m = tail_mask(H - k);
                const V n = mul(load(m, xi + k), rv);
                const V g = load(m, dyi + k);
                dot = fmadd(mul(g, load(m, w + k)), n, dot);
                if (dw_t != nullptr) store(dw_t + k, m, fmadd(g, n, load(m, dw_t + k)));
            }
            if (dx == nullptr) continue;
            const V mean = set1(sum(dot) / static_cast<float>(H));
            for (int64_t k = 0; k < H; k += kLanes) {
                const Mask m = tail_mask(H - k);
                const V n = mul(load(m, xi + k), rv);
                const V dn = mul(load(m, dyi + k), load(m, w + k));
                store(dx + i * H + k, m, mul(rv, fnmadd(n, mean, dn)));
            }
        }
    }
    if (dw == nullptr) return;
    for (int64_t k = 0; k < H; ++k) {
        float sum = 0.0f;
        for (int t = 0; t < T; ++t) sum += partial[static_cast<size_t>(t) * H + k];
        dw[k] = sum;
    }
}

}  // extern "C"
