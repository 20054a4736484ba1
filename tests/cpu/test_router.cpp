// The router (docs/math.md section 1) through the C ABI on the reference backend: forward against an independent
// implementation for every kind, tie-breaking, -inf masks, counts, and the backward against central finite
// differences in fp64.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/test_util.h"
#include "cpu/router_plan.h"

using moekit_test::HostTensor;
using moekit_test::ReferenceHandle;

namespace {

moekit_router_desc_t router_desc(int64_t tokens, int64_t experts, int64_t top_k, int32_t kind, bool renormalize,
                                 double scale, moekit_dtype_t dtype) {
  moekit_router_desc_t desc;
  moekit_router_desc_init(&desc);
  desc.max_tokens = tokens;
  desc.experts = experts;
  desc.top_k = top_k;
  desc.kind = kind;
  desc.renormalize = renormalize ? 1 : 0;
  desc.scale = scale;
  desc.dtype = dtype;
  return desc;
}

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

// What the router must produce for one problem, computed the plain way: sort every expert by its fp32 key.
struct Expected {
  std::vector<double> scores;
  std::vector<int64_t> indices;
  std::vector<int64_t> counts;
};

Expected expected_forward(const moekit_router_desc_t& d, int64_t tokens, const std::vector<double>& logits,
                          const std::vector<double>& bias) {
  int64_t E = d.experts, K = d.top_k;
  Expected out{std::vector<double>(static_cast<size_t>(tokens * K)),
               std::vector<int64_t>(static_cast<size_t>(tokens * K)), std::vector<int64_t>(static_cast<size_t>(E))};
  for (int64_t t = 0; t < tokens; ++t) {
    const double* row = &logits[static_cast<size_t>(t * E)];
    std::vector<float> key(static_cast<size_t>(E));
    std::vector<int64_t> order;
    for (int64_t e = 0; e < E; ++e) {
      double k = d.kind == MOEKIT_ROUTER_SIGMOID ? sigmoid(row[e]) + (bias.empty() ? 0.0 : bias[static_cast<size_t>(e)])
                                                 : row[e];
      key[static_cast<size_t>(e)] = static_cast<float>(k);
      if (!std::isinf(row[e])) order.push_back(e);
    }
    // stable_sort keeps the lower expert first among equal keys.
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return key[static_cast<size_t>(a)] > key[static_cast<size_t>(b)]; });
    std::vector<double> r(static_cast<size_t>(K));
    double denominator = 0;
    for (int64_t e = 0; e < E; ++e) denominator += std::exp(row[e]);
    for (int64_t k = 0; k < K; ++k) {
      int64_t e = order[static_cast<size_t>(k)];
      out.indices[static_cast<size_t>(t * K + k)] = e;
      ++out.counts[static_cast<size_t>(e)];
      switch (d.kind) {
        case MOEKIT_ROUTER_SOFTMAX_TOPK:
        case MOEKIT_ROUTER_TOPK: r[static_cast<size_t>(k)] = row[e]; break;
        case MOEKIT_ROUTER_TOPK_SOFTMAX: r[static_cast<size_t>(k)] = std::exp(row[e]) / denominator; break;
        default: r[static_cast<size_t>(k)] = sigmoid(row[e]);
      }
    }
    double sum = std::accumulate(r.begin(), r.end(), 0.0);
    double top_exp_sum = 0;
    for (double v : r) top_exp_sum += std::exp(v);
    for (int64_t k = 0; k < K; ++k) {
      double v = r[static_cast<size_t>(k)], s;
      if (d.kind == MOEKIT_ROUTER_SOFTMAX_TOPK) s = std::exp(v) / top_exp_sum;
      else s = d.renormalize ? v / sum : v;
      if (d.kind == MOEKIT_ROUTER_SIGMOID) s *= d.scale;
      out.scores[static_cast<size_t>(t * K + k)] = s;
    }
  }
  return out;
}

const char* kind_name(int32_t kind) {
  switch (kind) {
    case MOEKIT_ROUTER_SOFTMAX_TOPK: return "softmax_topk";
    case MOEKIT_ROUTER_TOPK_SOFTMAX: return "topk_softmax";
    case MOEKIT_ROUTER_TOPK: return "topk";
    default: return "sigmoid";
  }
}

struct ForwardResult {
  std::vector<double> scores;
  std::vector<int64_t> indices;
  std::vector<int64_t> counts;
};

ForwardResult run_forward(moekit_handle_t handle, const moekit_router_desc_t& desc, HostTensor& logits,
                          HostTensor* bias, moekit_dtype_t index_dtype, moekit_dtype_t score_dtype = MOEKIT_DTYPE_FP32) {
  RouterPlan plan(handle, desc);
  int64_t tokens = logits.rows();
  HostTensor scores(score_dtype, {tokens, desc.top_k}), indices(index_dtype, {tokens, desc.top_k});
  HostTensor counts(MOEKIT_DTYPE_INT32, {desc.experts});
  scores.poison();
  indices.poison();
  counts.poison();
  moekit_router_fwd_args_t args;
  moekit_router_fwd_args_init(&args);
  args.logits = logits.view();
  if (bias) args.bias = bias->view();
  args.scores = scores.view();
  args.indices = indices.view();
  args.counts = counts.view();
  MOEKIT_REQUIRE_OK(moekit_router_forward(plan.plan, &args, plan.ws(), plan.workspace.size(), nullptr));
  ForwardResult result{scores.values(), {}, {}};
  for (double v : indices.values()) result.indices.push_back(static_cast<int64_t>(v));
  for (double v : counts.values()) result.counts.push_back(static_cast<int64_t>(v));
  return result;
}

void check_scores(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("score " << i << ": got " << got[i] << ", want " << want[i]);
    REQUIRE(std::fabs(got[i] - want[i]) <= 1e-6 * std::max(1.0, std::fabs(want[i])));
  }
}

const int32_t kAllKinds[] = {MOEKIT_ROUTER_SOFTMAX_TOPK, MOEKIT_ROUTER_TOPK_SOFTMAX, MOEKIT_ROUTER_TOPK,
                             MOEKIT_ROUTER_SIGMOID};

}  // namespace

TEST_CASE("router forward matches a plain sort for every kind, renorm and logits dtype", "[router]") {
  ReferenceHandle h;
  std::mt19937_64 rng(20261);
  const int64_t T = 37, E = 13, K = 4;
  for (int32_t kind : kAllKinds)
    for (bool renormalize : {false, true})
      for (moekit_dtype_t dtype : {MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP32, MOEKIT_DTYPE_FP64}) {
        INFO(kind_name(kind) << " renorm " << renormalize << " dtype " << dtype);
        double scale = kind == MOEKIT_ROUTER_SIGMOID ? 2.5 : 1.0;
        moekit_router_desc_t desc = router_desc(T, E, K, kind, renormalize, scale, dtype);
        HostTensor logits(dtype, {T, E});
        logits.fill_uniform(rng, 3.0);
        if (kind == MOEKIT_ROUTER_TOPK) {
          // Already-activated scores: positive, as renormalising needs.
          std::uniform_real_distribution<double> positive(0.05, 1.0);
          for (int64_t i = 0; i < T * E; ++i) logits.set(i, positive(rng));
        }
        // Mask a few experts; every row keeps at least K finite logits.
        for (int64_t t = 0; t < T; t += 3) logits.set(t * E + (t % E), -INFINITY);
        HostTensor bias(MOEKIT_DTYPE_FP32, {E});
        bias.fill_uniform(rng, 0.3);
        HostTensor* bias_arg = kind == MOEKIT_ROUTER_SIGMOID ? &bias : nullptr;
        moekit_dtype_t index_dtype = dtype == MOEKIT_DTYPE_FP32 ? MOEKIT_DTYPE_INT64 : MOEKIT_DTYPE_INT32;

        ForwardResult got = run_forward(h.handle, desc, logits, bias_arg, index_dtype);
        Expected want = expected_forward(desc, T, logits.values(), bias_arg ? bias.values() : std::vector<double>{});
        REQUIRE(got.indices == want.indices);
        REQUIRE(got.counts == want.counts);
        check_scores(got.scores, want.scores);
      }
}

TEST_CASE("router forward breaks exact ties toward the lower expert", "[router]") {
  ReferenceHandle h;
  const int64_t E = 6, K = 3;
  // Row 0: three-way tie at the top; row 1: tie for the last slot; row 2: all equal.
  std::vector<double> rows = {0.5, 0.9, 0.1, 0.9, 0.2, 0.9,  //
                              0.8, 0.3, 0.7, 0.1, 0.3, 0.3,  //
                              0.4, 0.4, 0.4, 0.4, 0.4, 0.4};
  std::vector<int64_t> want = {1, 3, 5, 0, 2, 1, 0, 1, 2};
  for (int32_t kind : kAllKinds) {
    INFO(kind_name(kind));
    moekit_router_desc_t desc = router_desc(3, E, K, kind, false, 1.0, MOEKIT_DTYPE_FP32);
    HostTensor logits(MOEKIT_DTYPE_FP32, {3, E});
    logits.set_values(rows);
    HostTensor bias(MOEKIT_DTYPE_FP32, {E});
    bias.set_values(std::vector<double>(E, 0.25));  // the same bias for all keeps the ties
    ForwardResult got =
        run_forward(h.handle, desc, logits, kind == MOEKIT_ROUTER_SIGMOID ? &bias : nullptr, MOEKIT_DTYPE_INT64);
    REQUIRE(got.indices == want);
  }
}

TEST_CASE("router forward never selects a -inf logit, whatever the sigmoid bias", "[router]") {
  ReferenceHandle h;
  std::mt19937_64 rng(77);
  const int64_t T = 9, E = 8, K = 3;
  for (int32_t kind : kAllKinds) {
    INFO(kind_name(kind));
    moekit_router_desc_t desc = router_desc(T, E, K, kind, true, 1.0, MOEKIT_DTYPE_FP32);
    HostTensor logits(MOEKIT_DTYPE_FP32, {T, E});
    std::uniform_real_distribution<double> positive(0.05, 1.0);
    // Exactly K finite logits per row, at rotating positions: the selection must be exactly those.
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e) logits.set(t * E + e, (e - t + E) % E < K ? positive(rng) : -INFINITY);
    // Every masked expert carries a bias far larger than any sigmoid difference.
    HostTensor bias(MOEKIT_DTYPE_FP32, {E});
    bias.set_values(std::vector<double>(E, 1000.0));
    ForwardResult got =
        run_forward(h.handle, desc, logits, kind == MOEKIT_ROUTER_SIGMOID ? &bias : nullptr, MOEKIT_DTYPE_INT32);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < K; ++k) {
        int64_t e = got.indices[static_cast<size_t>(t * K + k)];
        INFO("token " << t << " slot " << k << " expert " << e);
        REQUIRE(e >= 0);
        REQUIRE(e < E);
        REQUIRE(!std::isinf(logits.get(t * E + e)));
      }
    // Renormalised (or softmax) scores over the finite logits are finite and sum to 1.
    for (int64_t t = 0; t < T; ++t) {
      double sum = 0;
      for (int64_t k = 0; k < K; ++k) sum += got.scores[static_cast<size_t>(t * K + k)];
      REQUIRE(sum == Approx(1.0).epsilon(1e-6));
    }
    // A large bias on an unmasked expert does win the sigmoid selection: the bias is live, not ignored.
    if (kind == MOEKIT_ROUTER_SIGMOID) {
      HostTensor dense(MOEKIT_DTYPE_FP32, {T, E});
      dense.fill_uniform(rng, 2.0);
      std::vector<double> steer(E, 0.0);
      steer[5] = 1000.0;
      bias.set_values(steer);
      ForwardResult steered = run_forward(h.handle, desc, dense, &bias, MOEKIT_DTYPE_INT32);
      for (int64_t t = 0; t < T; ++t) REQUIRE(steered.indices[static_cast<size_t>(t * K)] == 5);
    }
  }
}

TEST_CASE("router backward matches central finite differences in fp64", "[router]") {
  ReferenceHandle h;
  std::mt19937_64 rng(4242);
  const int64_t T = 5, E = 9, K = 3;
  const double step = 1e-6;
  for (int32_t kind : kAllKinds)
    for (bool renormalize : {false, true}) {
      INFO(kind_name(kind) << " renorm " << renormalize);
      moekit_router_desc_t desc = router_desc(T, E, K, kind, renormalize, kind == MOEKIT_ROUTER_SIGMOID ? 1.7 : 1.0,
                                              MOEKIT_DTYPE_FP64);
      // Distinct logits spaced 0.1 apart in a random order per row: a +-1e-6 step never flips the selection.
      HostTensor logits(MOEKIT_DTYPE_FP64, {T, E});
      for (int64_t t = 0; t < T; ++t) {
        std::vector<int64_t> rank(E);
        std::iota(rank.begin(), rank.end(), 0);
        std::shuffle(rank.begin(), rank.end(), rng);
        double base = kind == MOEKIT_ROUTER_TOPK ? 0.2 : -0.4;
        for (int64_t e = 0; e < E; ++e) logits.set(t * E + e, base + 0.1 * static_cast<double>(rank[static_cast<size_t>(e)]));
      }
      HostTensor g(MOEKIT_DTYPE_FP32, {T, K});
      g.fill_uniform(rng, 1.0);

      auto loss = [&](HostTensor& l, std::vector<int64_t>* indices_out) {
        ForwardResult r = run_forward(h.handle, desc, l, nullptr, MOEKIT_DTYPE_INT64, MOEKIT_DTYPE_FP64);
        if (indices_out) *indices_out = r.indices;
        double total = 0;
        for (size_t i = 0; i < r.scores.size(); ++i) total += g.get(static_cast<int64_t>(i)) * r.scores[i];
        return total;
      };
      std::vector<int64_t> selected;
      loss(logits, &selected);

      HostTensor indices(MOEKIT_DTYPE_INT64, {T, K});
      for (size_t i = 0; i < selected.size(); ++i) indices.set(static_cast<int64_t>(i), static_cast<double>(selected[i]));
      HostTensor dlogits(MOEKIT_DTYPE_FP64, {T, E});
      dlogits.poison();
      RouterPlan plan(h.handle, desc);
      moekit_router_bwd_args_t args;
      moekit_router_bwd_args_init(&args);
      args.logits = logits.view();
      args.indices = indices.view();
      args.dscores = g.view();
      args.dlogits = dlogits.view();
      args.accumulate = 0;
      MOEKIT_REQUIRE_OK(moekit_router_backward(plan.plan, &args, plan.ws(), plan.workspace.size(), nullptr));

      double max_abs = 0;
      for (int64_t i = 0; i < T * E; ++i) max_abs = std::max(max_abs, std::fabs(dlogits.get(i)));
      REQUIRE(max_abs > 1e-3);  // a gradient of zeros would pass the comparison below trivially
      for (int64_t i = 0; i < T * E; ++i) {
        double original = logits.get(i);
        std::vector<int64_t> moved;
        logits.set(i, original + step);
        double up = loss(logits, &moved);
        REQUIRE(moved == selected);
        logits.set(i, original - step);
        double down = loss(logits, &moved);
        REQUIRE(moved == selected);
        logits.set(i, original);
        double fd = (up - down) / (2 * step);
        INFO("logit " << i << ": analytic " << dlogits.get(i) << ", finite difference " << fd);
        REQUIRE(std::fabs(dlogits.get(i) - fd) <= 1e-6 * max_abs);
      }
      // Only TOPK_SOFTMAX reaches the experts it did not select.
      if (kind != MOEKIT_ROUTER_TOPK_SOFTMAX)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t e = 0; e < E; ++e) {
            bool chosen = false;
            for (int64_t k = 0; k < K; ++k) chosen = chosen || selected[static_cast<size_t>(t * K + k)] == e;
            if (!chosen) REQUIRE(dlogits.get(t * E + e) == 0.0);
          }
    }
}

TEST_CASE("router backward accumulates into dlogits when asked", "[router]") {
  ReferenceHandle h;
  std::mt19937_64 rng(99);
  const int64_t T = 11, E = 7, K = 2;
  for (int32_t kind : kAllKinds) {
    INFO(kind_name(kind));
    // fp64 logits and dlogits: the accumulated value must be exactly old + new.
    moekit_router_desc_t desc = router_desc(T, E, K, kind, true, 1.0, MOEKIT_DTYPE_FP64);
    HostTensor logits(MOEKIT_DTYPE_FP64, {T, E});
    std::uniform_real_distribution<double> positive(0.05, 1.0);
    for (int64_t i = 0; i < T * E; ++i) logits.set(i, positive(rng));
    ForwardResult fwd = run_forward(h.handle, desc, logits, nullptr, MOEKIT_DTYPE_INT32);
    HostTensor indices(MOEKIT_DTYPE_INT32, {T, K});
    for (size_t i = 0; i < fwd.indices.size(); ++i) indices.set(static_cast<int64_t>(i), static_cast<double>(fwd.indices[i]));
    HostTensor g(MOEKIT_DTYPE_FP32, {T, K});
    g.fill_uniform(rng, 1.0);

    RouterPlan plan(h.handle, desc);
    moekit_router_bwd_args_t args;
    moekit_router_bwd_args_init(&args);
    args.logits = logits.view();
    args.indices = indices.view();
    args.dscores = g.view();

    HostTensor fresh(MOEKIT_DTYPE_FP64, {T, E});
    fresh.poison();  // overwrite mode never reads the old values
    args.dlogits = fresh.view();
    args.accumulate = 0;
    MOEKIT_REQUIRE_OK(moekit_router_backward(plan.plan, &args, plan.ws(), plan.workspace.size(), nullptr));

    HostTensor accumulated(MOEKIT_DTYPE_FP64, {T, E});
    accumulated.fill_uniform(rng, 1.0);
    std::vector<double> before = accumulated.values();
    args.dlogits = accumulated.view();
    args.accumulate = 1;
    MOEKIT_REQUIRE_OK(moekit_router_backward(plan.plan, &args, plan.ws(), plan.workspace.size(), nullptr));
    for (int64_t i = 0; i < T * E; ++i) {
      REQUIRE(!std::isnan(fresh.get(i)));
      REQUIRE(accumulated.get(i) == before[static_cast<size_t>(i)] + fresh.get(i));
    }
  }
}
