// The embedded engine's decoding step through every decoder layer in one call: a Llama-style layer (pre-norm
// RMSNorms, RoPE on q and k, grouped-query attention over the shared-prefix cache, a SiLU-gated MLP) for each
// of `layers`, on 16 lanes (simd16.h: AVX-512 or AVX2).
//
// Built and loaded by native.py, called by decode_layers.py (see its docstring for why and for the
// measurements). Per layer, for the live rows' hidden states x [rows, hidden], updated in place:
//
//     h    = rmsnorm(x) * w_in                       (after the previous layer's  x += down(p), same pass)
//     qkv  = h Wqkv^T (+ b)                          (decode_gemm.cpp, q/k/v fused)
//     q, k = rope(q), rope(k)                        q*cos + roll(q, d/2)*sin_signed   (lean_decoder._rope)
//     a    = attention(q, k, v)                      (decode_attention.cpp: writes k/v to the cache first)
//     x   += a Wo^T (+ b);  h = rmsnorm(x) * w_post  (one pass)
//     gu   = h Wgu^T (+ b);  p = silu(gu[:, :I]) * gu[:, I:]
//     x   += p Wdown^T (+ b)
//
// The products and the attention are the same functions the Python loop calls; the RMSNorm, RoPE, SiLU and
// residual adds are written here, so values match that loop to fp32 rounding (other sum orders, simd_exp.h's
// exponential), not bit for bit (tests).
#include <omp.h>
#include <stdint.h>

#include <cmath>

#include "simd_exp.h"

extern "C" {
void ludic_decode_gemm(const float* x, int64_t M, int64_t K, const float* packed, int64_t N, const float* bias,
                       float* y, int threads);
void ludic_decode_attention(const float* q, int64_t q_stride, const float* k_new, int64_t k_stride,
                            const float* v_new, int64_t v_stride, const float* k_pre, const float* v_pre,
                            const float* pre_bias, const int64_t* prompt, float* k_suf, float* v_suf, int64_t max_new,
                            int64_t column, int64_t rows, int64_t kv_heads, int64_t groups, int64_t d, int64_t width,
                            float scale, float* out, int threads);
}

namespace {

using namespace ludic;

constexpr int64_t kLanes = 16;

// The per-layer pointers a call reads, in this order (decode_layers.py's TABLE).
enum Slot : int64_t {
    kInputNorm, kPostNorm, kQkv, kQkvBias, kO, kOBias, kGateUp, kGateUpBias, kDown, kDownBias,
    kKPre, kVPre, kKSuf, kVSuf, kSlots
};

// The call's sizes, in this order (decode_layers.py's DIMS).
enum Dim : int64_t { kRows, kHidden, kInter, kHeads, kKvHeads, kHeadDim, kWidth, kMaxNew, kColumn, kLayers, kDims };

// For each row: x += y (when y is not null), then h = w * x / sqrt(mean(x^2) + eps).
void add_rms_norm(float* x, const float* y, const float* w, float* h, int64_t rows, int64_t H, float eps,
                  int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
        float* xi = x + i * H;
        V acc = zero();
        for (int64_t k = 0; k < H; k += kLanes) {
            const Mask m = tail_mask(H - k);
            V v = load(m, xi + k);
            if (y != nullptr) {
                v = add(v, load(m, y + i * H + k));
                store(xi + k, m, v);
            }
            acc = fmadd(v, v, acc);
        }
        const V r = set1(1.0f / std::sqrt(sum(acc) / static_cast<float>(H) + eps));
        for (int64_t k = 0; k < H; k += kLanes) {
            const Mask m = tail_mask(H - k);
            const V n = mul(load(m, xi + k), r);
            store(h + i * H + k, m, mul(load(m, w + k), n));
        }
    }
}

// x += y over n values.
void add_rows(float* x, const float* y, int64_t n) {
    for (int64_t k = 0; k < n; k += kLanes) {
        const Mask m = tail_mask(n - k);
        store(x + k, m, add(load(m, x + k), load(m, y + k)));
    }
}

// In place on the first `heads` heads of each row of qkv (row stride `stride`): v = v*cos + roll(v, d/2)*sin,
// cos/sin [rows, d] (sin with its first half negated: lean_decoder.rope_tables). d <= 256, even.
void rope(float* qkv, int64_t stride, int64_t rows, int64_t heads, int64_t d, const float* cos, const float* sin) {
    const int64_t half = d / 2;
    for (int64_t r = 0; r < rows; ++r) {
        const float* c = cos + r * d;
        const float* s = sin + r * d;
        for (int64_t j = 0; j < heads; ++j) {
            float* v = qkv + r * stride + j * d;
            alignas(64) float rolled[256];
            for (int64_t t = 0; t < d; ++t) rolled[t] = v[t < half ? t + half : t - half];
            for (int64_t t = 0; t < d; ++t) v[t] = v[t] * c[t] + rolled[t] * s[t];
        }
    }
}

// p[r, :] = silu(gu[r, :I]) * gu[r, I:] for each row of gu [rows, 2I].
void swiglu_rows(const float* gu, float* p, int64_t rows, int64_t I) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* g = gu + r * 2 * I;
        const float* u = g + I;
        for (int64_t k = 0; k < I; k += kLanes) {
            const Mask m = tail_mask(I - k);
            const V gv = load(m, g + k);
            const V a = mul(gv, sigmoid16(gv));
            store(p + r * I + k, m, mul(a, load(m, u + k)));
        }
    }
}

}  // namespace

extern "C" {

// x [rows, hidden]: the step's embedded tokens in, the last layer's output out (before the final norm).
// cos, sin: [rows, head_dim]. table: layers x kSlots pointers (biases may be null; the weights packed for
// decode_gemm). pre_bias: [prompts, width] (null: no padding); prompt: [rows] each row's prompt.
// scratch: rows * (hidden + qkv + heads * d + 3 * inter + hidden) floats, qkv = (heads + 2 kv_heads) * d.
void ludic_decode_layers(float* x, const float* cos, const float* sin, const void* const* table, const int64_t* dims,
                         const float* pre_bias, const int64_t* prompt, float eps, float scale, float* scratch,
                         int threads) {
    const int64_t rows = dims[kRows], H = dims[kHidden], I = dims[kInter], heads = dims[kHeads];
    const int64_t kv = dims[kKvHeads], d = dims[kHeadDim], Q = (heads + 2 * kv) * d;
    float* h = scratch;
    float* qkv = h + rows * H;
    float* attn = qkv + rows * Q;
    float* gu = attn + rows * heads * d;
    float* p = gu + rows * 2 * I;
    float* y = p + rows * I;
    const float* pending = nullptr;  // the last down projection's output, added in the next norm's pass
    for (int64_t layer = 0; layer < dims[kLayers]; ++layer) {
        const void* const* w = table + layer * kSlots;
        auto f = [w](Slot s) { return static_cast<const float*>(w[s]); };
        add_rms_norm(x, pending, f(kInputNorm), h, rows, H, eps, threads);
        ludic_decode_gemm(h, rows, H, f(kQkv), Q, f(kQkvBias), qkv, threads);
        rope(qkv, Q, rows, heads + kv, d, cos, sin);
        ludic_decode_attention(qkv, Q, qkv + heads * d, Q, qkv + (heads + kv) * d, Q, f(kKPre), f(kVPre), pre_bias,
                               prompt, const_cast<float*>(f(kKSuf)), const_cast<float*>(f(kVSuf)), dims[kMaxNew],
                               dims[kColumn], rows, kv, heads / kv, d, dims[kWidth], scale, attn, threads);
        ludic_decode_gemm(attn, rows, heads * d, f(kO), H, f(kOBias), y, threads);
        add_rms_norm(x, y, f(kPostNorm), h, rows, H, eps, threads);
        ludic_decode_gemm(h, rows, H, f(kGateUp), 2 * I, f(kGateUpBias), gu, threads);
        swiglu_rows(gu, p, rows, I);
        ludic_decode_gemm(p, rows, I, f(kDown), H, f(kDownBias), y, threads);
        pending = y;
    }
    if (pending != nullptr) add_rows(x, pending, rows * H);
}

}  // extern "C"
