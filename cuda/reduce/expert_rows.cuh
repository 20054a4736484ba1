// The rows of one expert as the bias reductions read them, and how many chunks they make (bias_sums.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace reduce {

struct RowRange {
  int64_t begin, end;
};

// Rows offsets[e] .. offsets[e+1], clamped to [0, rows] and to a non-negative length, so offsets that break their
// contract (non-decreasing, within the rows) can give wrong sums but never a read outside the tensors.
__device__ __forceinline__ RowRange expert_rows(const int32_t* offsets, int64_t e, int64_t rows) {
  const int64_t begin = min(max(static_cast<int64_t>(offsets[e]), int64_t{0}), rows);
  const int64_t end = min(max(static_cast<int64_t>(offsets[e + 1]), begin), rows);
  return RowRange{begin, end};
}

__device__ __forceinline__ int64_t chunk_count(RowRange range, int64_t chunk_rows) {
  return (range.end - range.begin + chunk_rows - 1) / chunk_rows;
}

}  // namespace reduce
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
