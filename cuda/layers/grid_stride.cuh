// The launch shape of the layers' small elementwise kernels: 256-thread blocks walking `count` items with a
// grid-stride loop and 64-bit indices (a layer's tensors can pass 2^31 elements); at most 4096 blocks, enough to
// fill any Hopper part several times over while a tail of tiny launches stays cheap.
#pragma once

#include <cstdint>

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace layers {

constexpr int kThreads = 256;

inline unsigned blocks_for(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks > 4096 ? 4096 : blocks);
}

__device__ __forceinline__ int64_t first_item() { return blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; }
__device__ __forceinline__ int64_t item_step() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

}  // namespace layers
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
