// Host-callable launchers of the router's auxiliary losses (docs/math.md section 1.1) and the layout of the workspace
// they share with the router kernels. Plain C++ (no CUDA language features): src/cuda_backend/routing_ops.cpp
// includes it from g++.
//
// Every sum has a fixed order (warp butterflies, loops in index order, integer counts), so the losses and the
// gradient are the same bits on every run:
//   forward  (aux_loss_forward.cu):  lse_t per row -> per-chunk column sums of p over 256-row chunks -> one block
//                                    adds the chunks in order and forms both losses;
//   gradient (aux_loss_gradient.cu): counts from the indices (integer atomics: exact) -> per row, the aux gradient
//                                    added to the router backward's fp32 dlogits, rounded once into dlogits.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace routing {

// Rows per chunk of the forward's column sums: the chunk count, not the device, fixes the order of the sums.
constexpr int64_t aux_chunk_rows = 256;

inline int64_t aux_chunks(int64_t tokens) { return (tokens + aux_chunk_rows - 1) / aux_chunk_rows; }

// Byte offsets, from the start of the router workspace, of the aux-loss sections behind the router's own `begin`
// bytes. One layout serves the forward (counts, lse, column sums) and the backward (counts, dlogits).
struct AuxLossLayout {
  size_t counts;       // [E] int32
  size_t lse;          // [max_tokens] fp32
  size_t column_sums;  // [aux_chunks(max_tokens)][E] fp64
  size_t dlogits;      // [max_tokens][E] fp32: the router backward's gradient before the aux part is added
  size_t end;
};

inline AuxLossLayout aux_loss_layout(size_t begin, int64_t max_tokens, int64_t experts) {
  auto align = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  const size_t T = static_cast<size_t>(max_tokens), E = static_cast<size_t>(experts);
  AuxLossLayout l{};
  l.counts = align(begin);
  l.lse = align(l.counts + E * sizeof(int32_t));
  l.column_sums = align(l.lse + T * sizeof(float));
  l.dlogits = align(l.column_sums + static_cast<size_t>(aux_chunks(max_tokens)) * E * sizeof(double));
  l.end = l.dlogits + T * E * sizeof(float);
  return l;
}

struct AuxLossProblem {
  int64_t tokens;   // T >= 0
  int64_t experts;  // E
  int64_t top_k;    // K
  double load_balance_coeff;  // 0 = off
  double z_loss_coeff;        // 0 = off
};

struct AuxLossForwardArgs {
  const void* logits;  // [T, E] bf16, fp16 or fp32 (logits_dtype), row stride logits_stride
  int64_t logits_stride;
  int32_t logits_dtype;       // moekit_dtype_t
  const int32_t* counts;      // [E] the router forward's counts (written earlier on the stream)
  float* load_balance_loss;   // [1] or nullptr
  float* z_loss;              // [1] or nullptr
  float* lse;                 // workspace [T]
  double* column_sums;        // workspace [aux_chunks(T)][E]
};

struct AuxLossGradientArgs {
  const void* logits;  // [T, E] logits_dtype
  int64_t logits_stride;
  int32_t logits_dtype;
  const void* indices;  // [T, K] int32 or int64
  int64_t indices_stride;
  bool indices_int64;
  const float* d_load_balance;  // [1] upstream gradient, or nullptr for 1
  const float* d_z;             // [1] upstream gradient, or nullptr for 1
  int32_t* counts;              // workspace [E]
  const float* base;            // [T, E] fp32, row stride base_stride: the router backward's gradient
  int64_t base_stride;
  void* dlogits;                // [T, E] fp32 or logits_dtype (dlogits_dtype), row stride dlogits_stride
  int64_t dlogits_stride;
  int32_t dlogits_dtype;
  bool add_old;                 // dlogits += (base + aux); else dlogits = base + aux (base may alias dlogits)
};

// Both losses into their outputs (0 for T = 0). Enqueued on `stream`.
void aux_loss_forward(const AuxLossProblem& problem, const AuxLossForwardArgs& args, cudaStream_t stream);
// dlogits = [old +] base + the aux gradient, for every row. Enqueued on `stream`; nothing for T = 0.
void aux_loss_gradient(const AuxLossProblem& problem, const AuxLossGradientArgs& args, cudaStream_t stream);

}  // namespace routing
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
