// The CUDA backend's baselines: cuBLASLt dense bf16 GEMMs (row-major C[m, n] = A[m, k] B[n, k]^T, fp32
// accumulation, as F.linear computes) and cudaMemcpyAsync device copies, each on operand sets rotated past the L2
// size like the cases, timed by the same platform.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "baselines.h"
#include "measure.h"
#include "random_fill.h"

namespace moekit_bench {
namespace {

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw CaseFailure(MOEKIT_STATUS_EXECUTION_FAILED,
                      std::string(what) + ": cuBLASLt status " + std::to_string(static_cast<int>(status)));
}

constexpr size_t kCublasWorkspace = size_t{64} << 20;

// One dense GEMM shape: its cuBLASLt descriptors and chosen algorithm.
struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // in cuBLAS's column-major terms
  cublasLtMatmulAlgo_t algo{};
  ~GemmPlan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
};

class CudaBaselines final : public Baselines {
 public:
  explicit CudaBaselines(Platform& platform) : platform_(platform), workspace_(platform, kCublasWorkspace) {
    check_cublas(cublasLtCreate(&handle_), "cublasLtCreate");
    const TimeStats gemm = dense_gemms({DenseGemm{8192, 8192, 8192}}, 10, 50, 1);
    gemm_ceiling_tflops = DenseGemm{8192, 8192, 8192}.flops() / (gemm.median_us * 1e-6) / 1e12;
    const double copy_bytes = 2.0 * (size_t{1} << 30);
    const TimeStats copy = device_copy(copy_bytes, 5, 50, 1);
    copy_ceiling_gbps = copy_bytes / (copy.median_us * 1e-6) / 1e9;
  }
  ~CudaBaselines() override { cublasLtDestroy(handle_); }

  TimeStats dense_gemms(const std::vector<DenseGemm>& gemms, int warmup, int iterations, int repeats) override {
    std::vector<std::unique_ptr<GemmPlan>> plans;
    double set_bytes = 0;
    for (const DenseGemm& g : gemms) {
      plans.push_back(plan(g));
      set_bytes += 2.0 * static_cast<double>(g.m * g.k + g.n * g.k + g.m * g.n);
    }
    const int sets = rotation_sets(platform_, set_bytes);
    // Per set and GEMM: A [m, k], B [n, k], C [m, n].
    std::vector<std::vector<Buffer>> operands(static_cast<size_t>(sets));
    for (int s = 0; s < sets; ++s) {
      for (size_t i = 0; i < gemms.size(); ++i) {
        const DenseGemm& g = gemms[i];
        operands[s].emplace_back(platform_, static_cast<size_t>(g.m * g.k) * 2);
        operands[s].emplace_back(platform_, static_cast<size_t>(g.n * g.k) * 2);
        operands[s].emplace_back(platform_, static_cast<size_t>(g.m * g.n) * 2);
        fill_random(platform_, operands[s][3 * i].data(), MOEKIT_DTYPE_BF16, g.m * g.k, 1.0f, 17 + s);
        fill_random(platform_, operands[s][3 * i + 1].data(), MOEKIT_DTYPE_BF16, g.n * g.k, 1.0f, 29 + s);
      }
    }
    platform_.synchronize();
    const float alpha = 1.0f, beta = 0.0f;
    const auto stream = static_cast<cudaStream_t>(platform_.stream());
    const Call call = [&](int s) {
      for (size_t i = 0; i < gemms.size(); ++i) {
        const GemmPlan& p = *plans[i];
        void* c = operands[s][3 * i + 2].data();
        // Row-major C = A B^T is column-major C^T = B A^T: cuBLAS's A is our B (transposed), its B our A.
        check_cublas(cublasLtMatmul(handle_, p.desc, &alpha, operands[s][3 * i + 1].data(), p.a,
                                    operands[s][3 * i].data(), p.b, &beta, c, p.c, c, p.c, &p.algo, workspace_.data(),
                                    kCublasWorkspace, stream),
                     "cublasLtMatmul");
      }
    };
    return time_pooled(call, sets, warmup, iterations, repeats);
  }

  TimeStats device_copy(double bytes, int warmup, int iterations, int repeats) override {
    const size_t half = std::max<size_t>(256, static_cast<size_t>(bytes / 2) / 256 * 256);
    const int sets = rotation_sets(platform_, 2.0 * static_cast<double>(half));
    std::vector<Buffer> src, dst;
    for (int s = 0; s < sets; ++s) {
      src.emplace_back(platform_, half);
      dst.emplace_back(platform_, half);
      platform_.zero(src.back().data(), half);
    }
    platform_.synchronize();
    const auto stream = static_cast<cudaStream_t>(platform_.stream());
    const Call call = [&](int s) {
      const cudaError_t status = cudaMemcpyAsync(dst[s].data(), src[s].data(), half, cudaMemcpyDeviceToDevice, stream);
      if (status != cudaSuccess) throw CaseFailure(MOEKIT_STATUS_EXECUTION_FAILED, cudaGetErrorString(status));
    };
    return time_pooled(call, sets, warmup, iterations, repeats);
  }

 private:
  TimeStats time_pooled(const Call& call, int sets, int warmup, int iterations, int repeats) {
    return time_rounds(platform_, call, sets, CallCounts{warmup, iterations, repeats}).pooled;
  }

  std::unique_ptr<GemmPlan> plan(const DenseGemm& g) {
    auto p = std::make_unique<GemmPlan>();
    check_cublas(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
    check_cublas(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose),
                 "TRANSA");
    check_cublas(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep), "TRANSB");
    const auto m = static_cast<uint64_t>(g.m), n = static_cast<uint64_t>(g.n), k = static_cast<uint64_t>(g.k);
    // Our B [n, k] row-major = column-major k x n (ld k), used transposed; our A [m, k] = column-major k x m;
    // our C [m, n] = column-major n x m (ld n).
    check_cublas(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, k, n, static_cast<int64_t>(k)), "layout A");
    check_cublas(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, k, m, static_cast<int64_t>(k)), "layout B");
    check_cublas(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_16BF, n, m, static_cast<int64_t>(n)), "layout C");
    cublasLtMatmulPreference_t preference = nullptr;
    check_cublas(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
    const size_t workspace = kCublasWorkspace;
    cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                         sizeof workspace);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->c, p->c, preference, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(preference);
    check_cublas(status, "cublasLtMatmulAlgoGetHeuristic");
    if (found == 0)
      throw CaseFailure(MOEKIT_STATUS_EXECUTION_FAILED, "cuBLASLt has no algorithm for the dense GEMM m=" +
                                                            std::to_string(g.m) + " n=" + std::to_string(g.n) +
                                                            " k=" + std::to_string(g.k));
    p->algo = result.algo;
    return p;
  }

  Platform& platform_;
  Buffer workspace_;
  cublasLtHandle_t handle_ = nullptr;
};

}  // namespace

std::unique_ptr<Baselines> make_cuda_baselines(Platform& platform) { return std::make_unique<CudaBaselines>(platform); }

}  // namespace moekit_bench
