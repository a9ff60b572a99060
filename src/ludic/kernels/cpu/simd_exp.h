// exp(x) and sigmoid(x) on 16 lanes (simd16.h), shared by Ludic's C++ kernels (decode_attention.cpp,
// swiglu.cpp, decode_layers.cpp).
// A Cephes-style polynomial after range reduction by ln 2, about 1 ulp from expf.
#pragma once

#include "simd16.h"

namespace ludic {

// exp(x) for 16 lanes; lanes below -87 (e.g. -inf: a padding column) give exactly 0.
inline V exp16(V x) {
    const Mask live = at_least(x, -87.0f);
    x = min(max(x, set1(-87.0f)), set1(88.3f));
    const V n = round_nearest(mul(x, set1(1.44269504088896341f)));
    V r = fnmadd(n, set1(0.693359375f), x);
    r = fnmadd(n, set1(-2.12194440e-4f), r);
    V p = set1(1.9875691500e-4f);
    p = fmadd(p, r, set1(1.3981999507e-3f));
    p = fmadd(p, r, set1(8.3334519073e-3f));
    p = fmadd(p, r, set1(4.1665795894e-2f));
    p = fmadd(p, r, set1(1.6666665459e-1f));
    p = fmadd(p, r, set1(5.0000001201e-1f));
    p = fmadd(p, mul(r, r), add(r, set1(1.0f)));
    return keep(live, scale_by_pow2(p, n));
}

// sigmoid(x) = 1 / (1 + exp(-x)) for 16 lanes (the gated MLP's SiLU is x * sigmoid(x)).
inline V sigmoid16(V x) {
    const V one = set1(1.0f);
    return div(one, add(one, exp16(sub(zero(), x))));
}

}  // namespace ludic
