// Top-K selection over one token row of 16-bit logits (bf16, fp16) held by a warp, with one warp max per round.
//
// A 16-bit key has 16 significant bits, so its order code and its expert fit one 32-bit word:
//   word = (order code of the 16-bit value << 16) | (0xFFFF - expert)
// Words compare like (key, then lower expert first), the selection order of SPEC 1, so the warp's largest word is
// the round's winner and its tie-break at once. Codes as in row_group.cuh: 0 for a slot past E (the word 0),
// 1 for -inf or NaN (excluded: chosen only when no real key remains, the lowest expert first); -0 codes as +0.
// Every real key codes to at least 0x0080 (bf16) / 0x0400 (fp16).
//
// Each lane sorts its words descending once, so its best is always its first word; a round takes the warp max
// of the lanes' first words (redux.sync), and the one lane that holds it shifts its list by one.
// Preconditions: experts < 0xFFFF (an expert's complement fits 16 bits); the kind's key is the logit itself
// (every kind but SIGMOID, whose key is computed in fp32).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/storage.cuh"
#include "cuda/routing/row_group.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace routing {

// The fp32 value of a 16-bit logit's bits.
template <class T>
__device__ __forceinline__ float value_of_bits(unsigned short bits) {
  static_assert(sizeof(T) == 2, "packed selection takes 16-bit logits");
  if constexpr (std::is_same<T, __half>::value) {
    return __half2float(__ushort_as_half(bits));
  } else {
    return __uint_as_float(static_cast<unsigned>(bits) << 16);
  }
}

template <class T>
__device__ __forceinline__ unsigned packed_word(unsigned short bits, int expert) {
  const float value = value_of_bits<T>(bits);
  // Negative values order reversed by their bits, positive ones above every negative one.
  unsigned code = bits ^ ((bits & 0x8000u) ? 0xFFFFu : 0x8000u);
  if (value == 0.0f) code = 0x8000u;                   // -0 ties with +0
  if (!(value > -INFINITY)) code = excluded_code;      // -inf or NaN
  return (code << 16) | (0xFFFFu - static_cast<unsigned>(expert));
}

// The expert of a packed word.
__device__ __forceinline__ int expert_of_word(unsigned word) { return static_cast<int>(0xFFFFu - (word & 0xFFFFu)); }

// A thread's 16-bit logits of one row, as raw bits, in the row-group layout of row_group.cuh (slots past E: 0).
template <int THREADS,
          int ITEMS,
          int CHUNK>
__device__ __forceinline__ void load_row_bits(const unsigned short* row, int experts, int lane, bool chunked,
                                              unsigned short (&bits)[ITEMS]) {
  static_assert(ITEMS % CHUNK == 0, "a thread's share of a row is a whole number of chunks");
  if (chunked) {
    constexpr int bytes = 2 * CHUNK;
    constexpr int granule = bytes < 16 ? bytes : 16;
    constexpr int per_granule = granule / 2;
    using Raw = typename RawBytes<granule>::type;
#pragma unroll
    for (int c = 0; c < ITEMS / CHUNK; ++c) {
      const int e = element_of<THREADS, CHUNK>(c * CHUNK, lane, true);
#pragma unroll
      for (int g = 0; g < bytes / granule; ++g) {
        Raw raw{};
        if (e < experts) raw = reinterpret_cast<const Raw*>(row + e)[g];
        const unsigned short* values = reinterpret_cast<const unsigned short*>(&raw);
#pragma unroll
        for (int j = 0; j < per_granule; ++j) bits[c * CHUNK + g * per_granule + j] = values[j];
      }
    }
  } else {
#pragma unroll
    for (int s = 0; s < ITEMS; ++s) {
      const int e = element_of<THREADS, CHUNK>(s, lane, false);
      bits[s] = e < experts ? row[e] : 0;
    }
  }
}

// Sorts N words descending in registers: Batcher's odd-even merge sort (19 compare-exchanges for N = 8). Stage
// (p, k) compares a with a + k where a - k % p falls in the first half of a 2k block and both lie in one 2p block.
// NOTE: every loop has a constant trip count and the pair test folds at compile time, so the loops unroll fully
// and the words stay in registers (loops bounded by outer counters left a local-memory array at N = 16).
template <int N>
__device__ __forceinline__ void sort_descending(unsigned (&w)[N]) {
  static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "the merge network sorts 1 to 32 words, a power of two");
  constexpr int LOG = N == 1 ? 0 : N == 2 ? 1 : N == 4 ? 2 : N == 8 ? 3 : N == 16 ? 4 : 5;
#pragma unroll
  for (int pl = 0; pl < LOG; ++pl) {
#pragma unroll
    for (int kl = LOG - 1; kl >= 0; --kl) {
#pragma unroll
      for (int a = 0; a < N; ++a) {
        const int p = 1 << pl, k = 1 << kl, b = a + k;
        if (kl <= pl && b < N && a >= k % p && (a - k % p) % (2 * k) < k && a / (2 * p) == b / (2 * p)) {
          const unsigned high = max(w[a], w[b]);
          w[b] = min(w[a], w[b]);
          w[a] = high;
        }
      }
    }
  }
}

// K rounds over the warp's sorted lists; lane k (< K) gets the k-th winner's word, the other lanes 0.
template <int ITEMS>
__device__ __forceinline__ unsigned select_packed(unsigned (&w)[ITEMS], int top_k, int warp_lane) {
  unsigned mine = 0;
  for (int k = 0; k < top_k; ++k) {
    const unsigned top = __reduce_max_sync(full_warp, w[0]);
    if (warp_lane == k) mine = top;
    // Words are distinct (each carries its expert), so exactly one lane holds the winner.
    const bool won = w[0] == top;
#pragma unroll
    for (int s = 0; s + 1 < ITEMS; ++s) w[s] = won ? w[s + 1] : w[s];
    w[ITEMS - 1] = won ? 0u : w[ITEMS - 1];
  }
  return mine;
}

}  // namespace routing
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
