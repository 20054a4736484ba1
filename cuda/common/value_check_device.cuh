// Device helpers of the value checks (cuda/validation/): the address of a view's element from its row-major
// position, loads of any index or float dtype, the bound of the checked rows, and recording a failure.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/value_check_code.h"
#include "cuda/validation/value_checks.h"
#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace validation {

// Elements from data to the element at row-major `position` of v.
__device__ __forceinline__ int64_t element_offset(const CheckView& v, int64_t position) {
  int64_t offset = 0;
  for (int32_t i = v.rank - 1; i >= 0; --i) {
    const int64_t extent = v.shape[i] > 0 ? v.shape[i] : 1;
    offset += (i == 0 ? position : position % extent) * v.stride[i];
    position /= extent;
  }
  return offset;
}

__device__ __forceinline__ int64_t load_int(const CheckView& v, int64_t position) {
  const int64_t at = element_offset(v, position);
  return v.dtype == MOEKIT_DTYPE_INT64 ? static_cast<const int64_t*>(v.data)[at]
                                       : static_cast<int64_t>(static_cast<const int32_t*>(v.data)[at]);
}

__device__ __forceinline__ float load_float(const CheckView& v, int64_t position) {
  const int64_t at = element_offset(v, position);
  switch (v.dtype) {
    case MOEKIT_DTYPE_BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(v.data)[at]);
    case MOEKIT_DTYPE_FP16: return __half2float(static_cast<const __half*>(v.data)[at]);
    default: return static_cast<const float*>(v.data)[at];
  }
}

// The elements of one row: the product of the dimensions after the first.
__device__ __forceinline__ int64_t row_width(const CheckView& v) {
  int64_t width = 1;
  for (int32_t i = 1; i < v.rank; ++i) width *= v.shape[i];
  return width;
}

// How many of `extent` rows (or via entries) a check covers.
__device__ __forceinline__ int64_t covered_rows(const DeviceCheck& c, int64_t extent) {
  if (c.rows_bound == nullptr) return extent;
  return min(max(static_cast<int64_t>(*c.rows_bound), int64_t{0}), extent);
}

__device__ __forceinline__ void record_failure(unsigned long long* record, uint32_t check, int64_t position,
                                               uint32_t fault) {
  atomicMin(record, static_cast<unsigned long long>(value_failure_code(check, static_cast<uint64_t>(position), fault)));
}

// Threads of the grid-stride loops: enough blocks to cover `count` elements, at most a few per SM's worth.
inline unsigned check_blocks(int64_t count, int threads) {
  const int64_t blocks = (count + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 4096 ? 4096 : blocks));
}

}  // namespace validation
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
