// The combine kernel for bf16 storage (one instantiation per translation unit: DESIGN.md "Build budget").
#include "cuda/reduce/combine.cuh"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace reduce {

void combine_bf16(const CombineProblem& problem, cudaStream_t stream) { launch_combine<__nv_bfloat16>(problem, stream); }

}  // namespace reduce
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
