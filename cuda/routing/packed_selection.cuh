// Top-K selection over one token row of 16-bit logits (bf16, fp16) held by a warp, with one warp max per round.
//
// A 16-bit key has 16 significant bits, so its order code and its expert fit one 32-bit word:
//   word = (order code of the 16-bit value << 16) + (0xFFFF - expert)
// Words compare like (key, then lower expert first), the selection order of docs/math.md section 1, so the warp's
// largest word is the round's winner and its tie-break at once. The order code is the value's two's complement
// (sign-magnitude bits turned into a signed integer, so -0 meets +0) offset so that +inf codes to 0xFFFF; the keys
// never chosen while a real key remains (-inf and NaN of either sign) then wrap to or below one floor code and are
// clamped to it, so among themselves they order by the lowest expert only. A slot past E loads the bits 0xFFFF (a NaN):
// it is excluded and its expert is above every real one, so with K <= E it is never chosen.
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

// The fp32 value of a 16-bit logit's bits (the low half of `bits`).
template <class T>
__device__ __forceinline__ float value_of_bits(unsigned bits) {
  static_assert(sizeof(T) == 2, "packed selection takes 16-bit logits");
  if constexpr (std::is_same<T, __half>::value) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  } else {
    return __uint_as_float(bits << 16);
  }
}

// The packed word of a 16-bit logit's bits (in the low half of `bits`) held by the expert whose complement
// 0xFFFF - expert is `complement`. Integer logic only, no branch.
template <class T>
__device__ __forceinline__ unsigned packed_word(unsigned bits, unsigned complement) {
  constexpr unsigned inf = std::is_same<T, __half>::value ? 0x7C00u : 0x7F80u;  // the bits of +inf
  const unsigned magnitude = bits & 0x7FFFu;
  const unsigned negative = 0u - (bits >> 15);  // all ones for a negative sign
  // (+-magnitude + 0xFFFF - inf) mod 2^16: real keys land in [0x10000 - 2 inf, 0xFFFF] in value order, -inf on
  // 0xFFFF - 2 inf, and NaNs of either sign at or below it.
  const unsigned rotated = ((magnitude ^ negative) - negative + (0xFFFFu - inf)) << 16;
  constexpr unsigned floor = (0xFFFFu - 2 * inf) << 16;
  return max(rotated, floor) + complement;
}

// The expert of a packed word.
__device__ __forceinline__ int expert_of_word(unsigned word) { return static_cast<int>(0xFFFFu - (word & 0xFFFFu)); }

// A thread's 16-bit logits of one row, two to a register: slot s in the bits 16 * (s % 2) of raw[s / 2], in the
// row-group layout of row_group.cuh; slots past E hold 0xFFFF. Registers, not shorts, so a row can be loaded one
// row ahead at the cost of ITEMS / 2 registers.
template <int ITEMS>
struct RowBits {
  unsigned raw[(ITEMS + 1) / 2];

  __device__ __forceinline__ unsigned slot(int s) const { return (raw[s / 2] >> (16 * (s % 2))) & 0xFFFFu; }
};

// Unpacking a chunk's vector into RowBits registers, and the chunk a slot past E reads as.
__device__ __forceinline__ void unpack_raw(uint4 v, unsigned* out) {
  out[0] = v.x;
  out[1] = v.y;
  out[2] = v.z;
  out[3] = v.w;
}
__device__ __forceinline__ void unpack_raw(uint2 v, unsigned* out) {
  out[0] = v.x;
  out[1] = v.y;
}
__device__ __forceinline__ void unpack_raw(unsigned v, unsigned* out) { out[0] = v; }
__device__ __forceinline__ void unpack_raw(unsigned short v, unsigned* out) { out[0] = 0xFFFF0000u | v; }
__device__ __forceinline__ void set_all_ones(uint4& v) { v = make_uint4(~0u, ~0u, ~0u, ~0u); }
__device__ __forceinline__ void set_all_ones(uint2& v) { v = make_uint2(~0u, ~0u); }
__device__ __forceinline__ void set_all_ones(unsigned& v) { v = ~0u; }
__device__ __forceinline__ void set_all_ones(unsigned short& v) { v = 0xFFFFu; }

template <int THREADS,
          int ITEMS,
          int CHUNK>
__device__ __forceinline__ void load_row_bits(const unsigned short* row, int experts, int lane, bool chunked,
                                              RowBits<ITEMS>& bits) {
  static_assert(ITEMS % CHUNK == 0, "a thread's share of a row is a whole number of chunks");
  if (chunked) {
    constexpr int bytes = 2 * CHUNK;
    constexpr int granule = bytes < 16 ? bytes : 16;
    constexpr int words_per_granule = granule < 4 ? 1 : granule / 4;
    using Raw = typename RawBytes<granule>::type;
#pragma unroll
    for (int c = 0; c < ITEMS / CHUNK; ++c) {
      const int e = element_of<THREADS, CHUNK>(c * CHUNK, lane, true);
#pragma unroll
      for (int g = 0; g < bytes / granule; ++g) {
        Raw raw;
        if (e < experts) {
          raw = reinterpret_cast<const Raw*>(row + e)[g];
        } else {
          set_all_ones(raw);
        }
        unpack_raw(raw, &bits.raw[c * CHUNK / 2 + g * words_per_granule]);
      }
    }
  } else {
#pragma unroll
    for (int w = 0; w < (ITEMS + 1) / 2; ++w) bits.raw[w] = 0xFFFFFFFFu;
#pragma unroll
    for (int s = 0; s < ITEMS; ++s) {
      const int e = element_of<THREADS, CHUNK>(s, lane, false);
      if (e < experts) bits.raw[s / 2] ^= (0xFFFFu ^ row[e]) << (16 * (s % 2));
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
