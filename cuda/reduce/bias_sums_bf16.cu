// The bias reduction kernels for bf16 storage (one instantiation per translation unit: docs/kernels.md).
#include "cuda/reduce/bias_sums.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace reduce {

void bias_sums_bf16(const BiasSumsProblem& problem, const BiasSumsLayout& layout, cudaStream_t stream) {
  launch_bias_sums<__nv_bfloat16>(problem, layout, stream);
}

}  // namespace reduce
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
