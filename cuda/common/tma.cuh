// Tensor Memory Accelerator loads (sm_90): one thread asks for a box of a tensor described by a CUtensorMap
// (built on the host, passed as a __grid_constant__ kernel parameter); the box lands in shared memory in the
// map's swizzle, elements outside the tensor are filled with zeros, and the bytes complete on an mbarrier.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace moekit {
inline namespace v0 {
namespace cuda {

// Pulls the descriptor into the cache before the first load uses it.
__device__ __forceinline__ void tma_prefetch_descriptor(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Loads the box at coordinates (x, y, z) (x innermost, in elements) of a rank-3 map to shared `dst`, completing
// its bytes on the mbarrier at shared `bar`.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int32_t x, int32_t y,
                                            int32_t z) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(z), "r"(bar)
      : "memory");
}

// tma_load_3d into shared `dst` of every CTA of the cluster in `cta_mask` (bit r: rank r), completing the bytes on
// the mbarrier at shared `bar` of each of them (the same offsets in every CTA).
__device__ __forceinline__ void tma_load_3d_multicast(uint32_t dst, const CUtensorMap* map, uint32_t bar, int32_t x,
                                                      int32_t y, int32_t z, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(z), "r"(bar), "h"(cta_mask)
      : "memory");
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
