// Every entry of an index tensor in its range: lo + r*shift <= v < hi + r*shift for an entry of row r (shift 0 for
// one range; a group's size for subsample rows, whose row g lists ids of group g). Rows past the row bound (the
// valid grouped rows) are not checked.
#include "cuda/common/value_check_device.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace validation {

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) check_index_range_kernel(DeviceCheck c, unsigned long long* record) {
  const int64_t width = row_width(c.tensor);
  const int64_t count = covered_rows(c, c.tensor.shape[0]) * width;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t v = load_int(c.tensor, i);
    const int64_t base = (i / width) * c.shift;
    if (v < c.lo + base)
      record_failure(record, c.id, i, kFaultBelowRange);
    else if (v >= c.hi + base)
      record_failure(record, c.id, i, kFaultAboveRange);
  }
}

}  // namespace

cudaError_t launch_check_index_range(const DeviceCheck& check, unsigned long long* record, cudaStream_t stream) {
  int64_t count = 1;
  for (int32_t i = 0; i < check.tensor.rank; ++i) count *= check.tensor.shape[i];
  check_index_range_kernel<<<check_blocks(count, kThreads), kThreads, 0, stream>>>(check, record);
  return cudaGetLastError();
}

}  // namespace validation
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
