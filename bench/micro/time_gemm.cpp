// Timing of the CUDA grouped GEMM through the C ABI (moekit_time_gemm), at the shape: E = 128 experts,
// T = 16384 tokens routed to K = 8 experts each at random (P = 131072 rows, ~1024 per expert), hidden H = 4096,
// product width N = 2048; bf16 operands and outputs:
//   - varlen M, x rows gathered (STORE): C [P, N] = x[gather] W[e]^T, W [E, N, H]; the same with equal counts;
//     the same with the GATED SwiGLU epilogue (h [P, 2048], a [P, 1024]);
//   - varlen M DGATED: dA = dout[gather] W2[e] (W2 [E, H, 1024] as KN), dh, a', ds;
//   - varlen K weight gradient: dW[e] [N, H] = dh_e^T x[gather]_e (gather B), bf16 and fp32 out.
// The ceiling is a dense cuBLASLt bf16 GEMM of the same FLOPs measured in the same run, in the forward form
// (131072 x 2048 x 4096) and in the weight-gradient form (2048 x 4096, reduction 131072).
// Prints median / min / max time per call, TFLOP/s at the median and the ratio to the dense baseline.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "moekit/moekit.h"
#include "timing.h"

using namespace moekit_bench;

namespace {

constexpr int64_t kTokens = 16384, kTopK = 8, kExperts = 128, kHidden = 4096, kWidth = 2048;
constexpr int64_t kPairs = kTokens * kTopK;
constexpr double kFlops = 2.0 * kPairs * kWidth * kHidden;

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DevicePtr = std::unique_ptr<void, CudaFree>;

DevicePtr device_alloc(size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc");
  return DevicePtr(p);
}

DevicePtr random_bf16(size_t count, unsigned long long seed, float scale = 1.0f) {
  DevicePtr p = device_alloc(count * 2);
  fill_random_bf16_repeated(p.get(), count, scale, seed);
  return p;
}

template <class T>
DevicePtr upload(const std::vector<T>& values) {
  DevicePtr p = device_alloc(values.size() * sizeof(T));
  check(cudaMemcpy(p.get(), values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  return p;
}

void check_cublas(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  std::fprintf(stderr, "%s: %s\n", what, cublasLtGetStatusString(status));
  std::exit(1);
}

// Dense bf16 row-major D [m, n] (bf16, fp32 accumulate) by cuBLASLt: forward form D = A [m, k] B [n, k]^T, or
// weight-gradient form D = A [k, m]^T B [k, n]. Column-major, that is D^T = op(B view) op(A view).
struct DenseGemm {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo{};
  DevicePtr workspace;
  size_t workspace_bytes = size_t{32} << 20;

  DenseGemm(int64_t m, int64_t n, int64_t k, bool weight_gradient) {
    check_cublas(cublasLtCreate(&handle), "cublasLtCreate");
    check_cublas(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor");
    const cublasOperation_t trans_a = weight_gradient ? CUBLAS_OP_N : CUBLAS_OP_T;
    const cublasOperation_t trans_b = weight_gradient ? CUBLAS_OP_T : CUBLAS_OP_N;
    check_cublas(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a), "TRANSA");
    check_cublas(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b), "TRANSB");
    if (weight_gradient) {
      check_cublas(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, n, k, n), "A layout");
      check_cublas(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, m, k, m), "B layout");
    } else {
      check_cublas(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, n, k), "A layout");
      check_cublas(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, m, k), "B layout");
    }
    check_cublas(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, n, m, n), "D layout");
    workspace = device_alloc(workspace_bytes);
    cublasLtMatmulPreference_t pref = nullptr;
    check_cublas(cublasLtMatmulPreferenceCreate(&pref), "preference");
    check_cublas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                               sizeof workspace_bytes),
          "workspace preference");
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    check_cublas(cublasLtMatmulAlgoGetHeuristic(handle, op, la, lb, ld, ld, pref, 1, &result, &found), "heuristic");
    if (found < 1) {
      std::fprintf(stderr, "cuBLASLt: no algorithm\n");
      std::exit(1);
    }
    algo = result.algo;
    cublasLtMatmulPreferenceDestroy(pref);
  }
  ~DenseGemm() {
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(handle);
  }
  void run(const void* a, const void* b, void* d, cudaStream_t stream) {
    const float one = 1.0f, zero = 0.0f;
    check_cublas(cublasLtMatmul(handle, op, &one, b, la, a, lb, &zero, d, ld, d, ld, &algo, workspace.get(), workspace_bytes,
                         stream),
          "cublasLtMatmul");
  }
};

struct Row {
  std::string name;
  Timing timing;
  double flops;
  double baseline_us;  // the dense cuBLASLt GEMM of the same FLOPs, 0 if none
};

// A plan with the tile the heuristic picks, or the one MOEKIT_GEMM_TILE names when `tile` is not null.
moekit_plan_t gemm_plan(moekit_handle_t handle, const moekit_gemm_desc_t& desc, const char* tile) {
  if (tile != nullptr) setenv("MOEKIT_GEMM_TILE", tile, 1);
  moekit_plan_t plan = nullptr;
  check(moekit_gemm_plan_create(handle, &desc, &plan), "grouped GEMM plan");
  unsetenv("MOEKIT_GEMM_TILE");
  return plan;
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  moekit_handle_t handle = cuda_handle();
  std::printf("device: %s, %d SMs; E=%lld T=%lld K=%lld (P=%lld) H=%lld N=%lld, bf16\n", prop.name,
              prop.multiProcessorCount, static_cast<long long>(kExperts), static_cast<long long>(kTokens),
              static_cast<long long>(kTopK), static_cast<long long>(kPairs), static_cast<long long>(kHidden),
              static_cast<long long>(kWidth));

  const Routing routing = random_routing(kTokens, kExperts, kTopK, 7);
  std::vector<int32_t> equal_offsets(kExperts + 1);
  for (int64_t e = 0; e <= kExperts; ++e) equal_offsets[static_cast<size_t>(e)] = static_cast<int32_t>(e * kPairs / kExperts);
  DevicePtr offsets = upload(routing.offsets), equal = upload(equal_offsets), gather = upload(routing.gather_idx),
            pair = upload(routing.pair_idx);
  std::vector<float> host_scores(kPairs, 0.5f);
  DevicePtr scores = upload(host_scores), dscores = device_alloc(kPairs * 4);

  // Operands: two sets of the activations and weights, so a call never finds the previous call's in L2.
  const int sets = 2;
  const float weight_scale = 0.03f;
  std::vector<DevicePtr> x, w, dh, c, c32, h, a;
  for (int s = 0; s < sets; ++s) {
    x.push_back(random_bf16(size_t{kTokens} * kHidden, 10 + s));
    w.push_back(random_bf16(size_t{kExperts} * kWidth * kHidden, 20 + s, weight_scale));
    dh.push_back(random_bf16(size_t{kPairs} * kWidth, 30 + s));
    c.push_back(device_alloc(size_t{kExperts} * kWidth * kHidden * 2));  // also holds [P, N] outputs
    c32.push_back(device_alloc(size_t{kExperts} * kWidth * kHidden * 4));
    h.push_back(random_bf16(size_t{kPairs} * kWidth, 40 + s));
    a.push_back(device_alloc(size_t{kPairs} * kWidth * 2));
  }
  const moekit_dtype_t bf16 = MOEKIT_DTYPE_BF16;
  std::vector<Row> rows;

  // Dense baselines of the same FLOPs.
  double forward_us = 0, wgrad_us = 0;
  {
    DenseGemm dense(kPairs, kWidth, kHidden, false);
    // A [P, H]: the first P*H weight values; B [N, H]: the first N*H values of x.
    Timing t = time_calls([&](int s) { dense.run(w[s].get(), x[s].get(), c[s].get(), stream); }, sets, stream, 5, 30);
    forward_us = t.median_us;
    rows.push_back(Row{"cuBLASLt dense 131072x2048x4096 (forward form)", t, kFlops, 0});
    DenseGemm dense_wgrad(kWidth, kHidden, kPairs, true);
    // A [P, N] = dh; B [P, H]: the first P*H weight values.
    t = time_calls([&](int s) { dense_wgrad.run(dh[s].get(), w[s].get(), c[s].get(), stream); }, sets, stream, 5, 30);
    wgrad_us = t.median_us;
    rows.push_back(Row{"cuBLASLt dense 2048x4096, reduction 131072", t, kFlops, 0});
  }

  auto time_gemm = [&](const std::string& name, const moekit_gemm_desc_t& desc,
                       const std::function<moekit_gemm_args_t(int)>& args_for, double flops, double baseline_us,
                       const char* tile = nullptr) {
    moekit_plan_t plan = gemm_plan(handle, desc, tile);
    size_t bytes = 0;
    check(moekit_plan_workspace_size(plan, &bytes), "workspace size");
    DevicePtr workspace = device_alloc(bytes + 256);
    const Timing t = time_calls(
        [&](int s) {
          const moekit_gemm_args_t args = args_for(s);
          check(moekit_gemm(plan, &args, workspace.get(), bytes, stream), "moekit_gemm");
        },
        sets, stream, 5, 30);
    rows.push_back(Row{name, t, flops, baseline_us});
    moekit_plan_destroy(plan);
  };

  moekit_gemm_desc_t d;
  moekit_gemm_desc_init(&d);
  d.groups = kExperts;
  d.max_rows = kPairs;
  d.gather_rows = kTokens;
  d.gather = MOEKIT_GEMM_GATHER_A;
  d.n = kWidth;
  d.k = kHidden;
  for (int variant = 0; variant < 3; ++variant) {
    const bool equal_counts = variant == 1;
    const char* names[] = {"varlen M, gathered, random routing", "varlen M, gathered, 1024 rows per expert",
                           "varlen M, gathered, random, 128x128 tiles"};
    time_gemm(names[variant], d,
              [&](int s) {
                moekit_gemm_args_t args;
                moekit_gemm_args_init(&args);
                args.a = device_tensor(x[s].get(), bf16, {kTokens, kHidden});
                args.b = device_tensor(w[s].get(), bf16, {kExperts, kWidth, kHidden});
                args.offsets = device_tensor(equal_counts ? equal.get() : offsets.get(), MOEKIT_DTYPE_INT32,
                                             {kExperts + 1});
                args.gather_idx = device_tensor(gather.get(), MOEKIT_DTYPE_INT32, {kPairs});
                args.c = device_tensor(c[s].get(), bf16, {kPairs, kWidth});
                return args;
              },
              kFlops, forward_us, variant == 2 ? "128x128" : nullptr);
  }

  moekit_gemm_desc_t gated = d;
  gated.epilogue = MOEKIT_EPILOGUE_GATED;
  time_gemm("varlen M, gathered, GATED SwiGLU (h, a)", gated,
            [&](int s) {
              moekit_gemm_args_t args;
              moekit_gemm_args_init(&args);
              args.a = device_tensor(x[s].get(), bf16, {kTokens, kHidden});
              args.b = device_tensor(w[s].get(), bf16, {kExperts, kWidth, kHidden});
              args.offsets = device_tensor(offsets.get(), MOEKIT_DTYPE_INT32, {kExperts + 1});
              args.gather_idx = device_tensor(gather.get(), MOEKIT_DTYPE_INT32, {kPairs});
              args.c = device_tensor(c[s].get(), bf16, {kPairs, kWidth});
              args.act = device_tensor(a[s].get(), bf16, {kPairs, kWidth / 2});
              return args;
            },
            kFlops, forward_us);

  // DGATED: dA [P, 1024] = dout[gather] [P, 4096] W2[e] (W2 [E, 4096, 1024], KN); half the FLOPs of the above.
  moekit_gemm_desc_t dgated = d;
  dgated.epilogue = MOEKIT_EPILOGUE_DGATED;
  dgated.b_layout = MOEKIT_GEMM_B_KN;
  time_gemm("varlen M, gathered, DGATED SwiGLU (I = 1024, KN)", dgated,
            [&](int s) {
              moekit_gemm_args_t args;
              moekit_gemm_args_init(&args);
              args.a = device_tensor(x[s].get(), bf16, {kTokens, kHidden});
              args.b = device_tensor(w[s].get(), bf16, {kExperts, kHidden, kWidth / 2});
              args.offsets = device_tensor(offsets.get(), MOEKIT_DTYPE_INT32, {kExperts + 1});
              args.gather_idx = device_tensor(gather.get(), MOEKIT_DTYPE_INT32, {kPairs});
              args.h = device_tensor(h[s].get(), bf16, {kPairs, kWidth});
              args.row_scale = device_tensor(scores.get(), MOEKIT_DTYPE_FP32, {kPairs});
              args.pair_idx = device_tensor(pair.get(), MOEKIT_DTYPE_INT32, {kPairs});
              args.c = device_tensor(c[s].get(), bf16, {kPairs, kWidth});
              args.act = device_tensor(a[s].get(), bf16, {kPairs, kWidth / 2});
              args.dscores = device_tensor(dscores.get(), MOEKIT_DTYPE_FP32, {kPairs});
              return args;
            },
            kFlops / 2, forward_us / 2);

  // varlen K: dW[e] [N, H] = dh_e^T x[gather]_e.
  moekit_gemm_desc_t wgrad;
  moekit_gemm_desc_init(&wgrad);
  wgrad.mode = MOEKIT_GEMM_VARLEN_K;
  wgrad.groups = kExperts;
  wgrad.max_rows = kPairs;
  wgrad.gather_rows = kTokens;
  wgrad.gather = MOEKIT_GEMM_GATHER_B;
  wgrad.n = kHidden;
  wgrad.k = kWidth;
  for (int variant = 0; variant < 3; ++variant) {
    const bool fp32 = variant == 1;
    const char* names[] = {"varlen K weight gradient, gather B, bf16 out", "varlen K weight gradient, gather B, fp32 out",
                           "varlen K, gather B, bf16 out, 128x128 tiles"};
    wgrad.out_dtype = fp32 ? MOEKIT_DTYPE_FP32 : bf16;
    time_gemm(names[variant], wgrad,
              [&](int s) {
                moekit_gemm_args_t args;
                moekit_gemm_args_init(&args);
                args.a = device_tensor(dh[s].get(), bf16, {kPairs, kWidth});
                args.b = device_tensor(x[s].get(), bf16, {kTokens, kHidden});
                args.offsets = device_tensor(offsets.get(), MOEKIT_DTYPE_INT32, {kExperts + 1});
                args.gather_idx = device_tensor(gather.get(), MOEKIT_DTYPE_INT32, {kPairs});
                args.c = fp32 ? device_tensor(c32[s].get(), MOEKIT_DTYPE_FP32, {kExperts, kWidth, kHidden})
                              : device_tensor(c[s].get(), bf16, {kExperts, kWidth, kHidden});
                return args;
              },
              kFlops, wgrad_us, variant == 2 ? "128x128" : nullptr);
  }

  check(cudaStreamSynchronize(stream), "synchronize");
  std::printf("\n%-48s %10s %10s %10s  %s\n", "case", "median us", "min us", "max us",
              "TFLOP/s (median) / vs dense cuBLASLt of equal FLOPs");
  for (const Row& r : rows) {
    const double tflops = r.flops / (r.timing.median_us * 1e-6) / 1e12;
    char rate[128];
    if (r.baseline_us > 0)
      std::snprintf(rate, sizeof rate, "%.0f TFLOP/s / %.0f%% of cuBLASLt", tflops, 100.0 * r.baseline_us / r.timing.median_us);
    else
      std::snprintf(rate, sizeof rate, "%.0f TFLOP/s", tflops);
    std::printf("%s\n", format_row(r.name, r.timing, rate).c_str());
  }
  moekit_handle_destroy(handle);
  return 0;
}
