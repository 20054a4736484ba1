// No NaN (and no +-inf; -inf allowed by the masked rule) in the checked rows of a float tensor: rows below the row
// bound, or the rows a `via` index lists. One thread per element, grid-stride; a failing element records its
// row-major position, so the smallest position of the tensor is reported.
#include "cuda/common/value_check_device.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace validation {

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) check_finite_kernel(DeviceCheck c, unsigned long long* record) {
  const int64_t rows = c.tensor.shape[0];
  const int64_t width = row_width(c.tensor);
  const bool via = c.via.data != nullptr;
  const int64_t count = covered_rows(c, via ? c.via.shape[0] : rows) * width;
  const bool masked = c.rule == kRuleFiniteOrMasked;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t row = via ? load_int(c.via, i / width) : i / width;
    if (row < 0 || row >= rows) continue;  // via's own range check reports it
    const int64_t position = row * width + i % width;
    const float v = load_float(c.tensor, position);
    if (isnan(v))
      record_failure(record, c.id, position, kFaultNaN);
    else if (isinf(v) && v > 0)
      record_failure(record, c.id, position, kFaultPositiveInf);
    else if (isinf(v) && !masked)
      record_failure(record, c.id, position, kFaultNegativeInf);
  }
}

}  // namespace

cudaError_t launch_check_finite(const DeviceCheck& check, unsigned long long* record, cudaStream_t stream) {
  int64_t width = 1;
  for (int32_t i = 1; i < check.tensor.rank; ++i) width *= check.tensor.shape[i];
  const int64_t rows = check.via.data != nullptr ? check.via.shape[0] : check.tensor.shape[0];
  check_finite_kernel<<<check_blocks(rows * width, kThreads), kThreads, 0, stream>>>(check, record);
  return cudaGetLastError();
}

}  // namespace validation
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
