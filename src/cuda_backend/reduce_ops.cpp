// The CUDA backend's token reductions (docs/math.md section 6): combine and the broadcast backward (one method: scores
// absent means weights of 1), db1, and db2 with the dout . b2 part of ds. capi/ has checked shapes, dtypes,
// devices and 16-byte alignment; this file checks what only the kernels need (2-byte storage, rows made of whole
// 16-byte vectors), then enqueues the launchers of cuda/reduce/.
#include <cuda_runtime.h>

#include <string>

#include "cuda/common/cuda_check.h"
#include "src/cuda_backend/cuda_backend.h"
#include "src/cuda_backend/tensor_strides.h"
#include "cuda/reduce/bias_sums.h"
#include "cuda/reduce/combine.h"
#include "cuda/common/status_error.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

namespace {

void require_storage_dtype(const char* name, int32_t dtype) {
  if (dtype != MOEKIT_DTYPE_BF16 && dtype != MOEKIT_DTYPE_FP16)
    throw_not_supported(std::string(name) + ": the CUDA backend reduces bf16 or fp16 tensors, not dtype " +
                        std::to_string(dtype));
}

void require_fp32(const char* name, const moekit_tensor_t& t) {
  if (t.data != nullptr && t.dtype != MOEKIT_DTYPE_FP32)
    throw_not_supported(std::string(name) + ": the CUDA backend reads fp32 scores, not dtype " +
                        std::to_string(t.dtype));
}

// The kernels move whole 16-byte vectors: the row width and the row stride must both be multiples of the number
// of elements in one (8 for 2-byte values, 4 for fp32). An absent tensor passes.
void require_vector_rows(const char* name, const moekit_tensor_t& t) {
  if (t.data == nullptr || t.rank != 2) return;
  const int64_t per_vector = t.dtype == MOEKIT_DTYPE_FP32 ? 4 : 8;
  if (t.shape[1] % 8 != 0)
    throw_not_supported(std::string(name) + ": the CUDA backend needs a row width that is a multiple of 8, got " +
                        std::to_string(t.shape[1]));
  if (row_stride(t) % per_vector != 0)
    throw_not_supported(std::string(name) + ": the CUDA backend needs a row stride that is a multiple of " +
                        std::to_string(per_vector) + " elements (16 bytes), got " + std::to_string(row_stride(t)));
}

}  // namespace

void CudaBackend::combine(const moekit_plan& plan, const moekit_combine_args_t& args, Workspace, void* stream) {
  const moekit_combine_desc_t& d = plan.combine;
  require_storage_dtype("grouped", d.dtype);
  require_fp32("scores", args.scores);
  require_vector_rows("grouped", args.grouped);
  require_vector_rows("out", args.out);

  reduce::CombineProblem problem{};
  problem.tokens = args.out.shape[0];
  problem.hidden = d.hidden;
  problem.top_k = d.top_k;
  problem.grouped = args.grouped.data;
  problem.grouped_stride = row_stride(args.grouped);
  problem.scores = static_cast<const float*>(args.scores.data);
  // Variable top-k reads the scores flat as [P] (contiguous: capi checked); fixed top-k reads rows of K.
  problem.score_stride = args.scores.data != nullptr && d.top_k > 0 ? row_stride(args.scores) : 0;
  problem.grouped_pos = static_cast<const int32_t*>(args.grouped_pos.data);
  problem.tok_offsets = d.top_k == 0 ? static_cast<const int32_t*>(args.tok_offsets.data) : nullptr;
  problem.pairs = args.grouped_pos.shape[0];
  problem.rows = args.grouped.shape[0];
  problem.out = args.out.data;
  problem.out_stride = row_stride(args.out);
  problem.beta = static_cast<float>(args.beta);
  problem.sm_count = facts_.sm_count;

  if (d.dtype == MOEKIT_DTYPE_BF16)
    reduce::combine_bf16(problem, as_stream(stream));
  else
    reduce::combine_fp16(problem, as_stream(stream));
}

namespace {

void run_bias_sums(const moekit_bias_grad_desc_t& d, const reduce::BiasSumsProblem& problem, void* stream) {
  const reduce::BiasSumsLayout layout = reduce::bias_sums_layout(d.experts, d.max_rows, d.width);
  if (d.dtype == MOEKIT_DTYPE_BF16)
    reduce::bias_sums_bf16(problem, layout, as_stream(stream));
  else
    reduce::bias_sums_fp16(problem, layout, as_stream(stream));
}

}  // namespace

void CudaBackend::db1(const moekit_plan& plan, const moekit_db1_args_t& args, Workspace workspace, void* stream) {
  const moekit_bias_grad_desc_t& d = plan.bias_grad;
  require_storage_dtype("dh", d.dtype);
  require_vector_rows("dh", args.dh);
  require_vector_rows("db1", args.db1);

  reduce::BiasSumsProblem problem{};
  problem.experts = d.experts;
  problem.width = d.width;
  problem.rows = args.dh.shape[0];
  problem.src_rows = args.dh.shape[0];
  problem.offsets = static_cast<const int32_t*>(args.offsets.data);
  problem.src = args.dh.data;
  problem.src_stride = row_stride(args.dh);
  problem.sums = args.db1.data;
  problem.sums_stride = row_stride(args.db1);
  problem.sums_fp32 = d.out_dtype == MOEKIT_DTYPE_FP32;
  problem.beta = static_cast<float>(args.beta);
  problem.workspace = workspace.data;
  run_bias_sums(d, problem, stream);
}

void CudaBackend::db2_ds(const moekit_plan& plan, const moekit_db2_ds_args_t& args, Workspace workspace,
                         void* stream) {
  const moekit_bias_grad_desc_t& d = plan.bias_grad;
  require_storage_dtype("dout", d.dtype);
  require_fp32("scores", args.scores);
  require_fp32("dscores", args.dscores);
  require_vector_rows("dout", args.dout);
  require_vector_rows("b2", args.b2);
  require_vector_rows("db2", args.db2);
  const bool has_db2 = args.db2.data != nullptr, has_b2 = args.b2.data != nullptr;
  if (!has_db2 && !has_b2) return;  // nothing is asked for

  reduce::BiasSumsProblem problem{};
  problem.experts = d.experts;
  problem.width = d.width;
  // NOTE: with T = 0 no gather_idx entry can be valid, so no row is: none is read.
  problem.rows = args.dout.shape[0] > 0 ? args.gather_idx.shape[0] : 0;
  problem.src_rows = args.dout.shape[0];
  problem.pairs = 1;
  for (int32_t i = 0; i < args.scores.rank; ++i) problem.pairs *= args.scores.shape[i];
  problem.offsets = static_cast<const int32_t*>(args.offsets.data);
  problem.src = args.dout.data;
  problem.src_stride = row_stride(args.dout);
  problem.gather_idx = static_cast<const int32_t*>(args.gather_idx.data);
  problem.pair_idx = static_cast<const int32_t*>(args.pair_idx.data);
  // The weights serve db2 only: without it the scores are not read.
  problem.scores = has_db2 ? static_cast<const float*>(args.scores.data) : nullptr;
  if (has_db2) {
    problem.sums = args.db2.data;
    problem.sums_stride = row_stride(args.db2);
    problem.sums_fp32 = d.out_dtype == MOEKIT_DTYPE_FP32;
    problem.beta = static_cast<float>(args.beta);
  }
  if (has_b2) {
    problem.b2 = args.b2.data;
    problem.b2_stride = row_stride(args.b2);
    problem.dscores = static_cast<float*>(args.dscores.data);
  }
  problem.workspace = workspace.data;
  run_bias_sums(d, problem, stream);
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
