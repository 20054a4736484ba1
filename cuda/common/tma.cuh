// Tensor Memory Accelerator copies (sm_90): one thread asks for a box of a tensor described by a CUtensorMap
// (built on the host, passed as a __grid_constant__ kernel parameter). Loads land in shared memory in the map's
// swizzle, elements outside the tensor are filled with zeros, and the bytes complete on an mbarrier; stores write
// the box's elements inside the tensor and complete in bulk async-groups.
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

// Stores shared `src` (in the map's swizzle) to the box at coordinates (x, y, z) of a rank-3 map; elements outside
// the tensor are not written. Completes in the issuing thread's bulk async-group (bulk_commit_group).
// NOTE: no evict-first L2 hint: with one (createpolicy evict_first), the grouped GEMM's stores ran 5-15% slower.
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, uint32_t src, int32_t x, int32_t y, int32_t z) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(src), "r"(x), "r"(y), "r"(z)
               : "memory");
}

// Adds shared `src` (fp32 in the map's swizzle) to the box at coordinates (x, y, z) of a rank-3 fp32 map, in L2:
// each element of C inside the tensor is read, added to once (C + src, rounded to nearest) and written back.
// Completes like tma_store_3d.
__device__ __forceinline__ void tma_reduce_add_3d(const CUtensorMap* map, uint32_t src, int32_t x, int32_t y,
                                                  int32_t z) {
  asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::
                   "l"(reinterpret_cast<uint64_t>(map)),
               "r"(src), "r"(x), "r"(y), "r"(z)
               : "memory");
}

// Closes the thread's bulk async-group of the stores issued since the last one.
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until at most `pending` of the thread's bulk async-groups still read their shared memory sources.
template <int pending>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(pending) : "memory");
}

// Waits until at most `pending` of the thread's bulk async-groups are incomplete (their writes done).
template <int pending>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(pending) : "memory");
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
