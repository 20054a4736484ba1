// The element strides the CUDA backend hands its kernels, read from validated tensor views. capi lets a dimension of
// extent 1 carry any stride; its rows are never stepped over, so the dense stride stands in and every kernel sees a
// stride that also satisfies its alignment rules.
#pragma once

#include <cstdint>

#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

// Elements between index i and i + 1 of dimension `dim`.
inline int64_t stride_of(const moekit_tensor_t& t, int dim) {
  if (t.shape[dim] > 1) return t.stride[dim];
  int64_t dense = 1;
  for (int d = dim + 1; d < t.rank; ++d) dense *= t.shape[d];
  return dense;
}

// Elements between the rows of a view (its first dimension).
inline int64_t row_stride(const moekit_tensor_t& t) { return stride_of(t, 0); }

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
