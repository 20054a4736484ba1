// The router's auxiliary losses (docs/math.md section 1.1) through the C ABI on the reference backend: their values
// against a plain double-precision oracle written here, their gradients against central finite differences in fp64,
// the aux part of dlogits next to a large score gradient (compared on its own scale), the upstream gradients, the
// ugly shapes (T = 1, experts nobody picks, one expert taking every token) and the contract's refusals.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/finite_difference.h"
#include "common/test_util.h"
#include "cpu/router_plan.h"

using moekit_test::HostTensor;
using moekit_test::ReferenceHandle;

namespace {

moekit_router_desc_t aux_desc(int64_t tokens, int64_t experts, int64_t top_k, int32_t kind, moekit_dtype_t dtype,
                              double lb_coeff, double z_coeff) {
  moekit_router_desc_t d;
  moekit_router_desc_init(&d);
  d.max_tokens = tokens;
  d.experts = experts;
  d.top_k = top_k;
  d.kind = kind;
  d.dtype = dtype;
  d.load_balance_coeff = lb_coeff;
  d.z_loss_coeff = z_coeff;
  return d;
}

// The oracle: both losses and their logits gradient, from the definitions, with f counted from `indices`.
struct Oracle {
  double load_balance = 0, z = 0;
  std::vector<double> dlogits;  // d(LB + Z) / d logits, f held constant
};

Oracle oracle(const moekit_router_desc_t& d, int64_t T, const std::vector<double>& logits,
              const std::vector<int64_t>& indices) {
  const int64_t E = d.experts, K = d.top_k;
  Oracle o;
  o.dlogits.assign(static_cast<size_t>(T * E), 0.0);
  if (T == 0) return o;
  std::vector<double> f(static_cast<size_t>(E), 0.0), p(static_cast<size_t>(T * E)), lse(static_cast<size_t>(T));
  for (int64_t i : indices) f[static_cast<size_t>(i)] += 1.0 / static_cast<double>(T * K);
  for (int64_t t = 0; t < T; ++t) {
    double m = -INFINITY, z = 0;
    for (int64_t e = 0; e < E; ++e) m = std::max(m, logits[static_cast<size_t>(t * E + e)]);
    for (int64_t e = 0; e < E; ++e) z += std::exp(logits[static_cast<size_t>(t * E + e)] - m);
    lse[static_cast<size_t>(t)] = m + std::log(z);
    for (int64_t e = 0; e < E; ++e)
      p[static_cast<size_t>(t * E + e)] = std::exp(logits[static_cast<size_t>(t * E + e)] - lse[static_cast<size_t>(t)]);
  }
  for (int64_t e = 0; e < E; ++e) {
    double mean_p = 0;
    for (int64_t t = 0; t < T; ++t) mean_p += p[static_cast<size_t>(t * E + e)] / static_cast<double>(T);
    o.load_balance += d.load_balance_coeff * static_cast<double>(E) * f[static_cast<size_t>(e)] * mean_p;
  }
  for (int64_t t = 0; t < T; ++t) {
    const double l = lse[static_cast<size_t>(t)];
    o.z += d.z_loss_coeff * l * l / static_cast<double>(T);
    // d/dlogit_j of sum_e f_e p_e is p_j (f_j - f . p); of lse^2 it is 2 lse p_j.
    double f_dot_p = 0;
    for (int64_t e = 0; e < E; ++e) f_dot_p += f[static_cast<size_t>(e)] * p[static_cast<size_t>(t * E + e)];
    for (int64_t j = 0; j < E; ++j) {
      const double pj = p[static_cast<size_t>(t * E + j)];
      o.dlogits[static_cast<size_t>(t * E + j)] =
          d.load_balance_coeff * static_cast<double>(E) / static_cast<double>(T) * pj *
              (f[static_cast<size_t>(j)] - f_dot_p) +
          d.z_loss_coeff * 2.0 * l * pj / static_cast<double>(T);
    }
  }
  return o;
}

struct Forward {
  std::vector<int64_t> indices;
  double load_balance, z;
};

Forward run_forward(moekit_handle_t handle, const moekit_router_desc_t& d, HostTensor& logits) {
  RouterPlan plan(handle, d);
  const int64_t T = logits.rows();
  const moekit_dtype_t sd = d.dtype == MOEKIT_DTYPE_FP64 ? MOEKIT_DTYPE_FP64 : MOEKIT_DTYPE_FP32;
  HostTensor scores(sd, {T, d.top_k}), indices(MOEKIT_DTYPE_INT64, {T, d.top_k}), lb(sd, {1}), z(sd, {1});
  scores.poison();
  indices.poison();
  lb.poison();
  z.poison();
  moekit_router_fwd_args_t a;
  moekit_router_fwd_args_init(&a);
  a.logits = logits.view();
  a.scores = scores.view();
  a.indices = indices.view();
  if (d.load_balance_coeff != 0) a.load_balance_loss = lb.view();
  if (d.z_loss_coeff != 0) a.z_loss = z.view();
  MOEKIT_REQUIRE_OK(moekit_router_forward(plan.plan, &a, plan.ws(), plan.workspace.size(), nullptr));
  return Forward{moekit_test::as_integers(indices), d.load_balance_coeff != 0 ? lb.get(0) : 0.0,
                 d.z_loss_coeff != 0 ? z.get(0) : 0.0};
}

// dlogits (fp32, or fp64 in an fp64 plan) from dscores; upstream gradients < 0 mean "absent" (= 1). With `old`,
// the backward accumulates into a copy of it.
std::vector<double> run_backward(moekit_handle_t handle, const moekit_router_desc_t& d, HostTensor& logits,
                                 const std::vector<int64_t>& indices, HostTensor& dscores, double d_lb = -1,
                                 double d_z = -1, const HostTensor* old = nullptr) {
  RouterPlan plan(handle, d);
  const int64_t T = logits.rows();
  const moekit_dtype_t sd = d.dtype == MOEKIT_DTYPE_FP64 ? MOEKIT_DTYPE_FP64 : MOEKIT_DTYPE_FP32;
  HostTensor idx(MOEKIT_DTYPE_INT64, {T, d.top_k}), dlogits(sd, {T, d.experts}), dlb(sd, {1}), dz(sd, {1, 1});
  for (int64_t i = 0; i < idx.numel(); ++i) idx.set(i, static_cast<double>(indices[static_cast<size_t>(i)]));
  if (old) {
    dlogits = *old;
  } else {
    dlogits.poison();
  }
  dlb.set(0, d_lb);
  dz.set(0, d_z);
  moekit_router_bwd_args_t a;
  moekit_router_bwd_args_init(&a);
  a.logits = logits.view();
  a.indices = idx.view();
  a.dscores = dscores.view();
  a.dlogits = dlogits.view();
  a.accumulate = old ? 1 : 0;
  if (d_lb >= 0) a.dload_balance_loss = dlb.view();
  if (d_z >= 0) a.dz_loss = dz.view();
  MOEKIT_REQUIRE_OK(moekit_router_backward(plan.plan, &a, plan.ws(), plan.workspace.size(), nullptr));
  return dlogits.values();
}

// Logits of the ugly shapes: "random", "unused" (the last two experts masked with `mask`, -inf by default: f = P = 0
// there) and "one_takes_all" (expert 1 far above the rest in every row, K = 1: f_1 = 1).
HostTensor make_logits(const char* shape, int64_t T, int64_t E, moekit_dtype_t dtype, std::mt19937_64& rng,
                       double mask = -INFINITY) {
  HostTensor logits(dtype, {T, E});
  logits.fill_uniform(rng, 2.0);
  const std::string s = shape;
  for (int64_t t = 0; t < T; ++t) {
    if (s == "unused") {
      logits.set(t * E + E - 1, mask);
      logits.set(t * E + E - 2, mask);
    } else if (s == "one_takes_all") {
      logits.set(t * E + 1, 6.0);
    }
  }
  return logits;
}

struct Case {
  const char* shape;
  int64_t T, E, K;
  int32_t kind;
};

const Case kCases[] = {
    {"random", 37, 8, 2, MOEKIT_ROUTER_SOFTMAX_TOPK}, {"random", 29, 13, 3, MOEKIT_ROUTER_TOPK_SOFTMAX},
    {"random", 1, 6, 2, MOEKIT_ROUTER_SOFTMAX_TOPK},  {"random", 1, 5, 1, MOEKIT_ROUTER_TOPK_SOFTMAX},
    {"unused", 23, 9, 2, MOEKIT_ROUTER_SOFTMAX_TOPK}, {"unused", 17, 7, 3, MOEKIT_ROUTER_TOPK_SOFTMAX},
    {"one_takes_all", 19, 6, 1, MOEKIT_ROUTER_SOFTMAX_TOPK},
    {"one_takes_all", 11, 4, 1, MOEKIT_ROUTER_TOPK_SOFTMAX},
};

}  // namespace

TEST_CASE("aux losses: forward values match the double-precision oracle", "[router][aux_losses]") {
  ReferenceHandle h;
  std::mt19937_64 rng(401);
  for (const Case& c : kCases) {
    for (moekit_dtype_t dtype : {MOEKIT_DTYPE_FP64, MOEKIT_DTYPE_FP32, MOEKIT_DTYPE_BF16}) {
      INFO(c.shape << " T=" << c.T << " E=" << c.E << " K=" << c.K << " kind " << c.kind << " dtype " << dtype);
      moekit_router_desc_t d = aux_desc(c.T, c.E, c.K, c.kind, dtype, 0.01, 0.001);
      HostTensor logits = make_logits(c.shape, c.T, c.E, dtype, rng);
      Forward fwd = run_forward(h.handle, d, logits);
      Oracle o = oracle(d, c.T, logits.values(), fwd.indices);
      // The oracle reads the same rounded logits: only the output's rounding separates the two.
      const double tol = dtype == MOEKIT_DTYPE_FP64 ? 1e-13 : 1e-7;
      CHECK(std::abs(fwd.load_balance - o.load_balance) <= tol * o.load_balance);
      CHECK(std::abs(fwd.z - o.z) <= tol * o.z + 1e-300);
      if (std::string(c.shape) == "one_takes_all") {
        // f = e_1, so LB = coeff * E * P_1 and P_1 is close to 1.
        CHECK(fwd.load_balance > 0.9 * 0.01 * static_cast<double>(c.E));
      }
    }
  }
}

TEST_CASE("aux losses: balanced routing gives a load-balancing loss of coeff", "[router][aux_losses]") {
  // Token t's logits are 1 at expert t % E and 0 elsewhere, and T is a multiple of E: by symmetry f_e = P_e = 1/E,
  // so LB = coeff * E * E * (1/E)^2 = coeff, the loss's minimum over f.
  ReferenceHandle h;
  const int64_t E = 4, T = 8, K = 1;
  moekit_router_desc_t d = aux_desc(T, E, K, MOEKIT_ROUTER_SOFTMAX_TOPK, MOEKIT_DTYPE_FP64, 0.5, 0);
  HostTensor logits(MOEKIT_DTYPE_FP64, {T, E});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) logits.set(t * E + e, ((e - t) % E + E) % E == 0 ? 1.0 : 0.0);
  Forward fwd = run_forward(h.handle, d, logits);
  CHECK(std::abs(fwd.load_balance - 0.5) <= 1e-14);
}

TEST_CASE("aux losses: backward matches central finite differences in fp64", "[router][aux_losses]") {
  ReferenceHandle h;
  std::mt19937_64 rng(402);
  for (const Case& c : kCases) {
    INFO(c.shape << " T=" << c.T << " E=" << c.E << " K=" << c.K << " kind " << c.kind);
    moekit_router_desc_t d = aux_desc(c.T, c.E, c.K, c.kind, MOEKIT_DTYPE_FP64, 0.02, 0.003);
    // The step of a finite difference scales with the logits' rms: unused experts get a far-below logit, not -inf.
    HostTensor logits = make_logits(c.shape, c.T, c.E, MOEKIT_DTYPE_FP64, rng, -8.0);
    Forward fwd = run_forward(h.handle, d, logits);
    HostTensor dscores(MOEKIT_DTYPE_FP64, {c.T, c.K});  // zero: dlogits is the aux part alone
    std::vector<double> dlogits = run_backward(h.handle, d, logits, fwd.indices, dscores);
    HostTensor grad(MOEKIT_DTYPE_FP64, {c.T, c.E});
    grad.set_values(dlogits);
    std::vector<int64_t> entries = moekit_test::pick_entries(c.T * c.E, 60, rng);
    struct Problem {
      moekit_handle_t handle;
      const moekit_router_desc_t& d;
      HostTensor& logits;
      double loss() {
        Forward f = run_forward(handle, d, logits);
        return f.load_balance + f.z;
      }
    } problem{h.handle, d, logits};
    moekit_test::FdResult r = moekit_test::central_differences(problem, logits, grad, entries);
    moekit_test::check_fd_result("logits", r, grad);
    // And the analytic oracle, everywhere.
    Oracle o = oracle(d, c.T, logits.values(), fwd.indices);
    moekit_test::ErrorMetrics m = moekit_test::compare(dlogits, o.dlogits, c.E);
    INFO(moekit_test::describe(m));
    CHECK(moekit_test::within(m, moekit_test::bounds_for(MOEKIT_DTYPE_FP64)));
  }
}

TEST_CASE("aux losses: the aux part of dlogits next to a large score gradient, on its own scale",
          "[router][aux_losses]") {
  // dlogits = main + aux with |main| >> |aux|. The aux part is recovered as (with - without) and compared with the
  // oracle by the three metrics of docs/math.md section 9 (whole, per expert column, per row) in fp64, where the
  // subtraction is exact enough; in fp32 each element's deviation is bounded by the rounding of the larger term
  // (a few ulps of |main| + |aux|) plus 1e-6 of the aux part's own scale, and no element may pass that bound.
  ReferenceHandle h;
  std::mt19937_64 rng(403);
  for (const Case& c : kCases) {
    for (moekit_dtype_t dtype : {MOEKIT_DTYPE_FP64, MOEKIT_DTYPE_FP32, MOEKIT_DTYPE_BF16}) {
      INFO(c.shape << " T=" << c.T << " E=" << c.E << " K=" << c.K << " kind " << c.kind << " dtype " << dtype);
      moekit_router_desc_t on = aux_desc(c.T, c.E, c.K, c.kind, dtype, 0.01, 0.001);
      moekit_router_desc_t off = aux_desc(c.T, c.E, c.K, c.kind, dtype, 0, 0);
      HostTensor logits = make_logits(c.shape, c.T, c.E, dtype, rng);
      Forward fwd = run_forward(h.handle, on, logits);
      const moekit_dtype_t sd = dtype == MOEKIT_DTYPE_FP64 ? MOEKIT_DTYPE_FP64 : MOEKIT_DTYPE_FP32;
      HostTensor dscores(sd, {c.T, c.K});
      dscores.fill_uniform(rng, 10.0);
      const double d_lb = 0.75, d_z = 3.0;
      std::vector<double> with = run_backward(h.handle, on, logits, fwd.indices, dscores, d_lb, d_z);
      std::vector<double> without = run_backward(h.handle, off, logits, fwd.indices, dscores);
      // The upstream gradients weigh the two losses apart: the oracle of each alone.
      moekit_router_desc_t lb_only = on, z_only = on;
      lb_only.z_loss_coeff = 0;
      z_only.load_balance_coeff = 0;
      Oracle o_lb = oracle(lb_only, c.T, logits.values(), fwd.indices);
      Oracle o_z = oracle(z_only, c.T, logits.values(), fwd.indices);
      std::vector<double> aux(with.size()), expected(with.size());
      double aux_scale = 0;
      for (size_t i = 0; i < with.size(); ++i) {
        aux[i] = with[i] - without[i];
        expected[i] = d_lb * o_lb.dlogits[i] + d_z * o_z.dlogits[i];
        aux_scale = std::max(aux_scale, std::abs(expected[i]));
      }
      if (dtype == MOEKIT_DTYPE_FP64) {
        // Per expert: the metric's segments run over rows, so compare the transposed tensors with one row per expert.
        std::vector<double> aux_t(aux.size()), expected_t(aux.size());
        for (int64_t t = 0; t < c.T; ++t)
          for (int64_t e = 0; e < c.E; ++e) {
            aux_t[static_cast<size_t>(e * c.T + t)] = aux[static_cast<size_t>(t * c.E + e)];
            expected_t[static_cast<size_t>(e * c.T + t)] = expected[static_cast<size_t>(t * c.E + e)];
          }
        moekit_test::ErrorMetrics rows = moekit_test::compare(aux, expected, c.E);
        moekit_test::ErrorMetrics experts = moekit_test::compare(aux_t, expected_t, c.T);
        INFO("rows: " << moekit_test::describe(rows) << "; per expert: " << moekit_test::describe(experts));
        CHECK(within(rows, moekit_test::Bounds{1e-9, 1e-9, 1e-9}));
        CHECK(within(experts, moekit_test::Bounds{1e-9, 1e-9, 1e-9}));
      } else {
        int64_t deviations = 0;
        double worst = 0;
        for (size_t i = 0; i < with.size(); ++i) {
          const double ulps = 4 * 0x1p-24 * (std::abs(without[i]) + std::abs(expected[i]));
          const double bound = ulps + 1e-6 * aux_scale;
          worst = std::max(worst, std::abs(aux[i] - expected[i]) / bound);
          if (std::abs(aux[i] - expected[i]) > bound) ++deviations;
        }
        INFO("worst deviation / bound " << worst);
        CHECK(deviations == 0);
      }
    }
  }
}

TEST_CASE("aux losses: accumulate adds the aux gradient to the old dlogits once", "[router][aux_losses]") {
  ReferenceHandle h;
  std::mt19937_64 rng(404);
  const int64_t T = 9, E = 5, K = 2;
  moekit_router_desc_t d = aux_desc(T, E, K, MOEKIT_ROUTER_TOPK_SOFTMAX, MOEKIT_DTYPE_FP64, 0.1, 0.01);
  HostTensor logits = make_logits("random", T, E, MOEKIT_DTYPE_FP64, rng);
  Forward fwd = run_forward(h.handle, d, logits);
  HostTensor dscores(MOEKIT_DTYPE_FP64, {T, K});
  dscores.fill_uniform(rng, 1.0);
  std::vector<double> fresh = run_backward(h.handle, d, logits, fwd.indices, dscores);
  HostTensor old(MOEKIT_DTYPE_FP64, {T, E});
  old.fill_uniform(rng, 1.0);
  std::vector<double> summed = run_backward(h.handle, d, logits, fwd.indices, dscores, -1, -1, &old);
  for (int64_t i = 0; i < T * E; ++i)
    CHECK(std::abs(summed[static_cast<size_t>(i)] - (old.get(i) + fresh[static_cast<size_t>(i)])) <= 1e-15);
}

TEST_CASE("aux losses: T = 0 writes losses of 0 and touches no dlogits", "[router][aux_losses]") {
  ReferenceHandle h;
  std::mt19937_64 rng(405);
  moekit_router_desc_t d = aux_desc(4, 6, 2, MOEKIT_ROUTER_SOFTMAX_TOPK, MOEKIT_DTYPE_FP32, 0.01, 0.001);
  HostTensor logits(MOEKIT_DTYPE_FP32, {0, 6});
  Forward fwd = run_forward(h.handle, d, logits);
  CHECK(fwd.load_balance == 0.0);
  CHECK(fwd.z == 0.0);
}

TEST_CASE("aux losses: the contract's refusals", "[router][aux_losses]") {
  ReferenceHandle h;
  moekit_plan_t plan = nullptr;
  SECTION("a load-balancing loss needs a softmax kind") {
    for (int32_t kind : {MOEKIT_ROUTER_TOPK, MOEKIT_ROUTER_SIGMOID}) {
      moekit_router_desc_t d = aux_desc(4, 6, 2, kind, MOEKIT_DTYPE_FP32, 0.01, 0);
      CHECK(moekit_router_plan_create(h.handle, &d, &plan) == MOEKIT_STATUS_NOT_SUPPORTED);
      CHECK(moekit_test::last_error().find("load_balance_coeff") != std::string::npos);
      CHECK(plan == nullptr);
    }
  }
  SECTION("the z-loss serves every kind") {
    for (int32_t kind : {MOEKIT_ROUTER_TOPK, MOEKIT_ROUTER_SIGMOID}) {
      moekit_router_desc_t d = aux_desc(4, 6, 2, kind, MOEKIT_DTYPE_FP32, 0, 0.01);
      RouterPlan owner(h.handle, d);
    }
  }
  SECTION("negative or non-finite coefficients are invalid") {
    for (double bad : {-0.1, static_cast<double>(INFINITY), static_cast<double>(NAN)}) {
      moekit_router_desc_t d = aux_desc(4, 6, 2, MOEKIT_ROUTER_SOFTMAX_TOPK, MOEKIT_DTYPE_FP32, bad, 0);
      CHECK(moekit_router_plan_create(h.handle, &d, &plan) == MOEKIT_STATUS_INVALID_VALUE);
      d = aux_desc(4, 6, 2, MOEKIT_ROUTER_SOFTMAX_TOPK, MOEKIT_DTYPE_FP32, 0, bad);
      CHECK(moekit_router_plan_create(h.handle, &d, &plan) == MOEKIT_STATUS_INVALID_VALUE);
      CHECK(moekit_test::last_error().find("z_loss_coeff") != std::string::npos);
    }
  }
  SECTION("a loss tensor needs its loss on, and one fp32 element") {
    std::mt19937_64 rng(406);
    moekit_router_desc_t d = aux_desc(4, 6, 2, MOEKIT_ROUTER_SOFTMAX_TOPK, MOEKIT_DTYPE_FP32, 0.01, 0);
    RouterPlan owner(h.handle, d);
    HostTensor logits(MOEKIT_DTYPE_FP32, {4, 6}), scores(MOEKIT_DTYPE_FP32, {4, 2}), indices(MOEKIT_DTYPE_INT32, {4, 2});
    HostTensor one(MOEKIT_DTYPE_FP32, {1}), two(MOEKIT_DTYPE_FP32, {2}), half(MOEKIT_DTYPE_BF16, {1});
    logits.fill_uniform(rng, 1.0);
    moekit_router_fwd_args_t a;
    moekit_router_fwd_args_init(&a);
    a.logits = logits.view();
    a.scores = scores.view();
    a.indices = indices.view();
    a.z_loss = one.view();
    CHECK(moekit_router_forward(owner.plan, &a, owner.ws(), owner.workspace.size(), nullptr) ==
          MOEKIT_STATUS_INVALID_VALUE);
    CHECK(moekit_test::last_error().find("z_loss") != std::string::npos);
    a.z_loss = moekit_tensor_t{};
    a.load_balance_loss = two.view();
    CHECK(moekit_router_forward(owner.plan, &a, owner.ws(), owner.workspace.size(), nullptr) ==
          MOEKIT_STATUS_INVALID_VALUE);
    a.load_balance_loss = half.view();
    CHECK(moekit_router_forward(owner.plan, &a, owner.ws(), owner.workspace.size(), nullptr) ==
          MOEKIT_STATUS_INVALID_VALUE);
    a.load_balance_loss = one.view();
    MOEKIT_REQUIRE_OK(moekit_router_forward(owner.plan, &a, owner.ws(), owner.workspace.size(), nullptr));
    CHECK(one.get(0) > 0);
  }
}
