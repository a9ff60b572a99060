// The embedded engine's decoding attention on 16 lanes (simd16.h: AVX-512 or AVX2): one new token per row, over its prompt's K/V (kept
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
#include <omp.h>
#include <stdint.h>

#include "simd_exp.h"

#include <cmath>

#include <vector>

namespace {

using namespace ludic;

constexpr int kLanes = 16;
constexpr int kMaxGroups = 16;
constexpr int kMaxDim = 256;

// s[g * stride + t] = q_g . key_t (+ bias_t) for t in [0, count); keys [count][d]; q [groups][d]. Keys go
// 16 at a time, one accumulator each, summed across lanes together (a padding column's -inf bias stays -inf).
inline void scores(const float* q, int64_t groups, int64_t d, const float* keys, int64_t count,
                   const float* bias, float* s, int64_t stride) {
    for (int64_t t0 = 0; t0 < count; t0 += kLanes) {
        const int64_t nk = count - t0 < kLanes ? count - t0 : kLanes;
        const Mask live = tail_mask(nk);
        const V plus = bias != nullptr ? load(live, bias + t0) : zero();
        const float* key[kLanes];  // past the last key: the last key again (read, never stored)
        for (int t = 0; t < kLanes; ++t) key[t] = keys + (t0 + (t < nk ? t : nk - 1)) * d;
        for (int64_t g = 0; g < groups; ++g) {
            V acc[kLanes];
            for (int t = 0; t < kLanes; ++t) acc[t] = zero();
            for (int64_t i = 0; i < d; i += kLanes) {
                const V qv = load(q + g * d + i);
                for (int t = 0; t < kLanes; ++t) acc[t] = fmadd(qv, load(key[t] + i), acc[t]);
            }
            store(s + g * stride + t0, live, add(lane_sums(acc), plus));
        }
    }
}

// s[0, n) <- exp(s - max) in place; returns the sum (one pass for the max, one for exp and sum).
inline float softmax_numerators(float* s, int64_t n) {
    V mx = set1(-INFINITY);
    int64_t t = 0;
    for (; t + kLanes <= n; t += kLanes) mx = max(mx, load(s + t));
    float m = largest(mx);
    for (; t < n; ++t) m = s[t] > m ? s[t] : m;
    const V vm = set1(m);
    V total = zero();
    for (t = 0; t < n; t += kLanes) {
        const Mask k = tail_mask(n - t);
        const V e = exp16(sub(load(k, s + t), vm));
        store(s + t, k, e);
        total = add(total, keep(k, e));
    }
    return sum(total);
}

// o[:] = inv * (sum_t p[t] * values_a_t (t < count_a) + sum_t p[count_a + t] * values_b_t (t < count_b)), for
// one query head; values [count][d] each. C = d / 16 accumulators in registers (0: d / 16 at run time).
template <int C>
inline void weigh(const float* p, const float* values_a, int64_t count_a, const float* values_b, int64_t count_b,
                  int64_t d, float inv, float* o) {
    constexpr int kMax = kMaxDim / kLanes;
    const int chunks = C > 0 ? C : static_cast<int>(d / kLanes);
    V acc[C > 0 ? C : kMax];
    for (int c = 0; c < chunks; ++c) acc[c] = zero();
    for (int part = 0; part < 2; ++part) {
        const float* values = part == 0 ? values_a : values_b;
        const float* w = part == 0 ? p : p + count_a;
        const int64_t count = part == 0 ? count_a : count_b;
        for (int64_t t = 0; t < count; ++t) {
            if (w[t] == 0.0f) continue;  // a padding column
            const V vw = set1(w[t]);
            for (int c = 0; c < chunks; ++c)
                acc[c] = fmadd(vw, load(values + t * d + c * kLanes), acc[c]);
        }
    }
    const V vi = set1(inv);
    for (int c = 0; c < chunks; ++c) store(o + c * kLanes, mul(acc[c], vi));
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
