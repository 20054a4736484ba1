// Reading the pairs of a dispatch problem on the device: how many there are, the local expert of pair p (or -1
// when the pair is dropped), and its token. Shared by the count and scatter kernels so both see the same pairs.
#pragma once

#include <cstdint>

#include "cuda/common/storage.cuh"
#include "cuda/dispatch/dispatch.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

// Number of pairs: T*K for fixed routing; tok_offsets[T] for general routing, read here on the device.
// NOTE: the reference rejects a tok_offsets[T] outside [0, P]; the device cannot report it without a host sync,
// so it is clamped, which keeps every access in bounds.
__device__ __forceinline__ int32_t dispatch_pair_count(const DispatchProblem& pr) {
  if (pr.top_k > 0) return static_cast<int32_t>(pr.pair_slots);
  int64_t end = pr.tok_offsets[pr.tokens];
  return static_cast<int32_t>(end < 0 ? 0 : (end > pr.pair_slots ? pr.pair_slots : end));
}

// Local expert of pair p (< the pair count), or -1 when its id lies outside [e0, e0 + E).
__device__ __forceinline__ int32_t dispatch_local_expert(const DispatchProblem& pr, int32_t p) {
  int64_t offset = p;
  if (pr.top_k > 0) {
    uint32_t token = static_cast<uint32_t>(p) / static_cast<uint32_t>(pr.top_k);
    uint32_t k = static_cast<uint32_t>(p) - token * static_cast<uint32_t>(pr.top_k);
    offset = static_cast<int64_t>(token) * pr.indices_row_stride + k;
  }
  int64_t id = load_index(pr.indices, offset, pr.indices_int64);
  // NOTE: unsigned, so ids far below e0 (e.g. INT64_MIN) wrap past E instead of overflowing.
  uint64_t local = static_cast<uint64_t>(id) - static_cast<uint64_t>(pr.expert_begin);
  return local < static_cast<uint64_t>(pr.experts) ? static_cast<int32_t>(local) : -1;
}

// Token of pair p (< the pair count): p / K, or the last t with tok_offsets[t] <= p (tokens with no pairs are
// skipped that way) found by binary search over tok_offsets [T+1].
__device__ __forceinline__ int32_t dispatch_pair_token(const DispatchProblem& pr, int32_t p) {
  if (pr.top_k > 0) return static_cast<int32_t>(static_cast<uint32_t>(p) / static_cast<uint32_t>(pr.top_k));
  int32_t lo = 0;
  int32_t hi = static_cast<int32_t>(pr.tokens);  // the answer lies in [lo, hi)
  while (hi - lo > 1) {
    int32_t mid = lo + (hi - lo) / 2;
    if (pr.tok_offsets[mid] <= p)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
