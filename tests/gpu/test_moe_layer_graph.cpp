// The CUDA MoE layer under the ways frameworks run it (tests/gpu/replay_checks.h): a forward + backward captured
// once in a CUDA graph and replayed with different inputs, so different routing each time, and two handles on two
// host threads and two streams at once; every result bitwise what plain stream calls give.
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

constexpr int64_t kTokens = 200, kHidden = 128, kInter = 72, kExperts = 16, kTopK = 4;

// One layer's device state: a plan, its workspace and saved buffer, parameters, and the per-call tensors.
struct DeviceLayer {
  moekit_plan_t plan = nullptr;
  DeviceBuffer workspace, saved;
  size_t workspace_bytes = 0, saved_bytes = 0;
  DeviceTensor x, wr, w1, b1, w2, b2, out, dout, dx, dwr, dw1, db1, dw2, db2;

  DeviceLayer(moekit_handle_t handle, std::mt19937_64& rng) {
    moekit_moe_desc_t d;
    moekit_moe_desc_init(&d);
    d.max_tokens = kTokens;
    d.hidden = kHidden;
    d.intermediate = kInter;
    d.router_experts = d.experts = kExperts;
    d.top_k = kTopK;
    d.has_b1 = d.has_b2 = 1;
    MOEKIT_REQUIRE_OK(moekit_moe_plan_create(handle, &d, &plan));
    MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan, &workspace_bytes));
    MOEKIT_REQUIRE_OK(moekit_plan_saved_size(plan, &saved_bytes));
    workspace = DeviceBuffer(workspace_bytes);
    saved = DeviceBuffer(saved_bytes);
    const moekit_dtype_t bf16 = MOEKIT_DTYPE_BF16;
    auto random = [&](std::vector<int64_t> shape, double scale) {
      HostTensor t(bf16, std::move(shape));
      t.fill_uniform(rng, scale);
      return DeviceTensor(t);
    };
    x = random({kTokens, kHidden}, 1.0);
    wr = random({kExperts, kHidden}, 2.0 / std::sqrt(double(kHidden)));
    w1 = random({kExperts, 2 * kInter, kHidden}, 2.0 / std::sqrt(double(kHidden)));
    b1 = random({kExperts, 2 * kInter}, 0.5);
    w2 = random({kExperts, kHidden, kInter}, 2.0 / std::sqrt(double(kInter)));
    b2 = random({kExperts, kHidden}, 0.5);
    dout = random({kTokens, kHidden}, 1.0);
    out = random({kTokens, kHidden}, 1.0);
    dx = random({kTokens, kHidden}, 1.0);
    dwr = random({kExperts, kHidden}, 1.0);
    dw1 = random({kExperts, 2 * kInter, kHidden}, 1.0);
    db1 = random({kExperts, 2 * kInter}, 1.0);
    dw2 = random({kExperts, kHidden, kInter}, 1.0);
    db2 = random({kExperts, kHidden}, 1.0);
  }
  ~DeviceLayer() { moekit_plan_destroy(plan); }

  // Enqueues forward + backward on `stream` (capturable: no synchronisation, no allocation); returns the first
  // status that is not SUCCESS. (No Catch2 assertion here: host threads call it.)
  moekit_status_t enqueue(cudaStream_t stream) {
    moekit_moe_fwd_args_t f;
    moekit_moe_fwd_args_init(&f);
    f.x = x.view();
    f.w_router = wr.view();
    f.w1 = w1.view();
    f.b1 = b1.view();
    f.w2 = w2.view();
    f.b2 = b2.view();
    f.out = out.view();
    const moekit_status_t forward =
        moekit_moe_forward(plan, &f, saved.data(), saved_bytes, workspace.data(), workspace_bytes, stream);
    if (forward != MOEKIT_SUCCESS) return forward;
    moekit_moe_bwd_args_t b;
    moekit_moe_bwd_args_init(&b);
    b.x = f.x;
    b.dout = dout.view();
    b.w_router = f.w_router;
    b.w1 = f.w1;
    b.w2 = f.w2;
    b.b2 = f.b2;
    b.dx = dx.view();
    b.dw_router = dwr.view();
    b.dw1 = dw1.view();
    b.db1 = db1.view();
    b.dw2 = dw2.view();
    b.db2 = db2.view();
    return moekit_moe_backward(plan, &b, saved.data(), saved_bytes, workspace.data(), workspace_bytes, stream);
  }

  void new_input(std::mt19937_64& rng) {
    HostTensor t(MOEKIT_DTYPE_BF16, {kTokens, kHidden});
    t.fill_uniform(rng, 1.0);
    x.upload(t);
  }

  // out, dx, dWr, dW1, db1, dW2, db2
  std::vector<HostTensor> results() const {
    return {out.download(), dx.download(), dwr.download(), dw1.download(), db1.download(), dw2.download(),
            db2.download()};
  }
};

}  // namespace

TEST_CASE("a captured forward + backward replays with new routing each time, bitwise as stream calls",
          "[gpu][layer][graph][sanitize]") {
  moekit_handle_t handle = cuda_handle();
  std::mt19937_64 rng(21);
  {
    DeviceLayer layer(handle, rng);
    moekit_test::require_graph_replays_like_stream_calls(layer, rng);
  }
  moekit_handle_destroy(handle);
}

TEST_CASE("two handles on two host threads and two streams give what each gives alone",
          "[gpu][layer][threads][sanitize]") {
  std::mt19937_64 rng(33);
  moekit_handle_t handles[2] = {cuda_handle(), cuda_handle()};
  {
    DeviceLayer first(handles[0], rng), second(handles[1], rng);
    moekit_test::require_two_threads_like_alone(first, second);
  }
  for (moekit_handle_t h : handles) moekit_handle_destroy(h);
}
