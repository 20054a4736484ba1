// How long the reference backend takes for a medium MoE layer (DESIGN: "medium shapes check in seconds"):
// T=2048, H=1024, I=512, E=32, K=4, bf16 SwiGLU, forward + backward (~77 GFLOP in float64). Prints the wall time;
// the bound is loose (CI machines are slow and shared), the printed time is what to watch.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "common/test_util.h"

using moekit_test::HostTensor;

TEST_CASE("reference MoE layer forward + backward at T=2048 H=1024 I=512 E=32 K=4 takes seconds", "[timing]") {
  const int64_t T = 2048, H = 1024, I = 512, E = 32, K = 4;
  moekit_handle_t handle = nullptr;
  moekit_handle_desc_t hdesc;
  moekit_handle_desc_init(&hdesc);
  MOEKIT_REQUIRE_OK(moekit_handle_create(&hdesc, &handle));
  moekit_moe_desc_t desc;
  moekit_moe_desc_init(&desc);
  desc.max_tokens = T;
  desc.hidden = H;
  desc.intermediate = I;
  desc.router_experts = E;
  desc.experts = E;
  desc.top_k = K;
  desc.dtype = MOEKIT_DTYPE_BF16;
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_moe_plan_create(handle, &desc, &plan));
  size_t saved_bytes = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_saved_size(plan, &saved_bytes));
  std::vector<uint8_t> saved_storage(saved_bytes + 256);
  void* saved = saved_storage.data() + (256 - reinterpret_cast<uintptr_t>(saved_storage.data()) % 256) % 256;

  std::mt19937_64 rng(7);
  const moekit_dtype_t bf16 = MOEKIT_DTYPE_BF16;
  HostTensor x(bf16, {T, H}), wr(bf16, {E, H}), w1(bf16, {E, 2 * I, H}), w2(bf16, {E, H, I});
  HostTensor out(bf16, {T, H}), dout(bf16, {T, H}), dx(bf16, {T, H});
  HostTensor dwr(bf16, {E, H}), dw1(bf16, {E, 2 * I, H}), dw2(bf16, {E, H, I});
  x.fill_uniform(rng, 1.0);
  wr.fill_uniform(rng, 1.0 / std::sqrt(double(H)));
  w1.fill_uniform(rng, 2.0 / std::sqrt(double(H)));
  w2.fill_uniform(rng, 2.0 / std::sqrt(double(I)));
  dout.fill_uniform(rng, 1.0);
  out.poison();
  dx.poison();
  dw1.poison();

  moekit_moe_fwd_args_t fwd;
  moekit_moe_fwd_args_init(&fwd);
  fwd.x = x.view();
  fwd.w_router = wr.view();
  fwd.w1 = w1.view();
  fwd.w2 = w2.view();
  fwd.out = out.view();
  moekit_moe_bwd_args_t bwd;
  moekit_moe_bwd_args_init(&bwd);
  bwd.x = x.view();
  bwd.dout = dout.view();
  bwd.w_router = wr.view();
  bwd.w1 = w1.view();
  bwd.w2 = w2.view();
  bwd.dx = dx.view();
  bwd.dw_router = dwr.view();
  bwd.dw1 = dw1.view();
  bwd.dw2 = dw2.view();

  auto start = std::chrono::steady_clock::now();
  MOEKIT_REQUIRE_OK(moekit_moe_forward(plan, &fwd, saved, saved_bytes, nullptr, 0, nullptr));
  auto middle = std::chrono::steady_clock::now();
  MOEKIT_REQUIRE_OK(moekit_moe_backward(plan, &bwd, saved, saved_bytes, nullptr, 0, nullptr));
  auto end = std::chrono::steady_clock::now();
  double forward_s = std::chrono::duration<double>(middle - start).count();
  double backward_s = std::chrono::duration<double>(end - middle).count();
  std::printf("reference MoE layer T=%lld H=%lld I=%lld E=%lld K=%lld bf16 SwiGLU: forward %.2f s, backward %.2f s, "
              "total %.2f s\n",
              static_cast<long long>(T), static_cast<long long>(H), static_cast<long long>(I),
              static_cast<long long>(E), static_cast<long long>(K), forward_s, backward_s, forward_s + backward_s);

  // The outputs are real numbers of the expected scale, not poison.
  for (int64_t i = 0; i < out.numel(); i += 4099) REQUIRE(std::isfinite(out.get(i)));
  for (int64_t i = 0; i < dx.numel(); i += 4099) REQUIRE(std::isfinite(dx.get(i)));
  for (int64_t i = 0; i < dw1.numel(); i += 40009) REQUIRE(std::isfinite(dw1.get(i)));
  REQUIRE(forward_s + backward_s < 60.0);
  moekit_plan_destroy(plan);
  moekit_handle_destroy(handle);
}
