// The CUDA backend's sparse-FFN building blocks (SPEC section 7): group selection and the load-balance update.
//
// Group selection per chunk of tokens: the gate pre-activation pre = x · W_sel^T is one cuBLASLt GEMM (bf16/fp16
// in, fp32 accumulation, bf16/fp16 out: its output rounding is SPEC's rounding point), W_sel being Wg itself or
// its subsample rows gathered into the workspace; then the energy + top-kg kernel reads pre. Counts, when asked
// for, are one histogram pass over the groups at the end (group_counts.cu). Nothing waits for
// the device, nothing is allocated on the device, and the chosen GEMM algorithm is fixed per problem shape, so
// a call gives the same bits on every run and stream.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "cuda/common/cuda_check.h"
#include "cuda/cuda_backend.h"
#include "cuda/sparse_ffn/group_select.h"
#include "cuda/sparse_ffn/group_select_workspace.h"
#include "error.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

namespace {

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error(MOEKIT_STATUS_EXECUTION_FAILED, std::string(what) + ": " + cublasLtGetStatusString(status));
}

std::mutex& cublaslt_mutex() {
  static std::mutex m;
  return m;
}

// One cuBLASLt handle per device for the whole process, created on first use (out of every later call's path).
// NOTE: never destroyed: destruction at process exit could run after the CUDA runtime has shut down.
cublasLtHandle_t cublaslt_handle(int device) {
  static std::map<int, cublasLtHandle_t> handles;
  std::lock_guard<std::mutex> lock(cublaslt_mutex());
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cublasLtHandle_t handle = nullptr;
  check_cublas(cublasLtCreate(&handle), "group select: cublasLtCreate");
  handles.emplace(device, handle);
  return handle;
}

// pre [rows, R] (row-major) = x [rows, D] (rows x_stride apart) · w [R, D]^T (rows w_stride apart), fp32
// accumulation, one rounding to the storage type. In cuBLASLt's column-major terms: pre^T [R, rows] = op(A) · B
// with A = w^T stored [D, R] (TRANSA = T) and B = x^T stored [D, rows].
struct GateGemm {
  cudaDataType_t type;
  int64_t rows, selected_rows, d_model, x_stride, w_stride;

  auto key(int device) const {
    return std::make_tuple(device, static_cast<int>(type), rows, selected_rows, d_model, x_stride, w_stride);
  }
};

struct GemmDescriptors {
  cublasLtMatmulDescOpaque_t op;
  cublasLtMatrixLayoutOpaque_t a, b, d;
};

// Descriptors initialised in place: no allocation on the call path.
void describe(const GateGemm& g, GemmDescriptors& desc) {
  check_cublas(cublasLtMatmulDescInit(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "group select: matmul descriptor");
  const cublasOperation_t transpose = CUBLAS_OP_T, none = CUBLAS_OP_N;
  check_cublas(cublasLtMatmulDescSetAttribute(&desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose),
               "group select: TRANSA");
  check_cublas(cublasLtMatmulDescSetAttribute(&desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof none),
               "group select: TRANSB");
  check_cublas(cublasLtMatrixLayoutInit(&desc.a, g.type, static_cast<uint64_t>(g.d_model),
                                        static_cast<uint64_t>(g.selected_rows), g.w_stride),
               "group select: A layout");
  check_cublas(cublasLtMatrixLayoutInit(&desc.b, g.type, static_cast<uint64_t>(g.d_model),
                                        static_cast<uint64_t>(g.rows), g.x_stride),
               "group select: B layout");
  check_cublas(cublasLtMatrixLayoutInit(&desc.d, g.type, static_cast<uint64_t>(g.selected_rows),
                                        static_cast<uint64_t>(g.rows), g.selected_rows),
               "group select: D layout");
}

// The algorithm for a shape: asked of the heuristic once, then reused, so every call of that shape runs the
// same kernel (bitwise reproducibility does not hang on the heuristic answering alike each time).
cublasLtMatmulAlgo_t gemm_algorithm(cublasLtHandle_t handle, int device, const GateGemm& g, GemmDescriptors& desc) {
  static std::map<decltype(g.key(0)), cublasLtMatmulAlgo_t> chosen;
  {
    std::lock_guard<std::mutex> lock(cublaslt_mutex());
    auto it = chosen.find(g.key(device));
    if (it != chosen.end()) return it->second;
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  // First choice: up to our GEMM workspace, split-K reduced in fp32 only. NOTE: a split-K reduction in the
  // output type would round partial sums to bf16/fp16, a second rounding point; fp32 reductions (or none) keep
  // SPEC's single rounding of the pre-activation. Should cuBLASLt offer nothing so, no workspace at all (no
  // split-K) is the fallback.
  for (uint64_t workspace : {static_cast<uint64_t>(sparse_ffn::kGemmWorkspaceBytes), uint64_t{0}}) {
    cublasLtMatmulPreferenceOpaque_t pref;
    check_cublas(cublasLtMatmulPreferenceInit(&pref), "group select: matmul preference");
    check_cublas(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                      sizeof workspace),
                 "group select: workspace preference");
    const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    check_cublas(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction,
                                                      sizeof reduction),
                 "group select: reduction preference");
    // CUDA tensors are 16-byte aligned (and so are chunk starts and workspace sections): let the heuristic
    // pick kernels for exactly that, whatever addresses a call brings.
    const uint32_t alignment = 16;
    for (auto attribute : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                           CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      check_cublas(cublasLtMatmulPreferenceSetAttribute(&pref, attribute, &alignment, sizeof alignment),
                   "group select: alignment preference");
    // NOT_SUPPORTED means no algorithm under these preferences, as found == 0 does.
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle, &desc.op, &desc.a, &desc.b, &desc.d, &desc.d,
                                                           &pref, 1, &result, &found);
    if (status != CUBLAS_STATUS_NOT_SUPPORTED) check_cublas(status, "group select: cuBLASLt heuristic");
    if (status == CUBLAS_STATUS_SUCCESS && found > 0) break;
    found = 0;
  }
  if (found < 1)
    throw_not_supported("x: cuBLASLt has no algorithm for the gate pre-activation GEMM of this shape and stride");
  std::lock_guard<std::mutex> lock(cublaslt_mutex());
  return chosen.emplace(g.key(device), result.algo).first->second;
}

void run_gate_gemm(int device, const GateGemm& g, const void* x, const void* w, void* pre, void* workspace,
                   cudaStream_t stream) {
  cublasLtHandle_t handle = cublaslt_handle(device);
  GemmDescriptors desc;
  describe(g, desc);
  const cublasLtMatmulAlgo_t algo = gemm_algorithm(handle, device, g, desc);
  const float one = 1.0f, zero = 0.0f;
  check_cublas(cublasLtMatmul(handle, &desc.op, &one, w, &desc.a, x, &desc.b, &zero, pre, &desc.d, pre, &desc.d,
                              &algo, workspace, sparse_ffn::kGemmWorkspaceBytes, stream),
               "group select: gate pre-activation GEMM");
}

// The gather (with a subsample), then per chunk of tokens the gate GEMM into the workspace's pre buffer and the
// energy + top-kg kernel writing that chunk's groups.
void select_chunks(int device, const moekit_sparse_ffn_desc_t& d, const sparse_ffn::GroupSelectLayout& layout,
                   const moekit_group_select_args_t& args, char* workspace, cudaStream_t stream) {
  const int64_t tokens = args.x.shape[0];
  const void* w_sel = args.w_gate.data;
  int64_t w_stride = args.w_gate.stride[0];
  if (layout.gathers_rows) {
    sparse_ffn::GatherRowsArgs gather{args.w_gate.data, args.w_gate.stride[0],
                                      static_cast<const int32_t*>(args.subsample_rows.data),
                                      layout.groups, d.group_size, layout.rows_per_group, d.d_model,
                                      workspace + layout.w_sel_offset};
    sparse_ffn::launch_gather_subsample_rows(gather, stream);
    w_sel = gather.w_sel;
    w_stride = d.d_model;
  }

  const cudaDataType_t type = d.dtype == MOEKIT_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
  const sparse_ffn::Storage storage =
      d.dtype == MOEKIT_DTYPE_BF16 ? sparse_ffn::Storage::bf16 : sparse_ffn::Storage::fp16;
  const size_t element = 2;
  void* pre = workspace + layout.pre_offset;
  for (int64_t first = 0; first < tokens; first += layout.chunk_tokens) {
    const int64_t rows = std::min(layout.chunk_tokens, tokens - first);
    // A one-token tensor may carry any row stride; cuBLASLt wants a leading dimension of at least D.
    const GateGemm gemm{type, rows, layout.selected_rows, d.d_model, std::max(args.x.stride[0], d.d_model), w_stride};
    const char* x_chunk = static_cast<const char*>(args.x.data) + first * args.x.stride[0] * element;
    run_gate_gemm(device, gemm, x_chunk, w_sel, pre, workspace + layout.gemm_offset, stream);

    sparse_ffn::GroupEnergyArgs energy{};
    energy.pre = pre;
    energy.tokens = rows;
    energy.groups = layout.groups;
    energy.rows_per_group = layout.rows_per_group;
    energy.estimate_scale =
        layout.gathers_rows ? static_cast<float>(d.group_size) / static_cast<float>(d.subsample) : 1.0f;
    energy.lb_bias = static_cast<const float*>(args.lb_bias.data);
    energy.top_groups = d.top_groups;
    energy.groups_out = static_cast<int32_t*>(args.groups.data) + first * args.groups.stride[0];
    energy.groups_stride = args.groups.stride[0];
    sparse_ffn::launch_group_energy_topk(storage, energy, stream);
  }
}

}  // namespace

void CudaBackend::group_select(const moekit_plan& plan, const moekit_group_select_args_t& args, Workspace ws,
                               void* stream_ptr) {
  const moekit_sparse_ffn_desc_t& d = plan.sparse_ffn;
  const sparse_ffn::GroupSelectLayout layout = sparse_ffn::group_select_layout(d);
  const cudaStream_t stream = as_stream(stream_ptr);
  const int64_t tokens = args.x.shape[0];
  char* workspace = static_cast<char*>(ws.data);

  if (tokens > 0) select_chunks(device_index_, d, layout, args, workspace, stream);
  if (args.counts.data) {
    sparse_ffn::GroupCountsArgs counting{static_cast<const int32_t*>(args.groups.data),
                                         args.groups.stride[0],
                                         tokens,
                                         d.top_groups,
                                         layout.groups,
                                         reinterpret_cast<int32_t*>(workspace + layout.partials_offset),
                                         static_cast<int32_t*>(args.counts.data)};
    sparse_ffn::launch_group_counts(counting, stream);
  }
}

void CudaBackend::load_balance_update(const moekit_load_balance_args_t& args, void* stream) {
  sparse_ffn::LoadBalanceArgs lb{};
  lb.counts = args.counts.data;
  switch (args.counts.dtype) {
    case MOEKIT_DTYPE_INT32: lb.counts_type = sparse_ffn::CountsType::int32; break;
    case MOEKIT_DTYPE_INT64: lb.counts_type = sparse_ffn::CountsType::int64; break;
    case MOEKIT_DTYPE_FP32: lb.counts_type = sparse_ffn::CountsType::fp32; break;
    default: throw_not_supported("counts: the load-balance update takes int32, int64 or fp32 counts");
  }
  lb.ema = static_cast<float*>(args.ema.data);
  lb.bias = static_cast<float*>(args.bias.data);
  lb.groups = args.counts.shape[0];
  lb.tokens = args.tokens;
  lb.top_groups = args.top_groups;
  lb.momentum = args.momentum;
  lb.gamma = args.gamma;
  lb.bias_max = args.bias_max;
  sparse_ffn::launch_load_balance_update(lb, as_stream(stream));
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
