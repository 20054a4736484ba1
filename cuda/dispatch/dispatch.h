// Host launcher of the CUDA dispatch metadata (docs/math.md section 2): the deterministic CSR of the valid pairs.
// Plain C++ (no moekit_tensor_t): src/cuda_backend/dispatch_ops.cpp reads the tensor views and fills a DispatchProblem.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/dispatch/dispatch_layout.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

struct DispatchProblem {
  // Fixed routing (top_k >= 1): [T, K] global expert ids, rows `indices_row_stride` elements apart.
  // General routing (top_k = 0): [P] ids of the pairs sorted by token (only the first tok_offsets[T] are pairs).
  const void* indices;
  bool indices_int64;
  int64_t indices_row_stride;
  int64_t tokens;              // T
  int64_t top_k;               // K, or 0 for general routing
  const int32_t* tok_offsets;  // [T+1], general routing only; tok_offsets[T] is read on the device
  int64_t pair_slots;          // P: rows of gather_idx, pair_idx, grouped_pos (T*K, or the general call's P)
  int64_t experts;             // E local experts
  int64_t expert_begin;        // e0: global id of local expert 0
  int32_t* expert_offsets;     // out [E+1]
  int32_t* gather_idx;         // out [P]: rows < Pv written, the rest untouched
  int32_t* pair_idx;           // out [P]: rows < Pv written, the rest untouched
  int32_t* grouped_pos;        // out [P]: every row written (-1 for a dropped pair or a slot past tok_offsets[T])
};

// Enqueues the three kernels (count per chunk, prefix over chunks, ranked scatter) on `stream`; no host
// synchronisation. `workspace` holds layout.workspace_bytes (layout from dispatch_layout(E, P bound)).
void launch_dispatch(const DispatchProblem& problem, const DispatchLayout& layout, void* workspace,
                     cudaStream_t stream);

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
