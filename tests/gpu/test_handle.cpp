// The CUDA handle on a Hopper GPU: created, reports its device, rejects host tensors, and destroys cleanly.
#include <catch2/catch.hpp>

#include "gpu/gpu_util.h"

using namespace moekit_test;

TEST_CASE("a CUDA handle is created on a Hopper GPU and rejects host tensors", "[sanitize][gpu][handle]") {
  Handles handles;
  moekit_router_desc_t desc;
  moekit_router_desc_init(&desc);
  desc.max_tokens = 4;
  desc.experts = 8;
  desc.top_k = 2;
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_router_plan_create(handles.cuda, &desc, &plan));

  HostTensor logits(MOEKIT_DTYPE_BF16, {4, 8});
  HostTensor scores(MOEKIT_DTYPE_FP32, {4, 2});
  HostTensor indices(MOEKIT_DTYPE_INT32, {4, 2});
  moekit_router_fwd_args_t args;
  moekit_router_fwd_args_init(&args);
  args.logits = logits.view();
  args.scores = scores.view();
  args.indices = indices.view();
  REQUIRE(moekit_router_forward(plan, &args, nullptr, 0, nullptr) == MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(last_error().find("logits") != std::string::npos);
  moekit_plan_destroy(plan);
}
