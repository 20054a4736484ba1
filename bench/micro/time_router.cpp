// Times moekit_router_forward / moekit_router_backward on the CUDA backend (the whole C ABI call) at the issue's
// shape, T = 32768 with E = 256 and E = 128, K = 8, bf16 logits, plus a few other kinds and E = 4096.
// Each timed unit is a CUDA graph of `sets` calls, one per copy of the buffers (rotated past the L2 size), so the
// per-call figure is GPU time without host launch gaps; one row also times plain stream calls for comparison.
// Bytes counted (the minimum): forward reads the logits and writes scores, int32 indices and counts (not the
// per-block counts in the workspace); backward reads the K selected logits, indices and dscores (and the whole
// logits row for TOPK_SOFTMAX) and writes dlogits.
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

struct Case {
  std::string name;
  int64_t tokens, experts, top_k;
  moekit_router_kind_t kind;
  bool backward;
  moekit_dtype_t dlogits_dtype;  // backward: fp32 or bf16
  bool stream_calls;             // time plain stream calls instead of graphs
  bool counts = true;            // forward: request the per-expert counts
};

// One copy of a call's buffers.
struct DeviceSet {
  void* logits = nullptr;   // [T, E] bf16
  float* bias = nullptr;    // [E]
  float* scores = nullptr;  // [T, K] (backward: dscores)
  int32_t* indices = nullptr;
  int32_t* counts = nullptr;
  void* dlogits = nullptr;  // [T, E]
};

std::string run_case(moekit_handle_t handle, const Case& c, cudaStream_t stream, double copy_tbps) {
  const int64_t T = c.tokens, E = c.experts, K = c.top_k;
  moekit_router_desc_t desc;
  moekit_router_desc_init(&desc);
  desc.max_tokens = T;
  desc.experts = E;
  desc.top_k = K;
  desc.kind = c.kind;
  desc.renormalize = c.kind == MOEKIT_ROUTER_SOFTMAX_TOPK ? 0 : 1;
  desc.dtype = MOEKIT_DTYPE_BF16;
  moekit_plan_t plan = nullptr;
  check(moekit_router_plan_create(handle, &desc, &plan), "moekit_router_plan_create");
  size_t workspace_bytes = 0;
  check(moekit_plan_workspace_size(plan, &workspace_bytes), "moekit_plan_workspace_size");
  void* workspace = nullptr;
  check(cudaMalloc(&workspace, workspace_bytes + 1), "cudaMalloc workspace");

  const size_t logits_bytes = static_cast<size_t>(T * E) * 2;
  const size_t pair_bytes = static_cast<size_t>(T * K) * 4;
  const size_t dlogits_bytes = static_cast<size_t>(T * E) * (c.dlogits_dtype == MOEKIT_DTYPE_FP32 ? 4 : 2);
  double bytes = 0;
  if (!c.backward) {
    bytes = static_cast<double>(logits_bytes + 2 * pair_bytes + static_cast<size_t>(E) * 4);
  } else {
    const double logits_read = c.kind == MOEKIT_ROUTER_TOPK_SOFTMAX ? static_cast<double>(logits_bytes)
                                                                     : static_cast<double>(T * K * 2);
    bytes = logits_read + 2.0 * static_cast<double>(pair_bytes) + static_cast<double>(dlogits_bytes);
  }
  const int sets = moekit_bench::rotation_sets(logits_bytes + 2 * pair_bytes + (c.backward ? dlogits_bytes : 0));

  std::vector<DeviceSet> device(static_cast<size_t>(sets));
  for (size_t i = 0; i < device.size(); ++i) {
    DeviceSet& d = device[i];
    check(cudaMalloc(&d.logits, logits_bytes), "cudaMalloc logits");
    moekit_bench::fill_random_bf16(d.logits, static_cast<size_t>(T * E), 3.0f, 17 + i);
    check(cudaMalloc(&d.bias, static_cast<size_t>(E) * 4), "cudaMalloc bias");
    check(cudaMemset(d.bias, 0, static_cast<size_t>(E) * 4), "cudaMemset bias");
    check(cudaMalloc(&d.scores, pair_bytes), "cudaMalloc scores");
    check(cudaMalloc(&d.indices, pair_bytes), "cudaMalloc indices");
    check(cudaMalloc(&d.counts, static_cast<size_t>(E) * 4), "cudaMalloc counts");
    if (c.backward) check(cudaMalloc(&d.dlogits, dlogits_bytes), "cudaMalloc dlogits");
  }

  auto forward = [&](DeviceSet& d) {
    moekit_router_fwd_args_t args;
    moekit_router_fwd_args_init(&args);
    args.logits = device_tensor(d.logits, MOEKIT_DTYPE_BF16, {T, E});
    if (c.kind == MOEKIT_ROUTER_SIGMOID) args.bias = device_tensor(d.bias, MOEKIT_DTYPE_FP32, {E});
    args.scores = device_tensor(d.scores, MOEKIT_DTYPE_FP32, {T, K});
    args.indices = device_tensor(d.indices, MOEKIT_DTYPE_INT32, {T, K});
    if (c.counts) args.counts = device_tensor(d.counts, MOEKIT_DTYPE_INT32, {E});
    check(moekit_router_forward(plan, &args, workspace, workspace_bytes, stream), "moekit_router_forward");
  };
  auto backward = [&](DeviceSet& d) {
    moekit_router_bwd_args_t args;
    moekit_router_bwd_args_init(&args);
    args.logits = device_tensor(d.logits, MOEKIT_DTYPE_BF16, {T, E});
    args.indices = device_tensor(d.indices, MOEKIT_DTYPE_INT32, {T, K});
    args.dscores = device_tensor(d.scores, MOEKIT_DTYPE_FP32, {T, K});
    args.dlogits = device_tensor(d.dlogits, c.dlogits_dtype, {T, E});
    check(moekit_router_backward(plan, &args, workspace, workspace_bytes, stream), "moekit_router_backward");
  };
  // The backward's indices are the forward's; its dscores are the forward's scores.
  if (c.backward)
    for (DeviceSet& d : device) forward(d);
  check(cudaStreamSynchronize(stream), "set-up");
  auto call = [&](int set) {
    DeviceSet& d = device[static_cast<size_t>(set)];
    if (c.backward) {
      backward(d);
    } else {
      forward(d);
    }
  };

  moekit_bench::Timing t{};
  if (c.stream_calls) {
    t = moekit_bench::time_calls(call, sets, stream, 20, 200);
  } else {
    cudaGraph_t graph = nullptr;
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    for (int s = 0; s < sets; ++s) call(s);
    check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    t = moekit_bench::time_calls([&](int) { check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch"); }, 1,
                                 stream, 5, 50);
    t.median_us /= sets;
    t.min_us /= sets;
    t.max_us /= sets;
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  check(cudaStreamSynchronize(stream), "timed runs");

  // A sanity check of the timed calls: the forward's counts sum to T*K.
  bool ok = true;
  if (!c.backward && c.counts) {
    std::vector<int32_t> counts(static_cast<size_t>(E));
    check(cudaMemcpy(counts.data(), device.back().counts, counts.size() * 4, cudaMemcpyDeviceToHost),
               "download counts");
    int64_t total = 0;
    for (int32_t n : counts) total += n;
    ok = total == T * K;
  }

  for (DeviceSet& d : device) {
    cudaFree(d.logits);
    cudaFree(d.bias);
    cudaFree(d.scores);
    cudaFree(d.indices);
    cudaFree(d.counts);
    cudaFree(d.dlogits);
  }
  cudaFree(workspace);
  moekit_plan_destroy(plan);

  const double tbps = bytes / (t.median_us * 1e-6) / 1e12;
  char rate[160];
  std::snprintf(rate, sizeof rate, "%8.1f GB/s  %5.1f%% of copy  %.1f MB  %s", tbps * 1e3, 100 * tbps / copy_tbps,
                bytes / 1e6, ok ? "verified" : "WRONG");
  return moekit_bench::format_row(c.name, t, rate);
}

}  // namespace

int main() {
  moekit_handle_desc_t hdesc;
  moekit_handle_desc_init(&hdesc);
  hdesc.backend = MOEKIT_BACKEND_CUDA;
  moekit_handle_t handle = nullptr;
  check(moekit_handle_create(&hdesc, &handle), "moekit_handle_create");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const double copy_tbps = moekit_bench::measured_copy_tbps(size_t{256} << 20, stream);

  const moekit_dtype_t fp32 = MOEKIT_DTYPE_FP32, bf16 = MOEKIT_DTYPE_BF16;
  const Case cases[] = {
      {"fwd SOFTMAX_TOPK T=32768 E=256 K=8", 32768, 256, 8, MOEKIT_ROUTER_SOFTMAX_TOPK, false, fp32, false},
      {"fwd SOFTMAX_TOPK T=32768 E=128 K=8", 32768, 128, 8, MOEKIT_ROUTER_SOFTMAX_TOPK, false, fp32, false},
      {"fwd SOFTMAX_TOPK E=256 K=8, stream calls", 32768, 256, 8, MOEKIT_ROUTER_SOFTMAX_TOPK, false, fp32, true},
      {"fwd SOFTMAX_TOPK E=256 K=8, no counts", 32768, 256, 8, MOEKIT_ROUTER_SOFTMAX_TOPK, false, fp32, false, false},
      {"fwd TOPK_SOFTMAX+renorm T=32768 E=256 K=8", 32768, 256, 8, MOEKIT_ROUTER_TOPK_SOFTMAX, false, fp32, false},
      {"fwd SIGMOID+renorm T=32768 E=256 K=8", 32768, 256, 8, MOEKIT_ROUTER_SIGMOID, false, fp32, false},
      {"fwd SOFTMAX_TOPK T=32768 E=4096 K=8", 32768, 4096, 8, MOEKIT_ROUTER_SOFTMAX_TOPK, false, fp32, false},
      {"fwd SOFTMAX_TOPK E=4096 K=8, no counts", 32768, 4096, 8, MOEKIT_ROUTER_SOFTMAX_TOPK, false, fp32, false, false},
      {"bwd SOFTMAX_TOPK T=32768 E=256 K=8 fp32 dl", 32768, 256, 8, MOEKIT_ROUTER_SOFTMAX_TOPK, true, fp32, false},
      {"bwd SOFTMAX_TOPK T=32768 E=256 K=8 bf16 dl", 32768, 256, 8, MOEKIT_ROUTER_SOFTMAX_TOPK, true, bf16, false},
      {"bwd SOFTMAX_TOPK T=32768 E=128 K=8 fp32 dl", 32768, 128, 8, MOEKIT_ROUTER_SOFTMAX_TOPK, true, fp32, false},
      {"bwd TOPK_SOFTMAX+renorm E=256 K=8 fp32 dl", 32768, 256, 8, MOEKIT_ROUTER_TOPK_SOFTMAX, true, fp32, false},
  };
  std::vector<std::string> rows;
  for (const Case& c : cases) rows.push_back(run_case(handle, c, stream, copy_tbps));

  std::printf("moekit router on %s (copy ceiling %.2f TB/s measured), bf16 logits, int32 indices, counts on\n",
              prop.name, copy_tbps);
  std::printf("%-48s %10s %10s %10s  %s\n", "case", "median us", "min us", "max us", "rate");
  for (const std::string& row : rows) std::printf("%s\n", row.c_str());
  cudaStreamDestroy(stream);
  moekit_handle_destroy(handle);
  return 0;
}
