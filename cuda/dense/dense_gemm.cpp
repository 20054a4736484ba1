// Dense GEMMs through cuBLASLt (dense_gemm.h). In cuBLASLt's column-major terms a row-major d [m, n] is a
// column-major [n, m], so the call computes d^T = B^T A^T: cuBLASLt's A is our B and its B is our A, each
// transposed exactly when it is NOT stored transposed here.
#include "cuda/dense/dense_gemm.h"

#include <cublasLt.h>

#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "cuda/common/cuda_check.h"
#include "cuda/common/status_error.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

namespace {

void check_cublas(cublasStatus_t status, const char* what, const char* step) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error(MOEKIT_STATUS_EXECUTION_FAILED,
                std::string(what) + ": " + step + ": " + cublasLtGetStatusString(status));
}

std::mutex& cublaslt_mutex() {
  static std::mutex m;
  return m;
}

// One cuBLASLt handle per device for the whole process, created on first use (out of every later call's path).
// NOTE: never destroyed: destruction at process exit could run after the CUDA runtime has shut down.
cublasLtHandle_t cublaslt_handle(int device, const char* what) {
  static std::map<int, cublasLtHandle_t> handles;
  std::lock_guard<std::mutex> lock(cublaslt_mutex());
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cublasLtHandle_t handle = nullptr;
  check_cublas(cublasLtCreate(&handle), what, "cublasLtCreate");
  handles.emplace(device, handle);
  return handle;
}

using ShapeKey = std::tuple<int, int, int, int64_t, int64_t, int64_t, bool, bool, int64_t, int64_t, int64_t, bool>;

ShapeKey shape_key(int device, const DenseGemm& g) {
  return ShapeKey{device, static_cast<int>(g.ab_type), static_cast<int>(g.d_type), g.m, g.n, g.k, g.a_transposed,
                  g.b_transposed, g.lda, g.ldb, g.ldd, g.beta != 0.0f};
}

struct Descriptors {
  cublasLtMatmulDescOpaque_t op;
  cublasLtMatrixLayoutOpaque_t a, b, d;
};

// Descriptors initialised in place: no allocation on the call path.
void describe(const DenseGemm& g, Descriptors& desc, const char* what) {
  check_cublas(cublasLtMatmulDescInit(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), what, "matmul descriptor");
  const cublasOperation_t op_a = g.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.a_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_cublas(cublasLtMatmulDescSetAttribute(&desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a), what,
               "TRANSA");
  check_cublas(cublasLtMatmulDescSetAttribute(&desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b), what,
               "TRANSB");
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  // cuBLASLt's A = our B as stored: column-major [n, k] (stored [k, n] row-major) or [k, n] (stored [n, k]).
  check_cublas(cublasLtMatrixLayoutInit(&desc.a, g.ab_type, g.b_transposed ? u(g.k) : u(g.n),
                                        g.b_transposed ? u(g.n) : u(g.k), g.ldb),
               what, "A layout");
  check_cublas(cublasLtMatrixLayoutInit(&desc.b, g.ab_type, g.a_transposed ? u(g.m) : u(g.k),
                                        g.a_transposed ? u(g.k) : u(g.m), g.lda),
               what, "B layout");
  check_cublas(cublasLtMatrixLayoutInit(&desc.d, g.d_type, u(g.n), u(g.m), g.ldd), what, "D layout");
}

// The algorithm for a shape: asked of the heuristic once, then reused, so every call of that shape runs the
// same kernel (bitwise reproducibility does not hang on the heuristic answering alike each time).
cublasLtMatmulAlgo_t algorithm(cublasLtHandle_t handle, int device, const DenseGemm& g, Descriptors& desc,
                               const char* what) {
  static std::map<ShapeKey, cublasLtMatmulAlgo_t> chosen;
  const ShapeKey key = shape_key(device, g);
  {
    std::lock_guard<std::mutex> lock(cublaslt_mutex());
    auto it = chosen.find(key);
    if (it != chosen.end()) return it->second;
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  // First choice: up to our workspace, split-K reduced in fp32 only; should cuBLASLt offer nothing so, no
  // workspace at all (no split-K).
  for (uint64_t workspace : {static_cast<uint64_t>(kDenseGemmWorkspaceBytes), uint64_t{0}}) {
    cublasLtMatmulPreferenceOpaque_t pref;
    check_cublas(cublasLtMatmulPreferenceInit(&pref), what, "matmul preference");
    check_cublas(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                      sizeof workspace),
                 what, "workspace preference");
    const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    check_cublas(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction,
                                                      sizeof reduction),
                 what, "reduction preference");
    // CUDA tensors are 16-byte aligned (and so are workspace sections): let the heuristic pick kernels for
    // exactly that, whatever addresses a call brings.
    const uint32_t alignment = 16;
    for (auto attribute : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                           CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      check_cublas(cublasLtMatmulPreferenceSetAttribute(&pref, attribute, &alignment, sizeof alignment), what,
                   "alignment preference");
    // NOT_SUPPORTED means no algorithm under these preferences, as found == 0 does.
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(handle, &desc.op, &desc.a, &desc.b, &desc.d, &desc.d, &pref, 1, &result, &found);
    if (status != CUBLAS_STATUS_NOT_SUPPORTED) check_cublas(status, what, "heuristic");
    if (status == CUBLAS_STATUS_SUCCESS && found > 0) break;
    found = 0;
  }
  if (found < 1) throw_not_supported(std::string(what) + ": cuBLASLt has no algorithm for this shape and stride");
  std::lock_guard<std::mutex> lock(cublaslt_mutex());
  return chosen.emplace(key, result.algo).first->second;
}

size_t element_bytes(cudaDataType_t type) { return type == CUDA_R_32F ? 4 : 2; }

}  // namespace

void run_dense_gemm(int device, const DenseGemm& g, const void* a, const void* b, void* d, void* workspace,
                    cudaStream_t stream, const char* what) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {
    if (g.beta == 0.0f) {
      const size_t bytes = element_bytes(g.d_type);
      check_cuda(cudaMemset2DAsync(d, static_cast<size_t>(g.ldd) * bytes, 0, static_cast<size_t>(g.n) * bytes,
                                   static_cast<size_t>(g.m), stream),
                 what);
    } else if (g.beta != 1.0f) {
      throw_invalid(std::string(what) + ": an empty product with beta other than 0 or 1");
    }
    return;
  }
  cublasLtHandle_t handle = cublaslt_handle(device, what);
  Descriptors desc;
  describe(g, desc, what);
  const cublasLtMatmulAlgo_t algo = algorithm(handle, device, g, desc, what);
  check_cublas(cublasLtMatmul(handle, &desc.op, &g.alpha, b, &desc.a, a, &desc.b, &g.beta, d, &desc.d, d, &desc.d,
                              &algo, workspace, kDenseGemmWorkspaceBytes, stream),
               what, "cublasLtMatmul");
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
