// The CUDA backend's grouped GEMM (docs/math.md section 5): capi/ has checked shapes, dtypes, devices and 16-byte
// alignment; this file checks what the tensor-core kernels need beyond that (bf16 / fp16 operands, widths and row
// strides in whole 16-byte vectors), fills the kernels' problem from the views and enqueues cuda/gemm/.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "cuda/common/cuda_check.h"
#include "src/cuda_backend/cuda_backend.h"
#include "cuda/gemm/grouped_gemm.h"
#include "cuda/common/status_error.h"
#include "cuda/gemm/gemm_config.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

namespace {

bool gated_activation(int32_t activation) {
  return activation == MOEKIT_ACT_SWIGLU || activation == MOEKIT_ACT_GEGLU || activation == MOEKIT_ACT_REGLU ||
         activation == MOEKIT_ACT_SWIGLU_OAI;
}

// The stride between rows `dim` and `dim + 1` apart; a dimension of extent 1 may carry any stride (capi allows
// it), and its rows are never stepped over, so the dense stride stands in.
int64_t stride_of(const moekit_tensor_t& t, int dim) {
  if (t.shape[dim] > 1) return t.stride[dim];
  int64_t dense = 1;
  for (int d = dim + 1; d < t.rank; ++d) dense *= t.shape[d];
  return dense;
}

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

thread_local bool kernel_choice_log_muted = false;

// MOEKIT_LOG_CONFIG=1 (anything but "0"): the kernel chosen for a grouped GEMM plan, one line on stderr.
void log_gemm_config(const moekit_gemm_desc_t& d, GemmPath path, GemmTile tile) {
  const char* log = std::getenv("MOEKIT_LOG_CONFIG");
  if (kernel_choice_log_muted || log == nullptr || std::strcmp(log, "0") == 0) return;
  std::fprintf(stderr, "moekit: grouped GEMM %s, %lld groups, n %lld, k %lld, epilogue %d, dtype %d: %s %s\n",
               d.mode == MOEKIT_GEMM_VARLEN_K ? "varlen K" : "varlen M", static_cast<long long>(d.groups),
               static_cast<long long>(d.n), static_cast<long long>(d.k), d.epilogue, d.dtype, gemm_path_name(path),
               gemm_tile_name(tile));
}

}  // namespace

KernelChoiceLogMute::KernelChoiceLogMute() : was_muted_(kernel_choice_log_muted) { kernel_choice_log_muted = true; }
KernelChoiceLogMute::~KernelChoiceLogMute() { kernel_choice_log_muted = was_muted_; }

void plan_grouped_gemm(moekit_plan& plan, int device_index) {
  const moekit_gemm_desc_t& d = plan.gemm;
  if (d.dtype != MOEKIT_DTYPE_BF16 && d.dtype != MOEKIT_DTYPE_FP16)
    throw_not_supported("dtype: the CUDA grouped GEMM multiplies bf16 or fp16 operands, not dtype " +
                        std::to_string(d.dtype));
  const GemmShape shape = gemm_shape(d);
  require_multiple_of_8("n", "the product's width", shape.n);
  require_multiple_of_8("k", d.mode == MOEKIT_GEMM_VARLEN_K ? "C's middle dim" : "the reduction length", d.k);
  if ((d.epilogue == MOEKIT_EPILOGUE_GATED || d.epilogue == MOEKIT_EPILOGUE_DGATED) && gated_activation(d.activation))
    require_multiple_of_8("n", "the activation width n/2", d.n / 2);
  int sm_count = 0;
  check_cuda(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device_index),
             "grouped GEMM: SM count");
  int cc_major = 0, cc_minor = 0;
  check_cuda(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device_index),
             "grouped GEMM: compute capability");
  check_cuda(cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, device_index),
             "grouped GEMM: compute capability");
  const GemmTile tile = choose_gemm_tile_or_override(shape, sm_count);
  const GemmPath path = choose_gemm_path_or_override(d, cc_major, cc_minor);
  plan.kernel_config = gemm_kernel_config(tile, path);
  plan.workspace_bytes = gemm_workspace_layout(d, tile, path).bytes;
  log_gemm_config(d, path, tile);
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
  p.rows = gathered ? args.gather_idx.shape[0] : args.a.shape[0];
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
  p.act_width = gated_activation(d.activation) ? d.n / 2 : d.n;
  if (d.epilogue == MOEKIT_EPILOGUE_DGATED) {
    p.h = args.h.data;
    p.ldh = stride_of(args.h, 0);
    p.row_scale = static_cast<const float*>(args.row_scale.data);
    p.pair_idx = static_cast<const int32_t*>(args.pair_idx.data);
    p.dscores = static_cast<float*>(args.dscores.data);
  }
  if (d.epilogue == MOEKIT_EPILOGUE_GATED || d.epilogue == MOEKIT_EPILOGUE_DGATED) {
    p.act = args.act.data;
    p.ld_act = stride_of(args.act, 0);
  }
  const GemmTile tile = gemm_config_tile(plan.kernel_config);
  const GemmPath path = gemm_config_path(plan.kernel_config);
  gemm::run_grouped_gemm(p, tile, path, gemm_workspace_layout(d, tile, path),
                         workspace.data, as_stream(stream));
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
