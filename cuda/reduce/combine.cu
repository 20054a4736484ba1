// The combine's entry points: each picks the kernel variant for the problem's pairs per token (combine.cuh).
#include "cuda/reduce/combine.h"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace reduce {

void combine_bf16(const CombineProblem& problem, cudaStream_t stream) {
  if (combine_has_few_pairs(problem))
    combine_few_pairs_bf16(problem, stream);
  else
    combine_many_pairs_bf16(problem, stream);
}

void combine_fp16(const CombineProblem& problem, cudaStream_t stream) {
  if (combine_has_few_pairs(problem))
    combine_few_pairs_fp16(problem, stream);
  else
    combine_many_pairs_fp16(problem, stream);
}

}  // namespace reduce
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
