// The bias reduction kernels for fp16 storage (one instantiation per translation unit: docs/kernels.md).
#include "cuda/reduce/bias_sums.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace reduce {

void bias_sums_fp16(const BiasSumsProblem& problem, const BiasSumsLayout& layout, cudaStream_t stream) {
  launch_bias_sums<__half>(problem, layout, stream);
}

}  // namespace reduce
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
