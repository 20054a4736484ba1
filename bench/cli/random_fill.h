// Deterministic random tensor contents, the same bits on every platform for a given seed.
#pragma once

#include <cstdint>

#include "moekit/moekit.h"
#include "platform.h"

namespace moekit_bench {

// Fills `count` elements of `dtype` (bf16, fp16, fp32 or fp64) at `dst` with values uniform in [-scale, scale),
// rounded to the dtype. At most 2^24 values are drawn (SplitMix64) on the host; a larger tensor repeats them
// (copied on the platform), which keeps filling a multi-GB weight cheap.
void fill_random(Platform& platform, void* dst, moekit_dtype_t dtype, int64_t count, float scale, uint64_t seed);

// Stores `v` rounded to `dtype` (bf16, fp16: nearest even; fp32; fp64) at `out`.
void store_element(moekit_dtype_t dtype, float v, unsigned char* out);

// SplitMix64 (as moekit_subsample_rows documents it): the bench's only source of random bits.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace moekit_bench
