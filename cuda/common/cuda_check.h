// Turning CUDA runtime failures into moekit errors (MOEKIT_STATUS_EXECUTION_FAILED with the CUDA message).
// Host code only; every launch is followed by check_launch so a bad configuration is reported by the call that
// made it, not by a later one.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cuda/common/status_error.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw Error(MOEKIT_STATUS_EXECUTION_FAILED, std::string(what) + ": " + cudaGetErrorString(status));
}

inline void check_launch(const char* kernel) { check_cuda(cudaGetLastError(), kernel); }

inline cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
