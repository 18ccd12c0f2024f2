// IEEE binary16 conversions in plain integer code: float32 -> fp16 bits rounded to nearest even
// (subnormals kept, a value that rounds past 65504 becomes infinity), and fp16 bits -> float32
// (exact).
//
// Why not a compiler type or ncnn's: GCC's _Float16 exists in C++ on x86 only (the aarch64 build
// has none), and ncnn's float32_to_float16 rounds half away and flushes subnormals, while the K/V
// cache rows (kv_cache.h) must hold exactly the numbers numpy's astype(float16) gives the Python
// loop (runtime/preallocated_cache.py), on every platform. `ncnnport-cpp fp16-bits` exposes the
// conversion so a test holds it against numpy.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace ncnnport {

inline uint16_t fp16_bits(float f) {
    uint32_t x;
    std::memcpy(&x, &f, sizeof x);
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN (quiet)
    if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 (and inf): infinity
    if (ax < 0x38800000u) {  // below 2^-14, fp16's smallest normal: a multiple of 2^-24, rounded to even
        float a;
        std::memcpy(&a, &ax, sizeof a);
        return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(a * 16777216.0f)));
    }
    const uint32_t r = ax - 0x38000000u;  // exponent re-biased from 127 to 15
    return static_cast<uint16_t>(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));  // mantissa 23 -> 10 bits, ties to even
}

inline float fp16_value(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t x;
    if (e == 0) {
        const float v = std::ldexp(static_cast<float>(m), -24);  // zero or subnormal, exact
        std::memcpy(&x, &v, sizeof x);
    } else if (e == 31) {
        x = 0x7f800000u | (m << 13);
    } else {
        x = ((e + 112u) << 23) | (m << 13);
    }
    x |= sign;
    float out;
    std::memcpy(&out, &x, sizeof out);
    return out;
}

}  // namespace ncnnport
