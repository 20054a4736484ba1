// Times moekit_dispatch on the CUDA backend for the shapes: T = 32768 with uniform random routing over
// E = 128 (K = 8), E = 256 (K = 16), E = 4096 (K = 8), int64 ids, general routing; plus the floor of three
// dependent tiny operations on the stream. Per case: the whole C ABI call between two events ("call": argument
// checks and three launches, so host cost shows when it exceeds the GPU's), the same call captured in a CUDA
// graph ("graph": the GPU's time alone), and the host time to enqueue one call. Inputs and outputs are rotated
// past the L2 size. Bytes counted: ids read once, gather_idx / pair_idx / grouped_pos written.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "moekit/moekit.h"
#include "timing.h"

namespace {

using moekit_bench::check;
using moekit_bench::device_tensor;

struct Case {
  std::string name;
  int64_t tokens, top_k, experts;
  bool int64_ids;
  bool general;  // general routing: 0..2K pairs per token (K on average), top_k then gives the average
};

struct DeviceSet {
  void* ids = nullptr;
  void* tok_offsets = nullptr;
  int32_t* outputs = nullptr;  // gather_idx, pair_idx, grouped_pos back to back, then expert_offsets
};

// The calls captured once per rotation set and replayed as graphs; empty timing (runs = 0) when capture fails.
moekit_bench::Timing time_graphs(const std::function<void(int)>& run, int sets, cudaStream_t stream) {
  std::vector<cudaGraphExec_t> graphs;
  for (int set = 0; set < sets; ++set) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed) != cudaSuccess) break;
    run(set);
    bool ok = cudaStreamEndCapture(stream, &graph) == cudaSuccess &&
              cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    if (graph) cudaGraphDestroy(graph);
    if (!ok) break;
    graphs.push_back(exec);
  }
  moekit_bench::Timing t{0, 0, 0, 0};
  if (static_cast<int>(graphs.size()) == sets)
    t = moekit_bench::time_calls(
        [&](int set) { check(cudaGraphLaunch(graphs[static_cast<size_t>(set)], stream), "cudaGraphLaunch"); },
        sets, stream, 20, 200);
  else
    std::fprintf(stderr, "graph capture failed: %s\n", cudaGetErrorString(cudaGetLastError()));
  for (cudaGraphExec_t g : graphs) cudaGraphExecDestroy(g);
  return t;
}

std::vector<std::string> run_case(moekit_handle_t handle, const Case& c, cudaStream_t stream, double copy_tbps) {
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<int64_t> expert(0, c.experts - 1);
  std::vector<int32_t> offsets{0};
  int64_t pairs = c.tokens * c.top_k;
  if (c.general) {
    std::uniform_int_distribution<int64_t> per_token(0, 2 * c.top_k);
    for (int64_t t = 0; t < c.tokens; ++t) offsets.push_back(offsets.back() + static_cast<int32_t>(per_token(rng)));
    pairs = offsets.back();
  }
  size_t id_bytes = static_cast<size_t>(pairs) * (c.int64_ids ? 8 : 4);
  std::vector<unsigned char> ids(id_bytes);
  for (int64_t p = 0; p < pairs; ++p) {
    int64_t id = expert(rng);
    if (c.int64_ids)
      reinterpret_cast<int64_t*>(ids.data())[p] = id;
    else
      reinterpret_cast<int32_t*>(ids.data())[p] = static_cast<int32_t>(id);
  }

  moekit_dispatch_desc_t desc;
  moekit_dispatch_desc_init(&desc);
  desc.max_tokens = c.tokens;
  desc.top_k = c.general ? 0 : c.top_k;
  desc.max_pairs = c.general ? pairs : 0;
  desc.experts = c.experts;
  moekit_plan_t plan = nullptr;
  check(moekit_dispatch_plan_create(handle, &desc, &plan), "moekit_dispatch_plan_create");
  size_t workspace_bytes = 0;
  check(moekit_plan_workspace_size(plan, &workspace_bytes), "moekit_plan_workspace_size");
  void* workspace = nullptr;
  check(cudaMalloc(&workspace, workspace_bytes + 1), "cudaMalloc workspace");

  size_t output_bytes = (3 * static_cast<size_t>(pairs) + static_cast<size_t>(c.experts) + 1) * 4;
  size_t set_bytes = id_bytes + output_bytes;
  int sets = moekit_bench::rotation_sets(set_bytes);
  std::vector<DeviceSet> device(static_cast<size_t>(sets));
  for (DeviceSet& d : device) {
    check(cudaMalloc(&d.ids, id_bytes), "cudaMalloc ids");
    check(cudaMemcpy(d.ids, ids.data(), id_bytes, cudaMemcpyHostToDevice), "upload ids");
    check(cudaMalloc(reinterpret_cast<void**>(&d.outputs), output_bytes), "cudaMalloc outputs");
    if (c.general) {
      check(cudaMalloc(&d.tok_offsets, offsets.size() * 4), "cudaMalloc tok_offsets");
      check(cudaMemcpy(d.tok_offsets, offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice),
                 "upload tok_offsets");
    }
  }
  moekit_dtype_t id_dtype = c.int64_ids ? MOEKIT_DTYPE_INT64 : MOEKIT_DTYPE_INT32;
  auto run = [&](int set) {
    DeviceSet& d = device[static_cast<size_t>(set)];
    moekit_dispatch_args_t args;
    moekit_dispatch_args_init(&args);
    if (c.general) {
      args.indices = device_tensor(d.ids, id_dtype, {pairs});
      args.tok_offsets = device_tensor(d.tok_offsets, MOEKIT_DTYPE_INT32, {c.tokens + 1});
    } else {
      args.indices = device_tensor(d.ids, id_dtype, {c.tokens, c.top_k});
    }
    args.gather_idx = device_tensor(d.outputs, MOEKIT_DTYPE_INT32, {pairs});
    args.pair_idx = device_tensor(d.outputs + pairs, MOEKIT_DTYPE_INT32, {pairs});
    args.grouped_pos = device_tensor(d.outputs + 2 * pairs, MOEKIT_DTYPE_INT32, {pairs});
    args.expert_offsets = device_tensor(d.outputs + 3 * pairs, MOEKIT_DTYPE_INT32, {c.experts + 1});
    check(moekit_dispatch(plan, &args, workspace, workspace_bytes, stream), "moekit_dispatch");
  };
  moekit_bench::Timing t = moekit_bench::time_calls(run, sets, stream, 20, 200);
  check(cudaStreamSynchronize(stream), "dispatch runs");
  moekit_bench::Timing graph = time_graphs(run, sets, stream);
  constexpr int kHostCalls = 200;
  auto host_start = std::chrono::steady_clock::now();
  for (int i = 0; i < kHostCalls; ++i) run(i % sets);
  double host_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - host_start).count() / kHostCalls;
  check(cudaStreamSynchronize(stream), "dispatch runs");

  // The result of the last set must be a permutation of the pairs (a cheap sanity check of the timed calls).
  std::vector<int32_t> out(3 * static_cast<size_t>(pairs) + static_cast<size_t>(c.experts) + 1);
  check(cudaMemcpy(out.data(), device.back().outputs, output_bytes, cudaMemcpyDeviceToHost), "download");
  bool ok = out[3 * static_cast<size_t>(pairs) + static_cast<size_t>(c.experts)] == pairs;
  for (int64_t i = 0; ok && i < pairs; ++i) {
    int64_t p = out[static_cast<size_t>(pairs + i)];
    ok = p >= 0 && p < pairs && out[static_cast<size_t>(2 * pairs + p)] == i;
  }

  for (DeviceSet& d : device) {
    cudaFree(d.ids);
    cudaFree(d.outputs);
    cudaFree(d.tok_offsets);
  }
  cudaFree(workspace);
  moekit_plan_destroy(plan);

  double bytes = static_cast<double>(id_bytes) + 3.0 * static_cast<double>(pairs) * 4;
  auto rate = [&](const moekit_bench::Timing& timing, const std::string& extra) {
    double tbps = bytes / (timing.median_us * 1e-6) / 1e12;
    char text[200];
    std::snprintf(text, sizeof text, "%8.1f GB/s  %5.1f%% of copy  %s", tbps * 1e3, 100 * tbps / copy_tbps,
                  extra.c_str());
    return std::string(text);
  };
  char extra[160];
  std::snprintf(extra, sizeof extra, "P=%lld  host enqueue %.1f us  %s", static_cast<long long>(pairs), host_us,
                ok ? "verified" : "WRONG");
  std::vector<std::string> rows{moekit_bench::format_row(c.name + "  call", t, rate(t, extra))};
  if (graph.runs > 0) rows.push_back(moekit_bench::format_row(c.name + "  graph", graph, rate(graph, "")));
  return rows;
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
  double copy_tbps = moekit_bench::measured_copy_tbps(size_t{256} << 20, stream);

  const Case cases[] = {
      {"T=32768 K=8 E=128 int32 ids", 32768, 8, 128, false, false},
      {"T=32768 K=8 E=128 int64 ids", 32768, 8, 128, true, false},
      {"T=32768 K=16 E=256 int32 ids", 32768, 16, 256, false, false},
      {"T=32768 K=8 E=4096 int32 ids", 32768, 8, 4096, false, false},
      {"T=4096 K=8 E=128 int32 ids", 4096, 8, 128, false, false},
      {"general T=32768 0..16 pairs E=128", 32768, 8, 128, false, true},
  };
  std::vector<std::string> rows;
  for (const Case& c : cases)
    for (const std::string& row : run_case(handle, c, stream, copy_tbps)) rows.push_back(row);

  // The floor: three dependent 4-byte memsets, the launch cost of a three-kernel chain on this stream.
  void* tiny = nullptr;
  check(cudaMalloc(&tiny, 16), "cudaMalloc");
  moekit_bench::Timing floor = moekit_bench::time_calls(
      [&](int) {
        for (int i = 0; i < 3; ++i) check(cudaMemsetAsync(tiny, i, 4, stream), "cudaMemsetAsync");
      },
      1, stream, 20, 200);
  cudaFree(tiny);
  rows.push_back(moekit_bench::format_row("floor: 3 dependent 4-byte memsets", floor, ""));

  std::printf("moekit_dispatch on %s (copy ceiling %.2f TB/s measured)\n", prop.name, copy_tbps);
  std::printf("%-48s %10s %10s %10s  %s\n", "case", "median us", "min us", "max us", "rate");
  for (const std::string& row : rows) std::printf("%s\n", row.c_str());
  cudaStreamDestroy(stream);
  moekit_handle_destroy(handle);
  return 0;
}
