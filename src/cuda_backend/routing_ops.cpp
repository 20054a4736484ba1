// The CUDA backend's router operations (docs/math.md section 1): read the tensor views capi validated and enqueue the
// kernels of cuda/routing/ on the caller's stream. No synchronisation, no allocation.
#include <string>

#include "cuda/common/cuda_check.h"
#include "src/cuda_backend/cuda_backend.h"
#include "src/cuda_backend/tensor_strides.h"
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

[[noreturn]] void unsupported_logits(int32_t dtype) {
  throw_not_supported("logits: the CUDA router takes bf16, fp16 or fp32 logits, got dtype " + std::to_string(dtype));
}

}  // namespace

void CudaBackend::router_forward(const moekit_plan& plan, const moekit_router_fwd_args_t& a, Workspace workspace,
                                 void* stream) {
  const routing::RouterProblem problem = problem_of(plan, a.logits.shape[0], facts_.sm_count);
  const routing::RouterForwardArgs args{a.logits.data,
                                        row_stride(a.logits),
                                        static_cast<const float*>(a.bias.data),
                                        static_cast<float*>(a.scores.data),
                                        row_stride(a.scores),
                                        a.indices.data,
                                        row_stride(a.indices),
                                        a.indices.dtype == MOEKIT_DTYPE_INT64,
                                        static_cast<int32_t*>(a.counts.data),
                                        workspace.data,
                                        workspace.bytes};
  switch (a.logits.dtype) {
    case MOEKIT_DTYPE_BF16: return routing::router_forward_bf16(problem, args, as_stream(stream));
    case MOEKIT_DTYPE_FP16: return routing::router_forward_fp16(problem, args, as_stream(stream));
    case MOEKIT_DTYPE_FP32: return routing::router_forward_fp32(problem, args, as_stream(stream));
    default: unsupported_logits(a.logits.dtype);
  }
}

void CudaBackend::router_backward(const moekit_plan& plan, const moekit_router_bwd_args_t& a, Workspace,
                                  void* stream) {
  const routing::RouterProblem problem = problem_of(plan, a.logits.shape[0], facts_.sm_count);
  const routing::RouterBackwardArgs args{a.logits.data,
                                         row_stride(a.logits),
                                         a.indices.data,
                                         row_stride(a.indices),
                                         a.indices.dtype == MOEKIT_DTYPE_INT64,
                                         static_cast<const float*>(a.dscores.data),
                                         row_stride(a.dscores),
                                         a.dlogits.data,
                                         row_stride(a.dlogits),
                                         a.dlogits.dtype == MOEKIT_DTYPE_FP32,
                                         a.accumulate != 0};
  switch (a.logits.dtype) {
    case MOEKIT_DTYPE_BF16: return routing::router_backward_bf16(problem, args, as_stream(stream));
    case MOEKIT_DTYPE_FP16: return routing::router_backward_fp16(problem, args, as_stream(stream));
    case MOEKIT_DTYPE_FP32: return routing::router_backward_fp32(problem, args, as_stream(stream));
    default: unsupported_logits(a.logits.dtype);
  }
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
