// Host-callable launchers of the router kernels (docs/math.md section 1) and the pure function that picks their shape.
// Plain C++ (no CUDA language features): src/cuda_backend/routing_ops.cpp includes it from g++.
//
// Both kernels give each token row to a "row group" of threads: one warp for E <= 1024, a whole block of 256 or
// 512 threads for larger E. The forward's blocks loop over rows (a grid of at most 2048 threads per SM) and count
// their selected experts in shared memory; the per-block counts go to the workspace and a second kernel sums them.
// NOTE: global atomics on the E counters serialise in the few L2 slices that hold them: on an H200 at T=32768,
// E=256, K=8 the forward took 96 us with them, 46 us with this scheme (44 us without counts); 27 us (24.6 us
// without counts) since bf16/fp16 rows select with packed words (packed_selection.cuh). Every thread of the
// group holds `items` logits of the row in registers, so a row is read from global memory once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace routing {

// The largest E the kernels hold in registers (512 threads x 16 items); plan creation rejects more.
constexpr int64_t max_router_experts = 8192;

struct RowGroupShape {
  int threads;  // threads per token row: 32 (a warp), 256 or 512 (a block)
  int items;    // logits per thread: a power of two, threads * items >= E
};

// The smallest shape that holds E logits (1 <= E <= max_router_experts). A pure function, so the launchers and a
// test on the CPU agree on it.
inline RowGroupShape row_group_shape(int64_t experts) {
  // NOTE: 512 threads past 4096 experts keep the kernels at 16 logits per thread (32 spilled registers).
  const int threads = experts <= 1024 ? 32 : experts <= 4096 ? 256 : 512;
  int items = 1;
  while (static_cast<int64_t>(threads) * items < experts) items *= 2;
  return RowGroupShape{threads, items};
}

// Row groups per block of the forward: warps fill a 1024-thread block; a block-sized group is alone.
inline int forward_rows_per_block(int64_t experts) { return row_group_shape(experts).threads == 32 ? 32 : 1; }

// The forward's grid for T tokens on `sm_count` SMs: enough blocks to fill every SM (2048 threads each), never
// more than there are row iterations; at least 1 (so the counts are written even for T = 0).
inline int64_t router_forward_blocks(int64_t tokens, int64_t experts, int sm_count) {
  const int rows = forward_rows_per_block(experts);
  const int64_t per_sm = 2048 / (static_cast<int64_t>(row_group_shape(experts).threads) * rows);
  const int64_t needed = (tokens + rows - 1) / rows;
  const int64_t resident = static_cast<int64_t>(sm_count) * per_sm;
  return needed < 1 ? 1 : needed < resident ? needed : resident;
}

// Workspace of a router plan: the forward's per-block counts, [blocks][E] int32, for up to max_tokens tokens.
// The same function sizes it (plan creation) and bounds the grid that writes it (each launch).
inline size_t router_workspace_bytes(int64_t max_tokens, int64_t experts, int sm_count) {
  return static_cast<size_t>(router_forward_blocks(max_tokens, experts, sm_count)) * static_cast<size_t>(experts) *
         sizeof(int32_t);
}

struct RouterProblem {
  int64_t tokens;   // T >= 0
  int64_t experts;  // E
  int64_t top_k;    // 1 <= K <= min(E, 32)
  moekit_router_kind_t kind;
  bool renormalize;
  float scale;   // SIGMOID kind
  int sm_count;  // the device's multiprocessors (the forward's grid bound)
};

struct RouterForwardArgs {
  const void* logits;     // [T, E] bf16, fp16 or fp32 (the launcher's dtype), row stride logits_stride
  int64_t logits_stride;  // elements
  const float* bias;      // [E] or nullptr (SIGMOID kind)
  float* scores;          // [T, K], row stride scores_stride
  int64_t scores_stride;
  void* indices;          // [T, K] int32 or int64, row stride indices_stride
  int64_t indices_stride;
  bool indices_int64;
  int32_t* counts;  // [E] or nullptr; overwritten
  void* workspace;  // router_workspace_bytes(max_tokens, E, SMs) bytes, or more
  size_t workspace_bytes;
};

struct RouterBackwardArgs {
  const void* logits;  // [T, E] the launcher's dtype
  int64_t logits_stride;
  const void* indices;  // [T, K] int32 or int64
  int64_t indices_stride;
  bool indices_int64;
  const float* dscores;  // [T, K]
  int64_t dscores_stride;
  void* dlogits;  // [T, E] fp32 or the logits dtype
  int64_t dlogits_stride;
  bool dlogits_fp32;
  bool accumulate;  // dlogits += gradient (else the old values are never read)
};

// counts [E] = the sum of the forward's per-block counts partials [blocks][E] (router_counts.cu).
void router_counts(const int32_t* partials, int64_t blocks, int64_t experts, int32_t* counts, cudaStream_t stream);

// One launcher per logits dtype; each enqueues its work on `stream` and returns without synchronising.
void router_forward_bf16(const RouterProblem& problem, const RouterForwardArgs& args, cudaStream_t stream);
void router_forward_fp16(const RouterProblem& problem, const RouterForwardArgs& args, cudaStream_t stream);
void router_forward_fp32(const RouterProblem& problem, const RouterForwardArgs& args, cudaStream_t stream);
void router_backward_bf16(const RouterProblem& problem, const RouterBackwardArgs& args, cudaStream_t stream);
void router_backward_fp16(const RouterProblem& problem, const RouterBackwardArgs& args, cudaStream_t stream);
void router_backward_fp32(const RouterProblem& problem, const RouterBackwardArgs& args, cudaStream_t stream);

}  // namespace routing
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
