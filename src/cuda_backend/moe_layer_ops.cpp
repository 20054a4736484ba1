// The MoE layer (docs/math.md sections 3 and 4) on the CUDA backend: the building blocks chained on the caller's
// stream, every buffer carved from the caller's workspace and saved buffer, nothing allocated and nothing waited for,
// so a forward + backward can be captured in a CUDA graph and replayed with any routing (the per-expert counts live
// on the device only).
//
// Forward: logits = x Wr^T (cuBLASLt) -> router -> the routed experts (routed_experts.h: dispatch, up and down
// GEMMs, combine into out). Saved: the logits, scores, int32 indices, the dispatch and h.
// Backward: the routed experts' backward (dh, a', ds, db2, dx from the experts, dW2, dW1, db1) -> router backward
// (dlogits) -> dx += dlogits Wr, dWr = dlogits^T x.
//
// NOTE: the saved buffer is device memory; checking its header against the plan would need a host
// synchronisation, so the backward trusts it (the reference backend checks it). The forward still writes the
// header, so a buffer moves between backends' semantics unchanged.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda/common/cuda_check.h"
#include "src/cuda_backend/cuda_backend.h"
#include "cuda/dense/dense_gemm.h"
#include "src/cuda_backend/layer_chain.h"
#include "src/cuda_backend/routed_experts.h"
#include "cuda/layers/layer_kernels.h"
#include "cuda/common/status_error.h"
#include "cuda/layers/saved_header.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

namespace {

// Every building block of a layer call, as a plan of its own.
struct MoePlans {
  moekit_plan router;
  RoutedPlans routed;

  // The plans a forward, or a backward, runs (the backward's dispatch and combine are the forward's).
  std::vector<std::pair<const char*, moekit_plan*>> used(bool backward) {
    if (backward) return routed.used(true);
    std::vector<std::pair<const char*, moekit_plan*>> all{{"router", &router}};
    for (const auto& named : routed.used(false)) all.push_back(named);
    return all;
  }
};

MoePlans moe_plans(const moekit_plan& layer) {
  const moekit_moe_desc_t& d = layer.moe;
  MoePlans p;
  p.router = sub_plan(layer, OpKind::router);
  moekit_router_desc_init(&p.router.router);
  p.router.router.max_tokens = d.max_tokens;
  p.router.router.experts = d.router_experts;
  p.router.router.top_k = d.top_k;
  p.router.router.kind = d.router;
  p.router.router.renormalize = d.renormalize;
  p.router.router.scale = d.router_scale;
  p.router.router.dtype = d.dtype;
  p.router.router.load_balance_coeff = d.load_balance_coeff;
  p.router.router.z_loss_coeff = d.z_loss_coeff;
  p.routed = routed_plans(layer);
  return p;
}

// Buffers of a call, carved from the workspace (forward and backward share it: a plan reports the larger) and
// from the saved buffer. The scratch section is every building block's workspace in turn (they run one after
// another on the stream) and the dense GEMMs' cuBLASLt workspace.
struct MoeBuffers {
  void* scratch;
  size_t scratch_bytes;
  // Saved (workspace in inference mode): the router's outputs, then the routed experts' dispatch and h.
  void* logits;
  float* scores;
  int32_t* indices;
  RoutedBuffers routed;
  // Backward only.
  void* dlogits;
  size_t workspace_end, saved_end;
};

MoeBuffers moe_buffers(const moekit_plan& layer, void* workspace, void* saved, bool backward) {
  const moekit_moe_desc_t& d = layer.moe;
  const int64_t T = d.max_tokens, P = T * d.top_k;
  const size_t es = storage_bytes(d.dtype);
  MoeBuffers b{};
  b.scratch_bytes = kDenseGemmWorkspaceBytes;
  for (const auto& [name, sub] : layer.sub_plans->list())
    b.scratch_bytes = std::max(b.scratch_bytes, sub->workspace_bytes);

  Carve ws(workspace);
  b.scratch = ws.take(b.scratch_bytes);
  const bool saving = !d.inference;
  Carve sv(saved, kSavedHeaderBytes);
  Carve& kept = saving ? sv : ws;
  b.logits = kept.take(static_cast<size_t>(T * d.router_experts) * es);
  b.scores = kept.take<float>(P);
  b.indices = kept.take<int32_t>(P);
  // The dispatch's output is saved too: the backward reads it instead of dispatching again (~30 us at T = 24576).
  take_routed_saved(kept, d, b.routed);
  b.saved_end = saving ? sv.end() : 0;
  take_routed_scratch(ws, d, backward, b.routed);
  if (backward) b.dlogits = ws.take(static_cast<size_t>(T * d.router_experts) * es);
  b.workspace_end = ws.end();
  return b;
}

}  // namespace

void CudaBackend::moe_layer_sizes(moekit_plan& plan) const {
  const moekit_moe_desc_t& d = plan.moe;
  if (d.dtype != MOEKIT_DTYPE_BF16 && d.dtype != MOEKIT_DTYPE_FP16)
    throw_not_supported("dtype: the CUDA MoE layer takes bf16 or fp16 storage");
  plan.sub_plans = std::make_shared<const LayerPlans<MoePlans>>(*this, moe_plans(plan), !d.inference);
  set_layer_sizes(plan, d.inference,
                  [&](bool backward) { return moe_buffers(plan, nullptr, nullptr, backward); });
}

void CudaBackend::moe_forward(const moekit_plan& plan, const moekit_moe_fwd_args_t& args, void* saved, Workspace ws,
                              void* stream_ptr) {
  const moekit_moe_desc_t& d = plan.moe;
  const cudaStream_t stream = as_stream(stream_ptr);
  const MoePlans& p = layer_parts<MoePlans>(plan);
  const MoeBuffers b = moe_buffers(plan, ws.data, saved, false);
  const Workspace scratch{b.scratch, b.scratch_bytes};
  const int64_t T = args.x.shape[0], K = d.top_k, RE = d.router_experts;
  const int32_t dt = d.dtype;
  const int dev = device_index_;

  const DenseGemm router_linear{cuda_type(dt), cuda_type(dt), T, RE, d.hidden, false, true, row_stride(args.x),
                                row_stride(args.w_router), RE, 1.0f, 0.0f};
  run_dense_gemm(dev, router_linear, args.x.data, args.w_router.data, b.logits, b.scratch, stream,
                 "MoE layer forward: router linear");

  moekit_router_fwd_args_t r;
  moekit_router_fwd_args_init(&r);
  r.logits = device_view(b.logits, dt, {T, RE}, dev);
  r.bias = args.router_bias;
  r.scores = device_view(b.scores, MOEKIT_DTYPE_FP32, {T, K}, dev);
  r.indices = device_view(b.indices, MOEKIT_DTYPE_INT32, {T, K}, dev);
  r.counts = args.counts;
  r.load_balance_loss = args.load_balance_loss;
  r.z_loss = args.z_loss;
  router_forward(p.router, r, scratch, stream);

  const RoutedCall call = routed_call(*this, plan, p.routed, b.routed, r.indices, scratch, stream, dev);
  routed_forward(call, RoutedForward{args.x, r.scores, args.w1, args.b1, args.w2, args.b2, args.out, args.beta_out});

  if (args.scores.data)
    copy_rows(args.scores.data, row_stride(args.scores), b.scores, T, K, sizeof(float), stream,
              "MoE layer forward: scores copy");
  if (args.indices.data) {
    if (args.indices.dtype == MOEKIT_DTYPE_INT64) {
      layers::widen_indices(b.indices, T, K, static_cast<int64_t*>(args.indices.data), row_stride(args.indices),
                            stream);
    } else {
      copy_rows(args.indices.data, row_stride(args.indices), b.indices, T, K, sizeof(int32_t), stream,
                "MoE layer forward: indices copy");
    }
  }
  if (!d.inference) layers::write_saved_header(saved, SavedHeader{kSavedMagic, plan.id, T, 0}, stream);
}

void CudaBackend::moe_backward(const moekit_plan& plan, const moekit_moe_bwd_args_t& args, const void* saved,
                               Workspace ws, void* stream_ptr) {
  const moekit_moe_desc_t& d = plan.moe;
  const bool input_grad = args.compute_input_grad != 0, weight_grad = args.compute_weight_grad != 0;
  if (!input_grad && !weight_grad) return;
  const cudaStream_t stream = as_stream(stream_ptr);
  const MoePlans& p = layer_parts<MoePlans>(plan);
  // NOTE: the backward only reads the saved sections unless the plan lets dh overwrite h (take_dh); the const_cast
  // lets one carving serve both directions.
  const MoeBuffers b = moe_buffers(plan, ws.data, const_cast<void*>(saved), true);
  const Workspace scratch{b.scratch, b.scratch_bytes};
  const int64_t T = args.x.shape[0], K = d.top_k, RE = d.router_experts;
  const int32_t dt = d.dtype;
  const int dev = device_index_;

  // The forward's dispatch of these indices, from the saved buffer.
  const moekit_tensor_t indices = device_view(b.indices, MOEKIT_DTYPE_INT32, {T, K}, dev);
  const moekit_tensor_t scores = device_view(b.scores, MOEKIT_DTYPE_FP32, {T, K}, dev);
  const RoutedCall call = routed_call(*this, plan, p.routed, b.routed, indices, scratch, stream, dev);
  routed_backward(call, routed_backward_args(args, scores));

  moekit_router_bwd_args_t rb;
  moekit_router_bwd_args_init(&rb);
  rb.logits = device_view(b.logits, dt, {T, RE}, dev);
  rb.indices = indices;
  rb.dscores = device_view(b.routed.ds, MOEKIT_DTYPE_FP32, {T, K}, dev);
  rb.dlogits = device_view(b.dlogits, dt, {T, RE}, dev);
  rb.dload_balance_loss = args.dload_balance_loss;
  rb.dz_loss = args.dz_loss;
  router_backward(p.router, rb, scratch, stream);

  if (input_grad) {
    // dx += dlogits [T, RE] Wr [RE, H], rounded again.
    const DenseGemm router_dx{cuda_type(dt), cuda_type(dt), T, d.hidden, RE, false, false, RE,
                              row_stride(args.w_router), row_stride(args.dx), 1.0f, 1.0f};
    run_dense_gemm(dev, router_dx, b.dlogits, args.w_router.data, args.dx.data, b.scratch, stream,
                   "MoE layer backward: router input gradient");
  }

  if (weight_grad) {
    // dWr [RE, H] = dlogits^T (stored [T, RE]) x [T, H].
    const DenseGemm router_dw{cuda_type(dt), cuda_type(args.dw_router.dtype), RE, d.hidden, T, true, false, RE,
                              row_stride(args.x), row_stride(args.dw_router), 1.0f,
                              static_cast<float>(args.beta_dw_router)};
    run_dense_gemm(dev, router_dw, b.dlogits, args.x.data, args.dw_router.data, b.scratch, stream,
                   "MoE layer backward: router weight gradient");
  }
  spend_saved(saved, plan, T, stream);
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
