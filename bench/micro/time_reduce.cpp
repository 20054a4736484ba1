// Timing of the CUDA token reductions through the C ABI (moekit_time_reduce): combine and the broadcast backward at
// T = 32768, K = 8, H = 4096 (random routing over E = 128 experts, every pair valid), the combine also at (T, H) =
// (24576, 1536) and (40960, 768) with K = 8, 4 and 2, db1 at E = 128, 2I = 2048 over the same P = 262144 grouped
// rows, db2 + ds at H = 4096. Prints the median/min/max time per call, the GB/s the minimum bytes give at the
// median, and the percentage of the device-copy ceiling measured in the same run.
// Minimum bytes: every input byte read once and every output byte written once (y or dh rows, the gathered dout
// rows of each pair, index and score tensors), nothing for the workspace.
// NOTE: db2 + ds reads each token's dout row once per pair (K times); rows that blocks running at the same time
// share can come from L2, so its rate may pass the copy ceiling.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "moekit/moekit.h"
#include "timing.h"

using namespace moekit_bench;

namespace {

constexpr int64_t kTokens = 32768, kTopK = 8, kExperts = 128, kHidden = 4096, kGatedWidth = 2048;
constexpr int64_t kPairs = kTokens * kTopK;

struct DeviceMemory {
  void* data = nullptr;
  explicit DeviceMemory(size_t bytes) { check(cudaMalloc(&data, std::max<size_t>(bytes, 1)), "cudaMalloc"); }
  ~DeviceMemory() { cudaFree(data); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
};

template <class T>
void upload(DeviceMemory& dst, const std::vector<T>& src) {
  check(cudaMemcpy(dst.data, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
}

moekit_tensor_t view(void* data, moekit_dtype_t dtype, std::vector<int64_t> shape) {
  const moekit_device_t device{MOEKIT_DEVICE_CUDA, 0};
  return moekit_tensor_make(data, dtype, static_cast<int32_t>(shape.size()), shape.data(), device);
}

using DeviceSets = std::vector<std::unique_ptr<DeviceMemory>>;

// `sets` buffers of `bytes` each, one per rotation set; with a seed, filled with random bf16 values (set s drawn
// from seed + s).
DeviceSets device_sets(size_t bytes, int sets, unsigned long long seed = 0) {
  DeviceSets buffers;
  for (int s = 0; s < sets; ++s) {
    buffers.push_back(std::make_unique<DeviceMemory>(bytes));
    if (seed != 0) fill_random_bf16_repeated(buffers.back()->data, bytes / 2, 1.0f, seed + s);
  }
  return buffers;
}

struct Row {
  std::string name;
  Timing timing;
  double bytes;
};

// Times the combine of `tokens` tokens, K = `top_k`, H = `hidden` (bf16, beta = 0) over `routing` with weights
// `scores` [tokens, K], and with `broadcast` the broadcast backward of the same shape; appends their rows.
void time_combine(moekit_handle_t handle, cudaStream_t stream, const Routing& routing,
                  const std::vector<float>& scores, int64_t tokens, int64_t top_k, int64_t hidden, bool broadcast,
                  std::vector<Row>& rows) {
  const int64_t pairs = tokens * top_k;
  DeviceMemory grouped_pos(pairs * 4), weights(pairs * 4);
  upload(grouped_pos, routing.grouped_pos);
  upload(weights, scores);
  const size_t y_bytes = size_t(pairs * hidden * 2), out_bytes = size_t(tokens * hidden * 2);
  const int sets = rotation_sets(y_bytes + out_bytes);
  const DeviceSets ys = device_sets(y_bytes, sets, 100), outs = device_sets(out_bytes, sets);
  moekit_combine_desc_t desc;
  moekit_combine_desc_init(&desc);
  desc.max_tokens = tokens;
  desc.top_k = top_k;
  desc.hidden = hidden;
  desc.dtype = MOEKIT_DTYPE_BF16;
  moekit_plan_t plan = nullptr;
  check(moekit_combine_plan_create(handle, &desc, &plan), "combine plan");
  for (int weighted = 1; weighted >= (broadcast ? 0 : 1); --weighted) {
    const auto run = [&](int s) {
      moekit_combine_args_t args;
      moekit_combine_args_init(&args);
      args.grouped = view(ys[s]->data, MOEKIT_DTYPE_BF16, {pairs, hidden});
      if (weighted) args.scores = view(weights.data, MOEKIT_DTYPE_FP32, {tokens, top_k});
      args.grouped_pos = view(grouped_pos.data, MOEKIT_DTYPE_INT32, {pairs});
      args.out = view(outs[s]->data, MOEKIT_DTYPE_BF16, {tokens, hidden});
      check(weighted ? moekit_combine(plan, &args, nullptr, 0, stream)
                     : moekit_broadcast_backward(plan, &args, nullptr, 0, stream),
            "combine");
    };
    const double bytes = static_cast<double>(y_bytes + out_bytes + pairs * 4 + (weighted ? pairs * 4 : 0));
    const std::string shape = "T=" + std::to_string(tokens) + " K=" + std::to_string(top_k) +
                              " H=" + std::to_string(hidden);
    rows.push_back(Row{weighted ? "combine " + shape + " bf16 beta=0" : "broadcast backward " + shape,
                       time_calls(run, sets, stream), bytes});
  }
  moekit_plan_destroy(plan);
}

}  // namespace

int main() {
  try {
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    moekit_handle_desc_t handle_desc;
    moekit_handle_desc_init(&handle_desc);
    handle_desc.backend = MOEKIT_BACKEND_CUDA;
    moekit_handle_t handle = nullptr;
    check(moekit_handle_create(&handle_desc, &handle), "moekit_handle_create");

    const double copy_tbps = measured_copy_tbps(size_t{1} << 30, stream);
    std::printf("device: %s, %d SMs; device copy ceiling (1 GiB, read + write): %.2f TB/s\n", prop.name,
                prop.multiProcessorCount, copy_tbps);

    const Routing routing = random_routing(kTokens, kExperts, kTopK, 7);
    DeviceMemory gather_idx(kPairs * 4), pair_idx(kPairs * 4), offsets((kExperts + 1) * 4);
    upload(gather_idx, routing.gather_idx);
    upload(pair_idx, routing.pair_idx);
    upload(offsets, routing.offsets);
    std::vector<float> host_scores(kPairs);
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    for (float& s : host_scores) s = unit(rng);
    DeviceMemory scores(kPairs * 4), dscores(kPairs * 4);
    upload(scores, host_scores);
    upload(dscores, host_scores);

    std::vector<Row> rows;

    // The combine at the layer's largest shape, with the broadcast backward; then at the SonicMoE figure's smaller
    // hidden sizes (their H / 8 vectors per row are not a power of two) and its top-k of 8, 4 and 2 (the few-pairs
    // kernel from 4 down), each with its own random routing.
    time_combine(handle, stream, routing, host_scores, kTokens, kTopK, kHidden, true, rows);
    for (const auto& [tokens, hidden] : {std::pair<int64_t, int64_t>{24576, 1536}, {40960, 768}})
      for (const int64_t top_k : {8, 4, 2}) {
        const Routing shape_routing = random_routing(tokens, kExperts, top_k, 8);
        std::vector<float> shape_scores(static_cast<size_t>(tokens * top_k));
        for (float& s : shape_scores) s = unit(rng);
        time_combine(handle, stream, shape_routing, shape_scores, tokens, top_k, hidden, false, rows);
      }

    {  // db1
      const size_t dh_bytes = size_t{kPairs} * kGatedWidth * 2;
      const int sets = rotation_sets(dh_bytes);
      const DeviceSets dhs = device_sets(dh_bytes, sets, 200);
      DeviceMemory db1(kExperts * kGatedWidth * 2);
      moekit_bias_grad_desc_t desc;
      moekit_bias_grad_desc_init(&desc);
      desc.experts = kExperts;
      desc.max_rows = kPairs;
      desc.width = kGatedWidth;
      desc.dtype = MOEKIT_DTYPE_BF16;
      moekit_plan_t plan = nullptr;
      check(moekit_bias_grad_plan_create(handle, &desc, &plan), "db1 plan");
      size_t workspace_bytes = 0;
      check(moekit_plan_workspace_size(plan, &workspace_bytes), "workspace size");
      DeviceMemory workspace(workspace_bytes);
      std::printf("db1 workspace: %.1f MiB\n", static_cast<double>(workspace_bytes) / (1 << 20));
      const auto run = [&](int s) {
        moekit_db1_args_t args;
        moekit_db1_args_init(&args);
        args.dh = view(dhs[s]->data, MOEKIT_DTYPE_BF16, {kPairs, kGatedWidth});
        args.offsets = view(offsets.data, MOEKIT_DTYPE_INT32, {kExperts + 1});
        args.db1 = view(db1.data, MOEKIT_DTYPE_BF16, {kExperts, kGatedWidth});
        check(moekit_db1(plan, &args, workspace.data, workspace_bytes, stream), "db1");
      };
      rows.push_back(Row{"db1 E=128 P=262144 2I=2048 bf16", time_calls(run, sets, stream),
                         static_cast<double>(dh_bytes + kExperts * kGatedWidth * 2)});
      moekit_plan_destroy(plan);
    }

    {  // db2 + ds
      const size_t dout_bytes = size_t{kTokens} * kHidden * 2;
      const int sets = rotation_sets(dout_bytes);
      const DeviceSets douts = device_sets(dout_bytes, sets, 300);
      DeviceMemory b2(kExperts * kHidden * 2), db2(kExperts * kHidden * 2);
      fill_random_bf16_repeated(b2.data, kExperts * kHidden, 1.0f, 400);
      moekit_bias_grad_desc_t desc;
      moekit_bias_grad_desc_init(&desc);
      desc.experts = kExperts;
      desc.max_rows = kPairs;
      desc.width = kHidden;
      desc.max_tokens = kTokens;
      desc.dtype = MOEKIT_DTYPE_BF16;
      moekit_plan_t plan = nullptr;
      check(moekit_bias_grad_plan_create(handle, &desc, &plan), "db2 plan");
      size_t workspace_bytes = 0;
      check(moekit_plan_workspace_size(plan, &workspace_bytes), "workspace size");
      DeviceMemory workspace(workspace_bytes);
      std::printf("db2_ds workspace: %.1f MiB\n", static_cast<double>(workspace_bytes) / (1 << 20));
      for (int with_db2 = 1; with_db2 >= 0; --with_db2) {
        const auto run = [&](int s) {
          moekit_db2_ds_args_t args;
          moekit_db2_ds_args_init(&args);
          args.dout = view(douts[s]->data, MOEKIT_DTYPE_BF16, {kTokens, kHidden});
          args.scores = view(scores.data, MOEKIT_DTYPE_FP32, {kTokens, kTopK});
          args.b2 = view(b2.data, MOEKIT_DTYPE_BF16, {kExperts, kHidden});
          args.offsets = view(offsets.data, MOEKIT_DTYPE_INT32, {kExperts + 1});
          args.gather_idx = view(gather_idx.data, MOEKIT_DTYPE_INT32, {kPairs});
          args.pair_idx = view(pair_idx.data, MOEKIT_DTYPE_INT32, {kPairs});
          if (with_db2) args.db2 = view(db2.data, MOEKIT_DTYPE_BF16, {kExperts, kHidden});
          args.dscores = view(dscores.data, MOEKIT_DTYPE_FP32, {kTokens, kTopK});
          check(moekit_db2_ds(plan, &args, workspace.data, workspace_bytes, stream), "db2_ds");
        };
        // Each pair's dout row is read (gathered), b2 once; db2 written; indices, scores and ds (read + write).
        const double bytes = static_cast<double>(size_t{kPairs} * kHidden * 2 + kExperts * kHidden * 2 +
                                                 (with_db2 ? kExperts * kHidden * 2 + kPairs * 4 : 0) +
                                                 kPairs * (4 + 4 + 8));
        rows.push_back(Row{with_db2 ? "db2 + ds E=128 P=262144 H=4096 bf16" : "ds only (b2, no db2), same shape",
                           time_calls(run, sets, stream), bytes});
      }
      moekit_plan_destroy(plan);
    }

    check(cudaStreamSynchronize(stream), "synchronize");
    std::printf("\n%-48s %10s %10s %10s  %s\n", "case", "median us", "min us", "max us",
                "GB/s (minimum bytes) / % of copy ceiling");
    for (const Row& r : rows) {
      const double gbps = r.bytes / (r.timing.median_us * 1e-6) / 1e9;
      char rate[128];
      std::snprintf(rate, sizeof rate, "%.0f GB/s (%.2f GB) / %.0f%%", gbps, r.bytes / 1e9,
                    100.0 * gbps / (copy_tbps * 1000.0));
      std::printf("%s\n", format_row(r.name, r.timing, rate).c_str());
    }
    moekit_handle_destroy(handle);
    cudaStreamDestroy(stream);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moekit_time_reduce: %s\n", e.what());
    return 1;
  }
}
