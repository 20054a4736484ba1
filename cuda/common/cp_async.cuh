// Asynchronous global-to-shared copies (cp.async, sm_80+): 16-byte copies that land in shared memory without
// passing through registers, grouped with commit and waited on by group count. A copy whose source is out of
// bounds writes 16 zero bytes instead and reads nothing, which is how tiles are masked at expert and matrix edges.
#pragma once

#include <cstdint>

namespace moekit {
inline namespace v0 {
namespace cuda {

// The 32-bit shared-memory address the PTX shared-state-space instructions take.
__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// Copies 16 bytes from global `src` to shared `dst` (both 16-byte aligned), bypassing L1; when !valid, writes 16
// zero bytes to dst and reads nothing from src (which may then point anywhere, e.g. past the end of a tensor).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// Closes the group of copies issued since the last commit (an empty group is fine).
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most `pending` committed groups of this thread are still in flight.
template <int pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
