// The CUDA backend's dispatch (docs/math.md section 2): reads the tensor views capi has validated and enqueues the
// kernels of cuda/dispatch/ on the caller's stream. No host synchronisation: the number of valid pairs, and for
// general routing the number of pairs, stay on the device.
#include "cuda/common/cuda_check.h"
#include "src/cuda_backend/cuda_backend.h"
#include "src/cuda_backend/tensor_strides.h"
#include "cuda/dispatch/dispatch.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

void CudaBackend::dispatch(const moekit_plan& plan, const moekit_dispatch_args_t& args, Workspace workspace,
                           void* stream) {
  const moekit_dispatch_desc_t& d = plan.dispatch;
  DispatchProblem problem{};
  problem.indices = args.indices.data;
  problem.indices_int64 = args.indices.dtype == MOEKIT_DTYPE_INT64;
  problem.top_k = d.top_k;
  problem.experts = d.experts;
  problem.expert_begin = d.expert_begin;
  if (d.top_k > 0) {
    problem.tokens = args.indices.shape[0];
    // NOTE: capi requires only the last dimension to be contiguous; rows of ids may be further apart.
    problem.indices_row_stride = row_stride(args.indices);
    problem.pair_slots = problem.tokens * d.top_k;
  } else {
    problem.tokens = args.tok_offsets.shape[0] - 1;
    problem.tok_offsets = static_cast<const int32_t*>(args.tok_offsets.data);
    problem.indices_row_stride = 1;
    problem.pair_slots = args.indices.shape[0];
  }
  problem.expert_offsets = static_cast<int32_t*>(args.expert_offsets.data);
  problem.gather_idx = static_cast<int32_t*>(args.gather_idx.data);
  problem.pair_idx = static_cast<int32_t*>(args.pair_idx.data);
  problem.grouped_pos = static_cast<int32_t*>(args.grouped_pos.data);
  // The plan's bound, not this call's P: plan_sizes sized the workspace from the same layout.
  launch_dispatch(problem, dispatch_layout(d.experts, d.max_pairs), workspace.data, as_stream(stream));
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
