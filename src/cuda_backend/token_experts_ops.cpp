// The experts on token-major rows (moekit_token_experts_*) on the CUDA backend: not implemented yet. Plan creation
// answers NOT_SUPPORTED, so a framework can fall back; without a plan the run methods are never reached.
#include "cuda/common/status_error.h"
#include "src/cuda_backend/cuda_backend.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

namespace {

[[noreturn]] void token_experts_not_supported() {
  throw_not_supported(
      "handle: the CUDA backend does not run the experts on token-major rows (moekit_token_experts_*) yet; use a "
      "reference handle, or group the rows (moekit_dispatch) and call moekit_experts_forward / _backward");
}

}  // namespace

void CudaBackend::token_experts_sizes(moekit_plan&) const { token_experts_not_supported(); }

void CudaBackend::token_experts_forward(const moekit_plan&, const moekit_token_experts_fwd_args_t&, void*, Workspace,
                                        void*) {
  token_experts_not_supported();
}

void CudaBackend::token_experts_backward(const moekit_plan&, const moekit_token_experts_bwd_args_t&, const void*,
                                         Workspace, void*) {
  token_experts_not_supported();
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
