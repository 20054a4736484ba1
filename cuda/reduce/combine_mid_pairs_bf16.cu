// The combine kernel for bf16 storage, mid pairs per token (combine.cuh: CombineMidPairs); one
// instantiation per translation unit (DESIGN.md "Build budget").
#include "cuda/reduce/combine.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace reduce {

void combine_mid_pairs_bf16(const CombineProblem& problem, cudaStream_t stream) {
  launch_combine<__nv_bfloat16, CombineMidPairs>(problem, stream);
}

}  // namespace reduce
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
