// moekit_plan_describe on the reference backend: for a plan of every kind the text names the operation and the
// backend, and the copy-out behaves as moekit_get_last_error's (the length query, truncation to cap - 1 characters
// with a NUL, cap = 1, a NULL plan), the same text on every call.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "moekit/moekit.h"
#include "plan_descs.h"

using moekit_test::PlanOwner;
using moekit_test::ReferenceHandle;

namespace {

using namespace plan_descs;

// A plan of one kind and the operation name its text must hold.
struct NamedPlan {
  const char* kind;
  const char* operation;
  std::unique_ptr<PlanOwner> owner;
};

std::vector<NamedPlan> plans_of_every_kind(moekit_handle_t h) {
  std::vector<NamedPlan> plans;
  const auto add = [&plans](const char* kind, const char* operation) -> moekit_plan_t* {
    plans.push_back(NamedPlan{kind, operation, std::make_unique<PlanOwner>()});
    return &plans.back().owner->plan;
  };
  const moekit_router_desc_t router = router_desc();
  MOEKIT_REQUIRE_OK(moekit_router_plan_create(h, &router, add("router", "router")));
  const moekit_dispatch_desc_t dispatch = dispatch_desc();
  MOEKIT_REQUIRE_OK(moekit_dispatch_plan_create(h, &dispatch, add("dispatch", "dispatch")));
  const moekit_gemm_desc_t gemm_m = gated_gemm_desc();
  MOEKIT_REQUIRE_OK(moekit_gemm_plan_create(h, &gemm_m, add("gemm (varlen M)", "grouped GEMM")));
  const moekit_gemm_desc_t gemm_k = varlen_k_gemm_desc();
  MOEKIT_REQUIRE_OK(moekit_gemm_plan_create(h, &gemm_k, add("gemm (varlen K)", "grouped GEMM")));
  const moekit_combine_desc_t combine = combine_desc();
  MOEKIT_REQUIRE_OK(moekit_combine_plan_create(h, &combine, add("combine", "combine")));
  const moekit_bias_grad_desc_t bias_grad = bias_grad_desc();
  MOEKIT_REQUIRE_OK(moekit_bias_grad_plan_create(h, &bias_grad, add("bias_grad", "bias gradient")));
  const moekit_sparse_ffn_desc_t ffn = sparse_ffn_desc();
  MOEKIT_REQUIRE_OK(moekit_group_select_plan_create(h, &ffn, add("group_select", "group selection")));
  const moekit_moe_desc_t moe = moe_desc();
  MOEKIT_REQUIRE_OK(moekit_moe_plan_create(h, &moe, add("moe layer", "MoE layer")));
  moekit_moe_desc_t moe_inference = moe;
  moe_inference.inference = 1;
  MOEKIT_REQUIRE_OK(moekit_moe_plan_create(h, &moe_inference, add("moe layer (inference)", "MoE layer")));
  MOEKIT_REQUIRE_OK(moekit_experts_plan_create(h, &moe, add("experts layer", "experts layer")));
  const moekit_moe_desc_t token_experts = token_experts_desc();
  MOEKIT_REQUIRE_OK(
      moekit_token_experts_plan_create(h, &token_experts, add("token-major experts layer", "token-major experts layer")));
  MOEKIT_REQUIRE_OK(moekit_sparse_ffn_plan_create(h, &ffn, add("sparse FFN layer", "sparse FFN layer")));
  return plans;
}

// The whole text, from a length query and a buffer of that length plus the NUL.
std::string described(moekit_plan_t plan) {
  const size_t length = moekit_plan_describe(plan, nullptr, 0);
  std::vector<char> buf(length + 1, 'z');
  REQUIRE(moekit_plan_describe(plan, buf.data(), buf.size()) == length);
  REQUIRE(buf[length] == '\0');
  return std::string(buf.data(), length);
}

}  // namespace

TEST_CASE("plan describe: every kind of plan names its operation and the reference backend", "[capi]") {
  ReferenceHandle h;
  const std::vector<NamedPlan> plans = plans_of_every_kind(h.handle);
  for (const NamedPlan& p : plans) {
    const std::string text = described(p.owner->plan);
    INFO(p.kind << ": " << text);
    CHECK_FALSE(text.empty());
    CHECK(text.find(p.operation) == 0);  // the operation comes first
    CHECK(text.find("reference backend") != std::string::npos);
    CHECK(std::strlen(text.c_str()) == text.size());  // no NUL inside the text
  }
  const auto text_of = [&plans](const std::string& kind) {
    for (const NamedPlan& p : plans)
      if (kind == p.kind) return described(p.owner->plan);
    FAIL("no plan of kind " << kind);
    return std::string();
  };
  // The layers are told apart: a MoE layer's text is not an experts layer's.
  CHECK(text_of("moe layer").find("experts layer") == std::string::npos);
  // The grouped GEMM's text says its mode.
  CHECK(text_of("gemm (varlen M)").find("varlen M") != std::string::npos);
  CHECK(text_of("gemm (varlen K)").find("varlen K") != std::string::npos);
}

TEST_CASE("plan describe: the length query, truncation to cap - 1 characters, and cap = 1", "[capi]") {
  ReferenceHandle h;
  const std::vector<NamedPlan> plans = plans_of_every_kind(h.handle);
  for (const NamedPlan& p : plans) {
    INFO(p.kind);
    const moekit_plan_t plan = p.owner->plan;
    const std::string text = described(plan);
    const size_t length = moekit_plan_describe(plan, nullptr, 0);
    REQUIRE(length == text.size());
    REQUIRE(length > 8);

    // The exact size and any larger one copy the whole text.
    std::vector<char> exact(length + 1, 'z');
    CHECK(moekit_plan_describe(plan, exact.data(), exact.size()) == length);
    CHECK(std::string(exact.data()) == text);
    std::vector<char> large(length + 64, 'z');
    CHECK(moekit_plan_describe(plan, large.data(), large.size()) == length);
    CHECK(std::string(large.data()) == text);
    CHECK(large[length + 1] == 'z');  // nothing past the NUL is written

    // Shorter buffers: the first cap - 1 characters and a NUL, the full length returned; the rest untouched.
    for (size_t cap : {size_t{2}, size_t{6}, length / 2, length}) {
      std::vector<char> small(cap + 4, 'z');
      CHECK(moekit_plan_describe(plan, small.data(), cap) == length);
      CHECK(std::string(small.data()) == text.substr(0, cap - 1));
      CHECK(small[cap - 1] == '\0');
      for (size_t i = cap; i < small.size(); ++i) CHECK(small[i] == 'z');
    }

    char one[2] = {'z', 'z'};
    CHECK(moekit_plan_describe(plan, one, 1) == length);
    CHECK(one[0] == '\0');
    CHECK(one[1] == 'z');

    // cap = 0 writes nothing, even with a buffer.
    char none = 'z';
    CHECK(moekit_plan_describe(plan, &none, 0) == length);
    CHECK(none == 'z');
  }
}

TEST_CASE("plan describe: a NULL plan gives 0 and \"\", writing only the NUL", "[capi]") {
  CHECK(moekit_plan_describe(nullptr, nullptr, 0) == 0);
  char buf[8];
  std::memset(buf, 'z', sizeof buf);
  CHECK(moekit_plan_describe(nullptr, buf, sizeof buf) == 0);
  CHECK(buf[0] == '\0');
  for (size_t i = 1; i < sizeof buf; ++i) CHECK(buf[i] == 'z');
  char one = 'z';
  CHECK(moekit_plan_describe(nullptr, &one, 1) == 0);
  CHECK(one == '\0');
}

TEST_CASE("plan describe: the text is the same on every call", "[capi]") {
  ReferenceHandle h;
  const std::vector<NamedPlan> plans = plans_of_every_kind(h.handle);
  std::vector<std::string> first;
  for (const NamedPlan& p : plans) first.push_back(described(p.owner->plan));
  // Other plans created in between, and other queries, change nothing.
  const std::vector<NamedPlan> more = plans_of_every_kind(h.handle);
  for (int round = 0; round < 3; ++round)
    for (size_t i = 0; i < plans.size(); ++i) {
      INFO(plans[i].kind << ", round " << round);
      CHECK(described(plans[i].owner->plan) == first[i]);
      char small[5];
      moekit_plan_describe(plans[i].owner->plan, small, sizeof small);
      CHECK(std::string(small) == first[i].substr(0, 4));
    }
  // A second plan of the same descriptor on the same handle reads the same.
  for (size_t i = 0; i < plans.size(); ++i) {
    INFO(plans[i].kind);
    CHECK(described(more[i].owner->plan) == first[i]);
  }
}
