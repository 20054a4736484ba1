// Programmatic dependent launch (sm_90): a kernel launched with the attribute
// cudaLaunchAttributeProgrammaticStreamSerialization may start while the previous kernel of its stream still
// runs; it must call wait_for_previous_grid() before it reads anything that kernel writes (the wait returns once
// the previous grid has completed and its writes are visible). The previous kernel lets it start early by calling
// allow_next_grid(). Both are no-ops for a kernel launched without the attribute.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "cuda/common/cuda_check.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

__device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

__device__ __forceinline__ void allow_next_grid() { asm volatile("griddepcontrol.launch_dependents;" :::); }

// Launches `kernel` as a programmatic dependent of the previous kernel on `stream` (it calls
// wait_for_previous_grid() before reading anything an earlier kernel writes); `name` names the launch in errors.
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), unsigned blocks, int threads, size_t shared_bytes,
                      cudaStream_t stream, const char* name, Args... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  check_cuda(cudaLaunchKernelEx(&config, kernel, args...), name);
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
