// The router backward for fp32 logits: this dtype's instantiations of the kernel template,
// one per row-group shape (one dtype per translation unit, as docs/kernels.md says).
#include "cuda/routing/router_backward.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace routing {

void router_backward_fp32(const RouterProblem& problem, const RouterBackwardArgs& args, cudaStream_t stream) {
  launch_router_backward<float>(problem, args, stream);
}

}  // namespace routing
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
