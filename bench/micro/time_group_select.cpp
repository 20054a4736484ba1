// Times moekit_group_select on the CUDA backend (the whole C ABI call: subsample gather, chunked cuBLASLt gate
// GEMM, energy + top-kg kernel, counts) at T = 16384, D = 1024 and 2048, F = 4096 and 8192, G = 32,
// kg = 6.25% of the groups, spg = 0 (all rows) and 8, bf16; and, for comparison, the same pre-activation as one
// cuBLASLt GEMM over all T tokens with the library's settings ([T, NG * pg] bf16 out, fp32 accumulation).
// The selection is compute-bound: the rate is TFLOP/s of the GEMM's 2 * T * (NG * pg) * D and its share of the
// H200's ~790 TFLOP/s dense bf16 peak; the minimum bytes (x, the rows of Wg read, groups, counts) give GB/s.
// Inputs are rotated over enough copies of x to exceed twice the L2 size.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "moekit/moekit.h"
#include "timing.h"

namespace {

using moekit_bench::check;
using moekit_bench::device_tensor;

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s: %s\n", what, cublasLtGetStatusString(status));
    std::exit(1);
  }
}

constexpr double kPeakTflops = 790.0;

struct Case {
  int64_t tokens, d_model, d_ff, group_size, subsample;
  int64_t groups() const { return d_ff / group_size; }
  int64_t top_groups() const { return groups() / 16; }  // 6.25%
  int64_t selected_rows() const { return groups() * (subsample > 0 ? subsample : group_size); }
  std::string name(const char* what) const {
    char text[160];
    std::snprintf(text, sizeof text, "%s T=%lld D=%lld F=%lld kg=%lld spg=%lld", what,
                  static_cast<long long>(tokens), static_cast<long long>(d_model), static_cast<long long>(d_ff),
                  static_cast<long long>(top_groups()), static_cast<long long>(subsample));
    return text;
  }
};

std::string rate_text(const Case& c, double median_us, double bytes, double copy_tbps, const char* note) {
  const double flops = 2.0 * static_cast<double>(c.tokens) * static_cast<double>(c.selected_rows()) *
                       static_cast<double>(c.d_model);
  const double tflops = flops / (median_us * 1e-6) / 1e12;
  const double tbps = bytes / (median_us * 1e-6) / 1e12;
  char rate[200];
  std::snprintf(rate, sizeof rate, "%6.1f TFLOP/s %5.1f%% of peak  %7.1f GB/s %5.1f%% of copy  %s", tflops,
                100 * tflops / kPeakTflops, tbps * 1e3, 100 * tbps / copy_tbps, note);
  return rate;
}

// The whole selection through the C ABI, with or without the optional counts. With them, also checks that the
// counts of the last call sum to T * kg.
std::string time_select(moekit_handle_t handle, const Case& c, const std::vector<void*>& x, void* w_gate,
                        const int32_t* rows, bool with_counts, cudaStream_t stream, double copy_tbps) {
  moekit_sparse_ffn_desc_t desc;
  moekit_sparse_ffn_desc_init(&desc);
  desc.max_tokens = c.tokens;
  desc.d_model = c.d_model;
  desc.d_ff = c.d_ff;
  desc.group_size = c.group_size;
  desc.top_groups = c.top_groups();
  desc.subsample = c.subsample;
  desc.dtype = MOEKIT_DTYPE_BF16;
  moekit_plan_t plan = nullptr;
  check(moekit_group_select_plan_create(handle, &desc, &plan), "moekit_group_select_plan_create");
  size_t workspace_bytes = 0;
  check(moekit_plan_workspace_size(plan, &workspace_bytes), "moekit_plan_workspace_size");
  void* workspace = nullptr;
  int32_t* groups = nullptr;
  int32_t* counts = nullptr;
  float* bias = nullptr;
  check(cudaMalloc(&workspace, workspace_bytes), "cudaMalloc workspace");
  check(cudaMalloc(&groups, static_cast<size_t>(c.tokens * c.top_groups()) * 4), "cudaMalloc groups");
  check(cudaMalloc(&counts, static_cast<size_t>(c.groups()) * 4), "cudaMalloc counts");
  check(cudaMalloc(&bias, static_cast<size_t>(c.groups()) * 4), "cudaMalloc bias");
  check(cudaMemset(bias, 0, static_cast<size_t>(c.groups()) * 4), "cudaMemset bias");

  auto call = [&](int set) {
    moekit_group_select_args_t args;
    moekit_group_select_args_init(&args);
    args.x = device_tensor(x[static_cast<size_t>(set)], MOEKIT_DTYPE_BF16, {c.tokens, c.d_model});
    args.w_gate = device_tensor(w_gate, MOEKIT_DTYPE_BF16, {c.d_ff, c.d_model});
    if (c.subsample > 0)
      args.subsample_rows = device_tensor(const_cast<int32_t*>(rows), MOEKIT_DTYPE_INT32, {c.groups(), c.subsample});
    args.lb_bias = device_tensor(bias, MOEKIT_DTYPE_FP32, {c.groups()});
    args.groups = device_tensor(groups, MOEKIT_DTYPE_INT32, {c.tokens, c.top_groups()});
    if (with_counts) args.counts = device_tensor(counts, MOEKIT_DTYPE_INT32, {c.groups()});
    check(moekit_group_select(plan, &args, workspace, workspace_bytes, stream), "moekit_group_select");
  };
  const moekit_bench::Timing t = moekit_bench::time_calls(call, static_cast<int>(x.size()), stream, 10, 100);
  check(cudaStreamSynchronize(stream), "timed runs");

  std::vector<int32_t> host(static_cast<size_t>(c.groups()));
  check(cudaMemcpy(host.data(), counts, host.size() * 4, cudaMemcpyDeviceToHost), "download counts");
  int64_t total = 0;
  for (int32_t n : host) total += n;
  const bool ok = !with_counts || total == c.tokens * c.top_groups();

  cudaFree(workspace);
  cudaFree(groups);
  cudaFree(counts);
  cudaFree(bias);
  moekit_plan_destroy(plan);
  const double bytes = static_cast<double>(c.tokens * c.d_model * 2 + c.selected_rows() * c.d_model * 2 +
                                           c.tokens * c.top_groups() * 4 + c.groups() * 4);
  char note[64];
  std::snprintf(note, sizeof note, "ws %.1f MiB  %s", static_cast<double>(workspace_bytes) / (1 << 20),
                !with_counts ? "no counts" : ok ? "counts verified" : "COUNTS WRONG");
  return moekit_bench::format_row(c.name(with_counts ? "select" : "select -counts"), t, rate_text(c, t.median_us, bytes, copy_tbps, note));
}

// The pre-activation of all T tokens as one cuBLASLt GEMM: pre [T, R] = x [T, D] · w [R, D]^T, bf16 out,
// fp32 accumulation, the library's preferences (4 MiB workspace, fp32 split-K reduction, 16-byte alignment).
std::string time_gemm(cublasLtHandle_t handle, const Case& c, const std::vector<void*>& x, void* w, cudaStream_t stream,
                      double copy_tbps) {
  const int64_t R = c.selected_rows(), D = c.d_model, T = c.tokens;
  void* pre = nullptr;
  void* workspace = nullptr;
  const size_t workspace_bytes = size_t{4} << 20;
  check(cudaMalloc(&pre, static_cast<size_t>(T * R) * 2), "cudaMalloc pre");
  check(cudaMalloc(&workspace, workspace_bytes), "cudaMalloc gemm workspace");
  cublasLtMatmulDescOpaque_t op;
  cublasLtMatrixLayoutOpaque_t a, b, d;
  check_cublas(cublasLtMatmulDescInit(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc");
  const cublasOperation_t transpose = CUBLAS_OP_T, none = CUBLAS_OP_N;
  check_cublas(cublasLtMatmulDescSetAttribute(&op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose), "TRANSA");
  check_cublas(cublasLtMatmulDescSetAttribute(&op, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof none), "TRANSB");
  check_cublas(cublasLtMatrixLayoutInit(&a, CUDA_R_16BF, D, R, D), "A layout");
  check_cublas(cublasLtMatrixLayoutInit(&b, CUDA_R_16BF, D, T, D), "B layout");
  check_cublas(cublasLtMatrixLayoutInit(&d, CUDA_R_16BF, R, T, R), "D layout");
  // The library's preferences, and its fallback (no workspace) should those find nothing.
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  for (uint64_t max_workspace : {static_cast<uint64_t>(workspace_bytes), uint64_t{0}}) {
    cublasLtMatmulPreferenceOpaque_t pref;
    check_cublas(cublasLtMatmulPreferenceInit(&pref), "preference");
    check_cublas(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace,
                                                      sizeof max_workspace),
                 "workspace preference");
    const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    check_cublas(cublasLtMatmulPreferenceSetAttribute(&pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction,
                                                      sizeof reduction),
                 "reduction preference");
    const uint32_t alignment = 16;
    for (auto attribute : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                           CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      check_cublas(cublasLtMatmulPreferenceSetAttribute(&pref, attribute, &alignment, sizeof alignment), "alignment");
    if (cublasLtMatmulAlgoGetHeuristic(handle, &op, &a, &b, &d, &d, &pref, 1, &result, &found) ==
            CUBLAS_STATUS_SUCCESS &&
        found > 0)
      break;
    found = 0;
  }
  if (found < 1) {
    std::fprintf(stderr, "no cuBLASLt algorithm\n");
    std::exit(1);
  }
  const float one = 1.0f, zero = 0.0f;
  auto call = [&](int set) {
    check_cublas(cublasLtMatmul(handle, &op, &one, w, &a, x[static_cast<size_t>(set)], &b, &zero, pre, &d, pre, &d,
                                &result.algo, workspace, workspace_bytes, stream),
                 "cublasLtMatmul");
  };
  const moekit_bench::Timing t = moekit_bench::time_calls(call, static_cast<int>(x.size()), stream, 10, 100);
  check(cudaStreamSynchronize(stream), "timed GEMMs");
  cudaFree(pre);
  cudaFree(workspace);
  const double bytes = static_cast<double>(T * D * 2 + R * D * 2 + T * R * 2);
  return moekit_bench::format_row(c.name("gemm alone"), t, rate_text(c, t.median_us, bytes, copy_tbps, "[T, R] out"));
}

}  // namespace

int main() {
  moekit_handle_desc_t hdesc;
  moekit_handle_desc_init(&hdesc);
  hdesc.backend = MOEKIT_BACKEND_CUDA;
  moekit_handle_t handle = nullptr;
  check(moekit_handle_create(&hdesc, &handle), "moekit_handle_create");
  cublasLtHandle_t lt = nullptr;
  check_cublas(cublasLtCreate(&lt), "cublasLtCreate");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const double copy_tbps = moekit_bench::measured_copy_tbps(size_t{256} << 20, stream);

  std::vector<std::string> rows;
  for (int64_t d_model : {1024, 2048})
    for (int64_t d_ff : {4096, 8192}) {
      const int64_t tokens = 16384, group_size = 32;
      const size_t x_bytes = static_cast<size_t>(tokens * d_model) * 2;
      const int sets = moekit_bench::rotation_sets(x_bytes);
      std::vector<void*> x(static_cast<size_t>(sets));
      for (size_t i = 0; i < x.size(); ++i) {
        check(cudaMalloc(&x[i], x_bytes), "cudaMalloc x");
        moekit_bench::fill_random_bf16(x[i], static_cast<size_t>(tokens * d_model), 1.0f, 11 + i);
      }
      void* w_gate = nullptr;
      check(cudaMalloc(&w_gate, static_cast<size_t>(d_ff * d_model) * 2), "cudaMalloc w_gate");
      moekit_bench::fill_random_bf16(w_gate, static_cast<size_t>(d_ff * d_model), 0.1f, 5);
      const int64_t groups = d_ff / group_size, spg = 8;
      std::vector<int32_t> host_rows(static_cast<size_t>(groups * spg));
      check(moekit_subsample_rows(1234, groups, group_size, spg, host_rows.data()), "moekit_subsample_rows");
      int32_t* rows_device = nullptr;
      check(cudaMalloc(&rows_device, host_rows.size() * 4), "cudaMalloc rows");
      check(cudaMemcpy(rows_device, host_rows.data(), host_rows.size() * 4, cudaMemcpyHostToDevice), "rows");

      for (int64_t subsample : {int64_t{0}, spg}) {
        const Case c{tokens, d_model, d_ff, group_size, subsample};
        rows.push_back(time_select(handle, c, x, w_gate, rows_device, true, stream, copy_tbps));
        rows.push_back(time_select(handle, c, x, w_gate, rows_device, false, stream, copy_tbps));
        // With a subsample the GEMM reads only the first NG * spg rows of Wg: the same cost as the gathered rows.
        rows.push_back(time_gemm(lt, c, x, w_gate, stream, copy_tbps));
      }
      for (void* p : x) cudaFree(p);
      cudaFree(w_gate);
      cudaFree(rows_device);
    }

  std::printf("device: %s, measured copy ceiling %.2f TB/s, bf16 peak taken as %.0f TFLOP/s\n", prop.name, copy_tbps,
              kPeakTflops);
  std::printf("%-48s %10s %10s %10s  %s\n", "case", "median us", "min us", "max us", "rate");
  for (const std::string& r : rows) std::printf("%s\n", r.c_str());
  cublasLtDestroy(lt);
  cudaStreamDestroy(stream);
  moekit_handle_destroy(handle);
  return 0;
}
