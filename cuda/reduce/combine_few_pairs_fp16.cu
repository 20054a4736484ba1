// The combine kernel for fp16 storage, few pairs per token (combine.cuh: CombineFewPairs); one instantiation per translation
// unit (docs/kernels.md).
#include "cuda/reduce/combine.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace reduce {

void combine_few_pairs_fp16(const CombineProblem& problem, cudaStream_t stream) {
  launch_combine<__half, CombineFewPairs>(problem, stream);
}

}  // namespace reduce
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
