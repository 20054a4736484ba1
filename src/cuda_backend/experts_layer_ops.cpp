// The experts alone on pre-grouped rows (moekit_experts_*) on the CUDA backend: the MoE layer's expert MLP with no
// router, no combine, every score 1. Forward: up GEMM (gated epilogue: h, a) -> down GEMM (+ b2) into y. Saved:
// h. Backward: dgated GEMM (dy @ W2 with scores of 1 and the identity pair order: dh, a' = a) -> dx = dh W1
// (beta_dx folded into the GEMM) and dW2 = dy^T a', dW1 = dh^T x (over a' where that lies in dW1), db1 = the sum
// of dh, db2 = the sum of dy.
// The same rules as moe_layer_ops.cpp: one stream, the caller's memory only, no host synchronisation; the saved
// header is written, not checked.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>

#include "cuda/common/cuda_check.h"
#include "src/cuda_backend/cuda_backend.h"
#include "src/cuda_backend/layer_chain.h"
#include "cuda/layers/layer_kernels.h"
#include "cuda/common/status_error.h"
#include "cuda/layers/saved_header.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

namespace {

ExpertMlpPlans experts_plans(const moekit_plan& layer) {
  return expert_mlp_plans(layer, GroupedRows{layer.moe.max_tokens, layer.moe.max_tokens}, false);
}

struct ExpertsBuffers {
  void* scratch;
  size_t scratch_bytes;
  void* h;        // saved (workspace in inference mode)
  void* a;        // forward: a; backward: a' (= a, every score being 1), unset when a_in_dw1
  bool a_in_dw1;  // backward: a' in the caller's dW1, which the dW1 GEMM writes last (beta 0)
  float *ones, *ds;
  int32_t* iota;
  void* dh;
  size_t workspace_end, saved_end;
};

ExpertsBuffers experts_buffers(const moekit_plan& layer, void* workspace, void* saved,
                               bool backward) {
  const moekit_moe_desc_t& d = layer.moe;
  const int64_t P = d.max_tokens, hw = h_width(d);
  const size_t es = storage_bytes(d.dtype);
  ExpertsBuffers b{};
  b.scratch_bytes = 0;
  for (const auto& [name, sub] : layer.sub_plans->list())
    b.scratch_bytes = std::max(b.scratch_bytes, sub->workspace_bytes);
  Carve ws(workspace);
  b.scratch = ws.take(b.scratch_bytes);
  Carve sv(saved, kSavedHeaderBytes);
  b.h = (d.inference ? ws : sv).take(static_cast<size_t>(P * hw) * es);
  b.saved_end = d.inference ? 0 : sv.end();
  const size_t a_bytes = static_cast<size_t>(P * d.intermediate) * es;
  b.a_in_dw1 = backward && scratch_fits_dw1(d, a_bytes);
  if (!b.a_in_dw1) b.a = ws.take(a_bytes);
  if (backward) {
    b.ones = ws.take<float>(P);
    b.ds = ws.take<float>(P);
    b.iota = ws.take<int32_t>(P);
    b.dh = take_dh(ws, b.h, d, static_cast<size_t>(P * hw) * es);
  }
  b.workspace_end = ws.end();
  return b;
}

}  // namespace

void CudaBackend::experts_layer_sizes(moekit_plan& plan) const {
  const moekit_moe_desc_t& d = plan.moe;
  if (d.dtype != MOEKIT_DTYPE_BF16 && d.dtype != MOEKIT_DTYPE_FP16)
    throw_not_supported("dtype: the CUDA experts layer takes bf16 or fp16 storage");
  plan.sub_plans = std::make_shared<const LayerPlans<ExpertMlpPlans>>(*this, experts_plans(plan), !d.inference);
  set_layer_sizes(plan, d.inference,
                  [&](bool backward) { return experts_buffers(plan, nullptr, nullptr, backward); });
}

void CudaBackend::experts_forward(const moekit_plan& plan, const moekit_experts_fwd_args_t& args, void* saved,
                                  Workspace ws, void* stream_ptr) {
  const moekit_moe_desc_t& d = plan.moe;
  const cudaStream_t stream = as_stream(stream_ptr);
  const ExpertMlpPlans& p = layer_parts<ExpertMlpPlans>(plan);
  const ExpertsBuffers b = experts_buffers(plan, ws.data, saved, false);
  const Workspace scratch{b.scratch, b.scratch_bytes};
  const int64_t P = args.x.shape[0];
  const int dev = device_index_;

  moekit_gemm_args_t up = gemm_args(args.x, args.w1, args.offsets, device_view(b.h, d.dtype, {P, p.up.gemm.n}, dev));
  up.bias = args.b1;
  up.act = device_view(b.a, d.dtype, {P, d.intermediate}, dev);
  gemm(p.up, up, scratch, stream);

  moekit_gemm_args_t down = gemm_args(up.act, args.w2, args.offsets, args.y);
  down.bias = args.b2;
  gemm(p.down, down, scratch, stream);

  if (!d.inference) layers::write_saved_header(saved, SavedHeader{kSavedMagic, plan.id, P, 0}, stream);
}

void CudaBackend::experts_backward(const moekit_plan& plan, const moekit_experts_bwd_args_t& args, const void* saved,
                                   Workspace ws, void* stream_ptr) {
  const moekit_moe_desc_t& d = plan.moe;
  const bool input_grad = args.compute_input_grad != 0, weight_grad = args.compute_weight_grad != 0;
  if (!input_grad && !weight_grad) return;
  const cudaStream_t stream = as_stream(stream_ptr);
  const ExpertMlpPlans& p = layer_parts<ExpertMlpPlans>(plan);
  // NOTE: the backward only reads the saved h unless the plan lets dh overwrite it (take_dh); the const_cast lets
  // one carving serve both directions.
  const ExpertsBuffers b = experts_buffers(plan, ws.data, const_cast<void*>(saved), true);
  const Workspace scratch{b.scratch, b.scratch_bytes};
  const int64_t P = args.x.shape[0], hw = p.up.gemm.n;
  const int dev = device_index_;

  layers::fill_ones_and_iota(b.ones, b.iota, P, stream);
  moekit_gemm_args_t dg = gemm_args(args.dy, args.w2, args.offsets, device_view(b.dh, d.dtype, {P, hw}, dev));
  dg.h = device_view(b.h, d.dtype, {P, hw}, dev);
  dg.act = device_view(b.a_in_dw1 ? args.dw1.data : b.a, d.dtype, {P, d.intermediate}, dev);
  dg.row_scale = device_view(b.ones, MOEKIT_DTYPE_FP32, {P}, dev);
  dg.pair_idx = device_view(b.iota, MOEKIT_DTYPE_INT32, {P}, dev);
  dg.dscores = device_view(b.ds, MOEKIT_DTYPE_FP32, {P}, dev);
  gemm(p.dgated, dg, scratch, stream);

  if (input_grad) gemm(p.dxe, gemm_args(dg.c, args.w1, args.offsets, args.dx, args.beta_dx), scratch, stream);
  if (weight_grad) {
    gemm(p.dw2, gemm_args(args.dy, dg.act, args.offsets, args.dw2, args.beta_dw2), scratch, stream);
    gemm(p.dw1, gemm_args(dg.c, args.x, args.offsets, args.dw1, args.beta_dw1), scratch, stream);
    if (d.has_b1) db1(p.db1, row_sum_args(dg.c, args.offsets, args.db1, args.beta_db1), scratch, stream);
    // db2 = the sum of each expert's dy rows (every score is 1): the db1 reduction over H columns.
    if (d.has_b2) db1(p.db2, row_sum_args(args.dy, args.offsets, args.db2, args.beta_db2), scratch, stream);
  }
  spend_saved(saved, plan, P, stream);
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
