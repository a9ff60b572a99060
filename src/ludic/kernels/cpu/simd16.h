// 16 fp32 lanes as one value, for Ludic's C++ kernels: one AVX-512 register where the compiler targets
// AVX-512 (-mavx512f: each function below is the one intrinsic it names), two AVX2 registers otherwise
// (-mavx2 -mfma: most laptops and older servers). The kernels are written once against these; native.py
// builds one library per instruction set and loads the one this CPU runs.
//
// Masks are 16 bits, lane i in bit i; a masked load reads only its lanes (no fault past the end of an array)
// and gives 0 in the others; a masked store writes only its lanes.
#pragma once

#include <immintrin.h>
#include <stdint.h>

namespace ludic {

using Mask = uint16_t;

// The first `left` lanes (all 16 when left >= 16).
inline Mask tail_mask(int64_t left) { return left >= 16 ? static_cast<Mask>(0xFFFF) : static_cast<Mask>((1u << left) - 1); }

#if defined(__AVX512F__)

constexpr const char* kIsa = "avx512";

struct V {
    __m512 v;
};

inline V zero() { return {_mm512_setzero_ps()}; }
inline V set1(float a) { return {_mm512_set1_ps(a)}; }
inline V load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void store(float* p, V a) { _mm512_storeu_ps(p, a.v); }
inline V load(Mask m, const float* p) { return {_mm512_maskz_loadu_ps(m, p)}; }
inline void store(float* p, Mask m, V a) { _mm512_mask_storeu_ps(p, m, a.v); }
inline V add(V a, V b) { return {_mm512_add_ps(a.v, b.v)}; }
inline V sub(V a, V b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline V mul(V a, V b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline V div(V a, V b) { return {_mm512_div_ps(a.v, b.v)}; }
inline V max(V a, V b) { return {_mm512_max_ps(a.v, b.v)}; }
inline V min(V a, V b) { return {_mm512_min_ps(a.v, b.v)}; }
inline V fmadd(V a, V b, V c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }    // a * b + c
inline V fnmadd(V a, V b, V c) { return {_mm512_fnmadd_ps(a.v, b.v, c.v)}; }  // c - a * b
inline V keep(Mask m, V a) { return {_mm512_maskz_mov_ps(m, a.v)}; }          // a in m's lanes, 0 elsewhere
inline Mask at_least(V a, float b) { return _mm512_cmp_ps_mask(a.v, _mm512_set1_ps(b), _CMP_GE_OQ); }
inline V round_nearest(V a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
inline V scale_by_pow2(V a, V n) { return {_mm512_scalef_ps(a.v, n.v)}; }  // a * 2^n, n a whole number
inline float sum(V a) { return _mm512_reduce_add_ps(a.v); }
inline float largest(V a) { return _mm512_reduce_max_ps(a.v); }

// One value whose lane t is the sum of a[t]'s 16 lanes: pairwise unpacks and shuffles, 45 operations for
// 16 dot products instead of a horizontal sum each.
inline V lane_sums(const V* a) {
    __m512 b[8], c[4];
    for (int m = 0; m < 8; ++m)  // within each 128-bit lane: a[2m] at positions 0, 2; a[2m+1] at 1, 3
        b[m] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * m].v, a[2 * m + 1].v), _mm512_unpackhi_ps(a[2 * m].v, a[2 * m + 1].v));
    for (int m = 0; m < 4; ++m)  // each 128-bit lane: a[4m .. 4m+3]'s sums over that lane, in order
        c[m] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * m], b[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(b[2 * m], b[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 d0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 d1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return {_mm512_add_ps(_mm512_shuffle_f32x4(d0, d1, _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_f32x4(d0, d1, _MM_SHUFFLE(3, 1, 3, 1)))};
}

// The machine register behind V, for register-blocked loops (decode_gemm.cpp) whose accumulators must stay in
// registers: arrays of R are, arrays of two-register Vs are kept on the stack by GCC. kPerV of them make a V.
using R = __m512;
constexpr int kPerV = 1;
inline R r_zero() { return _mm512_setzero_ps(); }
inline R r_load(const float* p) { return _mm512_loadu_ps(p); }
inline R r_set1(float a) { return _mm512_set1_ps(a); }
inline R r_fmadd(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
inline V join(const R* r) { return {r[0]}; }

#elif defined(__AVX2__) && defined(__FMA__)

constexpr const char* kIsa = "avx2";

struct V {
    __m256 lo, hi;  // lanes 0-7, 8-15
};

// The 8-lane halves of a 16-bit mask as AVX2 lane masks (all bits set in a selected lane).
inline __m256i half_mask(unsigned bits) {
    const __m256i selected = _mm256_and_si256(_mm256_set1_epi32(static_cast<int>(bits)), _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128));
    return _mm256_cmpeq_epi32(selected, _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128));
}

inline V zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V set1(float a) { return {_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
inline V load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void store(float* p, V a) { _mm256_storeu_ps(p, a.lo); _mm256_storeu_ps(p + 8, a.hi); }
inline V load(Mask m, const float* p) {
    if (m == 0xFFFF) return load(p);
    return {_mm256_maskload_ps(p, half_mask(m & 0xFF)), _mm256_maskload_ps(p + 8, half_mask(m >> 8))};
}
inline void store(float* p, Mask m, V a) {
    if (m == 0xFFFF) return store(p, a);
    _mm256_maskstore_ps(p, half_mask(m & 0xFF), a.lo);
    _mm256_maskstore_ps(p + 8, half_mask(m >> 8), a.hi);
}
inline V add(V a, V b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline V sub(V a, V b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline V mul(V a, V b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline V div(V a, V b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline V max(V a, V b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline V min(V a, V b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
inline V fmadd(V a, V b, V c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline V fnmadd(V a, V b, V c) { return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)}; }
inline V keep(Mask m, V a) {
    return {_mm256_and_ps(_mm256_castsi256_ps(half_mask(m & 0xFF)), a.lo),
            _mm256_and_ps(_mm256_castsi256_ps(half_mask(m >> 8)), a.hi)};
}
inline Mask at_least(V a, float b) {
    const __m256 vb = _mm256_set1_ps(b);
    const unsigned lo = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(a.lo, vb, _CMP_GE_OQ)));
    const unsigned hi = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(a.hi, vb, _CMP_GE_OQ)));
    return static_cast<Mask>(lo | (hi << 8));
}
inline V round_nearest(V a) {
    return {_mm256_round_ps(a.lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
            _mm256_round_ps(a.hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
// a * 2^n for whole n in [-126, 127] (exp16's range): 2^n built in the exponent field.
inline __m256 pow2(__m256 n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
inline V scale_by_pow2(V a, V n) { return {_mm256_mul_ps(a.lo, pow2(n.lo)), _mm256_mul_ps(a.hi, pow2(n.hi))}; }
inline float sum8(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline float sum(V a) { return sum8(_mm256_add_ps(a.lo, a.hi)); }
inline float largest(V a) {
    const __m256 m8 = _mm256_max_ps(a.lo, a.hi);
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

// Lane t of the result: the sum of a[t]'s 8 lanes, for 8 values (horizontal adds, then the halves added).
inline __m256 lane_sums8(const __m256* a) {
    const __m256 s0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 s1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(s0, s1, 0x20), _mm256_permute2f128_ps(s0, s1, 0x31));
}

// One value whose lane t is the sum of a[t]'s 16 lanes.
inline V lane_sums(const V* a) {
    __m256 folded[16];
    for (int t = 0; t < 16; ++t) folded[t] = _mm256_add_ps(a[t].lo, a[t].hi);
    return {lane_sums8(folded), lane_sums8(folded + 8)};
}

using R = __m256;
constexpr int kPerV = 2;
inline R r_zero() { return _mm256_setzero_ps(); }
inline R r_load(const float* p) { return _mm256_loadu_ps(p); }
inline R r_set1(float a) { return _mm256_set1_ps(a); }
inline R r_fmadd(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
inline V join(const R* r) { return {r[0], r[1]}; }

#else
#error "Ludic's kernels need AVX-512 (-mavx512f) or AVX2 with FMA (-mavx2 -mfma)"
#endif

}  // namespace ludic
