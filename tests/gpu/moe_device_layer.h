// One MoE layer's whole device state for the tests that run a layer the way frameworks do (tests/gpu/replay_checks.h):
// a plan of one shape, its workspace and saved buffer, random parameters, and the per-call tensors; enqueue() runs
// forward + backward on a stream with no synchronisation (capturable), new_input() draws a new x (so new routing).
#pragma once

#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "gpu_util.h"

namespace moekit_test {

struct LayerShape {
  int64_t tokens = 200, hidden = 128, inter = 72, experts = 16, top_k = 4;
};

struct DeviceLayer {
  LayerShape s;
  moekit_plan_t plan = nullptr;
  DeviceBuffer workspace, saved;
  size_t workspace_bytes = 0, saved_bytes = 0;
  DeviceTensor x, wr, w1, b1, w2, b2, out, dout, dx, dwr, dw1, db1, dw2, db2;

  DeviceLayer(moekit_handle_t handle, std::mt19937_64& rng, LayerShape shape = {}) : s(shape) {
    moekit_moe_desc_t d;
    moekit_moe_desc_init(&d);
    d.max_tokens = s.tokens;
    d.hidden = s.hidden;
    d.intermediate = s.inter;
    d.router_experts = d.experts = s.experts;
    d.top_k = s.top_k;
    d.has_b1 = d.has_b2 = 1;
    MOEKIT_REQUIRE_OK(moekit_moe_plan_create(handle, &d, &plan));
    MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan, &workspace_bytes));
    MOEKIT_REQUIRE_OK(moekit_plan_saved_size(plan, &saved_bytes));
    workspace = DeviceBuffer(workspace_bytes);
    saved = DeviceBuffer(saved_bytes);
    const int64_t T = s.tokens, H = s.hidden, I = s.inter, E = s.experts;
    auto random = [&](std::vector<int64_t> dims, double scale) {
      HostTensor t(MOEKIT_DTYPE_BF16, std::move(dims));
      t.fill_uniform(rng, scale);
      return DeviceTensor(t);
    };
    x = random({T, H}, 1.0);
    wr = random({E, H}, 2.0 / std::sqrt(double(H)));
    w1 = random({E, 2 * I, H}, 2.0 / std::sqrt(double(H)));
    b1 = random({E, 2 * I}, 0.5);
    w2 = random({E, H, I}, 2.0 / std::sqrt(double(I)));
    b2 = random({E, H}, 0.5);
    dout = random({T, H}, 1.0);
    out = random({T, H}, 1.0);
    dx = random({T, H}, 1.0);
    dwr = random({E, H}, 1.0);
    dw1 = random({E, 2 * I, H}, 1.0);
    db1 = random({E, 2 * I}, 1.0);
    dw2 = random({E, H, I}, 1.0);
    db2 = random({E, H}, 1.0);
  }
  DeviceLayer(const DeviceLayer&) = delete;
  DeviceLayer& operator=(const DeviceLayer&) = delete;
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
    HostTensor t(MOEKIT_DTYPE_BF16, {s.tokens, s.hidden});
    t.fill_uniform(rng, 1.0);
    x.upload(t);
  }

  // out, dx, dWr, dW1, db1, dW2, db2
  std::vector<HostTensor> results() const {
    return {out.download(), dx.download(), dwr.download(), dw1.download(), db1.download(), dw2.download(),
            db2.download()};
  }
};

}  // namespace moekit_test
