// The CUDA sparse FFN layer under the ways frameworks run it (tests/gpu/replay_checks.h): a forward + backward
// captured once in a CUDA graph and replayed with different inputs, so a different group selection and different
// per-group counts each time, and two handles on two host threads and two streams at once; every result bitwise
// what plain stream calls give.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "gpu_util.h"
#include "replay_checks.h"

using moekit_test::cuda_handle;
using moekit_test::DeviceBuffer;
using moekit_test::DeviceTensor;
using moekit_test::HostTensor;

namespace {

constexpr int64_t kTokens = 200, kModel = 128, kGroupSize = 32, kGroups = 16, kTopGroups = 4;
constexpr int64_t kFF = kGroups * kGroupSize;

// One layer's device state: a plan, its workspace and saved buffer, parameters, and the per-call tensors.
struct DeviceLayer {
  moekit_plan_t plan = nullptr;
  DeviceBuffer workspace, saved;
  size_t workspace_bytes = 0, saved_bytes = 0;
  DeviceTensor x, wg, wu, wd, lb_bias, out, groups, counts, dout, dx, dwg, dwu, dwd;

  DeviceLayer(moekit_handle_t handle, std::mt19937_64& rng) {
    moekit_sparse_ffn_desc_t d;
    moekit_sparse_ffn_desc_init(&d);
    d.max_tokens = kTokens;
    d.d_model = kModel;
    d.d_ff = kFF;
    d.group_size = kGroupSize;
    d.top_groups = kTopGroups;
    MOEKIT_REQUIRE_OK(moekit_sparse_ffn_plan_create(handle, &d, &plan));
    MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan, &workspace_bytes));
    MOEKIT_REQUIRE_OK(moekit_plan_saved_size(plan, &saved_bytes));
    workspace = DeviceBuffer(workspace_bytes);
    saved = DeviceBuffer(saved_bytes);
    auto random = [&](moekit_dtype_t dtype, std::vector<int64_t> shape, double scale) {
      HostTensor t(dtype, std::move(shape));
      t.fill_uniform(rng, scale);
      return DeviceTensor(t);
    };
    const moekit_dtype_t bf16 = MOEKIT_DTYPE_BF16, i32 = MOEKIT_DTYPE_INT32;
    x = random(bf16, {kTokens, kModel}, 1.0);
    wg = random(bf16, {kFF, kModel}, 2.0 / std::sqrt(double(kModel)));
    wu = random(bf16, {kFF, kModel}, 2.0 / std::sqrt(double(kModel)));
    wd = random(bf16, {kModel, kFF}, 2.0 / std::sqrt(double(kTopGroups * kGroupSize)));
    lb_bias = random(MOEKIT_DTYPE_FP32, {kGroups}, 0.3);
    out = random(bf16, {kTokens, kModel}, 1.0);
    groups = random(i32, {kTokens, kTopGroups}, 100.0);
    counts = random(i32, {kGroups}, 100.0);
    dout = random(bf16, {kTokens, kModel}, 1.0);
    dx = random(bf16, {kTokens, kModel}, 1.0);
    dwg = random(bf16, {kFF, kModel}, 1.0);
    dwu = random(bf16, {kFF, kModel}, 1.0);
    dwd = random(bf16, {kModel, kFF}, 1.0);
  }
  ~DeviceLayer() { moekit_plan_destroy(plan); }

  moekit_status_t enqueue(cudaStream_t stream) {
    moekit_sparse_ffn_fwd_args_t f;
    moekit_sparse_ffn_fwd_args_init(&f);
    f.x = x.view();
    f.w_gate = wg.view();
    f.w_up = wu.view();
    f.w_down = wd.view();
    f.lb_bias = lb_bias.view();
    f.out = out.view();
    f.groups = groups.view();
    f.counts = counts.view();
    const moekit_status_t forward =
        moekit_sparse_ffn_forward(plan, &f, saved.data(), saved_bytes, workspace.data(), workspace_bytes, stream);
    if (forward != MOEKIT_SUCCESS) return forward;
    moekit_sparse_ffn_bwd_args_t b;
    moekit_sparse_ffn_bwd_args_init(&b);
    b.x = f.x;
    b.w_gate = f.w_gate;
    b.w_up = f.w_up;
    b.w_down = f.w_down;
    b.dout = dout.view();
    b.dx = dx.view();
    b.dw_gate = dwg.view();
    b.dw_up = dwu.view();
    b.dw_down = dwd.view();
    return moekit_sparse_ffn_backward(plan, &b, saved.data(), saved_bytes, workspace.data(), workspace_bytes, stream);
  }

  void new_input(std::mt19937_64& rng) {
    HostTensor t(MOEKIT_DTYPE_BF16, {kTokens, kModel});
    t.fill_uniform(rng, 1.0);
    x.upload(t);
  }

  // out, groups, counts, dx, dWg, dWu, dWd
  std::vector<HostTensor> results() const {
    return {out.download(), groups.download(), counts.download(), dx.download(),
            dwg.download(), dwu.download(),    dwd.download()};
  }
};

}  // namespace

TEST_CASE("sparse FFN: a captured forward + backward replays with a new group selection each time, bitwise as "
          "stream calls",
          "[gpu][sparse_ffn][graph][sanitize]") {
  moekit_handle_t handle = cuda_handle();
  std::mt19937_64 rng(45);
  {
    DeviceLayer layer(handle, rng);
    moekit_test::require_graph_replays_like_stream_calls(layer, rng);
  }
  moekit_handle_destroy(handle);
}

TEST_CASE("sparse FFN: two handles on two host threads and two streams give what each gives alone",
          "[gpu][sparse_ffn][threads][sanitize]") {
  std::mt19937_64 rng(46);
  moekit_handle_t handles[2] = {cuda_handle(), cuda_handle()};
  {
    DeviceLayer first(handles[0], rng), second(handles[1], rng);
    moekit_test::require_two_threads_like_alone(first, second);
  }
  for (moekit_handle_t h : handles) moekit_handle_destroy(h);
}
