// Storage-dtype rounding on the host: bf16 and fp16 round-to-nearest-even conversions, and round_to(), the
// single function every rounding point of docs/math.md section 8 goes through in the reference backend.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {

inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

inline float bf16_to_float(uint16_t v) { return bits_to_float(static_cast<uint32_t>(v) << 16); }

// Round to nearest even; NaN stays a (quiet) NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t bits = float_to_bits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float fp16_to_float(uint16_t v);
uint16_t float_to_fp16(float f);  // round to nearest even, overflow to inf

// double -> float rounding to odd: exact values stay, inexact ones get the odd neighbour toward zero. A second
// rounding to nearest even into a format at least 2 bits narrower (bf16, fp16) then equals one direct rounding,
// which double -> float -> bf16 with nearest-even twice would not always give.
float double_to_float_round_odd(double v);

// Rounds a value to what a tensor of `dtype` would hold (one correctly rounded step, nearest even); fp64 and
// integer dtypes return it unchanged.
inline double round_to(double v, int32_t dtype) {
  switch (dtype) {
    case MOEKIT_DTYPE_BF16: return bf16_to_float(float_to_bf16(double_to_float_round_odd(v)));
    case MOEKIT_DTYPE_FP16: return fp16_to_float(float_to_fp16(double_to_float_round_odd(v)));
    case MOEKIT_DTYPE_FP32: return static_cast<float>(v);
    default: return v;
  }
}

}  // namespace v0
}  // namespace moekit
