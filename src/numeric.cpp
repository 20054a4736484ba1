#include "src/numeric.h"

#include <limits>

namespace moekit {
inline namespace v0 {

float fp16_to_float(uint16_t v) {
  uint32_t sign = static_cast<uint32_t>(v & 0x8000u) << 16;
  uint32_t exponent = (v >> 10) & 0x1fu;
  uint32_t mantissa = v & 0x3ffu;
  if (exponent == 0x1f) return bits_to_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return bits_to_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint16_t float_to_fp16(float f) {
  uint32_t bits = float_to_bits(f);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  if (std::isnan(f)) return static_cast<uint16_t>(sign | 0x7e00u);
  float magnitude = std::fabs(f);
  if (magnitude >= 65520.0f) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past the largest half
  if (magnitude < std::ldexp(1.0f, -14)) {
    // Subnormal half: a multiple of 2^-24; nearbyint rounds half to even in the default rounding mode.
    float units = std::nearbyint(std::ldexp(magnitude, 24));
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(units));
  }
  uint32_t mag_bits = float_to_bits(magnitude);
  uint32_t rounding = 0xfffu + ((mag_bits >> 13) & 1u);
  mag_bits += rounding;
  uint32_t exponent = (mag_bits >> 23) - 112u;
  uint32_t mantissa = (mag_bits >> 13) & 0x3ffu;
  return static_cast<uint16_t>(sign | (exponent << 10) | mantissa);
}

float double_to_float_round_odd(double v) {
  float nearest = static_cast<float>(v);
  if (static_cast<double>(nearest) == v || std::isnan(v) || std::isinf(nearest)) return nearest;
  // One step toward zero is one unit off the magnitude bits (nearest is not zero when it lies beyond v).
  uint32_t bits = float_to_bits(nearest);
  if (std::fabs(static_cast<double>(nearest)) > std::fabs(v)) bits -= 1u;
  return bits_to_float(bits | 1u);
}

}  // namespace v0
}  // namespace moekit
