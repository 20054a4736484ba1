// The CUDA backend's router operations (docs/math.md section 1): read the tensor views capi validated and enqueue the
// kernels of cuda/routing/ on the caller's stream. No synchronisation, no allocation.
#include <string>

#include "cuda/common/cuda_check.h"
#include "src/cuda_backend/cuda_backend.h"
#include "src/cuda_backend/tensor_strides.h"
#include "cuda/routing/aux_losses.h"
#include "cuda/routing/router.h"
#include "cuda/common/status_error.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

namespace {

routing::RouterProblem problem_of(const moekit_plan& plan, int64_t tokens, int sm_count) {
  const moekit_router_desc_t& d = plan.router;
  return routing::RouterProblem{tokens,
                                d.experts,
                                d.top_k,
                                static_cast<moekit_router_kind_t>(d.kind),
                                d.renormalize != 0,
                                static_cast<float>(d.scale),
                                sm_count};
}

bool has_aux_losses(const moekit_router_desc_t& d) { return d.load_balance_coeff != 0 || d.z_loss_coeff != 0; }

routing::AuxLossProblem aux_problem_of(const moekit_plan& plan, int64_t tokens) {
  const moekit_router_desc_t& d = plan.router;
  return routing::AuxLossProblem{tokens, d.experts, d.top_k, d.load_balance_coeff, d.z_loss_coeff};
}

routing::AuxLossLayout aux_layout_of(const moekit_plan& plan, int sm_count) {
  const moekit_router_desc_t& d = plan.router;
  return routing::aux_loss_layout(routing::router_workspace_bytes(d.max_tokens, d.experts, sm_count), d.max_tokens,
                                  d.experts);
}

template <class T>
T* section(Workspace workspace, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(workspace.data) + offset);
}

[[noreturn]] void unsupported_logits(int32_t dtype) {
  throw_not_supported("logits: the CUDA router takes bf16, fp16 or fp32 logits, got dtype " + std::to_string(dtype));
}

}  // namespace

void CudaBackend::router_forward(const moekit_plan& plan, const moekit_router_fwd_args_t& a, Workspace workspace,
                                 void* stream) {
  const routing::RouterProblem problem = problem_of(plan, a.logits.shape[0], facts_.sm_count);
  const bool aux = has_aux_losses(plan.router);
  const routing::AuxLossLayout layout = aux_layout_of(plan, facts_.sm_count);
  // The load-balancing loss needs the counts: the caller's, or the workspace's when the caller asked for none.
  int32_t* counts = static_cast<int32_t*>(a.counts.data);
  if (counts == nullptr && plan.router.load_balance_coeff != 0) counts = section<int32_t>(workspace, layout.counts);
  const routing::RouterForwardArgs args{a.logits.data,
                                        row_stride(a.logits),
                                        static_cast<const float*>(a.bias.data),
                                        static_cast<float*>(a.scores.data),
                                        row_stride(a.scores),
                                        a.indices.data,
                                        row_stride(a.indices),
                                        a.indices.dtype == MOEKIT_DTYPE_INT64,
                                        counts,
                                        workspace.data,
                                        aux ? layout.counts : workspace.bytes};  // the aux sections follow
  switch (a.logits.dtype) {
    case MOEKIT_DTYPE_BF16: routing::router_forward_bf16(problem, args, as_stream(stream)); break;
    case MOEKIT_DTYPE_FP16: routing::router_forward_fp16(problem, args, as_stream(stream)); break;
    case MOEKIT_DTYPE_FP32: routing::router_forward_fp32(problem, args, as_stream(stream)); break;
    default: unsupported_logits(a.logits.dtype);
  }
  if (!aux) return;
  const routing::AuxLossForwardArgs losses{a.logits.data,
                                           row_stride(a.logits),
                                           a.logits.dtype,
                                           counts,
                                           static_cast<float*>(a.load_balance_loss.data),
                                           static_cast<float*>(a.z_loss.data),
                                           section<float>(workspace, layout.lse),
                                           section<double>(workspace, layout.column_sums)};
  routing::aux_loss_forward(aux_problem_of(plan, problem.tokens), losses, as_stream(stream));
}

void CudaBackend::router_backward(const moekit_plan& plan, const moekit_router_bwd_args_t& a, Workspace workspace,
                                  void* stream) {
  const routing::RouterProblem problem = problem_of(plan, a.logits.shape[0], facts_.sm_count);
  const bool aux = has_aux_losses(plan.router);
  const bool fp32_out = a.dlogits.dtype == MOEKIT_DTYPE_FP32;
  const routing::AuxLossLayout layout = aux_layout_of(plan, facts_.sm_count);
  // With aux losses and a bf16/fp16 dlogits, the router gradient stays fp32 in the workspace until the aux part is
  // added, so dlogits is rounded once (docs/math.md section 1.1). An fp32 dlogits takes both in place.
  const bool staged = aux && !fp32_out;
  float* staging = staged ? section<float>(workspace, layout.dlogits) : nullptr;  // [T, E], row stride E
  const routing::RouterBackwardArgs args{a.logits.data,
                                         row_stride(a.logits),
                                         a.indices.data,
                                         row_stride(a.indices),
                                         a.indices.dtype == MOEKIT_DTYPE_INT64,
                                         static_cast<const float*>(a.dscores.data),
                                         row_stride(a.dscores),
                                         staged ? staging : a.dlogits.data,
                                         staged ? plan.router.experts : row_stride(a.dlogits),
                                         staged || fp32_out,
                                         !staged && a.accumulate != 0};
  switch (a.logits.dtype) {
    case MOEKIT_DTYPE_BF16: routing::router_backward_bf16(problem, args, as_stream(stream)); break;
    case MOEKIT_DTYPE_FP16: routing::router_backward_fp16(problem, args, as_stream(stream)); break;
    case MOEKIT_DTYPE_FP32: routing::router_backward_fp32(problem, args, as_stream(stream)); break;
    default: unsupported_logits(a.logits.dtype);
  }
  if (!aux) return;
  const routing::AuxLossGradientArgs gradient{a.logits.data,
                                              row_stride(a.logits),
                                              a.logits.dtype,
                                              a.indices.data,
                                              row_stride(a.indices),
                                              a.indices.dtype == MOEKIT_DTYPE_INT64,
                                              static_cast<const float*>(a.dload_balance_loss.data),
                                              static_cast<const float*>(a.dz_loss.data),
                                              section<int32_t>(workspace, layout.counts),
                                              staged ? staging : static_cast<const float*>(a.dlogits.data),
                                              staged ? plan.router.experts : row_stride(a.dlogits),
                                              a.dlogits.data,
                                              row_stride(a.dlogits),
                                              a.dlogits.dtype,
                                              staged && a.accumulate != 0};
  routing::aux_loss_gradient(aux_problem_of(plan, problem.tokens), gradient, as_stream(stream));
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
