// The embedded engine's decoding matmul on 16 lanes (simd16.h: AVX-512 or AVX2): y[M, N] = x[M, K] W^T (+ b)
// for a few dozen rows M.
//
// Built and loaded by decode_gemm.py (see its docstring for why and for the measurements). W is packed
// there once per batch as [P = ceil(N / 16)][K][16]: panel p holds output columns 16p..16p+15, one 64-byte
// line per k, so a panel streams from memory in order. Threads (OpenMP: torch's own runtime, loaded
// first) take contiguous runs of groups of panels; within a group, rows go a block at a time through a
// register block of accumulators, k from 0 to K-1 in order, so each output is one fp32 sum of K fused
// multiply-adds. AVX-512: groups of 3 panels (48 columns), blocks of 8 rows (8 x 3 accumulators, 24 of the
// 32 zmm registers); AVX2: one panel, 6 rows (6 x 2 accumulators, 12 of the 16 ymm registers). While a group's later row blocks run from
// cache (or its only block, under two blocks of rows), they prefetch the next group's panels, spread evenly over
// their k steps, so the weight stream from memory overlaps the arithmetic instead of stalling the first
// row block of every group.
#include <omp.h>
#include <stdint.h>

#include "simd16.h"

namespace {

using namespace ludic;

constexpr int kLanes = 16;  // floats per panel line
#if defined(__AVX512F__)
constexpr int kRowBlock = 8;
constexpr int kGroup = 3;  // panels per thread work item
#else
constexpr int kRowBlock = 6;
constexpr int kGroup = 1;
#endif
static_assert(kRowBlock <= 8, "group() handles the rows after the full blocks in a switch up to 7");

// acc[r][j] = sum_k x[r, k] * panel_j[k, :] for MR rows and NP panels; stores (plus bias) to y.
// ``prefetch``: null, or memory whose 64-byte lines [lo, hi) are prefetched, spread evenly over k.
template <int MR, int NP>
inline void block(const float* x, int64_t K, const float* panels, float* y, int64_t ldy, const float* bias,
                  int64_t n0, int64_t N, const char* prefetch, int64_t lo, int64_t hi) {
    constexpr int kRegs = NP * kPerV, kRegLanes = kLanes / kPerV;  // machine registers across the NP panels
    R acc[MR][kRegs];
    for (int r = 0; r < MR; ++r)
        for (int j = 0; j < kRegs; ++j) acc[r][j] = r_zero();
    const int64_t span = prefetch != nullptr ? hi - lo : 0;
    int64_t line = lo, owed = 0;  // lines [lo, lo + span * (k + 1) / K) are prefetched by the end of step k
    for (int64_t k = 0; k < K; ++k) {
        R w[kRegs];
        for (int j = 0; j < kRegs; ++j) w[j] = r_load(panels + ((j / kPerV) * K + k) * kLanes + (j % kPerV) * kRegLanes);
        for (owed += span; owed >= K; owed -= K, ++line) _mm_prefetch(prefetch + line * 64, _MM_HINT_T1);
        for (int r = 0; r < MR; ++r) {
            const R xr = r_set1(x[r * K + k]);
            for (int j = 0; j < kRegs; ++j) acc[r][j] = r_fmadd(xr, w[j], acc[r][j]);
        }
    }
    for (int j = 0; j < NP; ++j) {
        const int64_t n = n0 + j * kLanes, left = N - n;
        const Mask mask = tail_mask(left);
        const V b = bias != nullptr ? load(mask, bias + n) : zero();
        for (int r = 0; r < MR; ++r) store(y + r * ldy + n, mask, add(join(&acc[r][j * kPerV]), b));
    }
}

// Every row of x against NP panels (output columns n0..): full row blocks, then the rows left over.
// ``next``/``next_lines``: what to prefetch meanwhile (the next panels to run), spread over the full row
// blocks after the first (which waits for this group's own panels), or over the first when it is the only one.
template <int NP>
void group(const float* x, int64_t M, int64_t K, const float* panels, float* y, int64_t N, const float* bias,
           int64_t n0, const char* next, int64_t next_lines) {
    const int64_t full = M / kRowBlock, spread = full > 1 ? full - 1 : full;
    int64_t r = 0;
    for (; r + kRowBlock <= M; r += kRowBlock) {
        const int64_t b = r / kRowBlock - (full > 1 ? 1 : 0);  // index among the prefetching blocks
        const bool on = next != nullptr && b >= 0;
        block<kRowBlock, NP>(x + r * K, K, panels, y + r * N, N, bias, n0, N, on ? next : nullptr,
                             on ? next_lines * b / spread : 0, on ? next_lines * (b + 1) / spread : 0);
    }
    const float* xr = x + r * K;
    float* yr = y + r * N;
    switch (M - r) {
        case 7: block<7, NP>(xr, K, panels, yr, N, bias, n0, N, nullptr, 0, 0); break;
        case 6: block<6, NP>(xr, K, panels, yr, N, bias, n0, N, nullptr, 0, 0); break;
        case 5: block<5, NP>(xr, K, panels, yr, N, bias, n0, N, nullptr, 0, 0); break;
        case 4: block<4, NP>(xr, K, panels, yr, N, bias, n0, N, nullptr, 0, 0); break;
        case 3: block<3, NP>(xr, K, panels, yr, N, bias, n0, N, nullptr, 0, 0); break;
        case 2: block<2, NP>(xr, K, panels, yr, N, bias, n0, N, nullptr, 0, 0); break;
        case 1: block<1, NP>(xr, K, panels, yr, N, bias, n0, N, nullptr, 0, 0); break;
        default: break;
    }
}

// group<np> for the np (1..NP) panels of a work item (the last may have fewer than kGroup).
template <int NP>
void run_group(int64_t np, const float* x, int64_t M, int64_t K, const float* panels, float* y, int64_t N,
               const float* bias, int64_t n0, const char* next, int64_t next_lines) {
    if constexpr (NP > 1) {
        if (np < NP) return run_group<NP - 1>(np, x, M, K, panels, y, N, bias, n0, next, next_lines);
    }
    group<NP>(x, M, K, panels, y, N, bias, n0, next, next_lines);
}

}  // namespace

extern "C" {

// y[M][N] = x[M][K] W^T + bias (bias may be null); x and y row-major and contiguous. Each thread takes a
// contiguous run of groups, so the group after the current one is its own and can be prefetched.
void ludic_decode_gemm(const float* x, int64_t M, int64_t K, const float* packed, int64_t N, const float* bias,
                       float* y, int threads) {
    const int64_t P = (N + kLanes - 1) / kLanes, groups = (P + kGroup - 1) / kGroup;
#pragma omp parallel num_threads(threads)
    {
        const int64_t T = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t begin = groups * t / T, end = groups * (t + 1) / T;
        for (int64_t g = begin; g < end; ++g) {
            const int64_t p0 = g * kGroup, np = P - p0 < kGroup ? P - p0 : kGroup;
            const float* panels = packed + p0 * K * kLanes;
            const char* ahead = nullptr;  // the next group's panels follow these in memory
            int64_t lines = 0;
            if (g + 1 < end) {
                const int64_t q0 = p0 + kGroup, nq = P - q0 < kGroup ? P - q0 : kGroup;
                ahead = reinterpret_cast<const char*>(panels + kGroup * K * kLanes);
                lines = nq * K * kLanes * static_cast<int64_t>(sizeof(float)) / 64;
            }
            run_group<kGroup>(np, x, M, K, panels, y, N, bias, p0 * kLanes, ahead, lines);
        }
    }
}

}  // extern "C"
