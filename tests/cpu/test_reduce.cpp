// The token reductions of docs/math.md section 6 through the C ABI on the reference backend, against straightforward
// loops: combine and the broadcast backward (fixed and variable top-k), db1, db2 + ds.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/test_util.h"

using moekit_test::HostTensor;
using moekit_test::PlanOwner;
using moekit_test::ReferenceHandle;

namespace {

// A routing of `pairs` pairs onto `experts` local experts: a random stable grouping with about a fifth of the
// pairs dropped, as dispatch would lay it out.
struct Routing {
  std::vector<int64_t> expert_offsets;  // [E+1]
  std::vector<int64_t> pair_idx;        // [Pv]
  std::vector<int64_t> grouped_pos;     // [pairs], -1 for dropped
};

Routing random_routing(std::mt19937_64& rng, int64_t pairs, int64_t experts) {
  std::uniform_int_distribution<int64_t> id(0, experts - 1);
  std::bernoulli_distribution dropped(0.2);
  std::vector<int64_t> expert(static_cast<size_t>(pairs));
  for (int64_t& e : expert) e = dropped(rng) ? -1 : id(rng);
  Routing r;
  r.expert_offsets.assign(static_cast<size_t>(experts + 1), 0);
  r.grouped_pos.assign(static_cast<size_t>(pairs), -1);
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t p = 0; p < pairs; ++p)
      if (expert[static_cast<size_t>(p)] == e) {
        r.grouped_pos[static_cast<size_t>(p)] = static_cast<int64_t>(r.pair_idx.size());
        r.pair_idx.push_back(p);
      }
    r.expert_offsets[static_cast<size_t>(e + 1)] = static_cast<int64_t>(r.pair_idx.size());
  }
  return r;
}

HostTensor int_tensor(const std::vector<int64_t>& values, int64_t rows, moekit_dtype_t dtype = MOEKIT_DTYPE_INT32) {
  HostTensor t(dtype, {rows});
  t.poison();
  for (size_t i = 0; i < values.size(); ++i) t.set(static_cast<int64_t>(i), static_cast<double>(values[i]));
  return t;
}

// Grouped rows [rows, width]: random for the first `valid` rows, NaN past them (never read).
HostTensor grouped_rows(std::mt19937_64& rng, moekit_dtype_t dtype, int64_t rows, int64_t width, int64_t valid) {
  HostTensor t(dtype, {rows, width});
  t.fill_uniform(rng, 1.0);
  for (int64_t i = valid * width; i < rows * width; ++i) t.set(i, NAN);
  return t;
}

// out_t = beta * out_t + sum over pairs p of t (ascending) with grouped_pos[p] >= 0 of w_p * y[grouped_pos[p]].
std::vector<double> combine_loop(const std::vector<int64_t>& tok_begin, const std::vector<double>& y, int64_t width,
                                 const std::vector<double>* weights, const std::vector<int64_t>& grouped_pos,
                                 double beta, const std::vector<double>& old_out) {
  int64_t tokens = static_cast<int64_t>(tok_begin.size()) - 1;
  std::vector<double> out(static_cast<size_t>(tokens * width));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < width; ++c) {
      double acc = 0;
      for (int64_t p = tok_begin[static_cast<size_t>(t)]; p < tok_begin[static_cast<size_t>(t + 1)]; ++p) {
        int64_t i = grouped_pos[static_cast<size_t>(p)];
        if (i >= 0) acc += (weights ? (*weights)[static_cast<size_t>(p)] : 1.0) * y[static_cast<size_t>(i * width + c)];
      }
      size_t o = static_cast<size_t>(t * width + c);
      out[o] = beta != 0 ? beta * old_out[o] + acc : acc;
    }
  return out;
}

// fp64 follows the same summation order as the loop above, so it must match exactly; the storage dtypes get
// docs/math.md section 9's bounds.
void check_values(const std::vector<double>& got, const std::vector<double>& want, int64_t width,
                  moekit_dtype_t dtype) {
  if (dtype == MOEKIT_DTYPE_FP64) {
    REQUIRE(got == want);
    return;
  }
  moekit_test::ErrorMetrics m = moekit_test::compare(got, want, width);
  INFO(moekit_test::describe(m));
  REQUIRE(moekit_test::within(m, moekit_test::bounds_for(dtype)));
}

}  // namespace

TEST_CASE("combine and broadcast backward match a plain loop", "[reduce]") {
  ReferenceHandle h;
  std::mt19937_64 rng(555);
  const int64_t T = 29, H = 48, E = 5;
  for (bool variable : {false, true})
    for (moekit_dtype_t dtype : {MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP64})
      for (bool broadcast : {false, true})
        for (double beta : {0.0, 1.0}) {
          INFO((variable ? "variable" : "fixed") << " top-k, dtype " << dtype << (broadcast ? ", broadcast" : ", combine")
                                                 << ", beta " << beta);
          // Pairs per token: K = 3, or 0..5 (some tokens have none) with P_max larger than the pairs used.
          const int64_t K = 3;
          std::vector<int64_t> tok_begin(1, 0);
          std::uniform_int_distribution<int64_t> per_token(0, 5);
          for (int64_t t = 0; t < T; ++t) tok_begin.push_back(tok_begin.back() + (variable ? per_token(rng) : K));
          int64_t pairs = tok_begin.back();
          int64_t slots = variable ? pairs + 7 : pairs;
          Routing routing = random_routing(rng, pairs, E);
          int64_t valid = routing.expert_offsets.back();

          PlanOwner plan;
          moekit_combine_desc_t desc;
          moekit_combine_desc_init(&desc);
          desc.max_tokens = T;
          desc.top_k = variable ? 0 : K;
          desc.max_pairs = slots;
          desc.hidden = H;
          desc.dtype = dtype;
          MOEKIT_REQUIRE_OK(moekit_combine_plan_create(h.handle, &desc, &plan.plan));
          plan.size_workspace();

          HostTensor grouped = grouped_rows(rng, dtype, slots, H, valid);
          HostTensor scores = variable ? HostTensor(MOEKIT_DTYPE_FP32, {slots}) : HostTensor(MOEKIT_DTYPE_FP32, {T, K});
          scores.fill_uniform(rng, 1.0);
          HostTensor grouped_pos = int_tensor(routing.grouped_pos, slots);
          HostTensor tok_offsets = int_tensor(tok_begin, T + 1);
          HostTensor out(dtype, {T, H});
          if (beta != 0) out.fill_uniform(rng, 1.0);
          else out.poison();  // beta = 0: out is never read
          std::vector<double> old_out = out.values();

          moekit_combine_args_t args;
          moekit_combine_args_init(&args);
          args.grouped = grouped.view();
          if (!broadcast) args.scores = scores.view();
          args.grouped_pos = grouped_pos.view();
          if (variable) args.tok_offsets = tok_offsets.view();
          args.out = out.view();
          args.beta = beta;
          if (broadcast)
            MOEKIT_REQUIRE_OK(moekit_broadcast_backward(plan.plan, &args, plan.ws(), plan.workspace.size(), nullptr));
          else
            MOEKIT_REQUIRE_OK(moekit_combine(plan.plan, &args, plan.ws(), plan.workspace.size(), nullptr));

          std::vector<double> weights = scores.values();
          std::vector<double> want = combine_loop(tok_begin, grouped.values(), H, broadcast ? nullptr : &weights,
                                                  routing.grouped_pos, beta, old_out);
          // Round the expectation to the output dtype, as the library's last rounding point does.
          HostTensor rounded(dtype, {T, H});
          rounded.set_values(want);
          check_values(out.values(), rounded.values(), H, dtype);
          // Tokens whose every pair is dropped get exactly beta * old (0 with beta = 0).
          for (int64_t t = 0; t < T; ++t) {
            bool any = false;
            for (int64_t p = tok_begin[static_cast<size_t>(t)]; p < tok_begin[static_cast<size_t>(t + 1)]; ++p)
              any = any || routing.grouped_pos[static_cast<size_t>(p)] >= 0;
            if (!any)
              for (int64_t c = 0; c < H; ++c)
                REQUIRE(out.get(t * H + c) == (beta != 0 ? old_out[static_cast<size_t>(t * H + c)] : 0.0));
          }
        }
}

TEST_CASE("db1 sums each expert's grouped rows", "[reduce]") {
  ReferenceHandle h;
  std::mt19937_64 rng(6502);
  const int64_t P = 70, W = 40, E = 7;
  for (moekit_dtype_t dtype : {MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP64})
    for (moekit_dtype_t out_dtype : {dtype, MOEKIT_DTYPE_FP32})
      for (double beta : {0.0, 1.0}) {
        INFO("dtype " << dtype << ", out dtype " << out_dtype << ", beta " << beta);
        Routing routing = random_routing(rng, P, E);
        routing.expert_offsets[4] = routing.expert_offsets[3];  // expert 3 is empty
        int64_t valid = routing.expert_offsets.back();
        REQUIRE(valid < P);

        PlanOwner plan;
        moekit_bias_grad_desc_t desc;
        moekit_bias_grad_desc_init(&desc);
        desc.experts = E;
        desc.max_rows = P;
        desc.width = W;
        desc.max_tokens = P;
        desc.dtype = dtype;
        desc.out_dtype = out_dtype;
        MOEKIT_REQUIRE_OK(moekit_bias_grad_plan_create(h.handle, &desc, &plan.plan));
        plan.size_workspace();

        HostTensor dh = grouped_rows(rng, dtype, P, W, valid);
        HostTensor offsets = int_tensor(routing.expert_offsets, E + 1);
        HostTensor db1(out_dtype, {E, W});
        if (beta != 0) db1.fill_uniform(rng, 1.0);
        else db1.poison();
        std::vector<double> old = db1.values();
        moekit_db1_args_t args;
        moekit_db1_args_init(&args);
        args.dh = dh.view();
        args.offsets = offsets.view();
        args.db1 = db1.view();
        args.beta = beta;
        MOEKIT_REQUIRE_OK(moekit_db1(plan.plan, &args, plan.ws(), plan.workspace.size(), nullptr));

        std::vector<double> rows = dh.values(), want(static_cast<size_t>(E * W));
        for (int64_t e = 0; e < E; ++e)
          for (int64_t c = 0; c < W; ++c) {
            double acc = 0;
            for (int64_t i = routing.expert_offsets[static_cast<size_t>(e)];
                 i < routing.expert_offsets[static_cast<size_t>(e + 1)]; ++i)
              acc += rows[static_cast<size_t>(i * W + c)];
            size_t o = static_cast<size_t>(e * W + c);
            want[o] = beta != 0 ? beta * old[o] + acc : acc;
          }
        HostTensor rounded(out_dtype, {E, W});
        rounded.set_values(want);
        check_values(db1.values(), rounded.values(), W, out_dtype == MOEKIT_DTYPE_FP32 ? dtype : out_dtype);
        for (int64_t c = 0; c < W; ++c) REQUIRE(db1.get(3 * W + c) == (beta != 0 ? old[static_cast<size_t>(3 * W + c)] : 0.0));
      }
}

TEST_CASE("db2 and the dout . b2 part of ds", "[reduce]") {
  ReferenceHandle h;
  std::mt19937_64 rng(1234);
  const int64_t T = 31, K = 2, H = 36, E = 6, P = T * K;
  for (moekit_dtype_t dtype : {MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP64})
    for (bool has_b2 : {false, true})
      for (bool has_db2 : {false, true})
        for (double beta : {0.0, 1.0}) {
          if (!has_b2 && !has_db2) continue;
          INFO("dtype " << dtype << ", b2 " << has_b2 << ", db2 " << has_db2 << ", beta " << beta);
          Routing routing = random_routing(rng, P, E);
          std::vector<int64_t> gather(routing.pair_idx.size());
          for (size_t i = 0; i < gather.size(); ++i) gather[i] = routing.pair_idx[i] / K;

          PlanOwner plan;
          moekit_bias_grad_desc_t desc;
          moekit_bias_grad_desc_init(&desc);
          desc.experts = E;
          desc.max_rows = P;
          desc.width = H;
          desc.max_tokens = T;
          desc.dtype = dtype;
          MOEKIT_REQUIRE_OK(moekit_bias_grad_plan_create(h.handle, &desc, &plan.plan));
          plan.size_workspace();

          HostTensor dout(dtype, {T, H}), b2(dtype, {E, H}), scores(MOEKIT_DTYPE_FP32, {T, K});
          HostTensor ds(MOEKIT_DTYPE_FP32, {T, K}), db2(dtype, {E, H});
          dout.fill_uniform(rng, 1.0);
          b2.fill_uniform(rng, 1.0);
          scores.fill_uniform(rng, 1.0);
          ds.fill_uniform(rng, 1.0);
          if (beta != 0) db2.fill_uniform(rng, 1.0);
          else db2.poison();
          HostTensor ds_before = ds, db2_before = db2;
          HostTensor offsets = int_tensor(routing.expert_offsets, E + 1);
          HostTensor gather_idx = int_tensor(gather, P), pair_idx = int_tensor(routing.pair_idx, P);

          moekit_db2_ds_args_t args;
          moekit_db2_ds_args_init(&args);
          args.dout = dout.view();
          args.scores = scores.view();
          if (has_b2) args.b2 = b2.view();
          args.offsets = offsets.view();
          args.gather_idx = gather_idx.view();
          args.pair_idx = pair_idx.view();
          if (has_db2) args.db2 = db2.view();
          // Without b2, dscores is optional: passed with beta = 1, absent with beta = 0.
          if (has_b2 || beta != 0) args.dscores = ds.view();
          args.beta = beta;
          MOEKIT_REQUIRE_OK(moekit_db2_ds(plan.plan, &args, plan.ws(), plan.workspace.size(), nullptr));

          std::vector<double> g = dout.values(), bias = b2.values(), s = scores.values();
          std::vector<double> want_db2(static_cast<size_t>(E * H)), want_ds = ds_before.values();
          std::vector<double> old_db2 = db2_before.values();
          for (int64_t e = 0; e < E; ++e) {
            for (int64_t c = 0; c < H; ++c) {
              double acc = 0;
              for (int64_t i = routing.expert_offsets[static_cast<size_t>(e)];
                   i < routing.expert_offsets[static_cast<size_t>(e + 1)]; ++i) {
                int64_t p = routing.pair_idx[static_cast<size_t>(i)];
                acc += s[static_cast<size_t>(p)] * g[static_cast<size_t>((p / K) * H + c)];
              }
              size_t o = static_cast<size_t>(e * H + c);
              want_db2[o] = beta != 0 ? beta * old_db2[o] + acc : acc;
            }
            for (int64_t i = routing.expert_offsets[static_cast<size_t>(e)];
                 i < routing.expert_offsets[static_cast<size_t>(e + 1)]; ++i) {
              int64_t p = routing.pair_idx[static_cast<size_t>(i)];
              double dot = 0;
              for (int64_t c = 0; c < H; ++c)
                dot += g[static_cast<size_t>((p / K) * H + c)] * bias[static_cast<size_t>(e * H + c)];
              want_ds[static_cast<size_t>(p)] += dot;
            }
          }

          if (has_db2) {
            HostTensor rounded(dtype, {E, H});
            rounded.set_values(want_db2);
            check_values(db2.values(), rounded.values(), H, dtype);
          } else {
            REQUIRE(db2.bytes_equal(db2_before));
          }
          if (has_b2) {
            // ds is fp32 whatever the dtype: compare with a tolerance, element by element.
            for (int64_t p = 0; p < P; ++p) {
              INFO("pair " << p << (routing.grouped_pos[static_cast<size_t>(p)] < 0 ? " (dropped)" : ""));
              double want = static_cast<float>(want_ds[static_cast<size_t>(p)]);
              REQUIRE(std::fabs(ds.get(p) - want) <= 1e-6 * std::max(1.0, std::fabs(want)));
              if (routing.grouped_pos[static_cast<size_t>(p)] < 0) REQUIRE(ds.get(p) == ds_before.get(p));
            }
          } else {
            REQUIRE(ds.bytes_equal(ds_before));  // without b2, ds is untouched
          }
        }
}

TEST_CASE("combine rejects a grouped position past the grouped rows and writes nothing", "[reduce]") {
  ReferenceHandle h;
  std::mt19937_64 rng(404);
  const int64_t T = 4, K = 2, H = 8;
  PlanOwner plan;
  moekit_combine_desc_t desc;
  moekit_combine_desc_init(&desc);
  desc.max_tokens = T;
  desc.top_k = K;
  desc.hidden = H;
  desc.dtype = MOEKIT_DTYPE_FP32;
  MOEKIT_REQUIRE_OK(moekit_combine_plan_create(h.handle, &desc, &plan.plan));
  plan.size_workspace();
  HostTensor grouped(MOEKIT_DTYPE_FP32, {T * K, H}), scores(MOEKIT_DTYPE_FP32, {T, K}), out(MOEKIT_DTYPE_FP32, {T, H});
  grouped.fill_uniform(rng, 1.0);
  scores.fill_uniform(rng, 1.0);
  out.poison();
  HostTensor untouched = out;
  HostTensor grouped_pos = int_tensor({0, 1, 2, 3, -1, 5, 6, T * K}, T * K);
  moekit_combine_args_t args;
  moekit_combine_args_init(&args);
  args.grouped = grouped.view();
  args.scores = scores.view();
  args.grouped_pos = grouped_pos.view();
  args.out = out.view();
  REQUIRE(moekit_combine(plan.plan, &args, plan.ws(), plan.workspace.size(), nullptr) == MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(moekit_test::last_error().find("grouped_pos") != std::string::npos);
  REQUIRE(out.bytes_equal(untouched));
}
