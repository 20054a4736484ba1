// The expert half of a routed layer on the CUDA backend (docs/math.md sections 3 and 4 without the router): the MoE
// layer runs it on its router's choices, the experts on token-major rows on the caller's local ids and weights. The
// same steps on the same routing give both layers the same bits.
//
// Forward: dispatch of the [T, K] ids -> up GEMM (x rows gathered, gated epilogue: h, a) -> down GEMM (+ b2: y)
// -> combine of the weighted y into out. Backward, on the forward's saved dispatch and h: dgated GEMM (dout rows
// gathered @ W2: dh, a' = s a, ds = dA . a) -> db2 and ds += dout . b2 -> dW2 = dout^T a' -> input gradient:
// dxe = dh W1 (over a'; by column chunks of dx where it must fit in dW1), dx = beta dx + sum of dxe -> dW1 = dh^T x
// (over a' and dxe where they lie in dW1), db1.
// One stream, the caller's memory only, no host synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "moekit/moekit.h"
#include "src/backend.h"
#include "src/cuda_backend/cuda_backend.h"
#include "src/cuda_backend/layer_chain.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

// The building blocks, from a layer's moe descriptor: ids over [expert_begin, expert_begin + experts), P =
// max_tokens * top_k grouped rows.
struct RoutedPlans {
  moekit_plan dispatch, combine;
  ExpertMlpPlans mlp;  // dxe: of dx_combine's width
  // The backward's dxe GEMM and dx combine run once per chunk of dx's columns, of this plan's width (all of H
  // unless a' and dxe must fit in dW1).
  moekit_plan dx_combine;

  // The plans a forward, or a backward, runs (the backward reads the forward's dispatch).
  std::vector<std::pair<const char*, moekit_plan*>> used(bool backward);
};

RoutedPlans routed_plans(const moekit_plan& layer);

// The grouped buffers of P pairs. Saved (the workspace in inference mode): the dispatch's CSR, which the backward
// reads instead of dispatching again, and h. The forward's scratch: a and y; the backward's: ds, dh, and a' with
// dxe in one section, a workspace section or the caller's dW1 (scratch_in_dw1).
struct RoutedBuffers {
  Routing routing;
  void* h;
  void *a, *y;
  float* ds;  // [T, K]: 0 for a dropped pair
  void* dh;
  void* a_dxe;          // a' [P, I], then dxe [P, H]; unset when scratch_in_dw1
  bool scratch_in_dw1;  // a' and dxe in the caller's dW1, which the dW1 GEMM writes last (beta 0)
};

void take_routed_saved(Carve& kept, const moekit_moe_desc_t& d, RoutedBuffers& b);
void take_routed_scratch(Carve& ws, const moekit_moe_desc_t& d, bool backward, RoutedBuffers& b);

// One call: its plans and buffers, the routing views of its T = ids.shape[0] tokens, the scratch and the stream.
struct RoutedCall {
  CudaBackend& backend;
  const moekit_moe_desc_t& desc;
  const RoutedPlans& plans;
  const RoutedBuffers& buffers;
  moekit_dispatch_args_t routing;
  Workspace scratch;
  cudaStream_t stream;
  int device;
};

// `ids`: [T, K] int32/int64, rows apart as the dispatch allows.
RoutedCall routed_call(CudaBackend& backend, const moekit_plan& layer, const RoutedPlans& plans,
                       const RoutedBuffers& buffers, const moekit_tensor_t& ids, Workspace scratch,
                       cudaStream_t stream, int device);

struct RoutedForward {
  moekit_tensor_t x;        // [T, H]
  moekit_tensor_t weights;  // [T, K] fp32, rows apart as the combine allows; a dropped pair's is never read
  moekit_tensor_t w1, b1, w2, b2;
  moekit_tensor_t out;      // [T, H]
  double beta_out;
};

void routed_forward(const RoutedCall& call, const RoutedForward& f);

struct RoutedBackward {
  moekit_tensor_t x, dout, w1, w2, b2;
  moekit_tensor_t weights;  // [T, K] fp32, contiguous: the dgated epilogue reads it flat
  bool input_grad, weight_grad;
  moekit_tensor_t dx, dw1, db1, dw2, db2;
  double beta_dx, beta_dw1, beta_db1, beta_dw2, beta_db2;
};

// The tensors both layers' backward arguments name alike.
template <class Args>
RoutedBackward routed_backward_args(const Args& a, const moekit_tensor_t& weights) {
  RoutedBackward g{};
  g.x = a.x;
  g.dout = a.dout;
  g.w1 = a.w1;
  g.w2 = a.w2;
  g.b2 = a.b2;
  g.weights = weights;
  g.input_grad = a.compute_input_grad != 0;
  g.weight_grad = a.compute_weight_grad != 0;
  g.dx = a.dx;
  g.dw1 = a.dw1;
  g.db1 = a.db1;
  g.dw2 = a.dw2;
  g.db2 = a.db2;
  g.beta_dx = a.beta_dx;
  g.beta_dw1 = a.beta_dw1;
  g.beta_db1 = a.beta_db1;
  g.beta_dw2 = a.beta_dw2;
  g.beta_db2 = a.beta_db2;
  return g;
}

// Leaves ds in call.buffers.ds, for the router's backward or the caller's d(weights).
void routed_backward(const RoutedCall& call, const RoutedBackward& g);

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
