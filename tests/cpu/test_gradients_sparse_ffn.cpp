// Finite-difference checks of the sparse SwiGLU FFN layer backward (docs/math.md section 7) through the C ABI.
//
// float64 throughout (MOEKIT_DTYPE_FP64), so the analytic gradients of loss = sum(G * out) with respect to x, Wg,
// Wu and Wd must match central differences to ~1e-6 relative. The group selection is not differentiated: a draw
// is redrawn until every token's energies down to the (kg+1)-th are separated by a relative margin the
// perturbations cannot cross, and every perturbed forward checks that the selection stayed the same.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/finite_difference.h"
#include "common/test_util.h"

namespace {

using moekit_test::HostTensor;
using moekit_test::max_abs;
using moekit_test::pick_entries;
using moekit_test::FdResult;
using moekit_test::central_differences;
using moekit_test::check_fd_result;
using moekit_test::draw_well_conditioned;
using moekit_test::FdPlan;

constexpr double kEnergyMargin = 1e-3;  // smallest relative gap between consecutive energies down to the (kg+1)-th
constexpr int64_t kEntriesPerTensor = 128;  // per weight tensor: 96 of selected groups, 32 of the others

struct FfnCase {
  std::string name;
  int64_t tokens = 5;
  int64_t d_model = 8;
  int64_t d_ff = 128;
  int64_t group_size = 16;
  int64_t top_groups = 2;
  int64_t subsample = 0;
  bool lb_bias = false;
  bool need_unselected_group = false;  // redraw until some group is selected by no token

  int64_t groups() const { return d_ff / group_size; }
};

struct FfnGradients {
  HostTensor dx, dw_gate, dw_up, dw_down;
  std::vector<HostTensor*> list() { return {&dx, &dw_gate, &dw_up, &dw_down}; }
};

struct BackwardRequest {
  bool input_grad = true;
  bool weight_grad = true;
  double beta_dx = 0, beta_dw_gate = 0, beta_dw_up = 0, beta_dw_down = 0;
};

double silu(double z) { return z / (1.0 + std::exp(-z)); }

class FfnProblem {
 public:
  FfnProblem(const FfnCase& c, std::mt19937_64& rng) : case_(c) {
    moekit_sparse_ffn_desc_t desc;
    MOEKIT_REQUIRE_OK(moekit_sparse_ffn_desc_init(&desc));
    desc.max_tokens = c.tokens;
    desc.d_model = c.d_model;
    desc.d_ff = c.d_ff;
    desc.group_size = c.group_size;
    desc.top_groups = c.top_groups;
    desc.subsample = c.subsample;
    desc.dtype = MOEKIT_DTYPE_FP64;
    desc.inference = 0;
    desc.weight_grad_dtype = MOEKIT_DTYPE_FP64;
    plan_.create(moekit_sparse_ffn_plan_create, desc);

    const int64_t T = c.tokens, D = c.d_model, F = c.d_ff, NG = c.groups();
    x = HostTensor(MOEKIT_DTYPE_FP64, {T, D});
    w_gate = HostTensor(MOEKIT_DTYPE_FP64, {F, D});
    w_up = HostTensor(MOEKIT_DTYPE_FP64, {F, D});
    w_down = HostTensor(MOEKIT_DTYPE_FP64, {D, F});
    g = HostTensor(MOEKIT_DTYPE_FP64, {T, D});
    out = HostTensor(MOEKIT_DTYPE_FP64, {T, D});
    groups = HostTensor(MOEKIT_DTYPE_INT32, {T, c.top_groups});
    if (c.lb_bias) lb_bias = HostTensor(MOEKIT_DTYPE_FP32, {NG});
    if (c.subsample > 0) {
      subsample_rows = HostTensor(MOEKIT_DTYPE_INT32, {NG, c.subsample});
      MOEKIT_REQUIRE_OK(moekit_subsample_rows(rng(), NG, c.group_size, c.subsample,
                                              static_cast<int32_t*>(subsample_rows.data())));
    }

    draw_well_conditioned([&] { draw(rng); }, [&] { return well_conditioned(); });
    forward();
    base_groups_ = groups;
  }

  const FfnCase& spec() const { return case_; }

  void forward() {
    out.poison();
    groups.poison();
    moekit_sparse_ffn_fwd_args_t args;
    MOEKIT_REQUIRE_OK(moekit_sparse_ffn_fwd_args_init(&args));
    args.x = x.view();
    args.w_gate = w_gate.view();
    args.w_up = w_up.view();
    args.w_down = w_down.view();
    if (case_.subsample > 0) args.subsample_rows = subsample_rows.view();
    if (case_.lb_bias) args.lb_bias = lb_bias.view();
    args.out = out.view();
    args.groups = groups.view();
    args.beta_out = 0;
    plan_.run(moekit_sparse_ffn_forward, args);
  }

  double loss() {
    forward();
    if (!groups.bytes_equal(base_groups_)) ++selection_changes;
    double sum = 0;
    for (int64_t i = 0; i < out.numel(); ++i) sum += g.get(i) * out.get(i);
    return sum;
  }

  FfnGradients poisoned_gradients() const {
    FfnGradients grads;
    grads.dx = HostTensor(MOEKIT_DTYPE_FP64, x.shape());
    grads.dw_gate = HostTensor(MOEKIT_DTYPE_FP64, w_gate.shape());
    grads.dw_up = HostTensor(MOEKIT_DTYPE_FP64, w_up.shape());
    grads.dw_down = HostTensor(MOEKIT_DTYPE_FP64, w_down.shape());
    for (HostTensor* t : grads.list()) t->poison();
    return grads;
  }

  void backward(FfnGradients& grads, const BackwardRequest& request) {
    moekit_sparse_ffn_bwd_args_t args;
    MOEKIT_REQUIRE_OK(moekit_sparse_ffn_bwd_args_init(&args));
    args.x = x.view();
    args.w_gate = w_gate.view();
    args.w_up = w_up.view();
    args.w_down = w_down.view();
    args.dout = g.view();
    args.dx = grads.dx.view();
    args.dw_gate = grads.dw_gate.view();
    args.dw_up = grads.dw_up.view();
    args.dw_down = grads.dw_down.view();
    args.compute_input_grad = request.input_grad ? 1 : 0;
    args.compute_weight_grad = request.weight_grad ? 1 : 0;
    args.beta_dx = request.beta_dx;
    args.beta_dw_gate = request.beta_dw_gate;
    args.beta_dw_up = request.beta_dw_up;
    args.beta_dw_down = request.beta_dw_down;
    plan_.run(moekit_sparse_ffn_backward, args);
  }

  FfnGradients gradients() {
    forward();
    FfnGradients grads = poisoned_gradients();
    backward(grads, BackwardRequest{});
    return grads;
  }

  // Groups that some token selected in the base draw (as the test computed them).
  const std::set<int64_t>& selected_groups() const { return selected_; }

  HostTensor x, w_gate, w_up, w_down, g, lb_bias, subsample_rows;
  HostTensor out, groups;
  int64_t selection_changes = 0;

 private:
  void draw(std::mt19937_64& rng) {
    x.fill_uniform(rng, -1.0, 1.0);
    w_gate.fill_uniform(rng, -0.5, 0.5);
    w_up.fill_uniform(rng, -0.5, 0.5);
    w_down.fill_uniform(rng, -0.5, 0.5);
    g.fill_uniform(rng, -1.0, 1.0);
    if (case_.lb_bias) lb_bias.fill_uniform(rng, -0.5, 0.5);
  }

  // en[t, g] of docs/math.md section 7, in float64.
  std::vector<double> energies(int64_t t) const {
    const int64_t D = case_.d_model, G = case_.group_size, NG = case_.groups(), spg = case_.subsample;
    std::vector<double> en(static_cast<size_t>(NG));
    for (int64_t grp = 0; grp < NG; ++grp) {
      std::vector<int64_t> neurons;
      if (spg > 0) {
        for (int64_t j = 0; j < spg; ++j) neurons.push_back(static_cast<int64_t>(subsample_rows.get(grp * spg + j)));
      } else {
        for (int64_t j = 0; j < G; ++j) neurons.push_back(grp * G + j);
      }
      double sum = 0;
      for (int64_t n : neurons) {
        double z = 0;
        for (int64_t d = 0; d < D; ++d) z += x.get(t * D + d) * w_gate.get(n * D + d);
        sum += std::abs(silu(z));
      }
      if (spg > 0) sum *= static_cast<double>(G) / static_cast<double>(spg);
      if (case_.lb_bias) sum *= std::exp(lb_bias.get(grp));
      en[static_cast<size_t>(grp)] = sum;
    }
    return en;
  }

  bool well_conditioned() {
    selected_.clear();
    const int64_t kg = case_.top_groups, NG = case_.groups();
    for (int64_t t = 0; t < case_.tokens; ++t) {
      std::vector<double> en = energies(t);
      std::vector<int64_t> order(en.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return en[a] > en[b]; });
      for (int64_t k = 0; k < kg && k + 1 < NG; ++k) {
        if (en[order[k]] - en[order[k + 1]] < kEnergyMargin * en[order[0]]) return false;
      }
      for (int64_t k = 0; k < kg; ++k) selected_.insert(order[k]);
    }
    if (case_.need_unselected_group && static_cast<int64_t>(selected_.size()) == NG) return false;
    return true;
  }

  FfnCase case_;
  FdPlan plan_;
  HostTensor base_groups_;
  std::set<int64_t> selected_;
};

// The neuron (row of Wg/Wu, column of Wd) an entry of a weight tensor belongs to.
int64_t neuron_of(int which, int64_t entry, const FfnCase& c) {
  return which == 3 ? entry % c.d_ff : entry / c.d_model;
}

std::string describe(const FfnCase& c) {
  std::ostringstream s;
  s << c.name << " (T " << c.tokens << ", D " << c.d_model << ", F " << c.d_ff << ", G " << c.group_size << ", kg "
    << c.top_groups << ", spg " << c.subsample << ", lb bias " << c.lb_bias << ")";
  return s.str();
}

const char* const kNames[] = {"x", "w_gate", "w_up", "w_down"};

// Checks the four gradients against central differences; weight entries are drawn from selected groups (where
// the gradient is not zero) and from the others (where it must be zero).
void check_gradients(const FfnCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  FfnProblem problem(c, rng);
  INFO(describe(c) << ", seed " << seed << ", groups selected by some token " << problem.selected_groups().size());
  FfnGradients grads = problem.gradients();
  std::vector<HostTensor*> params{&problem.x, &problem.w_gate, &problem.w_up, &problem.w_down};
  std::vector<HostTensor*> grad_list = grads.list();
  for (int which = 0; which < 4; ++which) {
    std::vector<int64_t> entries;
    if (which == 0) {
      entries = pick_entries(params[0]->numel(), kEntriesPerTensor, rng);
    } else {
      // Candidates split by whether their neuron's group was selected, so both kinds are always checked.
      std::vector<int64_t> in_selected, in_other;
      for (int64_t i = 0; i < params[which]->numel(); ++i) {
        int64_t group = neuron_of(which, i, c) / c.group_size;
        (problem.selected_groups().count(group) ? in_selected : in_other).push_back(i);
      }
      for (int64_t pick : pick_entries(static_cast<int64_t>(in_selected.size()), kEntriesPerTensor * 3 / 4, rng)) {
        entries.push_back(in_selected[static_cast<size_t>(pick)]);
      }
      for (int64_t pick : pick_entries(static_cast<int64_t>(in_other.size()), kEntriesPerTensor / 4, rng)) {
        entries.push_back(in_other[static_cast<size_t>(pick)]);
      }
    }
    FdResult r = central_differences(problem, *params[which], *grad_list[which], entries);
    check_fd_result(kNames[which], r, *grad_list[which]);
  }
  CHECK(problem.selection_changes == 0);
}

}  // namespace

TEST_CASE("sparse ffn gradients match central differences (4 and 8 groups, all rows)", "[sparse_ffn][gradients]") {
  FfnCase c;
  c.name = "8 groups";
  check_gradients(c, 11);
  c.name = "4 groups";
  c.d_ff = 64;
  check_gradients(c, 12);
}

TEST_CASE("sparse ffn gradients match central differences with subsample rows and a load-balance bias",
          "[sparse_ffn][gradients]") {
  FfnCase c;
  c.name = "subsample";
  c.subsample = 4;
  check_gradients(c, 21);
  c.name = "load-balance bias";
  c.subsample = 0;
  c.lb_bias = true;
  check_gradients(c, 22);
  c.name = "subsample and load-balance bias, 4 groups";
  c.subsample = 5;
  c.d_ff = 64;
  check_gradients(c, 23);
  c.name = "top-3 of 8, subsample";
  c.d_ff = 128;
  c.top_groups = 3;
  c.subsample = 8;
  check_gradients(c, 24);
}

TEST_CASE("sparse ffn backward: unselected groups get no weight gradient and beta 1 adds only to selected groups",
          "[sparse_ffn][gradients]") {
  std::mt19937_64 rng(31);
  FfnCase c;
  c.need_unselected_group = true;
  c.lb_bias = true;
  FfnProblem problem(c, rng);
  REQUIRE(problem.selected_groups().size() < static_cast<size_t>(c.groups()));
  FfnGradients fresh = problem.gradients();

  // The groups the layer reports are the ones the test computed.
  std::set<int64_t> reported;
  for (int64_t i = 0; i < problem.groups.numel(); ++i) reported.insert(static_cast<int64_t>(problem.groups.get(i)));
  REQUIRE(reported == problem.selected_groups());

  FfnGradients accumulated = problem.poisoned_gradients();
  for (HostTensor* t : accumulated.list()) t->fill_uniform(rng, 1.0);
  FfnGradients old = accumulated;
  BackwardRequest request;
  request.beta_dx = request.beta_dw_gate = request.beta_dw_up = request.beta_dw_down = 1.0;
  problem.backward(accumulated, request);

  std::vector<HostTensor*> fresh_list = fresh.list(), acc_list = accumulated.list(), old_list = old.list();
  for (int which = 0; which < 4; ++which) {
    INFO("gradient " << kNames[which]);
    const HostTensor& f = *fresh_list[static_cast<size_t>(which)];
    const HostTensor& a = *acc_list[static_cast<size_t>(which)];
    const HostTensor& o = *old_list[static_cast<size_t>(which)];
    int64_t nonzero_in_unselected = 0, changed_in_unselected = 0, nonzero_in_selected = 0;
    double worst_sum_error = 0;
    double scale = max_abs(f) + max_abs(o);
    for (int64_t i = 0; i < f.numel(); ++i) {
      bool selected = which == 0 || problem.selected_groups().count(neuron_of(which, i, c) / c.group_size) > 0;
      if (selected) {
        if (f.get(i) != 0) ++nonzero_in_selected;
      } else {
        if (f.get(i) != 0) ++nonzero_in_unselected;
        if (a.get(i) != o.get(i)) ++changed_in_unselected;
      }
      double expected = o.get(i) + f.get(i);
      worst_sum_error = std::max(worst_sum_error, std::abs(a.get(i) - expected) / (std::abs(expected) + 1e-3 * scale));
    }
    CHECK(nonzero_in_selected > 0);
    CHECK(nonzero_in_unselected == 0);
    CHECK(changed_in_unselected == 0);
    CHECK(worst_sum_error <= 1e-13);
  }
}

TEST_CASE("sparse ffn backward: input-only and weight-only calls match the combined call", "[sparse_ffn][gradients]") {
  std::mt19937_64 rng(41);
  FfnCase c;
  c.subsample = 4;
  FfnProblem problem(c, rng);
  FfnGradients combined = problem.gradients();
  FfnGradients untouched = problem.poisoned_gradients();

  FfnGradients weight_only = problem.poisoned_gradients();
  BackwardRequest weights;
  weights.input_grad = false;
  problem.backward(weight_only, weights);
  CHECK(weight_only.dx.bytes_equal(untouched.dx));
  CHECK(weight_only.dw_gate.bytes_equal(combined.dw_gate));
  CHECK(weight_only.dw_up.bytes_equal(combined.dw_up));
  CHECK(weight_only.dw_down.bytes_equal(combined.dw_down));

  FfnGradients input_only = problem.poisoned_gradients();
  BackwardRequest inputs;
  inputs.weight_grad = false;
  problem.backward(input_only, inputs);
  CHECK(input_only.dx.bytes_equal(combined.dx));
  CHECK(input_only.dw_gate.bytes_equal(untouched.dw_gate));
  CHECK(input_only.dw_up.bytes_equal(untouched.dw_up));
  CHECK(input_only.dw_down.bytes_equal(untouched.dw_down));
}
