// Finite-difference checks of the MoE layer backward (docs/math.md sections 3 and 4) through the C ABI.
//
// Everything runs in float64 (MOEKIT_DTYPE_FP64), where no rounding point changes a value, so the analytic
// gradients of loss = sum(G * out) must match central differences to ~1e-6 relative. A draw is rejected and
// redrawn when a perturbation could cross a discontinuity: two router keys closer than kSelectionMargin (the
// selection would flip), a ReLU pre-activation near 0, or a SwiGLU-OAI input near +-L. Every perturbed forward
// also checks that the selection did not change, so a flip cannot pass unnoticed.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
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

constexpr double kSelectionMargin = 1e-3;  // smallest gap between consecutive router keys down to the (K+1)-th
constexpr double kKinkMargin = 1e-3;       // smallest distance of a pre-activation from a kink
constexpr int64_t kEntriesPerTensor = 128;  // every entry of a smaller tensor, a random subset of a larger one

bool is_gated(int32_t activation) { return activation < MOEKIT_ACT_GELU; }
bool has_relu_kink(int32_t activation) {
  return activation == MOEKIT_ACT_REGLU || activation == MOEKIT_ACT_RELU || activation == MOEKIT_ACT_RELU2;
}

struct MoeCase {
  std::string name;
  int32_t activation = MOEKIT_ACT_SWIGLU;
  int32_t glu_layout = MOEKIT_GLU_CONCAT;
  double glu_limit = 7.0;
  int32_t router = MOEKIT_ROUTER_SOFTMAX_TOPK;
  bool renormalize = false;
  double router_scale = 1.0;
  bool router_bias = false;  // SIGMOID kind only
  bool has_b1 = true;
  bool has_b2 = true;
  int64_t tokens = 5;
  int64_t hidden = 8;
  int64_t intermediate = 6;
  int64_t router_experts = 5;
  int64_t experts = 5;
  int64_t expert_begin = 0;
  int64_t top_k = 2;
  // docs/math.md section 1.1; the loss adds lb_weight * LB + z_weight * Z, the weights passed as upstream gradients.
  double load_balance_coeff = 0;
  double z_loss_coeff = 0;
  double lb_weight = 0.7;
  double z_weight = 1.3;

  int64_t h_width() const { return is_gated(activation) ? 2 * intermediate : intermediate; }
  bool drops_pairs() const { return expert_begin > 0 || experts < router_experts; }
};

// The gradients one backward call writes; absent ones (no b1, no b2) stay empty.
struct MoeGradients {
  HostTensor dx, dw_router, dw1, db1, dw2, db2;
};

struct BackwardRequest {
  bool input_grad = true;
  bool weight_grad = true;
  double beta_dx = 0, beta_dw_router = 0, beta_dw1 = 0, beta_db1 = 0, beta_dw2 = 0, beta_db2 = 0;
};

// One MoE layer problem: a plan, well-conditioned random parameters, the loss weights G, and calls through the C ABI.
class MoeProblem {
 public:
  MoeProblem(const MoeCase& c, std::mt19937_64& rng) : case_(c) {
    moekit_moe_desc_t desc;
    MOEKIT_REQUIRE_OK(moekit_moe_desc_init(&desc));
    desc.max_tokens = c.tokens;
    desc.hidden = c.hidden;
    desc.intermediate = c.intermediate;
    desc.router_experts = c.router_experts;
    desc.experts = c.experts;
    desc.expert_begin = c.expert_begin;
    desc.top_k = c.top_k;
    desc.activation = c.activation;
    desc.glu_layout = c.glu_layout;
    desc.glu_limit = c.glu_limit;
    desc.router = c.router;
    desc.renormalize = c.renormalize ? 1 : 0;
    desc.router_scale = c.router_scale;
    desc.has_b1 = c.has_b1 ? 1 : 0;
    desc.has_b2 = c.has_b2 ? 1 : 0;
    desc.inference = 0;
    desc.dtype = MOEKIT_DTYPE_FP64;
    desc.weight_grad_dtype = MOEKIT_DTYPE_FP64;
    desc.load_balance_coeff = c.load_balance_coeff;
    desc.z_loss_coeff = c.z_loss_coeff;
    plan_.create(moekit_moe_plan_create, desc);

    const int64_t T = c.tokens, H = c.hidden, E = c.experts, RE = c.router_experts;
    x = HostTensor(MOEKIT_DTYPE_FP64, {T, H});
    w_router = HostTensor(MOEKIT_DTYPE_FP64, {RE, H});
    if (c.router_bias) router_bias = HostTensor(MOEKIT_DTYPE_FP32, {RE});
    w1 = HostTensor(MOEKIT_DTYPE_FP64, {E, c.h_width(), H});
    if (c.has_b1) b1 = HostTensor(MOEKIT_DTYPE_FP64, {E, c.h_width()});
    w2 = HostTensor(MOEKIT_DTYPE_FP64, {E, H, c.intermediate});
    if (c.has_b2) b2 = HostTensor(MOEKIT_DTYPE_FP64, {E, H});
    g = HostTensor(MOEKIT_DTYPE_FP64, {T, H});
    out = HostTensor(MOEKIT_DTYPE_FP64, {T, H});
    scores = HostTensor(MOEKIT_DTYPE_FP32, {T, c.top_k});
    indices = HostTensor(MOEKIT_DTYPE_INT32, {T, c.top_k});
    load_balance_loss = HostTensor(MOEKIT_DTYPE_FP64, {1});
    z_loss = HostTensor(MOEKIT_DTYPE_FP64, {1});
    lb_weight = HostTensor(MOEKIT_DTYPE_FP64, {1});
    z_weight = HostTensor(MOEKIT_DTYPE_FP64, {1});
    lb_weight.set(0, c.lb_weight);
    z_weight.set(0, c.z_weight);

    draw_well_conditioned([&] { draw(rng); }, [&] { return well_conditioned(); });
    forward();
    base_indices_ = indices;
  }

  const MoeCase& spec() const { return case_; }

  // Runs the forward on the current parameters (out poisoned first) and fills `saved`.
  void forward() {
    out.poison();
    scores.poison();
    indices.poison();
    moekit_moe_fwd_args_t args;
    MOEKIT_REQUIRE_OK(moekit_moe_fwd_args_init(&args));
    args.x = x.view();
    args.w_router = w_router.view();
    if (case_.router_bias) args.router_bias = router_bias.view();
    args.w1 = w1.view();
    if (case_.has_b1) args.b1 = b1.view();
    args.w2 = w2.view();
    if (case_.has_b2) args.b2 = b2.view();
    args.out = out.view();
    args.scores = scores.view();
    args.indices = indices.view();
    args.beta_out = 0;
    load_balance_loss.poison();
    z_loss.poison();
    if (case_.load_balance_coeff != 0) args.load_balance_loss = load_balance_loss.view();
    if (case_.z_loss_coeff != 0) args.z_loss = z_loss.view();
    plan_.run(moekit_moe_forward, args);
  }

  // sum(G * out) of a fresh forward; counts a selection that differs from the base draw's.
  double loss() {
    forward();
    if (!indices.bytes_equal(base_indices_)) ++selection_changes;
    double sum = 0;
    for (int64_t i = 0; i < out.numel(); ++i) sum += g.get(i) * out.get(i);
    if (case_.load_balance_coeff != 0) sum += case_.lb_weight * load_balance_loss.get(0);
    if (case_.z_loss_coeff != 0) sum += case_.z_weight * z_loss.get(0);
    return sum;
  }

  // Gradient tensors of the right shapes, filled with NaN.
  MoeGradients poisoned_gradients() const {
    MoeGradients grads;
    grads.dx = HostTensor(MOEKIT_DTYPE_FP64, x.shape());
    grads.dw_router = HostTensor(MOEKIT_DTYPE_FP64, w_router.shape());
    grads.dw1 = HostTensor(MOEKIT_DTYPE_FP64, w1.shape());
    if (case_.has_b1) grads.db1 = HostTensor(MOEKIT_DTYPE_FP64, b1.shape());
    grads.dw2 = HostTensor(MOEKIT_DTYPE_FP64, w2.shape());
    if (case_.has_b2) grads.db2 = HostTensor(MOEKIT_DTYPE_FP64, b2.shape());
    for (HostTensor* t : gradient_tensors(grads)) t->poison();
    return grads;
  }

  // The backward of the last forward with dout = G. All gradient views are passed, so a call that must not
  // write some of them can be checked to leave them alone.
  void backward(MoeGradients& grads, const BackwardRequest& request) {
    moekit_moe_bwd_args_t args;
    MOEKIT_REQUIRE_OK(moekit_moe_bwd_args_init(&args));
    args.x = x.view();
    args.dout = g.view();
    args.w_router = w_router.view();
    args.w1 = w1.view();
    args.w2 = w2.view();
    if (case_.has_b2) args.b2 = b2.view();
    args.dx = grads.dx.view();
    args.dw_router = grads.dw_router.view();
    args.dw1 = grads.dw1.view();
    if (case_.has_b1) args.db1 = grads.db1.view();
    args.dw2 = grads.dw2.view();
    if (case_.has_b2) args.db2 = grads.db2.view();
    args.compute_input_grad = request.input_grad ? 1 : 0;
    args.compute_weight_grad = request.weight_grad ? 1 : 0;
    args.beta_dx = request.beta_dx;
    args.beta_dw_router = request.beta_dw_router;
    args.beta_dw1 = request.beta_dw1;
    args.beta_db1 = request.beta_db1;
    args.beta_dw2 = request.beta_dw2;
    args.beta_db2 = request.beta_db2;
    if (case_.load_balance_coeff != 0) args.dload_balance_loss = lb_weight.view();
    if (case_.z_loss_coeff != 0) args.dz_loss = z_weight.view();
    plan_.run(moekit_moe_backward, args);
  }

  // Forward then a combined backward with beta = 0 into NaN-poisoned tensors.
  MoeGradients gradients() {
    forward();
    MoeGradients grads = poisoned_gradients();
    backward(grads, BackwardRequest{});
    return grads;
  }

  std::vector<HostTensor*> gradient_tensors(MoeGradients& grads) const {
    std::vector<HostTensor*> list{&grads.dx, &grads.dw_router, &grads.dw1};
    if (case_.has_b1) list.push_back(&grads.db1);
    list.push_back(&grads.dw2);
    if (case_.has_b2) list.push_back(&grads.db2);
    return list;
  }
  std::vector<HostTensor*> parameters() {
    std::vector<HostTensor*> list{&x, &w_router, &w1};
    if (case_.has_b1) list.push_back(&b1);
    list.push_back(&w2);
    if (case_.has_b2) list.push_back(&b2);
    return list;
  }
  std::vector<std::string> parameter_names() const {
    std::vector<std::string> list{"x", "w_router", "w1"};
    if (case_.has_b1) list.push_back("b1");
    list.push_back("w2");
    if (case_.has_b2) list.push_back("b2");
    return list;
  }

  HostTensor x, w_router, router_bias, w1, b1, w2, b2, g;
  HostTensor out, scores, indices;
  HostTensor load_balance_loss, z_loss, lb_weight, z_weight;  // [1] each
  int64_t selection_changes = 0;
  int64_t dropped_pairs = 0;     // of the accepted draw
  int64_t clamped_entries = 0;   // SwiGLU-OAI inputs beyond the limit, of the accepted draw

 private:
  void draw(std::mt19937_64& rng) {
    // Renormalised plain top-k divides by the sum of the selected logits: keep every logit positive.
    bool positive_logits = case_.router == MOEKIT_ROUTER_TOPK && case_.renormalize;
    x.fill_uniform(rng, positive_logits ? 0.05 : -1.0, 1.0);
    w_router.fill_uniform(rng, positive_logits ? 0.05 : -1.0, 1.0);
    if (case_.router_bias) router_bias.fill_uniform(rng, -0.3, 0.3);
    w1.fill_uniform(rng, -0.5, 0.5);
    if (case_.has_b1) b1.fill_uniform(rng, -0.5, 0.5);
    w2.fill_uniform(rng, -0.5, 0.5);
    if (case_.has_b2) b2.fill_uniform(rng, -0.5, 0.5);
    g.fill_uniform(rng, -1.0, 1.0);
  }

  // The selection key of each router expert for token t, as docs/math.md section 1 orders them.
  std::vector<double> router_keys(int64_t t) const {
    const int64_t H = case_.hidden;
    std::vector<double> keys(static_cast<size_t>(case_.router_experts));
    for (int64_t e = 0; e < case_.router_experts; ++e) {
      double logit = 0;
      for (int64_t j = 0; j < H; ++j) logit += x.get(t * H + j) * w_router.get(e * H + j);
      double key = logit;
      if (case_.router == MOEKIT_ROUTER_SIGMOID) {
        key = 1.0 / (1.0 + std::exp(-logit));
        if (case_.router_bias) key += router_bias.get(e);
      }
      keys[static_cast<size_t>(e)] = key;
    }
    return keys;
  }

  bool well_conditioned() {
    const int64_t H = case_.hidden, K = case_.top_k, HW = case_.h_width();
    dropped_pairs = 0;
    clamped_entries = 0;
    int64_t valid_pairs = 0;
    for (int64_t t = 0; t < case_.tokens; ++t) {
      std::vector<double> keys = router_keys(t);
      std::vector<int64_t> order(keys.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return keys[a] > keys[b]; });
      for (int64_t k = 0; k < K && k + 1 < case_.router_experts; ++k) {
        if (keys[order[k]] - keys[order[k + 1]] < kSelectionMargin) return false;
      }
      for (int64_t k = 0; k < K; ++k) {
        int64_t expert = order[k];
        if (case_.router == MOEKIT_ROUTER_TOPK && case_.renormalize && keys[expert] < 0.05) return false;
        int64_t local = expert - case_.expert_begin;
        if (local < 0 || local >= case_.experts) {
          ++dropped_pairs;
          continue;
        }
        ++valid_pairs;
        for (int64_t n = 0; n < HW; ++n) {
          double h = case_.has_b1 ? b1.get(local * HW + n) : 0.0;
          for (int64_t j = 0; j < H; ++j) h += x.get(t * H + j) * w1.get((local * HW + n) * H + j);
          if (has_relu_kink(case_.activation) && std::abs(h) < kKinkMargin) return false;
          if (case_.activation == MOEKIT_ACT_SWIGLU_OAI) {
            if (std::abs(std::abs(h) - case_.glu_limit) < kKinkMargin) return false;
            if (std::abs(h) > case_.glu_limit) ++clamped_entries;
          }
        }
      }
    }
    if (valid_pairs == 0) return false;
    if (case_.drops_pairs() && dropped_pairs == 0) return false;
    if (case_.activation == MOEKIT_ACT_SWIGLU_OAI && clamped_entries == 0) return false;
    return true;
  }

  MoeCase case_;
  FdPlan plan_;
  HostTensor base_indices_;
};

std::string describe(const MoeCase& c) {
  std::ostringstream s;
  s << c.name << " (act " << c.activation << ", layout " << c.glu_layout << ", router " << c.router << ", renorm "
    << c.renormalize << ", E " << c.experts << " of " << c.router_experts << " from " << c.expert_begin << ", K "
    << c.top_k << ", b1 " << c.has_b1 << ", b2 " << c.has_b2 << ", lb " << c.load_balance_coeff << ", z "
    << c.z_loss_coeff << ")";
  return s.str();
}

// Checks every parameter's gradient of one case against central differences.
void check_gradients(const MoeCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  MoeProblem problem(c, rng);
  INFO(describe(problem.spec()) << ", seed " << seed << ", dropped pairs " << problem.dropped_pairs
                                << ", clamped inputs " << problem.clamped_entries);
  MoeGradients grads = problem.gradients();
  std::vector<HostTensor*> params = problem.parameters();
  std::vector<HostTensor*> grad_list = problem.gradient_tensors(grads);
  std::vector<std::string> names = problem.parameter_names();
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<int64_t> entries = pick_entries(params[i]->numel(), kEntriesPerTensor, rng);
    FdResult r = central_differences(problem, *params[i], *grad_list[i], entries);
    check_fd_result(names[i], r, *grad_list[i]);
  }
  CHECK(problem.selection_changes == 0);
}

MoeCase activation_case(int32_t activation, int32_t layout) {
  MoeCase c;
  c.name = "activation";
  c.activation = activation;
  c.glu_layout = layout;
  // A small limit puts many SwiGLU-OAI inputs beyond it, so both sides of the clamp are exercised.
  if (activation == MOEKIT_ACT_SWIGLU_OAI) c.glu_limit = 0.5;
  return c;
}

struct RouterVariant {
  int32_t kind;
  bool renormalize;
};

const std::vector<RouterVariant>& router_variants() {
  static const std::vector<RouterVariant> variants{
      {MOEKIT_ROUTER_SOFTMAX_TOPK, false}, {MOEKIT_ROUTER_TOPK_SOFTMAX, false}, {MOEKIT_ROUTER_TOPK_SOFTMAX, true},
      {MOEKIT_ROUTER_TOPK, false},         {MOEKIT_ROUTER_TOPK, true},         {MOEKIT_ROUTER_SIGMOID, false},
      {MOEKIT_ROUTER_SIGMOID, true}};
  return variants;
}

MoeCase router_case(const RouterVariant& v) {
  MoeCase c;
  c.name = "router";
  c.router = v.kind;
  c.renormalize = v.renormalize;
  c.router_experts = c.experts = 6;
  if (v.kind == MOEKIT_ROUTER_SIGMOID) {
    c.router_scale = 2.5;
    c.router_bias = true;
  }
  return c;
}

const std::vector<int32_t> kGatedActivations{MOEKIT_ACT_SWIGLU, MOEKIT_ACT_GEGLU, MOEKIT_ACT_REGLU,
                                             MOEKIT_ACT_SWIGLU_OAI};
const std::vector<int32_t> kPlainActivations{MOEKIT_ACT_GELU, MOEKIT_ACT_RELU, MOEKIT_ACT_SILU, MOEKIT_ACT_RELU2};

// Tensors compared value for value (both may hold the same NaN-free numbers only).
bool same_values(const HostTensor& a, const HostTensor& b) { return a.bytes_equal(b); }

}  // namespace

TEST_CASE("moe gradients match central differences for every gated activation and GLU layout",
          "[moe][gradients]") {
  uint64_t seed = 100;
  for (int32_t activation : kGatedActivations) {
    for (int32_t layout : {MOEKIT_GLU_CONCAT, MOEKIT_GLU_INTERLEAVED}) {
      check_gradients(activation_case(activation, layout), ++seed);
    }
  }
}

TEST_CASE("moe gradients match central differences for every non-gated activation", "[moe][gradients]") {
  uint64_t seed = 200;
  for (int32_t activation : kPlainActivations) check_gradients(activation_case(activation, MOEKIT_GLU_CONCAT), ++seed);
}

TEST_CASE("moe gradients match central differences for every router kind, with and without renormalisation",
          "[moe][gradients]") {
  uint64_t seed = 300;
  for (const RouterVariant& v : router_variants()) check_gradients(router_case(v), ++seed);
}

TEST_CASE("moe gradients match central differences when pairs route to experts off this GPU", "[moe][gradients]") {
  uint64_t seed = 400;
  for (const RouterVariant& v : router_variants()) {
    MoeCase c = router_case(v);
    c.name = "dropped pairs";
    c.experts = 3;
    c.expert_begin = 2;  // global experts 2, 3, 4 are local; 0, 1 and 5 live elsewhere
    check_gradients(c, ++seed);
  }
  MoeCase c = activation_case(MOEKIT_ACT_SWIGLU_OAI, MOEKIT_GLU_INTERLEAVED);
  c.name = "dropped pairs, SwiGLU-OAI";
  c.router_experts = 6;
  c.experts = 4;
  c.expert_begin = 1;
  check_gradients(c, ++seed);
}

TEST_CASE("moe gradients match central differences without biases and for top-1 and top-3", "[moe][gradients]") {
  MoeCase c;
  c.name = "no biases";
  c.has_b1 = c.has_b2 = false;
  check_gradients(c, 501);
  c.name = "b2 only, GeGLU";
  c.activation = MOEKIT_ACT_GEGLU;
  c.has_b2 = true;
  check_gradients(c, 502);
  MoeCase top1 = router_case({MOEKIT_ROUTER_TOPK_SOFTMAX, false});
  top1.name = "top-1";
  top1.top_k = 1;
  check_gradients(top1, 503);
  MoeCase top3 = router_case({MOEKIT_ROUTER_SIGMOID, true});
  top3.name = "top-3";
  top3.top_k = 3;
  check_gradients(top3, 504);
}

TEST_CASE("moe gradients match central differences for clamped SwiGLU-OAI, interleaved, renormalised top-k of softmax, "
          "dropped pairs", "[moe][gradients]") {
  MoeCase c = router_case({MOEKIT_ROUTER_TOPK_SOFTMAX, true});
  c.name = "combined";
  c.activation = MOEKIT_ACT_SWIGLU_OAI;
  c.glu_limit = 0.5;
  c.glu_layout = MOEKIT_GLU_INTERLEAVED;
  c.experts = 5;
  c.expert_begin = 1;
  check_gradients(c, 601);
}

TEST_CASE("moe backward: input-only and weight-only calls write only their gradients and match the combined call",
          "[moe][gradients]") {
  for (const RouterVariant& v : {RouterVariant{MOEKIT_ROUTER_SOFTMAX_TOPK, false},
                                 RouterVariant{MOEKIT_ROUTER_SIGMOID, true}}) {
    std::mt19937_64 rng(700 + static_cast<uint64_t>(v.kind));
    MoeCase c = router_case(v);
    c.experts = 4;
    c.expert_begin = 1;
    MoeProblem problem(c, rng);
    INFO(describe(c));
    MoeGradients combined = problem.gradients();

    // Weight gradients first: the two calls may come in either order, and neither writes `saved`.
    MoeGradients split = problem.poisoned_gradients();
    MoeGradients untouched = problem.poisoned_gradients();
    BackwardRequest weight_only;
    weight_only.input_grad = false;
    problem.backward(split, weight_only);
    CHECK(split.dx.bytes_equal(untouched.dx));
    BackwardRequest input_only;
    input_only.weight_grad = false;
    MoeGradients input_split = problem.poisoned_gradients();
    problem.backward(input_split, input_only);
    CHECK(input_split.dw_router.bytes_equal(untouched.dw_router));
    CHECK(input_split.dw1.bytes_equal(untouched.dw1));
    CHECK(input_split.db1.bytes_equal(untouched.db1));
    CHECK(input_split.dw2.bytes_equal(untouched.dw2));
    CHECK(input_split.db2.bytes_equal(untouched.db2));

    CHECK(same_values(input_split.dx, combined.dx));
    CHECK(same_values(split.dw_router, combined.dw_router));
    CHECK(same_values(split.dw1, combined.dw1));
    CHECK(same_values(split.db1, combined.db1));
    CHECK(same_values(split.dw2, combined.dw2));
    CHECK(same_values(split.db2, combined.db2));

    // Neither flag: nothing is written.
    BackwardRequest nothing;
    nothing.input_grad = nothing.weight_grad = false;
    MoeGradients none = problem.poisoned_gradients();
    problem.backward(none, nothing);
    std::vector<HostTensor*> none_list = problem.gradient_tensors(none);
    std::vector<HostTensor*> untouched_list = problem.gradient_tensors(untouched);
    for (size_t i = 0; i < none_list.size(); ++i) CHECK(none_list[i]->bytes_equal(*untouched_list[i]));
  }
}

TEST_CASE("moe backward: beta 1 adds to each old gradient, beta 0 never reads it", "[moe][gradients]") {
  std::mt19937_64 rng(800);
  MoeCase c = router_case({MOEKIT_ROUTER_TOPK_SOFTMAX, true});
  c.experts = 5;
  c.expert_begin = 1;
  MoeProblem problem(c, rng);
  MoeGradients fresh = problem.gradients();
  std::vector<HostTensor*> fresh_list = problem.gradient_tensors(fresh);
  for (HostTensor* t : fresh_list) {
    for (int64_t i = 0; i < t->numel(); ++i) REQUIRE(std::isfinite(t->get(i)));
  }

  // One gradient at a time gets beta = 1 over random old values; the others keep beta = 0 over NaN, so a beta
  // applied to the wrong tensor shows as NaN or as a missing sum.
  const size_t count = fresh_list.size();
  for (size_t which = 0; which < count; ++which) {
    MoeGradients grads = problem.poisoned_gradients();
    std::vector<HostTensor*> list = problem.gradient_tensors(grads);
    list[which]->fill_uniform(rng, 1.0);
    HostTensor old = *list[which];
    BackwardRequest request;
    // In gradient_tensors' order: dx, dw_router, dw1, [db1], dw2, [db2].
    std::vector<double*> beta_of{&request.beta_dx, &request.beta_dw_router, &request.beta_dw1};
    if (c.has_b1) beta_of.push_back(&request.beta_db1);
    beta_of.push_back(&request.beta_dw2);
    if (c.has_b2) beta_of.push_back(&request.beta_db2);
    *beta_of[which] = 1.0;
    problem.backward(grads, request);
    for (size_t j = 0; j < count; ++j) {
      INFO("gradient " << j << " (beta 1 on gradient " << which << ")");
      const HostTensor& got = *list[j];
      const HostTensor& want = *fresh_list[j];
      double worst = 0;
      double scale = max_abs(want) + (j == which ? max_abs(old) : 0.0);
      for (int64_t i = 0; i < got.numel(); ++i) {
        double expected = j == which ? old.get(i) + want.get(i) : want.get(i);
        double error = std::abs(got.get(i) - expected) / (std::abs(expected) + 1e-3 * scale);
        if (!(error <= worst)) worst = error;
      }
      CHECK(worst <= 1e-13);
    }
  }
}

TEST_CASE("moe gradients match central differences with the auxiliary router losses", "[moe][gradients][aux_losses]") {
  uint64_t seed = 900;
  for (const RouterVariant& v : router_variants()) {
    MoeCase c = router_case(v);
    c.name = "aux losses";
    const bool softmax = v.kind == MOEKIT_ROUTER_SOFTMAX_TOPK || v.kind == MOEKIT_ROUTER_TOPK_SOFTMAX;
    c.load_balance_coeff = softmax ? 0.3 : 0.0;  // NOT_SUPPORTED on the other kinds (test_router_aux_losses.cpp)
    c.z_loss_coeff = 0.05;
    check_gradients(c, seed++);
  }
  // Expert parallelism: f and P run over every router expert, the dropped pairs included.
  MoeCase c;
  c.name = "aux losses, experts off this GPU";
  c.router_experts = 7;
  c.experts = 4;
  c.expert_begin = 2;
  c.load_balance_coeff = 0.3;
  c.z_loss_coeff = 0.05;
  check_gradients(c, seed++);
  // T = 1 and top-1.
  c = MoeCase{};
  c.name = "aux losses, one token";
  c.tokens = 1;
  c.top_k = 1;
  c.load_balance_coeff = 0.3;
  c.z_loss_coeff = 0.05;
  check_gradients(c, seed++);
}
