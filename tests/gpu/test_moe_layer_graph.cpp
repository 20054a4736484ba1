// The CUDA MoE layer under the ways frameworks run it: a forward + backward captured once in a CUDA graph and
// replayed with different inputs (so different routing: the per-expert counts must live on the device, not be
// baked into the graph), and two handles on two host threads and two streams at once. Every result must be
// bitwise what plain stream calls give for the same inputs.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "gpu_util.h"

using moekit_test::DeviceBuffer;
using moekit_test::DeviceTensor;
using moekit_test::HostTensor;

namespace {

constexpr int64_t kTokens = 200, kHidden = 128, kInter = 72, kExperts = 16, kTopK = 4;

moekit_handle_t cuda_handle() {
  moekit_handle_desc_t hd;
  moekit_handle_desc_init(&hd);
  hd.backend = MOEKIT_BACKEND_CUDA;
  moekit_handle_t h = nullptr;
  MOEKIT_REQUIRE_OK(moekit_handle_create(&hd, &h));
  return h;
}

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
    // NOTE: a pageable cudaMemcpy may return before its DMA lands, and the layer runs on non-blocking streams.
    CUDA_REQUIRE(cudaDeviceSynchronize());
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

  std::vector<HostTensor> results() const {
    return {out.download(), dx.download(), dwr.download(), dw1.download(), db1.download(), dw2.download(),
            db2.download()};
  }
};

void require_same(const std::vector<HostTensor>& a, const std::vector<HostTensor>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const std::vector<double> va = a[i].values(), vb = b[i].values();
    int64_t differing = 0, first = -1;
    for (size_t j = 0; j < va.size(); ++j)
      if (!(va[j] == vb[j]) && !(std::isnan(va[j]) && std::isnan(vb[j]))) {
        if (first < 0) first = static_cast<int64_t>(j);
        ++differing;
      }
    INFO("result " << i << " (out, dx, dWr, dW1, db1, dW2, db2): " << differing << " of " << va.size()
                   << " elements differ, the first at " << first);
    REQUIRE(a[i].bytes_equal(b[i]));
  }
}

HostTensor random_tokens(std::mt19937_64& rng) {
  HostTensor t(MOEKIT_DTYPE_BF16, {kTokens, kHidden});
  t.fill_uniform(rng, 1.0);
  return t;
}

}  // namespace

TEST_CASE("a captured forward + backward replays with new routing each time, bitwise as stream calls",
          "[gpu][layer][graph]") {
  moekit_handle_t handle = cuda_handle();
  std::mt19937_64 rng(21);
  DeviceLayer layer(handle, rng);
  cudaStream_t stream = nullptr;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // Plan and algorithm choices are made on the first call; capture the second.
  MOEKIT_REQUIRE_OK(layer.enqueue(stream));
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  cudaGraph_t graph = nullptr;
  CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  MOEKIT_REQUIRE_OK(layer.enqueue(stream));
  CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));

  for (int replay = 0; replay < 3; ++replay) {
    INFO("replay " << replay);
    const HostTensor x = random_tokens(rng);
    layer.x.upload(x);
    CUDA_REQUIRE(cudaDeviceSynchronize());  // the upload must land before the non-blocking stream reads x
    CUDA_REQUIRE(cudaGraphLaunch(exec, stream));
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    const std::vector<HostTensor> replayed = layer.results();
    MOEKIT_REQUIRE_OK(layer.enqueue(stream));
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    require_same(replayed, layer.results());
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  moekit_handle_destroy(handle);
}

TEST_CASE("two handles on two host threads and two streams give what each gives alone", "[gpu][layer][threads]") {
  std::mt19937_64 rng(33);
  moekit_handle_t handles[2] = {cuda_handle(), cuda_handle()};
  DeviceLayer first(handles[0], rng), second(handles[1], rng);
  cudaStream_t streams[2] = {};
  for (cudaStream_t& s : streams) CUDA_REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  DeviceLayer* layers[2] = {&first, &second};
  std::vector<HostTensor> alone[2];
  for (int i = 0; i < 2; ++i) {
    MOEKIT_REQUIRE_OK(layers[i]->enqueue(streams[i]));
    CUDA_REQUIRE(cudaStreamSynchronize(streams[i]));
    alone[i] = layers[i]->results();
  }
  // NOTE: Catch2's assertions are not thread-safe: the threads only record statuses; the main thread checks.
  moekit_status_t statuses[2][5] = {};
  auto work = [&](int i) {
    for (moekit_status_t& status : statuses[i]) status = layers[i]->enqueue(streams[i]);
    cudaStreamSynchronize(streams[i]);
  };
  std::thread t0(work, 0), t1(work, 1);
  t0.join();
  t1.join();
  for (int i = 0; i < 2; ++i) {
    for (moekit_status_t s : statuses[i]) REQUIRE(s == MOEKIT_SUCCESS);
    require_same(alone[i], layers[i]->results());
  }
  for (cudaStream_t s : streams) cudaStreamDestroy(s);
  for (moekit_handle_t h : handles) moekit_handle_destroy(h);
}
