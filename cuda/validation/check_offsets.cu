// An offsets tensor [n] as every grouped operation reads it: entry 0 is 0, no entry below the one before, and the
// last entry (the rows or pairs it claims) at most `hi`, the rows of the tensors it indexes.
#include "cuda/common/value_check_device.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace validation {

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) check_offsets_kernel(DeviceCheck c, unsigned long long* record) {
  const int64_t n = c.tensor.shape[0];
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t v = load_int(c.tensor, i);
    if (i == 0 && v != 0) record_failure(record, c.id, 0, kFaultFirstNotZero);
    if (i > 0 && v < load_int(c.tensor, i - 1)) record_failure(record, c.id, i, kFaultDecreasing);
    if (i == n - 1 && v > c.hi) record_failure(record, c.id, i, kFaultPastBound);
  }
}

}  // namespace

cudaError_t launch_check_offsets(const DeviceCheck& check, unsigned long long* record, cudaStream_t stream) {
  check_offsets_kernel<<<check_blocks(check.tensor.shape[0], kThreads), kThreads, 0, stream>>>(check, record);
  return cudaGetLastError();
}

}  // namespace validation
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
