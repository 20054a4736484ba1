// The router forward for fp16 logits: this dtype's instantiations of the kernel template,
// one per row-group shape (one dtype per translation unit, as docs/kernels.md says).
#include "cuda/routing/router_forward.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace routing {

void router_forward_fp16(const RouterProblem& problem, const RouterForwardArgs& args, cudaStream_t stream) {
  launch_router_forward<__half>(problem, args, stream);
}

}  // namespace routing
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
