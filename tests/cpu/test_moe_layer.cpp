// The MoE layer (docs/math.md sections 3, 4, 8) through the C ABI on the reference backend, against a straightforward
// per-token loop written in the test: for each token, for each of its K experts, the expert MLP directly (no
// dispatch, no grouping), with the rounding points of section 8. The router scores come from the router building
// block on logits the test computes, so the layer's router GEMM, its rounding and the wiring are checked too.
#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "layer_reference.h"
#include "src/numeric.h"

using layer_test::ExpertRef;
using layer_test::require_matches;
using moekit_test::HostTensor;
using moekit_test::AlignedBuffer;
using moekit_test::ReferenceHandle;

namespace {

struct Config {
  int32_t activation = MOEKIT_ACT_SWIGLU;
  int32_t glu_layout = MOEKIT_GLU_CONCAT;
  int32_t router = MOEKIT_ROUTER_SOFTMAX_TOPK;
  bool renormalize = false;
  bool biases = true;
  int64_t tokens = 13, hidden = 24, inter = 10, router_experts = 6, experts = 6, expert_begin = 0, top_k = 2;
  moekit_dtype_t dtype = MOEKIT_DTYPE_BF16;
  double beta_out = 0;
  bool backward_overwrites_saved = false;

  bool gated() const { return activation < MOEKIT_ACT_GELU; }
  int64_t hw() const { return gated() ? 2 * inter : inter; }
  moekit_dtype_t score_dtype() const { return dtype == MOEKIT_DTYPE_FP64 ? MOEKIT_DTYPE_FP64 : MOEKIT_DTYPE_FP32; }
  std::string describe() const {
    std::ostringstream s;
    s << "act " << activation << " glu " << glu_layout << " router " << router << " renorm " << renormalize
      << " biases " << biases << " T " << tokens << " E " << experts << "/" << router_experts << " e0 "
      << expert_begin << " K " << top_k << " dtype " << dtype << " beta_out " << beta_out;
    return s.str();
  }
};

// One layer: plan, random parameters scaled so every output is O(1), and the C ABI calls.
struct Layer {
  Config c;
  moekit_plan_t plan = nullptr;
  AlignedBuffer saved{0};
  HostTensor x, wr, router_bias, w1, b1, w2, b2, out, scores, indices, counts, dout;
  HostTensor dx, dwr, dw1, db1, dw2, db2;

  Layer(moekit_handle_t handle, const Config& config, std::mt19937_64& rng, bool inference = false) : c(config) {
    moekit_moe_desc_t d;
    moekit_moe_desc_init(&d);
    d.max_tokens = c.tokens + 3;  // a call may run fewer tokens than the bound
    d.hidden = c.hidden;
    d.intermediate = c.inter;
    d.router_experts = c.router_experts;
    d.experts = c.experts;
    d.expert_begin = c.expert_begin;
    d.top_k = c.top_k;
    d.activation = c.activation;
    d.glu_layout = c.glu_layout;
    d.glu_limit = 1.0;  // SWIGLU_OAI clamps often at this scale
    d.router = c.router;
    d.renormalize = c.renormalize;
    d.has_b1 = c.biases;
    d.has_b2 = c.biases;
    d.inference = inference;
    d.dtype = c.dtype;
    d.backward_overwrites_saved = c.backward_overwrites_saved;
    MOEKIT_REQUIRE_OK(moekit_moe_plan_create(handle, &d, &plan));
    size_t bytes = 0;
    MOEKIT_REQUIRE_OK(moekit_plan_saved_size(plan, &bytes));
    REQUIRE((inference ? bytes == 0 : bytes > 0));
    saved = AlignedBuffer(bytes);

    const int64_t T = c.tokens, H = c.hidden, E = c.experts, RE = c.router_experts;
    x = HostTensor(c.dtype, {T, H});
    wr = HostTensor(c.dtype, {RE, H});
    router_bias = HostTensor(MOEKIT_DTYPE_FP32, {RE});
    w1 = HostTensor(c.dtype, {E, c.hw(), H});
    b1 = HostTensor(c.dtype, {E, c.hw()});
    w2 = HostTensor(c.dtype, {E, H, c.inter});
    b2 = HostTensor(c.dtype, {E, H});
    x.fill_uniform(rng, 1.0);
    wr.fill_uniform(rng, 2.0 / std::sqrt(double(H)));
    router_bias.fill_uniform(rng, 0.2);
    w1.fill_uniform(rng, 2.0 / std::sqrt(double(H)));
    b1.fill_uniform(rng, 0.5);
    w2.fill_uniform(rng, 2.0 / std::sqrt(double(c.inter)));
    b2.fill_uniform(rng, 0.5);
    out = HostTensor(c.dtype, {T, H});
    out.fill_uniform(rng, 1.0);
    scores = HostTensor(c.score_dtype(), {T, c.top_k});
    indices = HostTensor(MOEKIT_DTYPE_INT64, {T, c.top_k});
    counts = HostTensor(MOEKIT_DTYPE_INT32, {RE});
    dout = HostTensor(c.dtype, {T, H});
    dout.fill_uniform(rng, 1.0);
    dx = HostTensor(c.dtype, {T, H});
    dwr = HostTensor(c.dtype, {RE, H});
    dw1 = HostTensor(c.dtype, {E, c.hw(), H});
    db1 = HostTensor(c.dtype, {E, c.hw()});
    dw2 = HostTensor(c.dtype, {E, H, c.inter});
    db2 = HostTensor(c.dtype, {E, H});
  }
  ~Layer() { moekit_plan_destroy(plan); }

  // With beta_out = 0, out is poisoned first (it must not be read); otherwise it keeps what the caller put there.
  moekit_status_t forward() {
    if (c.beta_out == 0) out.poison();
    scores.poison();
    indices.poison();
    counts.poison();
    moekit_moe_fwd_args_t a;
    moekit_moe_fwd_args_init(&a);
    a.x = x.view();
    a.w_router = wr.view();
    if (c.router == MOEKIT_ROUTER_SIGMOID) a.router_bias = router_bias.view();
    a.w1 = w1.view();
    a.w2 = w2.view();
    if (c.biases) {
      a.b1 = b1.view();
      a.b2 = b2.view();
    }
    a.out = out.view();
    a.scores = scores.view();
    a.indices = indices.view();
    a.counts = counts.view();
    a.beta_out = c.beta_out;
    return moekit_moe_forward(plan, &a, saved.data(), saved.size(), nullptr, 0, nullptr);
  }

  moekit_status_t backward(const void* saved_data, size_t saved_bytes) {
    for (HostTensor* g : {&dx, &dwr, &dw1, &db1, &dw2, &db2}) g->poison();
    moekit_moe_bwd_args_t a;
    moekit_moe_bwd_args_init(&a);
    a.x = x.view();
    a.dout = dout.view();
    a.w_router = wr.view();
    a.w1 = w1.view();
    a.w2 = w2.view();
    a.dx = dx.view();
    a.dw_router = dwr.view();
    a.dw1 = dw1.view();
    a.dw2 = dw2.view();
    if (c.biases) {
      a.b2 = b2.view();
      a.db1 = db1.view();
      a.db2 = db2.view();
    }
    return moekit_moe_backward(plan, &a, saved_data, saved_bytes, nullptr, 0, nullptr);
  }
};

// The per-token reference: logits, router (through the router building block), expert MLPs, combine; and backward.
struct Reference {
  const Layer& L;
  const Config& c;
  std::vector<double> x, wr, w1, b1, w2, b2, dout;
  HostTensor logits, scores, indices;
  ExpertRef mlp;
  moekit_plan_t router_plan = nullptr;

  Reference(moekit_handle_t handle, const Layer& layer)
      : L(layer), c(layer.c), x(layer.x.values()), wr(layer.wr.values()), w1(layer.w1.values()),
        b1(layer.b1.values()), w2(layer.w2.values()), b2(layer.b2.values()), dout(layer.dout.values()),
        mlp{c.hidden, c.inter, c.activation, c.glu_layout, 1.0, c.dtype, &w1, c.biases ? &b1 : nullptr, &w2,
            c.biases ? &b2 : nullptr} {
    const int64_t T = c.tokens, H = c.hidden, RE = c.router_experts;
    logits = HostTensor(c.dtype, {T, RE});
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < RE; ++e) {
        double sum = 0;
        for (int64_t k = 0; k < H; ++k) sum += x[static_cast<size_t>(t * H + k)] * wr[static_cast<size_t>(e * H + k)];
        logits.set(t * RE + e, moekit::round_to(sum, c.dtype));
      }
    moekit_router_desc_t rd;
    moekit_router_desc_init(&rd);
    rd.max_tokens = T;
    rd.experts = RE;
    rd.top_k = c.top_k;
    rd.kind = c.router;
    rd.renormalize = c.renormalize;
    rd.dtype = c.dtype;
    moekit_plan_t plan = nullptr;
    MOEKIT_REQUIRE_OK(moekit_router_plan_create(handle, &rd, &plan));
    scores = HostTensor(c.score_dtype(), {T, c.top_k});
    indices = HostTensor(MOEKIT_DTYPE_INT64, {T, c.top_k});
    moekit_router_fwd_args_t a;
    moekit_router_fwd_args_init(&a);
    HostTensor bias = layer.router_bias;
    a.logits = logits.view();
    if (c.router == MOEKIT_ROUTER_SIGMOID) a.bias = bias.view();
    a.scores = scores.view();
    a.indices = indices.view();
    router_plan = plan;
    MOEKIT_REQUIRE_OK(moekit_router_forward(plan, &a, nullptr, 0, nullptr));
  }
  ~Reference() { moekit_plan_destroy(router_plan); }

  // Local expert of pair (t, k), or -1 when the pair is dropped.
  int64_t local_expert(int64_t t, int64_t k) const {
    int64_t e = static_cast<int64_t>(indices.get(t * c.top_k + k)) - c.expert_begin;
    return e >= 0 && e < c.experts ? e : -1;
  }

  std::vector<double> forward(const std::vector<double>& out_before) const {
    const int64_t H = c.hidden;
    std::vector<double> out(static_cast<size_t>(c.tokens * H));
    std::vector<double> h, a, y;
    for (int64_t t = 0; t < c.tokens; ++t) {
      std::vector<double> sum(static_cast<size_t>(H), 0.0);
      for (int64_t k = 0; k < c.top_k; ++k) {
        int64_t e = local_expert(t, k);
        if (e < 0) continue;
        double s = scores.get(t * c.top_k + k);
        mlp.forward(e, x.data() + t * H, h, a, y);
        for (int64_t j = 0; j < H; ++j) sum[static_cast<size_t>(j)] += s * y[static_cast<size_t>(j)];
      }
      for (int64_t j = 0; j < H; ++j) {
        double old = c.beta_out != 0 ? c.beta_out * out_before[static_cast<size_t>(t * H + j)] : 0.0;
        out[static_cast<size_t>(t * H + j)] = moekit::round_to(old + sum[static_cast<size_t>(j)], c.dtype);
      }
    }
    return out;
  }

  struct Gradients {
    std::vector<double> dx, dwr, dw1, db1, dw2, db2;
  };

  Gradients backward() const {
    const int64_t T = c.tokens, H = c.hidden, RE = c.router_experts, E = c.experts, I = c.inter, W = c.hw();
    Gradients g;
    g.dx.assign(static_cast<size_t>(T * H), 0.0);
    g.dwr.assign(static_cast<size_t>(RE * H), 0.0);
    g.dw1.assign(static_cast<size_t>(E * W * H), 0.0);
    g.db1.assign(static_cast<size_t>(E * W), 0.0);
    g.dw2.assign(static_cast<size_t>(E * H * I), 0.0);
    g.db2.assign(static_cast<size_t>(E * H), 0.0);
    HostTensor ds(c.score_dtype(), {T, c.top_k});
    std::vector<double> h, a, y, dh, a_scaled, dxe;
    for (int64_t t = 0; t < T; ++t) {
      const double* xt = x.data() + t * H;
      const double* dt = dout.data() + t * H;
      for (int64_t k = 0; k < c.top_k; ++k) {
        int64_t e = local_expert(t, k);
        if (e < 0) {
          ds.set(t * c.top_k + k, 0.0);  // a dropped pair's score gets no gradient
          continue;
        }
        double s = scores.get(t * c.top_k + k);
        mlp.forward(e, xt, h, a, y);
        double dsv = 0;
        mlp.backward(e, h, dt, s, dsv, dh, a_scaled, dxe);
        if (c.biases)
          for (int64_t j = 0; j < H; ++j) dsv += dt[j] * b2[static_cast<size_t>(e * H + j)];
        ds.set(t * c.top_k + k, dsv);
        for (int64_t j = 0; j < H; ++j) g.dx[static_cast<size_t>(t * H + j)] += moekit::round_to(dxe[static_cast<size_t>(j)], c.dtype);
        for (int64_t j = 0; j < H; ++j)
          for (int64_t i = 0; i < I; ++i) g.dw2[static_cast<size_t>((e * H + j) * I + i)] += dt[j] * a_scaled[static_cast<size_t>(i)];
        for (int64_t j = 0; j < H; ++j) g.db2[static_cast<size_t>(e * H + j)] += s * dt[j];
        for (int64_t r = 0; r < W; ++r) {
          g.db1[static_cast<size_t>(e * W + r)] += dh[static_cast<size_t>(r)];
          for (int64_t j = 0; j < H; ++j) g.dw1[static_cast<size_t>((e * W + r) * H + j)] += dh[static_cast<size_t>(r)] * xt[j];
        }
      }
    }
    for (double& v : g.dx) v = moekit::round_to(v, c.dtype);
    // dlogits from the router building block, in the storage dtype (the layer's rounding point).
    HostTensor dlogits(c.dtype, {T, RE});
    moekit_router_bwd_args_t ra;
    moekit_router_bwd_args_init(&ra);
    HostTensor logits_copy = logits, indices_copy = indices;
    ra.logits = logits_copy.view();
    ra.indices = indices_copy.view();
    ra.dscores = ds.view();
    ra.dlogits = dlogits.view();
    MOEKIT_REQUIRE_OK(moekit_router_backward(router_plan, &ra, nullptr, 0, nullptr));
    std::vector<double> dl = dlogits.values();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < H; ++j) {
        double sum = 0;
        for (int64_t e = 0; e < RE; ++e) sum += dl[static_cast<size_t>(t * RE + e)] * wr[static_cast<size_t>(e * H + j)];
        g.dx[static_cast<size_t>(t * H + j)] = moekit::round_to(g.dx[static_cast<size_t>(t * H + j)] + sum, c.dtype);
      }
    for (int64_t e = 0; e < RE; ++e)
      for (int64_t j = 0; j < H; ++j)
        for (int64_t t = 0; t < T; ++t)
          g.dwr[static_cast<size_t>(e * H + j)] += dl[static_cast<size_t>(t * RE + e)] * x[static_cast<size_t>(t * H + j)];
    for (std::vector<double>* v : {&g.dwr, &g.dw1, &g.db1, &g.dw2, &g.db2})
      for (double& value : *v) value = moekit::round_to(value, c.dtype);
    return g;
  }
};

void check_forward(moekit_handle_t handle, const Config& c, std::mt19937_64& rng) {
  INFO(c.describe());
  Layer layer(handle, c, rng);
  std::vector<double> out_before = layer.out.values();
  MOEKIT_REQUIRE_OK(layer.forward());
  Reference ref(handle, layer);
  REQUIRE(layer.indices.values() == ref.indices.values());
  // In fp64 the logits are not rounded, so the two summation orders show in the last bits of the scores.
  if (c.dtype == MOEKIT_DTYPE_FP64)
    require_matches(layer.scores.values(), ref.scores.values(), c.dtype, "scores");
  else
    REQUIRE(layer.scores.values() == ref.scores.values());
  // counts: pairs per router expert, before dropping.
  std::vector<double> counts(static_cast<size_t>(c.router_experts), 0.0);
  for (double id : ref.indices.values()) counts[static_cast<size_t>(id)] += 1;
  REQUIRE(layer.counts.values() == counts);
  require_matches(layer.out.values(), ref.forward(out_before), c.dtype, "out");
}

const int32_t kActivations[] = {MOEKIT_ACT_SWIGLU, MOEKIT_ACT_GEGLU, MOEKIT_ACT_REGLU, MOEKIT_ACT_SWIGLU_OAI,
                                MOEKIT_ACT_GELU,   MOEKIT_ACT_RELU,  MOEKIT_ACT_SILU,  MOEKIT_ACT_RELU2};

}  // namespace

TEST_CASE("moe forward matches a per-token loop for every activation and GLU layout, bf16 and fp64", "[moe]") {
  ReferenceHandle handle;
  std::mt19937_64 rng(201);
  for (moekit_dtype_t dtype : {MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP64})
    for (int32_t activation : kActivations)
      for (int32_t layout : {MOEKIT_GLU_CONCAT, MOEKIT_GLU_INTERLEAVED}) {
        if (activation >= MOEKIT_ACT_GELU && layout == MOEKIT_GLU_INTERLEAVED) continue;
        Config c;
        c.activation = activation;
        c.glu_layout = layout;
        c.dtype = dtype;
        check_forward(handle.handle, c, rng);
      }
}

TEST_CASE("moe forward: no biases, dropped pairs off this rank, beta_out, every router kind, fp16", "[moe]") {
  ReferenceHandle handle;
  std::mt19937_64 rng(202);
  Config c;
  c.biases = false;
  check_forward(handle.handle, c, rng);
  c = Config{};
  c.router_experts = 8;
  c.experts = 3;
  c.expert_begin = 2;  // pairs routed to experts 0, 1 and 5..7 are dropped
  c.top_k = 3;
  check_forward(handle.handle, c, rng);
  c = Config{};
  c.beta_out = 1.0;
  check_forward(handle.handle, c, rng);
  for (int32_t router : {MOEKIT_ROUTER_TOPK_SOFTMAX, MOEKIT_ROUTER_SIGMOID})
    for (bool renormalize : {false, true}) {
      c = Config{};
      c.router = router;
      c.renormalize = renormalize;
      check_forward(handle.handle, c, rng);
    }
  c = Config{};
  c.dtype = MOEKIT_DTYPE_FP16;
  c.top_k = 1;
  check_forward(handle.handle, c, rng);
}

TEST_CASE("moe inference forward writes the same out, scores, indices and counts as the training forward", "[moe]") {
  ReferenceHandle handle;
  for (moekit_dtype_t dtype : {MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP64}) {
    Config c;
    c.dtype = dtype;
    c.activation = MOEKIT_ACT_GEGLU;
    std::mt19937_64 rng_train(203), rng_infer(203);
    Layer train(handle.handle, c, rng_train);
    Layer infer(handle.handle, c, rng_infer, true);
    MOEKIT_REQUIRE_OK(train.forward());
    infer.saved = AlignedBuffer(0);
    MOEKIT_REQUIRE_OK(infer.forward());
    REQUIRE(train.out.bytes_equal(infer.out));
    REQUIRE(train.scores.bytes_equal(infer.scores));
    REQUIRE(train.indices.bytes_equal(infer.indices));
    REQUIRE(train.counts.bytes_equal(infer.counts));
  }
}

TEST_CASE("moe backward matches a per-token loop (bf16 and fp64, biases, dropped pairs)", "[moe]") {
  ReferenceHandle handle;
  std::mt19937_64 rng(204);
  for (moekit_dtype_t dtype : {MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP64})
    for (int32_t activation : {MOEKIT_ACT_SWIGLU, MOEKIT_ACT_SWIGLU_OAI, MOEKIT_ACT_RELU2})
      for (bool drop : {false, true}) {
        Config c;
        c.dtype = dtype;
        c.activation = activation;
        c.glu_layout = activation == MOEKIT_ACT_SWIGLU_OAI ? MOEKIT_GLU_INTERLEAVED : MOEKIT_GLU_CONCAT;
        if (drop) {
          c.router_experts = 7;
          c.experts = 4;
          c.expert_begin = 3;
          c.router = MOEKIT_ROUTER_TOPK_SOFTMAX;  // every logit gets a gradient, dropped or not
        }
        INFO(c.describe());
        Layer layer(handle.handle, c, rng);
        MOEKIT_REQUIRE_OK(layer.forward());
        MOEKIT_REQUIRE_OK(layer.backward(layer.saved.data(), layer.saved.size()));
        Reference ref(handle.handle, layer);
        Reference::Gradients g = ref.backward();
        require_matches(layer.dx.values(), g.dx, dtype, "dx");
        require_matches(layer.dwr.values(), g.dwr, dtype, "dw_router");
        require_matches(layer.dw1.values(), g.dw1, dtype, "dw1");
        require_matches(layer.db1.values(), g.db1, dtype, "db1");
        require_matches(layer.dw2.values(), g.dw2, dtype, "dw2");
        require_matches(layer.db2.values(), g.db2, dtype, "db2");
      }
}

TEST_CASE("moe backward rejects a saved buffer from another plan or another token count", "[moe]") {
  ReferenceHandle handle;
  std::mt19937_64 rng(205);
  Config c;
  Layer first(handle.handle, c, rng);
  Layer second(handle.handle, c, rng);
  MOEKIT_REQUIRE_OK(first.forward());
  MOEKIT_REQUIRE_OK(second.forward());
  REQUIRE(second.backward(first.saved.data(), first.saved.size()) == MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(moekit_test::last_error().rfind("saved", 0) == 0);
  // Nothing was written.
  REQUIRE(std::isnan(second.dx.get(0)));
  REQUIRE(std::isnan(second.dw1.get(0)));

  // The same plan's buffer from a forward on fewer tokens.
  Config shorter = c;
  shorter.tokens = c.tokens - 2;
  Layer other(handle.handle, shorter, rng);
  MOEKIT_REQUIRE_OK(other.forward());
  moekit_plan_t own = second.plan;
  second.plan = other.plan;  // run other's plan with second's (longer) tensors on other's saved buffer
  REQUIRE(second.backward(other.saved.data(), other.saved.size()) == MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(moekit_test::last_error().rfind("saved", 0) == 0);
  second.plan = own;
  MOEKIT_REQUIRE_OK(second.backward(second.saved.data(), second.saved.size()));
}

TEST_CASE("moe backward_overwrites_saved: the same bits, then the saved buffer is spent", "[moe]") {
  ReferenceHandle handle;
  Config c;
  std::mt19937_64 rng_plain(207), rng_spent(207);
  Layer plain(handle.handle, c, rng_plain);
  c.backward_overwrites_saved = true;
  Layer spent(handle.handle, c, rng_spent);
  for (Layer* layer : {&plain, &spent}) {
    MOEKIT_REQUIRE_OK(layer->forward());
    MOEKIT_REQUIRE_OK(layer->backward(layer->saved.data(), layer->saved.size()));
  }
  for (auto [a, b] : {std::pair{&plain.dx, &spent.dx}, {&plain.dwr, &spent.dwr}, {&plain.dw1, &spent.dw1},
                      {&plain.db1, &spent.db1}, {&plain.dw2, &spent.dw2}, {&plain.db2, &spent.db2}})
    REQUIRE(a->values() == b->values());

  // The plain plan's buffer serves any number of backward calls; the other's only one.
  MOEKIT_REQUIRE_OK(plain.backward(plain.saved.data(), plain.saved.size()));
  spent.dx.poison();
  REQUIRE(spent.backward(spent.saved.data(), spent.saved.size()) == MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(moekit_test::last_error().rfind("saved: already spent", 0) == 0);
  REQUIRE(std::isnan(spent.dx.get(0)));
  // A new forward fills it again.
  MOEKIT_REQUIRE_OK(spent.forward());
  MOEKIT_REQUIRE_OK(spent.backward(spent.saved.data(), spent.saved.size()));
  REQUIRE(plain.dx.values() == spent.dx.values());
}

TEST_CASE("moe forward and backward are bitwise identical with 1, 2 and 3 reference threads", "[moe]") {
  Config c;
  c.tokens = 150;
  c.hidden = 200;
  c.inter = 72;
  c.router_experts = 5;
  c.experts = 5;
  c.top_k = 2;
  std::vector<std::vector<uint8_t>> first;
  for (int threads : {1, 2, 3}) {
    moekit_handle_desc_t desc;
    moekit_handle_desc_init(&desc);
    desc.num_threads = threads;
    moekit_handle_t handle = nullptr;
    MOEKIT_REQUIRE_OK(moekit_handle_create(&desc, &handle));
    std::mt19937_64 rng(206);
    {
      Layer layer(handle, c, rng);
      MOEKIT_REQUIRE_OK(layer.forward());
      MOEKIT_REQUIRE_OK(layer.backward(layer.saved.data(), layer.saved.size()));
      std::vector<std::vector<uint8_t>> results;
      for (HostTensor* t : {&layer.out, &layer.dx, &layer.dwr, &layer.dw1, &layer.db1, &layer.dw2, &layer.db2}) {
        const uint8_t* bytes = static_cast<const uint8_t*>(t->data());
        results.emplace_back(bytes, bytes + t->numel() * static_cast<int64_t>(moekit_test::dtype_size(t->dtype())));
      }
      INFO(threads << " threads");
      if (first.empty())
        first = results;
      else
        REQUIRE(results == first);
    }
    moekit_handle_destroy(handle);
  }
  ReferenceHandle restore_default_threads;  // NOTE: the reference thread count is process-wide; leave the default behind
}

TEST_CASE("moe layer with T = 0 tokens: forward runs, weight gradients are exactly 0", "[moe]") {
  ReferenceHandle handle;
  std::mt19937_64 rng(207);
  Config c;
  c.tokens = 0;
  Layer layer(handle.handle, c, rng);
  MOEKIT_REQUIRE_OK(layer.forward());
  MOEKIT_REQUIRE_OK(layer.backward(layer.saved.data(), layer.saved.size()));
  for (HostTensor* g : {&layer.dwr, &layer.dw1, &layer.db1, &layer.dw2, &layer.db2})
    for (int64_t i = 0; i < g->numel(); ++i) REQUIRE(g->get(i) == 0.0);
}
