// The experts on token-major rows (moekit_token_experts_*) on the CUDA backend: the MoE layer without its router.
// The caller's local ids and weights go straight to the routed experts (routed_experts.h), whose dispatch drops
// every pair with an id outside [0, E) and whose combine writes every token (zeros, or beta_out out, for a token
// with no local pair). Saved: the dispatch and h; the backward's d(topk_weights) is the routed experts' ds.
// The same rules as moe_layer_ops.cpp: one stream, the caller's memory only, no host synchronisation; the saved
// header is written, not checked.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>

#include "cuda/common/cuda_check.h"
#include "cuda/common/status_error.h"
#include "cuda/layers/layer_kernels.h"
#include "cuda/layers/saved_header.h"
#include "src/cuda_backend/cuda_backend.h"
#include "src/cuda_backend/layer_chain.h"
#include "src/cuda_backend/routed_experts.h"
#include "src/cuda_backend/tensor_strides.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

namespace {

struct TokenExpertsBuffers {
  void* scratch;
  size_t scratch_bytes;
  RoutedBuffers routed;
  float* weights;  // backward: topk_weights [N, K] made contiguous when its rows lie apart
  size_t workspace_end, saved_end;
};

TokenExpertsBuffers token_experts_buffers(const moekit_plan& layer, void* workspace, void* saved, bool backward) {
  const moekit_moe_desc_t& d = layer.moe;
  TokenExpertsBuffers b{};
  for (const auto& [name, sub] : layer.sub_plans->list())
    b.scratch_bytes = std::max(b.scratch_bytes, sub->workspace_bytes);
  Carve ws(workspace);
  b.scratch = ws.take(b.scratch_bytes);
  Carve sv(saved, kSavedHeaderBytes);
  take_routed_saved(d.inference ? ws : sv, d, b.routed);
  b.saved_end = d.inference ? 0 : sv.end();
  take_routed_scratch(ws, d, backward, b.routed);
  if (backward) b.weights = ws.take<float>(d.max_tokens * d.top_k);
  b.workspace_end = ws.end();
  return b;
}

}  // namespace

void CudaBackend::token_experts_sizes(moekit_plan& plan) const {
  const moekit_moe_desc_t& d = plan.moe;
  if (d.dtype != MOEKIT_DTYPE_BF16 && d.dtype != MOEKIT_DTYPE_FP16)
    throw_not_supported("dtype: the CUDA experts on token-major rows take bf16 or fp16 storage");
  plan.sub_plans = std::make_shared<const LayerPlans<RoutedPlans>>(*this, routed_plans(plan), !d.inference);
  set_layer_sizes(plan, d.inference,
                  [&](bool backward) { return token_experts_buffers(plan, nullptr, nullptr, backward); });
}

void CudaBackend::token_experts_forward(const moekit_plan& plan, const moekit_token_experts_fwd_args_t& args,
                                        void* saved, Workspace ws, void* stream_ptr) {
  const moekit_moe_desc_t& d = plan.moe;
  const cudaStream_t stream = as_stream(stream_ptr);
  const TokenExpertsBuffers b = token_experts_buffers(plan, ws.data, saved, false);
  const RoutedCall call = routed_call(*this, plan, layer_parts<RoutedPlans>(plan), b.routed, args.topk_idx,
                                      Workspace{b.scratch, b.scratch_bytes}, stream, device_index_);
  routed_forward(call, RoutedForward{args.x, args.topk_weights, args.w1, args.b1, args.w2, args.b2, args.out,
                                     args.beta_out});
  if (!d.inference)
    layers::write_saved_header(saved, SavedHeader{kSavedMagic, plan.id, args.x.shape[0], 0}, stream);
}

void CudaBackend::token_experts_backward(const moekit_plan& plan, const moekit_token_experts_bwd_args_t& args,
                                         const void* saved, Workspace ws, void* stream_ptr) {
  const moekit_moe_desc_t& d = plan.moe;
  const bool input_grad = args.compute_input_grad != 0, weight_grad = args.compute_weight_grad != 0;
  if (!input_grad && !weight_grad) return;
  const cudaStream_t stream = as_stream(stream_ptr);
  // NOTE: the backward only reads the saved sections unless the plan lets dh overwrite h (take_dh); the const_cast
  // lets one carving serve both directions.
  const TokenExpertsBuffers b = token_experts_buffers(plan, ws.data, const_cast<void*>(saved), true);
  const int64_t N = args.x.shape[0], K = d.top_k;
  const int dev = device_index_;

  // The dgated epilogue and db2 read the weights flat: rows further apart than K are packed first.
  moekit_tensor_t weights = args.topk_weights;
  if (N > 0 && row_stride(weights) != K) {
    check_cuda(cudaMemcpy2DAsync(b.weights, static_cast<size_t>(K) * sizeof(float), weights.data,
                                 static_cast<size_t>(row_stride(weights)) * sizeof(float),
                                 static_cast<size_t>(K) * sizeof(float), static_cast<size_t>(N),
                                 cudaMemcpyDeviceToDevice, stream),
               "token-major experts backward: topk_weights packing");
    weights = device_view(b.weights, MOEKIT_DTYPE_FP32, {N, K}, dev);
  }

  // The dispatch of these ids, from the saved buffer.
  const RoutedCall call = routed_call(*this, plan, layer_parts<RoutedPlans>(plan), b.routed, args.topk_idx,
                                      Workspace{b.scratch, b.scratch_bytes}, stream, dev);
  routed_backward(call, routed_backward_args(args, weights));

  if (input_grad && args.dtopk_weights.data)
    copy_rows(args.dtopk_weights.data, row_stride(args.dtopk_weights), b.routed.ds, N, K, sizeof(float), stream,
              "token-major experts backward: dtopk_weights copy");
  spend_saved(saved, plan, N, stream);
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
