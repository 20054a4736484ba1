// The combine kernel for bf16 storage, many pairs per token (combine.cuh: CombineManyPairs); one instantiation per translation
// unit (docs/kernels.md).
#include "cuda/reduce/combine.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace reduce {

void combine_many_pairs_bf16(const CombineProblem& problem, cudaStream_t stream) {
  launch_combine<__nv_bfloat16, CombineManyPairs>(problem, stream);
}

}  // namespace reduce
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
