// Programmatic dependent launch (sm_90): a kernel launched with the attribute
// cudaLaunchAttributeProgrammaticStreamSerialization may start while the previous kernel of its stream still
// runs; it must call wait_for_previous_grid() before it reads anything that kernel writes (the wait returns once
// the previous grid has completed and its writes are visible). The previous kernel lets it start early by calling
// allow_next_grid(). Both are no-ops for a kernel launched without the attribute.
#pragma once

namespace moekit {
inline namespace v0 {
namespace cuda {

__device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

__device__ __forceinline__ void allow_next_grid() { asm volatile("griddepcontrol.launch_dependents;" :::); }

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
