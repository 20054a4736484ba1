// The softmax statistics of one logits row held by a warp, for the auxiliary losses' kernels: lane l reads elements
// l, l + 32, ...; the row's max and sum_e exp(x_e - max) come from xor butterflies, so every lane holds the same bits
// on every run. A -inf logit adds exp(-inf) = 0.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/storage.cuh"
#include "cuda/routing/row_group.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace routing {

struct RowSoftmax {
  float max;
  float sum;
  __device__ __forceinline__ float lse() const { return max + logf(sum); }
  __device__ __forceinline__ float probability(float x) const { return expf(x - max) / sum; }
};

template <class T>
__device__ __forceinline__ RowSoftmax warp_row_softmax(const T* x, int64_t experts, int lane) {  // x: [E]
  float m = -INFINITY;
  for (int64_t e = lane; e < experts; e += 32) m = fmaxf(m, to_float(x[e]));
  m = warp_max(m);
  float s = 0.0f;
  for (int64_t e = lane; e < experts; e += 32) s += expf(to_float(x[e]) - m);
  return RowSoftmax{m, warp_sum(s)};
}

}  // namespace routing
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
