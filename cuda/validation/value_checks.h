// The device side of MOEKIT_HANDLE_VALIDATE: one small kernel per rule of src/value_checks.h, each writing the
// smallest failure code it finds (cuda/common/value_check_code.h) into a one-word record with atomicMin. The host
// resets the record, enqueues a call's checks, and reads it back once (src/cuda_backend/validation_ops.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace validation {

// A tensor view as the check kernels read it: any rank 1..4, strides in elements.
struct CheckView {
  const void* data;  // NULL: absent
  int32_t dtype;     // moekit_dtype_t: bf16, fp16, fp32 (floats); int32, int64 (indices)
  int32_t rank;
  int64_t shape[4];
  int64_t stride[4];
};

struct DeviceCheck {
  CheckView tensor;
  uint32_t id;  // the check's number in the call: the high bits of its failure codes
  int32_t rule; // kRule* of value_check_code.h
  int64_t lo, hi, shift;
  // Rows of dim 0 (or entries of `via`) checked: those below clamp(*rows_bound, 0, extent); all when NULL.
  const int32_t* rows_bound;
  CheckView via;  // rank 1 int32/int64: the rows of `tensor` checked (finite rules only); data NULL = none
};

// Each enqueues one kernel on `stream` and returns the launch status.
cudaError_t launch_check_finite(const DeviceCheck& check, unsigned long long* record, cudaStream_t stream);
cudaError_t launch_check_index_range(const DeviceCheck& check, unsigned long long* record, cudaStream_t stream);
cudaError_t launch_check_offsets(const DeviceCheck& check, unsigned long long* record, cudaStream_t stream);

}  // namespace validation
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
