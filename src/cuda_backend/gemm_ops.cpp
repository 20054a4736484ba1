// The CUDA backend's grouped GEMM (docs/math.md section 5): capi/ has checked shapes, dtypes, devices and 16-byte
// alignment; this file checks what the tensor-core kernels need beyond that (bf16 / fp16 operands, widths and row
// strides in whole 16-byte vectors), fills the kernels' problem from the views and enqueues cuda/gemm/.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>

#include "cuda/common/cuda_check.h"
#include "src/cuda_backend/cuda_backend.h"
#include "src/cuda_backend/tensor_strides.h"
#include "cuda/gemm/grouped_gemm.h"
#include "cuda/common/status_error.h"
#include "cuda/common/activation_kind.h"
#include "cuda/gemm/gemm_config.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

namespace {

void require_multiple_of_8(const char* name, const char* what, int64_t value) {
  if (value % 8 != 0)
    throw_not_supported(std::string(name) + ": the CUDA grouped GEMM needs " + what +
                        " to be a multiple of 8 elements (16 bytes), got " + std::to_string(value));
}

// Every stride but the last (contiguous) one a multiple of 8 elements. An absent tensor passes.
void require_vector_strides(const char* name, const moekit_tensor_t& t) {
  if (t.data == nullptr) return;
  for (int d = 0; d + 1 < t.rank; ++d) require_multiple_of_8(name, "every row stride", stride_of(t, d));
}

}  // namespace

void plan_grouped_gemm(moekit_plan& plan, const GemmDevice& device) {
  const moekit_gemm_desc_t& d = plan.gemm;
  if (d.dtype != MOEKIT_DTYPE_BF16 && d.dtype != MOEKIT_DTYPE_FP16)
    throw_not_supported("dtype: the CUDA grouped GEMM multiplies bf16 or fp16 operands, not dtype " +
                        std::to_string(d.dtype));
  const GemmShape shape = gemm_shape(d);
  require_multiple_of_8("n", "the product's width", shape.n);
  require_multiple_of_8("k", d.mode == MOEKIT_GEMM_VARLEN_K ? "C's middle dim" : "the reduction length", d.k);
  if ((d.epilogue == MOEKIT_EPILOGUE_GATED || d.epilogue == MOEKIT_EPILOGUE_DGATED) && is_gated_activation(d.activation))
    require_multiple_of_8("n", "the activation width n/2", d.n / 2);
  plan.gemm_config = choose_gemm_config(d, device, gemm_overrides_from_environment());
  plan.workspace_bytes = plan.gemm_config.workspace.bytes;
}

void CudaBackend::gemm(const moekit_plan& plan, const moekit_gemm_args_t& args, Workspace workspace, void* stream) {
  const moekit_gemm_desc_t& d = plan.gemm;
  const bool varlen_k = d.mode == MOEKIT_GEMM_VARLEN_K;
  const bool gathered = d.gather != MOEKIT_GEMM_GATHER_NONE;
  const GemmShape shape = gemm_shape(d);
  const std::pair<const char*, const moekit_tensor_t*> strided[] = {
      {"a", &args.a}, {"b", &args.b}, {"bias", &args.bias}, {"c", &args.c}, {"h", &args.h}, {"act", &args.act}};
  for (const auto& [name, tensor] : strided) require_vector_strides(name, *tensor);

  gemm::GroupedGemmProblem p{};
  p.mode = d.mode;
  p.b_layout = d.b_layout;
  p.gather = d.gather;
  p.epilogue = d.epilogue;
  p.dtype = d.dtype;
  p.groups = d.groups;
  // NOTE: with an empty gathered source no gather_idx entry can be valid, so no row is: none is read.
  const moekit_tensor_t& source = d.gather == MOEKIT_GEMM_GATHER_B ? args.b : args.a;
  p.rows = !gathered ? args.a.shape[0] : (source.shape[0] > 0 ? args.gather_idx.shape[0] : 0);
  p.source_rows = gathered ? source.shape[0] : p.rows;
  p.m = shape.m;
  p.n = shape.n;
  p.k = shape.k;
  p.a = args.a.data;
  p.lda = stride_of(args.a, 0);
  p.b = args.b.data;
  if (varlen_k) {
    p.ldb = stride_of(args.b, 0);
  } else {
    p.b_group_stride = stride_of(args.b, 0);
    p.ldb = stride_of(args.b, 1);
  }
  p.offsets = static_cast<const int32_t*>(args.offsets.data);
  p.gather_idx = args.gather_idx.data;
  p.gather_int64 = args.gather_idx.dtype == MOEKIT_DTYPE_INT64;
  p.alpha = static_cast<float>(args.alpha);
  p.beta = static_cast<float>(args.beta);
  if (d.epilogue == MOEKIT_EPILOGUE_BIAS || d.epilogue == MOEKIT_EPILOGUE_GATED) {
    p.bias = args.bias.data;
    if (p.bias != nullptr) p.bias_stride = stride_of(args.bias, 0);
  }
  p.c = args.c.data;
  if (varlen_k) {
    p.c_group_stride = stride_of(args.c, 0);
    p.ldc = stride_of(args.c, 1);
  } else {
    p.ldc = stride_of(args.c, 0);
  }
  p.c_fp32 = d.out_dtype == MOEKIT_DTYPE_FP32;
  p.activation = d.activation;
  p.glu_layout = d.glu_layout;
  p.glu_limit = static_cast<float>(d.glu_limit);
  p.act_width = is_gated_activation(d.activation) ? d.n / 2 : d.n;
  if (d.epilogue == MOEKIT_EPILOGUE_DGATED) {
    p.h = args.h.data;
    p.ldh = stride_of(args.h, 0);
    p.row_scale = static_cast<const float*>(args.row_scale.data);
    p.pair_idx = static_cast<const int32_t*>(args.pair_idx.data);
    p.dscores = static_cast<float*>(args.dscores.data);
    p.pairs = 1;
    for (int32_t i = 0; i < args.row_scale.rank; ++i) p.pairs *= args.row_scale.shape[i];
  }
  if (d.epilogue == MOEKIT_EPILOGUE_GATED || d.epilogue == MOEKIT_EPILOGUE_DGATED) {
    p.act = args.act.data;
    p.ld_act = stride_of(args.act, 0);
  }
  // The call's facts the plan's variants may require; the plan chose the kernel for each case.
  constexpr int64_t kStrideLimit = int64_t{UINT32_MAX} / 2;  // elements of 2 bytes
  uint32_t facts = 0;
  if (p.beta == 0.0f) facts |= kBetaZero;
  if (p.beta == 1.0f) facts |= kBetaOne;
  if (p.alpha == 1.0f && p.bias == nullptr) facts |= kUnitAlphaNoBias;
  if (p.lda <= kStrideLimit && p.ldb <= kStrideLimit) facts |= kStrides32Bit;
  gemm::run_grouped_gemm(p, plan.gemm_config.for_call(facts), plan.gemm_config.workspace, workspace.data,
                         as_stream(stream));
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
