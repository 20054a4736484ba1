// Grouped neuron selection (docs/math.md section 7) through the C ABI on the reference backend, against the energy
// formula written out directly: all rows or a subsample, with and without a load-balance bias, and the counts.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/test_util.h"
#include "src/numeric.h"

using moekit_test::HostTensor;
using moekit_test::PlanOwner;
using moekit_test::ReferenceHandle;
using moekit_test::as_integers;

namespace {

// en[t, g] = (G / spg) * sum over the group's (subsample) rows n of |silu(round(x_t . Wg_n))| * exp(bias[g]);
// groups ordered by fp32 energy, descending, ties to the lower group.
std::vector<int64_t> expected_groups(const moekit_sparse_ffn_desc_t& d, int64_t tokens, const std::vector<double>& x,
                                     const std::vector<double>& w_gate, const std::vector<int64_t>& rows,
                                     const std::vector<double>& bias) {
  int64_t D = d.d_model, G = d.group_size, NG = d.d_ff / G, kg = d.top_groups;
  int64_t spg = d.subsample > 0 ? d.subsample : G;
  std::vector<int64_t> out;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<float> energy(static_cast<size_t>(NG));
    for (int64_t g = 0; g < NG; ++g) {
      double sum = 0;
      for (int64_t j = 0; j < spg; ++j) {
        int64_t n = d.subsample > 0 ? rows[static_cast<size_t>(g * spg + j)] : g * G + j;
        double z = 0;
        for (int64_t c = 0; c < D; ++c) z += x[static_cast<size_t>(t * D + c)] * w_gate[static_cast<size_t>(n * D + c)];
        z = moekit::round_to(z, d.dtype);
        sum += std::fabs(z / (1.0 + std::exp(-z)));
      }
      sum *= static_cast<double>(G) / static_cast<double>(spg);
      if (!bias.empty()) sum *= std::exp(bias[static_cast<size_t>(g)]);
      energy[static_cast<size_t>(g)] = static_cast<float>(sum);
    }
    std::vector<int64_t> order(static_cast<size_t>(NG));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return energy[static_cast<size_t>(a)] > energy[static_cast<size_t>(b)];
    });
    out.insert(out.end(), order.begin(), order.begin() + kg);
  }
  return out;
}

// Creates a group-select plan (d_ff = F rows in groups of G) with its workspace; returns the descriptor it used.
moekit_sparse_ffn_desc_t create_select_plan(moekit_handle_t handle, PlanOwner& plan, int64_t T, int64_t D, int64_t F,
                                            int64_t G, int64_t top_groups, int64_t subsample, moekit_dtype_t dtype) {
  moekit_sparse_ffn_desc_t desc;
  moekit_sparse_ffn_desc_init(&desc);
  desc.max_tokens = T;
  desc.d_model = D;
  desc.d_ff = F;
  desc.group_size = G;
  desc.top_groups = top_groups;
  desc.subsample = subsample;
  desc.dtype = dtype;
  MOEKIT_REQUIRE_OK(moekit_group_select_plan_create(handle, &desc, &plan.plan));
  plan.size_workspace();
  return desc;
}

}  // namespace

TEST_CASE("group select matches the energy formula, with and without subsample and bias", "[group_select]") {
  ReferenceHandle h;
  std::mt19937_64 rng(2718);
  const int64_t T = 19, D = 24, G = 32, F = 8 * G, kg = 3;
  for (moekit_dtype_t dtype : {MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP32, MOEKIT_DTYPE_FP64})
    for (int64_t subsample : {int64_t{0}, int64_t{8}})
      for (bool with_bias : {false, true}) {
        INFO("dtype " << dtype << ", subsample " << subsample << ", bias " << with_bias);
        PlanOwner plan;
        moekit_sparse_ffn_desc_t desc = create_select_plan(h.handle, plan, T, D, F, G, kg, subsample, dtype);

        HostTensor x(dtype, {T, D}), w_gate(dtype, {F, D}), bias(MOEKIT_DTYPE_FP32, {F / G});
        x.fill_uniform(rng, 1.0);
        w_gate.fill_uniform(rng, 0.5);
        bias.fill_uniform(rng, 0.3);
        HostTensor rows(MOEKIT_DTYPE_INT32, {F / G, std::max<int64_t>(subsample, 1)});
        std::vector<int64_t> row_ids;
        if (subsample > 0) {
          std::vector<int32_t> drawn(static_cast<size_t>(F / G * subsample));
          MOEKIT_REQUIRE_OK(moekit_subsample_rows(99, F / G, G, subsample, drawn.data()));
          for (size_t i = 0; i < drawn.size(); ++i) rows.set(static_cast<int64_t>(i), drawn[i]);
          row_ids.assign(drawn.begin(), drawn.end());
        }
        HostTensor groups(MOEKIT_DTYPE_INT32, {T, kg}), counts(MOEKIT_DTYPE_INT32, {F / G});
        groups.poison();
        counts.poison();

        moekit_group_select_args_t args;
        moekit_group_select_args_init(&args);
        args.x = x.view();
        args.w_gate = w_gate.view();
        if (subsample > 0) args.subsample_rows = rows.view();
        if (with_bias) args.lb_bias = bias.view();
        args.groups = groups.view();
        args.counts = counts.view();
        MOEKIT_REQUIRE_OK(moekit_group_select(plan.plan, &args, plan.ws(), plan.workspace.size(), nullptr));

        std::vector<int64_t> want =
            expected_groups(desc, T, x.values(), w_gate.values(), row_ids, with_bias ? bias.values() : std::vector<double>{});
        std::vector<int64_t> got = as_integers(groups);
        REQUIRE(got == want);
        std::vector<int64_t> want_counts(static_cast<size_t>(F / G), 0);
        for (int64_t g : want) ++want_counts[static_cast<size_t>(g)];
        REQUIRE(as_integers(counts) == want_counts);
        // Each token's groups are distinct.
        for (int64_t t = 0; t < T; ++t) {
          std::vector<int64_t> mine(got.begin() + t * kg, got.begin() + (t + 1) * kg);
          std::sort(mine.begin(), mine.end());
          REQUIRE(std::adjacent_find(mine.begin(), mine.end()) == mine.end());
        }
      }
}

TEST_CASE("group select: a large load-balance bias steers every token to its group", "[group_select]") {
  ReferenceHandle h;
  std::mt19937_64 rng(161);
  const int64_t T = 7, D = 16, G = 16, F = 4 * G, kg = 1;
  PlanOwner plan;
  create_select_plan(h.handle, plan, T, D, F, G, kg, 0, MOEKIT_DTYPE_FP32);
  HostTensor x(MOEKIT_DTYPE_FP32, {T, D}), w_gate(MOEKIT_DTYPE_FP32, {F, D}), bias(MOEKIT_DTYPE_FP32, {F / G});
  x.fill_uniform(rng, 1.0);
  w_gate.fill_uniform(rng, 1.0);
  bias.set_values({0.0, 0.0, 30.0, 0.0});
  HostTensor groups(MOEKIT_DTYPE_INT32, {T, kg});
  groups.poison();
  moekit_group_select_args_t args;
  moekit_group_select_args_init(&args);
  args.x = x.view();
  args.w_gate = w_gate.view();
  args.lb_bias = bias.view();
  args.groups = groups.view();
  MOEKIT_REQUIRE_OK(moekit_group_select(plan.plan, &args, plan.ws(), plan.workspace.size(), nullptr));
  for (int64_t t = 0; t < T; ++t) REQUIRE(groups.get(t) == 2);
}

TEST_CASE("group select reads the gate pre-activation rounded to the storage dtype", "[group_select]") {
  ReferenceHandle h;
  // x = [1, 1]. Group 0's neurons have w = [1, 0] (pre-activation 1); group 1's have w = [1, 2^-8]
  // (pre-activation 1 + 2^-8, exact in fp32, a tie that rounds to even, i.e. to 1, in bf16). In bf16 the energies
  // tie and the lower group wins; in fp32 group 1 is larger.
  const int64_t T = 1, D = 2, G = 16, F = 2 * G;
  for (moekit_dtype_t dtype : {MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP32}) {
    INFO("dtype " << dtype);
    PlanOwner plan;
    create_select_plan(h.handle, plan, T, D, F, G, 1, 0, dtype);
    HostTensor x(dtype, {T, D}), w_gate(dtype, {F, D}), groups(MOEKIT_DTYPE_INT32, {T, 1});
    x.set_values({1.0, 1.0});
    for (int64_t n = 0; n < F; ++n) {
      w_gate.set(n * D, 1.0);
      w_gate.set(n * D + 1, n < G ? 0.0 : std::ldexp(1.0, -8));
    }
    groups.poison();
    moekit_group_select_args_t args;
    moekit_group_select_args_init(&args);
    args.x = x.view();
    args.w_gate = w_gate.view();
    args.groups = groups.view();
    MOEKIT_REQUIRE_OK(moekit_group_select(plan.plan, &args, plan.ws(), plan.workspace.size(), nullptr));
    REQUIRE(groups.get(0) == (dtype == MOEKIT_DTYPE_BF16 ? 0 : 1));
  }
}

TEST_CASE("group select rejects a subsample row outside its group and writes nothing", "[group_select]") {
  ReferenceHandle h;
  std::mt19937_64 rng(314);
  const int64_t T = 3, D = 8, G = 16, F = 2 * G, spg = 4;
  PlanOwner plan;
  create_select_plan(h.handle, plan, T, D, F, G, 1, spg, MOEKIT_DTYPE_FP32);
  HostTensor x(MOEKIT_DTYPE_FP32, {T, D}), w_gate(MOEKIT_DTYPE_FP32, {F, D}), groups(MOEKIT_DTYPE_INT32, {T, 1});
  x.fill_uniform(rng, 1.0);
  w_gate.fill_uniform(rng, 1.0);
  groups.poison();
  HostTensor untouched = groups;
  HostTensor rows(MOEKIT_DTYPE_INT32, {F / G, spg});
  rows.set_values({0, 5, 9, 17, 16, 20, 24, 31});  // 17 belongs to group 1, listed for group 0
  moekit_group_select_args_t args;
  moekit_group_select_args_init(&args);
  args.x = x.view();
  args.w_gate = w_gate.view();
  args.subsample_rows = rows.view();
  args.groups = groups.view();
  moekit_status_t status = moekit_group_select(plan.plan, &args, plan.ws(), plan.workspace.size(), nullptr);
  REQUIRE(status == MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(moekit_test::last_error().find("subsample_rows") != std::string::npos);
  REQUIRE(groups.bytes_equal(untouched));
}
