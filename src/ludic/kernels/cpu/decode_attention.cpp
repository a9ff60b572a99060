// The embedded engine's decoding attention on AVX-512: one new token per row, over its prompt's K/V (kept
// once per distinct prompt) and over the row's own decoded tokens, in one softmax.
//
// Built and loaded by native.py, called by decode_attention.py (see its docstring for why and for the
// measurements). For row r (prompt p = prompt[r]) and KV head j, the `groups` query heads g that read
// KV head j (their queries pre-scaled by `scale`):
//
//     s[g, t] = q[g] . k_pre[p, j, t] + bias[p, t]          t < W        (bias: 0, or -inf at padding)
//     s[g, W + t] = q[g] . k_suf[r, j, t]                   t <= column  (this step's k written first)
//     out[r, g] = sum_t softmax(s[g])_t v_t                 (v_pre, then v_suf, likewise)
//
// Threads (OpenMP, torch's runtime) take the (row, KV head) pairs in contiguous runs; each pair writes
// this step's k/v into its own suffix slot, then runs its query heads together so every key and value
// line is read once for all of them. The exponential is a Cephes-style polynomial (about 1 ulp), so
// values match softmax-then-matmul to fp32 rounding (tests), not bit for bit.
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#include "simd_exp.h"

#include <cmath>

#include <vector>

namespace {

constexpr int kLanes = 16;
constexpr int kMaxGroups = 16;
constexpr int kMaxDim = 256;

// One vector whose lane t is the sum of a[t]'s 16 lanes: pairwise unpacks and shuffles, 45 operations for
// 16 dot products instead of a horizontal sum each.
inline __m512 lane_sums(const __m512* a) {
    __m512 b[8], c[4];
    for (int m = 0; m < 8; ++m)  // within each 128-bit lane: a[2m] at positions 0, 2; a[2m+1] at 1, 3
        b[m] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * m], a[2 * m + 1]), _mm512_unpackhi_ps(a[2 * m], a[2 * m + 1]));
    for (int m = 0; m < 4; ++m)  // each 128-bit lane: a[4m .. 4m+3]'s sums over that lane, in order
        c[m] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * m], b[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(b[2 * m], b[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 d0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 d1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(d0, d1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(d0, d1, _MM_SHUFFLE(3, 1, 3, 1)));
}

// s[g * stride + t] = q_g . key_t (+ bias_t) for t in [0, count); keys [count][d]; q [groups][d]. Keys go
// 16 at a time, one accumulator each, summed across lanes together (a padding column's -inf bias stays -inf).
inline void scores(const float* q, int64_t groups, int64_t d, const float* keys, int64_t count,
                   const float* bias, float* s, int64_t stride) {
    for (int64_t t0 = 0; t0 < count; t0 += kLanes) {
        const int64_t nk = count - t0 < kLanes ? count - t0 : kLanes;
        const __mmask16 live = nk == kLanes ? (__mmask16)0xFFFF : (__mmask16)((1u << nk) - 1);
        const __m512 add = bias != nullptr ? _mm512_maskz_loadu_ps(live, bias + t0) : _mm512_setzero_ps();
        const float* key[kLanes];  // past the last key: the last key again (read, never stored)
        for (int t = 0; t < kLanes; ++t) key[t] = keys + (t0 + (t < nk ? t : nk - 1)) * d;
        for (int64_t g = 0; g < groups; ++g) {
            __m512 acc[kLanes];
            for (int t = 0; t < kLanes; ++t) acc[t] = _mm512_setzero_ps();
            for (int64_t i = 0; i < d; i += kLanes) {
                const __m512 qv = _mm512_loadu_ps(q + g * d + i);
                for (int t = 0; t < kLanes; ++t) acc[t] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(key[t] + i), acc[t]);
            }
            _mm512_mask_storeu_ps(s + g * stride + t0, live, _mm512_add_ps(lane_sums(acc), add));
        }
    }
}

// s[0, n) <- exp(s - max) in place; returns the sum (one pass for the max, one for exp and sum).
inline float softmax_numerators(float* s, int64_t n) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    int64_t t = 0;
    for (; t + kLanes <= n; t += kLanes) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + t));
    float m = _mm512_reduce_max_ps(mx);
    for (; t < n; ++t) m = s[t] > m ? s[t] : m;
    const __m512 vm = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    for (t = 0; t < n; t += kLanes) {
        const __mmask16 k = n - t >= kLanes ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - t)) - 1);
        const __m512 e = ludic::exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + t), vm));
        _mm512_mask_storeu_ps(s + t, k, e);
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, e));
    }
    return _mm512_reduce_add_ps(sum);
}

// o[:] = inv * (sum_t p[t] * values_a_t (t < count_a) + sum_t p[count_a + t] * values_b_t (t < count_b)), for
// one query head; values [count][d] each. C = d / 16 accumulators in registers (0: d / 16 at run time).
template <int C>
inline void weigh(const float* p, const float* values_a, int64_t count_a, const float* values_b, int64_t count_b,
                  int64_t d, float inv, float* o) {
    constexpr int kMax = kMaxDim / kLanes;
    const int chunks = C > 0 ? C : static_cast<int>(d / kLanes);
    __m512 acc[C > 0 ? C : kMax];
    for (int c = 0; c < chunks; ++c) acc[c] = _mm512_setzero_ps();
    for (int part = 0; part < 2; ++part) {
        const float* values = part == 0 ? values_a : values_b;
        const float* w = part == 0 ? p : p + count_a;
        const int64_t count = part == 0 ? count_a : count_b;
        for (int64_t t = 0; t < count; ++t) {
            if (w[t] == 0.0f) continue;  // a padding column
            const __m512 vw = _mm512_set1_ps(w[t]);
            for (int c = 0; c < chunks; ++c)
                acc[c] = _mm512_fmadd_ps(vw, _mm512_loadu_ps(values + t * d + c * kLanes), acc[c]);
        }
    }
    const __m512 vi = _mm512_set1_ps(inv);
    for (int c = 0; c < chunks; ++c) _mm512_storeu_ps(o + c * kLanes, _mm512_mul_ps(acc[c], vi));
}

}  // namespace

extern "C" {

// q: [rows] x q_stride, query head h = j * groups + g at q + r * q_stride + h * d.
// k_new, v_new: this step's K/V, KV head j of row r at + r * k_stride (v_stride) + j * d.
// k_pre, v_pre: [prompts, kv_heads, width, d] contiguous; pre_bias: [prompts, width] (null: no padding).
// prompt: [rows] int64. k_suf, v_suf: this layer's [rows_allocated, kv_heads, max_new, d] contiguous; the
// step writes column `column` and attends over [0, column]. out: [rows, kv_heads * groups * d].
void ludic_decode_attention(const float* q, int64_t q_stride, const float* k_new, int64_t k_stride,
                            const float* v_new, int64_t v_stride, const float* k_pre, const float* v_pre, const float* pre_bias,
                            const int64_t* prompt, float* k_suf, float* v_suf, int64_t max_new, int64_t column,
                            int64_t rows, int64_t kv_heads, int64_t groups, int64_t d, int64_t width, float scale,
                            float* out, int threads) {
    const int64_t pairs = rows * kv_heads, total = width + column + 1;
#pragma omp parallel num_threads(threads)
    {
        std::vector<float> s(groups * total);
        alignas(64) float qs[kMaxGroups * kMaxDim];
#pragma omp for schedule(static)
        for (int64_t pair = 0; pair < pairs; ++pair) {
            const int64_t r = pair / kv_heads, j = pair % kv_heads, p = prompt[r];
            float* ks = k_suf + (r * kv_heads + j) * max_new * d;
            float* vs = v_suf + (r * kv_heads + j) * max_new * d;
            for (int64_t i = 0; i < d; ++i) {
                ks[column * d + i] = k_new[r * k_stride + j * d + i];
                vs[column * d + i] = v_new[r * v_stride + j * d + i];
            }
            const float* qr = q + r * q_stride + j * groups * d;
            for (int64_t i = 0; i < groups * d; ++i) qs[i] = qr[i] * scale;
            const float* kp = k_pre + (p * kv_heads + j) * width * d;
            const float* vp = v_pre + (p * kv_heads + j) * width * d;
            const float* bias = pre_bias != nullptr ? pre_bias + p * width : nullptr;
            scores(qs, groups, d, kp, width, bias, s.data(), total);
            scores(qs, groups, d, ks, column + 1, nullptr, s.data() + width, total);
            float* o = out + r * kv_heads * groups * d + j * groups * d;
            for (int64_t g = 0; g < groups; ++g) {
                float* sg = s.data() + g * total;
                const float inv = 1.0f / softmax_numerators(sg, total);
                if (d == 64)
                    weigh<4>(sg, vp, width, vs, column + 1, d, inv, o + g * d);
                else if (d == 128)
                    weigh<8>(sg, vp, width, vs, column + 1, d, inv, o + g * d);
                else
                    weigh<0>(sg, vp, width, vs, column + 1, d, inv, o + g * d);
            }
        }
    }
}

}  // extern "C"
