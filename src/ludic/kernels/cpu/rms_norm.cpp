// RMSNorm on AVX-512, forward and backward, one pass over each row's memory.
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
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include <cmath>
#include <vector>

namespace {

constexpr int64_t kLanes = 16;

inline __mmask16 tail_mask(int64_t left) {
    return left >= kLanes ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

}  // namespace

extern "C" {

// y[i] = w * x[i] * r[i], r[i] = 1 / sqrt(mean(x[i]^2) + eps) for rows i < rows of H values.
void ludic_rms_norm(const float* x, const float* w, float* y, float* r, int64_t rows, int64_t H, float eps,
                    int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
        const float* xi = x + i * H;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t k = 0; k < H; k += kLanes) {
            const __m512 v = _mm512_maskz_loadu_ps(tail_mask(H - k), xi + k);
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        const float ri = 1.0f / std::sqrt(_mm512_reduce_add_ps(acc) / static_cast<float>(H) + eps);
        r[i] = ri;
        const __m512 rv = _mm512_set1_ps(ri);
        for (int64_t k = 0; k < H; k += kLanes) {
            const __mmask16 m = tail_mask(H - k);
            const __m512 n = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xi + k), rv);
            _mm512_mask_storeu_ps(y + i * H + k, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + k), n));
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
            const __m512 rv = _mm512_set1_ps(r[i]);
            __m512 dot = _mm512_setzero_ps();
            for (int64_t k = 0; k < H; k += kLanes) {
                const __mmask16 m = tail_mask(H - k);
                const __m512 n = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xi + k), rv);
                const __m512 g = _mm512_maskz_loadu_ps(m, dyi + k);
                dot = _mm512_fmadd_ps(_mm512_mul_ps(g, _mm512_maskz_loadu_ps(m, w + k)), n, dot);
                if (dw_t != nullptr) _mm512_mask_storeu_ps(dw_t + k, m, _mm512_fmadd_ps(g, n, _mm512_maskz_loadu_ps(m, dw_t + k)));
            }
            if (dx == nullptr) continue;
            const __m512 mean = _mm512_set1_ps(_mm512_reduce_add_ps(dot) / static_cast<float>(H));
            for (int64_t k = 0; k < H; k += kLanes) {
                const __mmask16 m = tail_mask(H - k);
                const __m512 n = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xi + k), rv);
                const __m512 dn = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, dyi + k), _mm512_maskz_loadu_ps(m, w + k));
                _mm512_mask_storeu_ps(dx + i * H + k, m, _mm512_mul_ps(rv, _mm512_fnmadd_ps(n, mean, dn)));
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
