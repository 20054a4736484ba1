// Device pieces shared by the router kernels: how one token row is spread over the threads of its row group,
// vector loads and stores of a thread's consecutive elements, the fp32 selection order as an unsigned integer,
// and row-group reductions whose order is fixed (so every run gives the same bits).
//
// Layouts (either way a thread's elements ascend with its slot, which the tie-breaking below relies on):
//   chunked: thread `lane` holds chunks lane, lane + THREADS, ... of CHUNK consecutive elements; used when E and
//            the row strides are multiples of CHUNK, so each chunk is one aligned vector access (16 bytes for bf16
//            rows of 8 or more elements per thread).
//   strided: thread `lane` holds elements lane, lane + THREADS, ...; any E, any row stride.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/storage.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace routing {

constexpr unsigned full_warp = 0xffffffffu;

// Elements of T per chunk: a thread's whole share when it is under 16 bytes, else 16 bytes' worth.
template <class T,
          int ITEMS>
__host__ __device__ constexpr int chunk_elements() {
  return ITEMS * static_cast<int>(sizeof(T)) < 16 ? ITEMS : 16 / static_cast<int>(sizeof(T));
}

// The row element held in `slot` by thread `lane` of the row group.
template <int THREADS,
          int CHUNK>
__device__ __forceinline__ int element_of(int slot, int lane, bool chunked) {
  return chunked ? (slot / CHUNK) * THREADS * CHUNK + lane * CHUNK + slot % CHUNK : slot * THREADS + lane;
}

// The inverse of element_of: the position slot * THREADS + lane of row element e in a slot-major array, where
// a thread's slots are THREADS apart (so a warp reading one slot of each lane touches consecutive words).
template <int THREADS,
          int CHUNK>
__device__ __forceinline__ int slot_major_position(int e, bool chunked) {
  if (!chunked) return e;
  const int lane = (e / CHUNK) % THREADS;
  const int slot = e / (THREADS * CHUNK) * CHUNK + e % CHUNK;
  return slot * THREADS + lane;
}

// Whether rows starting at `data` with `stride` elements allow the chunked layout for E elements per row.
template <class T,
          int CHUNK>
bool chunked_rows(const void* data, int64_t stride, int64_t experts) {
  // load_chunk / store_chunk access a chunk in pieces of at most 16 bytes.
  const uintptr_t piece_bytes = sizeof(T) * CHUNK < 16 ? sizeof(T) * CHUNK : 16;
  return experts % CHUNK == 0 && stride % CHUNK == 0 && reinterpret_cast<uintptr_t>(data) % piece_bytes == 0;
}

template <int BYTES>
struct RawBytes;
template <>
struct RawBytes<16> {
  using type = uint4;
};
template <>
struct RawBytes<8> {
  using type = uint2;
};
template <>
struct RawBytes<4> {
  using type = unsigned;
};
template <>
struct RawBytes<2> {
  using type = unsigned short;
};

// CHUNK consecutive values at p (aligned to the chunk's size, or to 16 bytes when larger), as fp32.
template <class T,
          int CHUNK>
__device__ __forceinline__ void load_chunk(const T* p, float* out) {
  constexpr int bytes = static_cast<int>(sizeof(T)) * CHUNK;
  constexpr int granule = bytes < 16 ? bytes : 16;
  constexpr int per_granule = granule / static_cast<int>(sizeof(T));
  using Raw = typename RawBytes<granule>::type;
#pragma unroll
  for (int g = 0; g < bytes / granule; ++g) {
    Raw raw = reinterpret_cast<const Raw*>(p)[g];
    const T* values = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int j = 0; j < per_granule; ++j) out[g * per_granule + j] = to_float(values[j]);
  }
}

// Rounds CHUNK fp32 values to T and stores them at p (same alignment as load_chunk).
template <class T,
          int CHUNK>
__device__ __forceinline__ void store_chunk(T* p, const float* in) {
  constexpr int bytes = static_cast<int>(sizeof(T)) * CHUNK;
  constexpr int granule = bytes < 16 ? bytes : 16;
  constexpr int per_granule = granule / static_cast<int>(sizeof(T));
  using Raw = typename RawBytes<granule>::type;
#pragma unroll
  for (int g = 0; g < bytes / granule; ++g) {
    Raw raw;
    T* values = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int j = 0; j < per_granule; ++j) values[j] = from_float<T>(in[g * per_granule + j]);
    reinterpret_cast<Raw*>(p)[g] = raw;
  }
}

// A thread's ITEMS elements of one row as fp32; slots past E hold -inf.
template <class T,
          int THREADS,
          int ITEMS>
__device__ __forceinline__ void load_row(const T* row, int experts, int lane, bool chunked, float (&x)[ITEMS]) {
  constexpr int CHUNK = chunk_elements<T, ITEMS>();
  static_assert(ITEMS % CHUNK == 0, "a thread's share of a row is a whole number of chunks");
  if (chunked) {
#pragma unroll
    for (int c = 0; c < ITEMS / CHUNK; ++c) {
      const int e = element_of<THREADS, CHUNK>(c * CHUNK, lane, true);
      if (e < experts) {
        load_chunk<T, CHUNK>(row + e, &x[c * CHUNK]);
      } else {
#pragma unroll
        for (int j = 0; j < CHUNK; ++j) x[c * CHUNK + j] = -INFINITY;
      }
    }
  } else {
#pragma unroll
    for (int s = 0; s < ITEMS; ++s) {
      const int e = element_of<THREADS, CHUNK>(s, lane, false);
      x[s] = e < experts ? to_float(row[e]) : -INFINITY;
    }
  }
}

// Selection keys as unsigned integers in the same order as the fp32 values. Two codes sit below every real key:
// `taken_code` (already selected, or a slot past E) and `excluded_code` (-inf or NaN: never chosen while a real
// key remains; like the reference, the lowest excluded positions fill a row that breaks the >= K finite rule).
constexpr unsigned taken_code = 0;
constexpr unsigned excluded_code = 1;

__device__ __forceinline__ unsigned order_code(float key) {
  if (isnan(key) || key == -INFINITY) return excluded_code;
  // NOTE: -0 and +0 compare equal, so they must tie (and go to the lower index); their bits differ.
  if (key == 0.0f) key = 0.0f;
  const unsigned bits = __float_as_uint(key);
  // Negative floats order reversed by their bits, positive ones above every negative one. -FLT_MAX maps to
  // 0x00800000, far above the two reserved codes.
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Reductions over one row group. Inside a warp an xor butterfly: every lane combines the same pairs, so every
// lane ends with bitwise the same value (addition is commutative). Across the warps of a block, each warp's
// value goes through shared memory and every thread combines them in warp order. `scratch` holds THREADS / 32
// floats; unused for a warp.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(full_warp, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(full_warp, v, offset));
  return v;
}

// The sum over lanes [0, width) of a warp (width a power of two up to 32), by an xor butterfly inside each
// aligned group of `width` lanes: every lane of the first group gets bitwise the same sum.
__device__ __forceinline__ float lanes_sum(float v, int width) {
  for (int offset = width / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(full_warp, v, offset);
  return v;
}

template <int THREADS>
__device__ __forceinline__ float group_sum(float v, float* scratch) {
  v = warp_sum(v);
  if constexpr (THREADS > 32) {
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    v = 0;
#pragma unroll
    for (int w = 0; w < THREADS / 32; ++w) v += scratch[w];
    __syncthreads();
  }
  return v;
}

template <int THREADS>
__device__ __forceinline__ float group_max(float v, float* scratch) {
  v = warp_max(v);
  if constexpr (THREADS > 32) {
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    v = -INFINITY;
#pragma unroll
    for (int w = 0; w < THREADS / 32; ++w) v = fmaxf(v, scratch[w]);
    __syncthreads();
  }
  return v;
}

template <int THREADS>
__device__ __forceinline__ void group_sync() {
  if constexpr (THREADS > 32) {
    __syncthreads();
  } else {
    __syncwarp();
  }
}

}  // namespace routing
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
