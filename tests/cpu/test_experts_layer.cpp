// The experts-only layer (moekit_experts_*) through the C ABI on the reference backend: against the MoE layer it is
// a piece of (dispatch -> experts -> combine gives the layer's out, bit for bit), against a per-row loop forward and
// backward, the input- / weight-gradient split and beta, rows past offsets[E] untouched, and a foreign saved buffer.
#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "expert_shape.h"
#include "layer_reference.h"
#include "src/numeric.h"

using layer_test::ExpertRef;
using layer_test::ExpertShape;
using layer_test::GradientRequest;
using layer_test::require_matches;
using moekit_test::HostTensor;
using moekit_test::AlignedBuffer;
using moekit_test::PlanOwner;
using moekit_test::ReferenceHandle;

namespace {

struct Config : ExpertShape {
  std::vector<int64_t> counts{4, 0, 11, 6};  // rows per expert; an empty expert, no tile multiples
  int64_t extra_rows = 3;                     // rows past offsets[E]

  int64_t experts() const { return static_cast<int64_t>(counts.size()); }
  int64_t valid() const {
    int64_t sum = 0;
    for (int64_t c : counts) sum += c;
    return sum;
  }
  int64_t rows() const { return valid() + extra_rows; }
  std::string describe() const {
    std::ostringstream s;
    s << "act " << activation << " glu " << glu_layout << " biases " << biases << " dtype " << dtype;
    return s.str();
  }
};

// An experts plan with its parameters, grouped input rows and gradient tensors.
struct Experts {
  Config c;
  PlanOwner plan;
  AlignedBuffer saved{0};
  HostTensor x, offsets, w1, b1, w2, b2, y, dy, dx, dw1, db1, dw2, db2;

  Experts(moekit_handle_t handle, const Config& config, std::mt19937_64& rng) : c(config) {
    moekit_moe_desc_t d = c.desc(c.rows(), c.experts(), 1);
    MOEKIT_REQUIRE_OK(moekit_experts_plan_create(handle, &d, &plan.plan));
    saved = moekit_test::saved_buffer(plan.plan);
    const int64_t P = c.rows(), H = c.hidden, E = c.experts();
    x = HostTensor(c.dtype, {P, H});
    x.fill_uniform(rng, 1.0);
    for (int64_t i = c.valid() * H; i < P * H; ++i) x.set(i, NAN);  // never read
    offsets = HostTensor(MOEKIT_DTYPE_INT32, {E + 1});
    int64_t at = 0;
    offsets.set(0, 0);
    for (int64_t e = 0; e < E; ++e) offsets.set(e + 1, static_cast<double>(at += c.counts[static_cast<size_t>(e)]));
    c.draw_weights(E, rng, w1, b1, w2, b2);
    y = HostTensor(c.dtype, {P, H});
    dy = HostTensor(c.dtype, {P, H});
    dy.fill_uniform(rng, 1.0);
    for (int64_t i = c.valid() * H; i < P * H; ++i) dy.set(i, NAN);
    dx = HostTensor(c.dtype, {P, H});
    c.expert_tensors(c.dtype, E, dw1, db1, dw2, db2);
  }

  moekit_status_t forward() {
    y.poison();
    moekit_experts_fwd_args_t a;
    moekit_experts_fwd_args_init(&a);
    a.x = x.view();
    a.offsets = offsets.view();
    a.w1 = w1.view();
    a.w2 = w2.view();
    if (c.biases) {
      a.b1 = b1.view();
      a.b2 = b2.view();
    }
    a.y = y.view();
    return moekit_experts_forward(plan.plan, &a, saved.data(), saved.size(), nullptr, 0, nullptr);
  }

  moekit_status_t backward(const GradientRequest& r, void* saved_data, size_t saved_bytes) {
    moekit_experts_bwd_args_t a;
    moekit_experts_bwd_args_init(&a);
    a.x = x.view();
    a.offsets = offsets.view();
    a.w1 = w1.view();
    a.w2 = w2.view();
    a.dy = dy.view();
    a.dx = dx.view();
    a.dw1 = dw1.view();
    a.dw2 = dw2.view();
    if (c.biases) {
      a.db1 = db1.view();
      a.db2 = db2.view();
    }
    r.set(a);
    return moekit_experts_backward(plan.plan, &a, saved_data, saved_bytes, nullptr, 0, nullptr);
  }
  moekit_status_t backward(const GradientRequest& r) { return backward(r, saved.data(), saved.size()); }

  std::vector<HostTensor*> gradients() { return {&dx, &dw1, &db1, &dw2, &db2}; }
};

// Rows [from, rows) of t still hold the poison (NaN).
void require_untouched_from(const HostTensor& t, int64_t from, const char* what) {
  for (int64_t i = from * t.row_width(); i < t.numel(); ++i) {
    INFO(what << " element " << i << " past offsets[E] was written");
    REQUIRE(std::isnan(t.get(i)));
  }
}

void check_against_loop(moekit_handle_t handle, const Config& c, std::mt19937_64& rng) {
  INFO(c.describe());
  Experts ex(handle, c, rng);
  MOEKIT_REQUIRE_OK(ex.forward());
  for (HostTensor* g : ex.gradients()) g->poison();
  MOEKIT_REQUIRE_OK(ex.backward({}));

  const int64_t H = c.hidden, E = c.experts(), W = c.hw(), I = c.inter;
  std::vector<double> x = ex.x.values(), dy = ex.dy.values(), w1 = ex.w1.values(), b1 = ex.b1.values(),
                      w2 = ex.w2.values(), b2 = ex.b2.values();
  ExpertRef mlp{H, I, c.activation, c.glu_layout, 1.0, c.dtype, &w1, c.biases ? &b1 : nullptr, &w2,
                c.biases ? &b2 : nullptr};
  const int64_t valid = c.valid();
  std::vector<double> y_ref(static_cast<size_t>(valid * H)), dx_ref(static_cast<size_t>(valid * H));
  std::vector<double> dw1(static_cast<size_t>(E * W * H), 0.0), db1(static_cast<size_t>(E * W), 0.0);
  std::vector<double> dw2(static_cast<size_t>(E * H * I), 0.0), db2(static_cast<size_t>(E * H), 0.0);
  std::vector<double> h, a, y, dh, a_scaled, dxe;
  int64_t r = 0;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t n = 0; n < c.counts[static_cast<size_t>(e)]; ++n, ++r) {
      const double* xr = x.data() + r * H;
      const double* dr = dy.data() + r * H;
      mlp.forward(e, xr, h, a, y);
      double ds = 0;
      mlp.backward(e, h, dr, 1.0, ds, dh, a_scaled, dxe);
      for (int64_t j = 0; j < H; ++j) {
        y_ref[static_cast<size_t>(r * H + j)] = y[static_cast<size_t>(j)];
        dx_ref[static_cast<size_t>(r * H + j)] = moekit::round_to(dxe[static_cast<size_t>(j)], c.dtype);
        db2[static_cast<size_t>(e * H + j)] += dr[j];
        for (int64_t i = 0; i < I; ++i) dw2[static_cast<size_t>((e * H + j) * I + i)] += dr[j] * a_scaled[static_cast<size_t>(i)];
      }
      for (int64_t k = 0; k < W; ++k) {
        db1[static_cast<size_t>(e * W + k)] += dh[static_cast<size_t>(k)];
        for (int64_t j = 0; j < H; ++j) dw1[static_cast<size_t>((e * W + k) * H + j)] += dh[static_cast<size_t>(k)] * xr[j];
      }
    }
  for (std::vector<double>* v : {&dw1, &db1, &dw2, &db2})
    for (double& value : *v) value = moekit::round_to(value, c.dtype);
  auto first_rows = [&](const HostTensor& t) {
    std::vector<double> v = t.values();
    v.resize(static_cast<size_t>(valid * H));
    return v;
  };
  require_matches(first_rows(ex.y), y_ref, c.dtype, "y");
  require_matches(first_rows(ex.dx), dx_ref, c.dtype, "dx");
  require_matches(ex.dw1.values(), dw1, c.dtype, "dw1");
  require_matches(ex.dw2.values(), dw2, c.dtype, "dw2");
  if (c.biases) {
    require_matches(ex.db1.values(), db1, c.dtype, "db1");
    require_matches(ex.db2.values(), db2, c.dtype, "db2");
  }
  // The empty expert's weight gradients are exactly 0.
  for (int64_t i = W * H; i < 2 * W * H; ++i) REQUIRE(ex.dw1.get(i) == 0.0);
  require_untouched_from(ex.y, valid, "y");
  require_untouched_from(ex.dx, valid, "dx");
}

}  // namespace

TEST_CASE("experts forward and backward match a per-row loop (activations, layouts, biases, bf16 and fp64)",
          "[experts]") {
  ReferenceHandle handle;
  std::mt19937_64 rng(301);
  for (moekit_dtype_t dtype : {MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP64})
    for (int32_t activation : {MOEKIT_ACT_SWIGLU, MOEKIT_ACT_GEGLU, MOEKIT_ACT_SWIGLU_OAI, MOEKIT_ACT_SILU})
      for (bool biases : {true, false}) {
        Config c;
        c.dtype = dtype;
        c.activation = activation;
        c.glu_layout = activation == MOEKIT_ACT_GEGLU ? MOEKIT_GLU_INTERLEAVED : MOEKIT_GLU_CONCAT;
        c.biases = biases;
        check_against_loop(handle.handle, c, rng);
      }
}

TEST_CASE("experts on the MoE layer's dispatched rows, combined with its scores, give the layer's out bit for bit",
          "[experts]") {
  ReferenceHandle handle;
  std::mt19937_64 rng(302);
  const int64_t T = 17, H = 16, I = 8, E = 5, K = 2;
  Config c;
  c.hidden = H;
  c.inter = I;
  c.counts.assign(static_cast<size_t>(E), 0);
  c.extra_rows = T * K;  // the experts plan gets all P = T*K rows; the valid ones come from dispatch
  for (moekit_dtype_t dtype : {MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP64}) {
    c.dtype = dtype;
    moekit_dtype_t score_dtype = dtype == MOEKIT_DTYPE_FP64 ? MOEKIT_DTYPE_FP64 : MOEKIT_DTYPE_FP32;
    // The layer.
    moekit_moe_desc_t md = c.desc(T, c.experts(), K);
    PlanOwner layer;
    MOEKIT_REQUIRE_OK(moekit_moe_plan_create(handle.handle, &md, &layer.plan));
    AlignedBuffer saved = moekit_test::saved_buffer(layer.plan);
    Experts ex(handle.handle, c, rng);  // its weights serve the layer too
    HostTensor x(dtype, {T, H}), wr(dtype, {E, H}), out(dtype, {T, H}), scores(score_dtype, {T, K});
    HostTensor indices(MOEKIT_DTYPE_INT32, {T, K});
    x.fill_uniform(rng, 1.0);
    wr.fill_uniform(rng, 1.0);
    out.poison();
    moekit_moe_fwd_args_t fa;
    moekit_moe_fwd_args_init(&fa);
    fa.x = x.view();
    fa.w_router = wr.view();
    fa.w1 = ex.w1.view();
    fa.b1 = ex.b1.view();
    fa.w2 = ex.w2.view();
    fa.b2 = ex.b2.view();
    fa.out = out.view();
    fa.scores = scores.view();
    fa.indices = indices.view();
    MOEKIT_REQUIRE_OK(moekit_moe_forward(layer.plan, &fa, saved.data(), saved.size(), nullptr, 0, nullptr));

    // Dispatch of the layer's indices, the gathered rows, the experts, the combine.
    moekit_dispatch_desc_t dd;
    moekit_dispatch_desc_init(&dd);
    dd.max_tokens = T;
    dd.top_k = K;
    dd.experts = E;
    PlanOwner dispatch;
    MOEKIT_REQUIRE_OK(moekit_dispatch_plan_create(handle.handle, &dd, &dispatch.plan));
    HostTensor gather(MOEKIT_DTYPE_INT32, {T * K}), pair(MOEKIT_DTYPE_INT32, {T * K}),
        grouped_pos(MOEKIT_DTYPE_INT32, {T * K});
    moekit_dispatch_args_t da;
    moekit_dispatch_args_init(&da);
    da.indices = indices.view();
    da.expert_offsets = ex.offsets.view();
    da.gather_idx = gather.view();
    da.pair_idx = pair.view();
    da.grouped_pos = grouped_pos.view();
    MOEKIT_REQUIRE_OK(moekit_dispatch(dispatch.plan, &da, nullptr, 0, nullptr));
    const int64_t valid = static_cast<int64_t>(ex.offsets.get(E));
    REQUIRE(valid == T * K);
    for (int64_t r = 0; r < valid; ++r)
      for (int64_t j = 0; j < H; ++j) ex.x.set(r * H + j, x.get(static_cast<int64_t>(gather.get(r)) * H + j));
    MOEKIT_REQUIRE_OK(ex.forward());

    moekit_combine_desc_t cd;
    moekit_combine_desc_init(&cd);
    cd.max_tokens = T;
    cd.top_k = K;
    cd.hidden = H;
    cd.dtype = dtype;
    PlanOwner combine;
    MOEKIT_REQUIRE_OK(moekit_combine_plan_create(handle.handle, &cd, &combine.plan));
    HostTensor combined(dtype, {T, H});
    combined.poison();
    moekit_combine_args_t ca;
    moekit_combine_args_init(&ca);
    ca.grouped = ex.y.view();
    ca.scores = scores.view();
    ca.grouped_pos = grouped_pos.view();
    ca.out = combined.view();
    MOEKIT_REQUIRE_OK(moekit_combine(combine.plan, &ca, nullptr, 0, nullptr));
    REQUIRE(combined.bytes_equal(out));
  }
}

TEST_CASE("experts backward: input-only and weight-only calls match the combined call, and beta 1 adds to the old value",
          "[experts]") {
  ReferenceHandle handle;
  std::mt19937_64 rng(303);
  Config c;
  c.dtype = MOEKIT_DTYPE_FP64;  // old + new is then one exact float64 addition the test can redo
  Experts ex(handle.handle, c, rng);
  MOEKIT_REQUIRE_OK(ex.forward());
  for (HostTensor* g : ex.gradients()) g->poison();
  MOEKIT_REQUIRE_OK(ex.backward({}));
  std::vector<std::vector<double>> combined;
  for (HostTensor* g : ex.gradients()) combined.push_back(g->values());

  for (HostTensor* g : ex.gradients()) g->poison();
  MOEKIT_REQUIRE_OK(ex.backward({false, true, 0}));
  REQUIRE(std::isnan(ex.dx.get(0)));  // not requested, not written
  MOEKIT_REQUIRE_OK(ex.backward({true, false, 0}));
  for (size_t i = 0; i < combined.size(); ++i) {
    std::vector<double> got = ex.gradients()[i]->values();
    for (size_t j = 0; j < got.size(); ++j) {
      if (std::isnan(combined[i][j])) continue;  // dx rows past offsets[E]
      REQUIRE(got[j] == combined[i][j]);
    }
  }

  std::vector<std::vector<double>> old;
  for (HostTensor* g : ex.gradients()) {
    g->fill_uniform(rng, 1.0);
    old.push_back(g->values());
  }
  MOEKIT_REQUIRE_OK(ex.backward({true, true, 1.0}));
  const int64_t valid_elements = c.valid() * c.hidden;
  for (size_t i = 0; i < combined.size(); ++i) {
    std::vector<double> got = ex.gradients()[i]->values();
    for (size_t j = 0; j < got.size(); ++j) {
      bool past_rows = i == 0 && static_cast<int64_t>(j) >= valid_elements;  // dx rows past offsets[E]
      REQUIRE(got[j] == (past_rows ? old[i][j] : old[i][j] + combined[i][j]));
    }
  }
}

TEST_CASE("experts backward rejects a saved buffer from another plan", "[experts]") {
  ReferenceHandle handle;
  std::mt19937_64 rng(304);
  Config c;
  Experts first(handle.handle, c, rng), second(handle.handle, c, rng);
  MOEKIT_REQUIRE_OK(first.forward());
  MOEKIT_REQUIRE_OK(second.forward());
  for (HostTensor* g : second.gradients()) g->poison();
  REQUIRE(second.backward({}, first.saved.data(), first.saved.size()) == MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(moekit_test::last_error().rfind("saved", 0) == 0);
  REQUIRE(std::isnan(second.dw1.get(0)));
  REQUIRE(std::isnan(second.dx.get(0)));
}
