// The experts on token-major rows (moekit_token_experts_*) through the C ABI on the reference backend: the MoE
// layer given the same routing (bit for bit, its own expert range against local ids with sentinels), a per-pair
// loop on the ugly cases (a token with every pair dropped, T = 1, an empty expert, one expert taking every pair, no
// local pair at all, sizes that are no tile multiples; NaN weights on the dropped pairs), central differences of
// the backward in float64, the input- / weight-gradient split and beta, N below the plan's bound, inference, and a
// foreign saved buffer.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/finite_difference.h"
#include "common/test_util.h"
#include "expert_shape.h"
#include "layer_reference.h"
#include "src/numeric.h"

using layer_test::ExpertRef;
using layer_test::ExpertShape;
using layer_test::GradientRequest;
using layer_test::require_matches;
using moekit_test::AlignedBuffer;
using moekit_test::HostTensor;
using moekit_test::PlanOwner;
using moekit_test::ReferenceHandle;

namespace {

struct Shape : ExpertShape {
  int64_t tokens = 11, experts = 4, top_k = 3;
  int64_t max_tokens = 0;  // 0: tokens
  moekit_dtype_t weight_grad_dtype = MOEKIT_DTYPE_INVALID;  // the storage dtype
  moekit_dtype_t index_dtype = MOEKIT_DTYPE_INT32;
  bool inference = false;

  moekit_dtype_t grad_dtype() const { return weight_grad_dtype == MOEKIT_DTYPE_INVALID ? dtype : weight_grad_dtype; }
  moekit_dtype_t score_dtype() const { return dtype == MOEKIT_DTYPE_FP64 ? MOEKIT_DTYPE_FP64 : MOEKIT_DTYPE_FP32; }
  std::string describe() const {
    std::ostringstream s;
    s << "N " << tokens << " K " << top_k << " E " << experts << " act " << activation << " glu " << glu_layout
      << " biases " << biases << " dtype " << dtype << " ids " << index_dtype;
    return s.str();
  }
};

moekit_moe_desc_t layer_desc(const Shape& s) {
  moekit_moe_desc_t d = s.desc(s.max_tokens > 0 ? s.max_tokens : s.tokens, s.experts, s.top_k);
  d.inference = s.inference;
  d.weight_grad_dtype = s.weight_grad_dtype;
  return d;
}

// A plan of the experts on token-major rows, with its inputs (random), routing (set by the test) and gradients.
struct TokenExperts {
  Shape s;
  PlanOwner plan;
  AlignedBuffer saved{0};
  HostTensor x, ids, weights, w1, b1, w2, b2, out, dout, dx, dweights, dw1, db1, dw2, db2;

  TokenExperts(moekit_handle_t handle, const Shape& shape, std::mt19937_64& rng) : s(shape) {
    moekit_moe_desc_t d = layer_desc(s);
    MOEKIT_REQUIRE_OK(moekit_token_experts_plan_create(handle, &d, &plan.plan));
    saved = moekit_test::saved_buffer(plan.plan);
    const int64_t N = s.tokens, H = s.hidden, E = s.experts, K = s.top_k;
    const moekit_dtype_t wg = s.grad_dtype();
    x = HostTensor(s.dtype, {N, H});
    x.fill_uniform(rng, 1.0);
    ids = HostTensor(s.index_dtype, {N, K});
    weights = HostTensor(s.score_dtype(), {N, K});
    weights.fill_uniform(rng, 1.0);
    s.draw_weights(E, rng, w1, b1, w2, b2);
    out = HostTensor(s.dtype, {N, H});
    dout = HostTensor(s.dtype, {N, H});
    dout.fill_uniform(rng, 1.0);
    dx = HostTensor(s.dtype, {N, H});
    dweights = HostTensor(s.score_dtype(), {N, K});
    s.expert_tensors(wg, E, dw1, db1, dw2, db2);
  }

  void set_ids(const std::vector<int64_t>& values) {
    REQUIRE(static_cast<int64_t>(values.size()) == ids.numel());
    for (size_t i = 0; i < values.size(); ++i) ids.set(static_cast<int64_t>(i), static_cast<double>(values[i]));
  }
  std::vector<int64_t> id_values() const { return moekit_test::as_integers(ids); }
  bool valid(int64_t id) const { return id >= 0 && id < s.experts; }

  // The inputs forward and backward share.
  template <class Args>
  void bind_inputs(Args& a) {
    a.x = x.view();
    a.topk_idx = ids.view();
    a.topk_weights = weights.view();
    a.w1 = w1.view();
    a.w2 = w2.view();
    if (s.biases) a.b2 = b2.view();
  }

  // With beta_out = 0, out is poisoned first.
  moekit_status_t forward(double beta_out = 0) {
    if (beta_out == 0) out.poison();
    moekit_token_experts_fwd_args_t a;
    moekit_token_experts_fwd_args_init(&a);
    bind_inputs(a);
    if (s.biases) a.b1 = b1.view();
    a.out = out.view();
    a.beta_out = beta_out;
    return moekit_token_experts_forward(plan.plan, &a, saved.data(), saved.size(), nullptr, 0, nullptr);
  }

  moekit_status_t backward(const GradientRequest& r, void* saved_data, size_t saved_bytes) {
    moekit_token_experts_bwd_args_t a;
    moekit_token_experts_bwd_args_init(&a);
    bind_inputs(a);
    if (s.biases) {
      a.db1 = db1.view();
      a.db2 = db2.view();
    }
    a.dout = dout.view();
    a.dx = dx.view();
    a.dtopk_weights = dweights.view();
    a.dw1 = dw1.view();
    a.dw2 = dw2.view();
    r.set(a);
    return moekit_token_experts_backward(plan.plan, &a, saved_data, saved_bytes, nullptr, 0, nullptr);
  }
  moekit_status_t backward(const GradientRequest& r) { return backward(r, saved.data(), saved.size()); }

  std::vector<HostTensor*> gradients() {
    std::vector<HostTensor*> all{&dx, &dweights, &dw1, &dw2};
    if (s.biases) {
      all.push_back(&db1);
      all.push_back(&db2);
    }
    return all;
  }
  void poison_gradients() {
    for (HostTensor* g : gradients()) g->poison();
  }
};

// ---- Against the MoE layer ----------------------------------------------------------------------------------

// The MoE layer on the same x and expert weights, with router_experts router experts of which [expert_begin,
// expert_begin + E) are local; its forward returns the routing the token-major experts then get.
struct MoeLayer {
  PlanOwner plan;
  AlignedBuffer saved{0};
  HostTensor w_router, out, scores, indices, dx, dw_router, dw1, db1, dw2, db2;
  int64_t expert_begin;

  MoeLayer(moekit_handle_t handle, const Shape& s, int64_t router_experts, int64_t begin, int32_t router,
           std::mt19937_64& rng)
      : expert_begin(begin) {
    moekit_moe_desc_t d = layer_desc(s);
    d.router_experts = router_experts;
    d.expert_begin = begin;
    d.router = router;
    MOEKIT_REQUIRE_OK(moekit_moe_plan_create(handle, &d, &plan.plan));
    saved = moekit_test::saved_buffer(plan.plan);
    const int64_t N = s.tokens, H = s.hidden, E = s.experts;
    const moekit_dtype_t wg = s.grad_dtype();
    w_router = HostTensor(s.dtype, {router_experts, H});
    w_router.fill_uniform(rng, 1.0);
    out = HostTensor(s.dtype, {N, H});
    scores = HostTensor(s.score_dtype(), {N, s.top_k});
    indices = HostTensor(s.index_dtype, {N, s.top_k});
    dx = HostTensor(s.dtype, {N, H});
    dw_router = HostTensor(wg, {router_experts, H});
    s.expert_tensors(wg, E, dw1, db1, dw2, db2);
  }

  void forward(TokenExperts& te, double beta_out) {
    moekit_moe_fwd_args_t a;
    moekit_moe_fwd_args_init(&a);
    a.x = te.x.view();
    a.w_router = w_router.view();
    a.w1 = te.w1.view();
    a.w2 = te.w2.view();
    if (te.s.biases) {
      a.b1 = te.b1.view();
      a.b2 = te.b2.view();
    }
    a.out = out.view();
    a.scores = scores.view();
    a.indices = indices.view();
    a.beta_out = beta_out;
    MOEKIT_REQUIRE_OK(moekit_moe_forward(plan.plan, &a, saved.data(), saved.size(), nullptr, 0, nullptr));
  }

  void backward(TokenExperts& te, double beta) {
    moekit_moe_bwd_args_t a;
    moekit_moe_bwd_args_init(&a);
    a.x = te.x.view();
    a.dout = te.dout.view();
    a.w_router = w_router.view();
    a.w1 = te.w1.view();
    a.w2 = te.w2.view();
    if (te.s.biases) {
      a.b2 = te.b2.view();
      a.db1 = db1.view();
      a.db2 = db2.view();
    }
    a.dx = dx.view();
    a.dw_router = dw_router.view();
    a.dw1 = dw1.view();
    a.dw2 = dw2.view();
    a.beta_dx = a.beta_dw_router = a.beta_dw1 = a.beta_db1 = a.beta_dw2 = a.beta_db2 = beta;
    MOEKIT_REQUIRE_OK(moekit_moe_backward(plan.plan, &a, saved.data(), saved.size(), nullptr, 0, nullptr));
  }
};

// Sentinels for the pairs the MoE layer drops: "not here", past the local range, far past it, negative.
std::vector<int64_t> sentinels(const Shape& s) {
  std::vector<int64_t> values{-1, s.experts, s.experts + 2, -7, 1000};
  if (s.index_dtype == MOEKIT_DTYPE_INT64) values.push_back(int64_t{1} << 40);
  return values;
}

struct MoeCase {
  Shape s;
  int64_t router_experts, expert_begin;
  int32_t router = MOEKIT_ROUTER_SIGMOID;
  double beta = 0;  // beta_out of the forward and every beta of the backward
};

void check_against_moe(moekit_handle_t handle, const MoeCase& c, std::mt19937_64& rng) {
  const Shape& s = c.s;
  INFO(s.describe() << " router experts " << c.router_experts << " expert_begin " << c.expert_begin << " beta "
                    << c.beta);
  TokenExperts te(handle, s, rng);
  MoeLayer moe(handle, s, c.router_experts, c.expert_begin, c.router, rng);
  if (c.beta != 0) {
    moe.out.fill_uniform(rng, 1.0);
    te.out.set_values(moe.out.values());
  }
  moe.forward(te, c.beta);

  // The layer's routing as local ids: its expert range becomes [0, E), every other id a sentinel.
  const std::vector<int64_t> global = moekit_test::as_integers(moe.indices), fill = sentinels(s);
  std::vector<int64_t> local(global.size());
  size_t dropped = 0;
  for (size_t p = 0; p < global.size(); ++p) {
    const int64_t e = global[p] - c.expert_begin;
    local[p] = e >= 0 && e < s.experts ? e : fill[dropped++ % fill.size()];
  }
  INFO(dropped << " of " << global.size() << " pairs dropped");
  CHECK((c.router_experts == s.experts) == (dropped == 0));
  te.set_ids(local);
  te.weights.set_values(moe.scores.values());
  MOEKIT_REQUIRE_OK(te.forward(c.beta));
  REQUIRE(te.out.bytes_equal(moe.out));

  if (s.inference) return;
  te.poison_gradients();
  for (HostTensor* g : {&moe.dx, &moe.dw_router, &moe.dw1, &moe.db1, &moe.dw2, &moe.db2}) {
    g->fill_uniform(rng, 1.0);
    if (c.beta == 0) g->poison();
  }
  te.dx.set_values(moe.dx.values());
  te.dw1.set_values(moe.dw1.values());
  te.dw2.set_values(moe.dw2.values());
  te.db1.set_values(moe.db1.values());
  te.db2.set_values(moe.db2.values());
  moe.backward(te, c.beta);
  MOEKIT_REQUIRE_OK(te.backward({true, true, c.beta}));
  REQUIRE(te.dw1.bytes_equal(moe.dw1));
  REQUIRE(te.dw2.bytes_equal(moe.dw2));
  if (s.biases) {
    REQUIRE(te.db1.bytes_equal(moe.db1));
    REQUIRE(te.db2.bytes_equal(moe.db2));
  }
  // With one softmax-normalised choice the score is 1 whatever the logit, so the router passes no gradient to x.
  if (c.router == MOEKIT_ROUTER_SOFTMAX_TOPK && s.top_k == 1) REQUIRE(te.dx.bytes_equal(moe.dx));
  for (size_t p = 0; p < local.size(); ++p)
    if (!te.valid(local[p])) REQUIRE(te.dweights.get(static_cast<int64_t>(p)) == 0.0);
}

// ---- Against a per-pair loop --------------------------------------------------------------------------------

struct Expected {
  std::vector<double> out, dx, dweights, dw1, db1, dw2, db2;
};

// The layer's math pair by pair, with the rounding points of docs/math.md section 8.
Expected per_pair_loop(const TokenExperts& te) {
  const Shape& s = te.s;
  const int64_t N = s.tokens, H = s.hidden, I = s.inter, E = s.experts, K = s.top_k, W = s.hw();
  const std::vector<double> x = te.x.values(), dout = te.dout.values(), w = te.weights.values();
  const std::vector<double> w1 = te.w1.values(), b1 = te.b1.values(), w2 = te.w2.values(), b2 = te.b2.values();
  const std::vector<int64_t> ids = te.id_values();
  ExpertRef mlp{H, I, s.activation, s.glu_layout, 1.0, s.dtype, &w1, s.biases ? &b1 : nullptr, &w2,
                s.biases ? &b2 : nullptr};
  Expected r;
  r.out.assign(static_cast<size_t>(N * H), 0.0);
  r.dx.assign(static_cast<size_t>(N * H), 0.0);
  r.dweights.assign(static_cast<size_t>(N * K), 0.0);
  r.dw1.assign(static_cast<size_t>(E * W * H), 0.0);
  r.db1.assign(static_cast<size_t>(E * W), 0.0);
  r.dw2.assign(static_cast<size_t>(E * H * I), 0.0);
  r.db2.assign(static_cast<size_t>(E * H), 0.0);
  std::vector<double> h, a, y, dh, a_scaled, dxe;
  for (int64_t t = 0; t < N; ++t) {
    const double* xt = x.data() + t * H;
    const double* dt = dout.data() + t * H;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t p = t * K + k, e = ids[static_cast<size_t>(p)];
      if (!te.valid(e)) continue;
      const double wp = w[static_cast<size_t>(p)];
      mlp.forward(e, xt, h, a, y);
      double ds = 0;
      mlp.backward(e, h, dt, wp, ds, dh, a_scaled, dxe);
      for (int64_t j = 0; j < H; ++j) {
        r.out[static_cast<size_t>(t * H + j)] += wp * y[static_cast<size_t>(j)];
        r.dx[static_cast<size_t>(t * H + j)] += moekit::round_to(dxe[static_cast<size_t>(j)], s.dtype);
        if (s.biases) ds += dt[j] * b2[static_cast<size_t>(e * H + j)];
        r.db2[static_cast<size_t>(e * H + j)] += wp * dt[j];
        for (int64_t i = 0; i < I; ++i)
          r.dw2[static_cast<size_t>((e * H + j) * I + i)] += dt[j] * a_scaled[static_cast<size_t>(i)];
      }
      for (int64_t i = 0; i < W; ++i) {
        r.db1[static_cast<size_t>(e * W + i)] += dh[static_cast<size_t>(i)];
        for (int64_t j = 0; j < H; ++j)
          r.dw1[static_cast<size_t>((e * W + i) * H + j)] += dh[static_cast<size_t>(i)] * xt[j];
      }
      r.dweights[static_cast<size_t>(p)] = moekit::round_to(ds, s.score_dtype());
    }
  }
  for (std::vector<double>* v : {&r.out, &r.dx})
    for (double& value : *v) value = moekit::round_to(value, s.dtype);
  for (std::vector<double>* v : {&r.dw1, &r.db1, &r.dw2, &r.db2})
    for (double& value : *v) value = moekit::round_to(value, s.grad_dtype());
  return r;
}

// require_matches where the reference has something to compare with; exact zeros where it is all zero.
void require_close(const HostTensor& got, const std::vector<double>& ref, moekit_dtype_t dtype, const char* what) {
  if (layer_test::rms(ref) > 0) {
    require_matches(got.values(), ref, dtype, what);
    return;
  }
  for (int64_t i = 0; i < got.numel(); ++i) {
    INFO(what << "[" << i << "] = " << got.get(i) << ", expected 0");
    REQUIRE(got.get(i) == 0.0);
  }
}

struct LoopCase {
  const char* name;
  Shape s;
  std::vector<int64_t> ids;  // [N, K]
};

// Random ids of N tokens: local ones of every expert but `empty`, and sentinels.
std::vector<int64_t> random_ids(const Shape& s, int64_t empty, std::mt19937_64& rng) {
  std::vector<int64_t> choices = sentinels(s);
  for (int64_t e = 0; e < s.experts; ++e)
    if (e != empty) choices.insert(choices.end(), 2, e);  // local ids twice as often as each sentinel
  std::uniform_int_distribution<size_t> pick(0, choices.size() - 1);
  std::vector<int64_t> ids(static_cast<size_t>(s.tokens * s.top_k));
  for (int64_t& id : ids) id = choices[pick(rng)];
  return ids;
}

std::vector<LoopCase> loop_cases(moekit_dtype_t dtype, std::mt19937_64& rng) {
  std::vector<LoopCase> cases;
  {
    LoopCase c{"sentinels, an empty expert and tokens with every pair dropped", {}, {}};
    c.s.tokens = 13;
    c.s.experts = 5;
    c.ids = random_ids(c.s, 3, rng);
    for (int64_t k = 0; k < c.s.top_k; ++k) {
      c.ids[static_cast<size_t>(4 * c.s.top_k + k)] = -1;
      c.ids[static_cast<size_t>(9 * c.s.top_k + k)] = sentinels(c.s)[static_cast<size_t>(k + 1)];
    }
    cases.push_back(c);
  }
  {
    LoopCase c{"T = 1", {}, {2, 0}};
    c.s.tokens = 1;
    c.s.top_k = 2;
    cases.push_back(c);
  }
  {
    LoopCase c{"one expert takes every pair", {}, {}};
    c.s.tokens = 9;
    c.s.top_k = 2;
    c.s.experts = 3;
    for (int64_t t = 0; t < c.s.tokens; ++t) {
      c.ids.push_back(t % 2 ? -1 : 1);
      c.ids.push_back(t % 2 ? 1 : 3);
    }
    cases.push_back(c);
  }
  {
    LoopCase c{"no pair is local", {}, {-1, 4, 7, -1, -1, -1, 4, 4}};
    c.s.tokens = 4;
    c.s.top_k = 2;
    cases.push_back(c);
  }
  {
    LoopCase c{"a non-gated activation, int64 ids, K above E, no biases", {}, {}};
    c.s.activation = MOEKIT_ACT_GELU;
    c.s.index_dtype = MOEKIT_DTYPE_INT64;
    c.s.biases = false;
    c.s.tokens = 7;
    c.s.experts = 2;
    c.s.top_k = 4;
    c.ids = random_ids(c.s, -1, rng);
    cases.push_back(c);
  }
  {
    LoopCase c{"GeGLU with interleaved halves, wide shapes", {}, {}};
    c.s.activation = MOEKIT_ACT_GEGLU;
    c.s.glu_layout = MOEKIT_GLU_INTERLEAVED;
    c.s.tokens = 37;
    c.s.hidden = 72;
    c.s.inter = 40;
    c.s.experts = 6;
    c.s.top_k = 2;
    c.ids = random_ids(c.s, -1, rng);
    cases.push_back(c);
  }
  for (LoopCase& c : cases) c.s.dtype = dtype;
  return cases;
}

// ---- Central differences ------------------------------------------------------------------------------------

// loss = sum(dout * out) of the fp64 layer, a fresh forward of the current parameters.
struct FdProblem {
  TokenExperts& te;
  double loss() {
    MOEKIT_REQUIRE_OK(te.forward());
    double sum = 0;
    for (int64_t i = 0; i < te.out.numel(); ++i) sum += te.dout.get(i) * te.out.get(i);
    return sum;
  }
};

}  // namespace

TEST_CASE("token-major experts give the MoE layer's out and weight gradients bit for bit on its routing",
          "[token_experts]") {
  ReferenceHandle handle;
  std::mt19937_64 rng(401);
  std::vector<MoeCase> cases;
  {
    MoeCase c{{}, 4, 0};  // every id local
    cases.push_back(c);
    c.s.dtype = MOEKIT_DTYPE_FP32;
    c.s.index_dtype = MOEKIT_DTYPE_INT64;
    c.s.activation = MOEKIT_ACT_GEGLU;
    c.s.glu_layout = MOEKIT_GLU_INTERLEAVED;
    c.s.biases = false;
    cases.push_back(c);
    c.s = Shape{};
    c.s.dtype = MOEKIT_DTYPE_FP64;
    c.s.activation = MOEKIT_ACT_SILU;
    cases.push_back(c);
  }
  {
    MoeCase c{{}, 9, 3};  // five of the router's experts live elsewhere: their pairs carry sentinels
    cases.push_back(c);
    c.s.index_dtype = MOEKIT_DTYPE_INT64;
    c.s.dtype = MOEKIT_DTYPE_FP64;
    c.s.activation = MOEKIT_ACT_SWIGLU_OAI;
    cases.push_back(c);
  }
  {
    MoeCase c{{}, 6, 2, MOEKIT_ROUTER_SOFTMAX_TOPK, 1.0};  // K = 1: dx too; accumulation into fp32 gradients
    c.s.top_k = 1;
    c.s.weight_grad_dtype = MOEKIT_DTYPE_FP32;
    cases.push_back(c);
    c.router_experts = c.s.experts;
    c.expert_begin = 0;
    c.s.tokens = 1;
    cases.push_back(c);
  }
  {
    MoeCase c{{}, 5, 1};
    c.s.inference = true;
    cases.push_back(c);
  }
  for (const MoeCase& c : cases) check_against_moe(handle.handle, c, rng);
}

TEST_CASE("token-major experts match a per-pair loop on the ugly cases (bf16 and fp64)", "[token_experts]") {
  ReferenceHandle handle;
  std::mt19937_64 rng(402);
  for (moekit_dtype_t dtype : {MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP64})
    for (const LoopCase& c : loop_cases(dtype, rng)) {
      INFO(c.name << ": " << c.s.describe());
      TokenExperts te(handle.handle, c.s, rng);
      te.set_ids(c.ids);
      for (int64_t p = 0; p < te.ids.numel(); ++p)  // a dropped pair's weight is never read
        if (!te.valid(c.ids[static_cast<size_t>(p)])) te.weights.set(p, NAN);
      MOEKIT_REQUIRE_OK(te.forward());
      te.poison_gradients();
      MOEKIT_REQUIRE_OK(te.backward({}));
      const Expected r = per_pair_loop(te);
      require_close(te.out, r.out, c.s.dtype, "out");
      require_close(te.dx, r.dx, c.s.dtype, "dx");
      require_close(te.dweights, r.dweights, c.s.score_dtype(), "dtopk_weights");
      require_close(te.dw1, r.dw1, c.s.grad_dtype(), "dw1");
      require_close(te.dw2, r.dw2, c.s.grad_dtype(), "dw2");
      if (c.s.biases) {
        require_close(te.db1, r.db1, c.s.grad_dtype(), "db1");
        require_close(te.db2, r.db2, c.s.grad_dtype(), "db2");
      }
      // A token with no local pair gets zeros, a dropped pair a zero weight gradient: exactly, not nearly.
      const std::vector<int64_t> ids = te.id_values();
      for (int64_t t = 0; t < c.s.tokens; ++t) {
        bool any_local = false;
        for (int64_t k = 0; k < c.s.top_k; ++k) {
          const int64_t p = t * c.s.top_k + k;
          if (te.valid(ids[static_cast<size_t>(p)])) {
            any_local = true;
          } else {
            REQUIRE(te.dweights.get(p) == 0.0);
          }
        }
        if (any_local) continue;
        for (int64_t j = 0; j < c.s.hidden; ++j) {
          INFO("token " << t << " has no local pair");
          REQUIRE(te.out.get(t * c.s.hidden + j) == 0.0);
          REQUIRE(te.dx.get(t * c.s.hidden + j) == 0.0);
        }
      }
    }
}

TEST_CASE("token-major experts backward matches central differences through the C ABI (fp64)", "[token_experts]") {
  ReferenceHandle handle;
  std::mt19937_64 rng(403);
  for (int32_t activation : {MOEKIT_ACT_SWIGLU, MOEKIT_ACT_GEGLU, MOEKIT_ACT_SILU}) {
    Shape s;
    s.dtype = MOEKIT_DTYPE_FP64;
    s.activation = activation;
    s.glu_layout = activation == MOEKIT_ACT_GEGLU ? MOEKIT_GLU_INTERLEAVED : MOEKIT_GLU_CONCAT;
    s.tokens = 7;
    s.hidden = 9;
    s.inter = 5;
    s.experts = 3;
    s.top_k = 3;
    INFO(s.describe());
    TokenExperts te(handle.handle, s, rng);
    std::vector<int64_t> ids = random_ids(s, -1, rng);
    for (int64_t k = 0; k < s.top_k; ++k) ids[static_cast<size_t>(2 * s.top_k + k)] = -1;  // token 2: nothing local
    te.set_ids(ids);
    MOEKIT_REQUIRE_OK(te.forward());
    te.poison_gradients();
    MOEKIT_REQUIRE_OK(te.backward({}));
    FdProblem problem{te};
    const std::vector<std::pair<const char*, std::pair<HostTensor*, HostTensor*>>> params = {
        {"x", {&te.x, &te.dx}},       {"topk_weights", {&te.weights, &te.dweights}},
        {"w1", {&te.w1, &te.dw1}},    {"b1", {&te.b1, &te.db1}},
        {"w2", {&te.w2, &te.dw2}},    {"b2", {&te.b2, &te.db2}},
    };
    for (const auto& [name, pg] : params) {
      const std::vector<int64_t> entries = moekit_test::pick_entries(pg.first->numel(), 96, rng);
      moekit_test::check_fd_result(name, moekit_test::central_differences(problem, *pg.first, *pg.second, entries),
                                   *pg.second);
    }
  }
}

TEST_CASE("token-major experts backward: input-only and weight-only calls match the combined call, beta 1 adds",
          "[token_experts]") {
  ReferenceHandle handle;
  std::mt19937_64 rng(404);
  Shape s;
  s.dtype = MOEKIT_DTYPE_FP64;  // old + new is then one exact float64 addition the test can redo
  TokenExperts te(handle.handle, s, rng);
  te.set_ids(random_ids(s, 1, rng));
  MOEKIT_REQUIRE_OK(te.forward());
  te.poison_gradients();
  MOEKIT_REQUIRE_OK(te.backward({}));
  std::vector<std::vector<double>> combined;
  for (HostTensor* g : te.gradients()) combined.push_back(g->values());

  te.poison_gradients();
  MOEKIT_REQUIRE_OK(te.backward({false, false, 0}));
  for (HostTensor* g : te.gradients()) REQUIRE(std::isnan(g->get(0)));  // nothing asked, nothing written
  MOEKIT_REQUIRE_OK(te.backward({false, true, 0}));
  REQUIRE(std::isnan(te.dx.get(0)));
  REQUIRE(std::isnan(te.dweights.get(0)));
  MOEKIT_REQUIRE_OK(te.backward({true, false, 0}));
  for (size_t i = 0; i < combined.size(); ++i) REQUIRE(te.gradients()[i]->values() == combined[i]);

  std::vector<std::vector<double>> old;
  for (HostTensor* g : te.gradients()) {
    g->fill_uniform(rng, 1.0);
    old.push_back(g->values());
  }
  MOEKIT_REQUIRE_OK(te.backward({true, true, 1.0}));
  for (size_t i = 0; i < combined.size(); ++i) {
    const std::vector<double> got = te.gradients()[i]->values();
    const bool overwritten = te.gradients()[i] == &te.dweights;  // d(topk_weights) has no beta
    for (size_t j = 0; j < got.size(); ++j) REQUIRE(got[j] == (overwritten ? 0.0 : old[i][j]) + combined[i][j]);
  }
}

TEST_CASE("token-major experts: one plan serves every N up to max_tokens, N = 0 included", "[token_experts]") {
  ReferenceHandle handle;
  std::mt19937_64 rng(405);
  Shape big;
  big.tokens = 16;
  Shape small = big;
  small.tokens = 5;
  small.max_tokens = big.tokens;
  TokenExperts whole(handle.handle, big, rng), part(handle.handle, small, rng);
  whole.set_ids(random_ids(big, -1, rng));
  // The first rows of the bigger problem, through a plan made for 16 tokens.
  const auto copy_leading = [](HostTensor& to, const HostTensor& from) {
    for (int64_t i = 0; i < to.numel(); ++i) to.set(i, from.get(i));
  };
  copy_leading(part.x, whole.x);
  copy_leading(part.weights, whole.weights);
  copy_leading(part.ids, whole.ids);
  copy_leading(part.w1, whole.w1);
  copy_leading(part.b1, whole.b1);
  copy_leading(part.w2, whole.w2);
  copy_leading(part.b2, whole.b2);
  MOEKIT_REQUIRE_OK(whole.forward());
  MOEKIT_REQUIRE_OK(part.forward());
  for (int64_t i = 0; i < part.out.numel(); ++i) REQUIRE(part.out.get(i) == whole.out.get(i));
  MOEKIT_REQUIRE_OK(part.backward({}));

  // N = 0: PyTorch hands out NULL data for empty tensors.
  moekit_token_experts_fwd_args_t a;
  moekit_token_experts_fwd_args_init(&a);
  const moekit_device_t cpu{MOEKIT_DEVICE_CPU, 0};
  int64_t rows_shape[2] = {0, big.hidden}, pair_shape[2] = {0, big.top_k};
  a.x = moekit_tensor_make(nullptr, big.dtype, 2, rows_shape, cpu);
  a.topk_idx = moekit_tensor_make(nullptr, MOEKIT_DTYPE_INT32, 2, pair_shape, cpu);
  a.topk_weights = moekit_tensor_make(nullptr, MOEKIT_DTYPE_FP32, 2, pair_shape, cpu);
  a.w1 = whole.w1.view();
  a.b1 = whole.b1.view();
  a.w2 = whole.w2.view();
  a.b2 = whole.b2.view();
  a.out = moekit_tensor_make(nullptr, big.dtype, 2, rows_shape, cpu);
  MOEKIT_REQUIRE_OK(moekit_token_experts_forward(whole.plan.plan, &a, whole.saved.data(), whole.saved.size(), nullptr,
                                                 0, nullptr));
}

TEST_CASE("token-major experts: an inference plan needs no saved buffer and has no backward", "[token_experts]") {
  ReferenceHandle handle;
  std::mt19937_64 rng(406);
  Shape s;
  TokenExperts training(handle.handle, s, rng);
  s.inference = true;
  std::mt19937_64 same(406);
  TokenExperts inference(handle.handle, s, same);
  REQUIRE(inference.saved.size() == 0);
  const std::vector<int64_t> ids = random_ids(s, -1, rng);
  training.set_ids(ids);
  inference.set_ids(ids);
  MOEKIT_REQUIRE_OK(training.forward());
  MOEKIT_REQUIRE_OK(inference.forward());
  REQUIRE(inference.out.bytes_equal(training.out));
  inference.poison_gradients();
  REQUIRE(inference.backward({}) == MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE_THAT(moekit_test::last_error(), Catch::Contains("inference"));
  REQUIRE(std::isnan(inference.dx.get(0)));
}

TEST_CASE("token-major experts backward rejects a saved buffer from another plan", "[token_experts]") {
  ReferenceHandle handle;
  std::mt19937_64 rng(407);
  Shape s;
  TokenExperts first(handle.handle, s, rng), second(handle.handle, s, rng);
  first.set_ids(random_ids(s, -1, rng));
  second.set_ids(first.id_values());
  MOEKIT_REQUIRE_OK(first.forward());
  MOEKIT_REQUIRE_OK(second.forward());
  second.poison_gradients();
  REQUIRE(second.backward({}, first.saved.data(), first.saved.size()) == MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(moekit_test::last_error().rfind("saved", 0) == 0);
  for (HostTensor* g : second.gradients()) REQUIRE(std::isnan(g->get(0)));
}
