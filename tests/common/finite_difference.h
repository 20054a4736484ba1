// Central-difference gradient checks shared by the float64 backward tests (test_gradients_*.cpp): the step and
// tolerance rule, the redrawing of ill-conditioned draws, a problem's plan and buffers, the random choice of entries
// to perturb, the checker and the assertions on its result. The checker only needs `double loss()` of a problem,
// a fresh forward of the current parameters.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/test_util.h"

namespace moekit_test {

// Central-difference step relative to the entry's scale: measured on the MoE cases, 1e-5 balances the truncation
// error (step^2) and the roundoff of the loss (ulp / step) about ten times better than 1e-6.
constexpr double kFdRelativeStep = 1e-5;
constexpr double kFdRelativeTolerance = 1e-6;

// Calls draw() until well_conditioned() holds, which must happen within 199 draws: a draw that a perturbation
// could carry across a discontinuity (a selection flip, a kink) is redrawn.
template <class Draw, class Accept>
void draw_well_conditioned(Draw draw, Accept well_conditioned) {
  int attempts = 0;
  do {
    REQUIRE(++attempts < 200);
    draw();
  } while (!well_conditioned());
}

// The plan of a problem with the saved buffer and workspace it asks for, on a reference handle of one thread:
// thousands of tiny forwards, thread start-up would dominate.
class FdPlan {
 public:
  // make(handle, &desc, &plan), a moekit_*_plan_create.
  template <class Make, class Desc>
  void create(Make make, const Desc& desc) {
    MOEKIT_REQUIRE_OK(make(handle_.handle, &desc, &plan_.plan));
    saved_ = saved_buffer(plan_.plan);
    workspace_ = workspace_buffer(plan_.plan);
  }

  // One host call of a moekit_*_forward or moekit_*_backward on the plan and its buffers.
  template <class Call, class Args>
  void run(Call call, const Args& args) {
    MOEKIT_REQUIRE_OK(call(plan_.plan, &args, saved_.data(), saved_.size(), workspace_.data(), workspace_.size(),
                           nullptr));
  }

 private:
  ReferenceHandle handle_{1};
  PlanOwner plan_;
  AlignedBuffer saved_, workspace_;
};

// `count` distinct entries of 0..n-1 drawn at random (all of them when n <= count).
inline std::vector<int64_t> pick_entries(int64_t n, int64_t count, std::mt19937_64& rng) {
  std::vector<int64_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  if (n <= count) return all;
  for (int64_t i = 0; i < count; ++i) {
    std::uniform_int_distribution<int64_t> pick(i, n - 1);
    std::swap(all[static_cast<size_t>(i)], all[static_cast<size_t>(pick(rng))]);
  }
  all.resize(static_cast<size_t>(count));
  return all;
}

struct FdResult {
  double worst_error = 0;
  int64_t worst_entry = -1;
  double worst_fd = 0, worst_analytic = 0;
  bool analytic_finite = true;
};

// Central differences of problem.loss() with respect to `entries` of `param`, against `grad`. The error of an entry
// is |fd - analytic| / (|analytic| + 1e-2 max|grad|): relative where the gradient is significant, and measured
// against the tensor's scale where it is (nearly) zero, e.g. behind a clamp or in an unselected group.
template <class Problem>
FdResult central_differences(Problem& problem, HostTensor& param, const HostTensor& grad,
                             const std::vector<int64_t>& entries) {
  FdResult result;
  double grad_scale = max_abs(grad);
  double param_scale = rms(param);
  for (int64_t i = 0; i < grad.numel(); ++i) {
    if (!std::isfinite(grad.get(i))) result.analytic_finite = false;
  }
  for (int64_t i : entries) {
    double v = param.get(i);
    double step = kFdRelativeStep * std::max(std::abs(v), param_scale);
    double plus = v + step, minus = v - step;
    param.set(i, plus);
    double loss_plus = problem.loss();
    param.set(i, minus);
    double loss_minus = problem.loss();
    param.set(i, v);
    double fd = (loss_plus - loss_minus) / (plus - minus);
    double analytic = grad.get(i);
    double error = std::abs(fd - analytic) / (std::abs(analytic) + 1e-2 * grad_scale);
    if (!(error <= result.worst_error)) {
      result.worst_error = error;
      result.worst_entry = i;
      result.worst_fd = fd;
      result.worst_analytic = analytic;
    }
  }
  return result;
}

// The assertions on one parameter's check: a finite analytic gradient within the tolerance, and not zero everywhere.
inline void check_fd_result(const std::string& name, const FdResult& r, const HostTensor& grad) {
  INFO("d loss / d " << name << ": worst entry " << r.worst_entry << ", finite difference " << r.worst_fd
                     << ", analytic " << r.worst_analytic << ", error " << r.worst_error);
  CHECK(r.analytic_finite);
  CHECK(r.worst_error <= kFdRelativeTolerance);
  // A gradient that is zero everywhere would pass the relative check trivially on zero differences.
  CHECK(max_abs(grad) > 0);
}

}  // namespace moekit_test
