// The expert-parallel layer (moekit_ep.h) over R = 1, 2, 4 in-process ranks on the reference backend, against the
// single-rank MoE layer (moekit_moe_*) on the same global batch: the ranks' tokens are consecutive blocks of it and
// rank r holds experts [r*E, (r+1)*E). Outputs and every gradient are compared with docs/math.md section 9's three
// metrics; where the summation order is the single-rank layer's (out, dx, the expert weight gradients: one token
// order, the same building blocks) the fp32 results must be bitwise equal, and dw_router, which the ranks sum
// themselves, within the dtype's bounds. The capacity mode's drops are checked against moekit_token_experts on the
// kept pairs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "moekit/moekit_ep.h"

using moekit_test::AlignedBuffer;
using moekit_test::HostTensor;
using moekit_test::ReferenceHandle;

namespace {

struct Problem {
  int ranks = 2;
  std::vector<int64_t> tokens{7, 5};  // per rank
  int64_t experts = 3;                // per rank
  int64_t hidden = 16, inter = 8, top_k = 2;
  int32_t activation = MOEKIT_ACT_SWIGLU;
  int32_t router = MOEKIT_ROUTER_SOFTMAX_TOPK;
  bool biases = false;
  moekit_dtype_t dtype = MOEKIT_DTYPE_FP32;
  int32_t mode = MOEKIT_EP_EXACT;
  int64_t capacity = 0;
  // One expert takes every token: x[:, 0] = 1 and that expert's router row dominates (with top_k 1, every other
  // expert is empty and every other rank receives nothing).
  int64_t hot_expert = -1;

  int64_t global_tokens() const { return std::accumulate(tokens.begin(), tokens.end(), int64_t{0}); }
  int64_t all_experts() const { return ranks * experts; }
  int64_t width() const { return activation < MOEKIT_ACT_GELU ? 2 * inter : inter; }
  moekit_dtype_t score_dtype() const { return dtype == MOEKIT_DTYPE_FP64 ? MOEKIT_DTYPE_FP64 : MOEKIT_DTYPE_FP32; }
  std::string describe() const {
    std::ostringstream s;
    s << "R " << ranks << " T";
    for (int64_t t : tokens) s << " " << t;
    s << " E " << experts << " K " << top_k << " act " << activation << " router " << router << " biases " << biases
      << " dtype " << dtype << " mode " << mode << " capacity " << capacity << " hot " << hot_expert;
    return s.str();
  }
};

// The global batch and weights, and the single-rank layer's results on it.
struct Global {
  HostTensor x, wr, rbias, w1, b1, w2, b2, dout;
  HostTensor out, scores, indices, dx, dwr, dw1, db1, dw2, db2;
};

moekit_moe_desc_t layer_desc(const Problem& p, int64_t max_tokens, int64_t experts) {
  moekit_moe_desc_t d;
  moekit_moe_desc_init(&d);
  d.max_tokens = max_tokens;
  d.hidden = p.hidden;
  d.intermediate = p.inter;
  d.router_experts = p.all_experts();
  d.experts = experts;
  d.top_k = p.top_k;
  d.activation = p.activation;
  d.router = p.router;
  d.has_b1 = p.biases;
  d.has_b2 = p.biases;
  d.dtype = p.dtype;
  return d;
}

// dx [T, H], dw_router [RE, H] and the weight gradients of `experts` experts, into `grads` (Global or RankRun).
template <class Grads>
void make_gradients(Grads& grads, const Problem& p, int64_t T, int64_t experts) {
  int64_t H = p.hidden, W = p.width(), I = p.inter;
  grads.dx = HostTensor(p.dtype, {T, H});
  grads.dwr = HostTensor(p.dtype, {p.all_experts(), H});
  grads.dw1 = HostTensor(p.dtype, {experts, W, H});
  grads.db1 = HostTensor(p.dtype, {experts, W});
  grads.dw2 = HostTensor(p.dtype, {experts, H, I});
  grads.db2 = HostTensor(p.dtype, {experts, H});
}

// The backward's arguments, named alike in moekit_moe_bwd_args_t and moekit_ep_bwd_args_t: the forward's inputs
// from its arguments `f`, then dout and the gradients of `grads`.
template <class Bwd, class Fwd, class Grads>
void bind_backward(Bwd& b, const Fwd& f, HostTensor& dout, Grads& grads, bool biases) {
  b.x = f.x;
  b.dout = dout.view();
  b.w_router = f.w_router;
  b.w1 = f.w1;
  b.w2 = f.w2;
  b.b2 = f.b2;
  b.dx = grads.dx.view();
  b.dw_router = grads.dwr.view();
  b.dw1 = grads.dw1.view();
  b.dw2 = grads.dw2.view();
  if (biases) {
    b.db1 = grads.db1.view();
    b.db2 = grads.db2.view();
  }
}

Global make_global(const Problem& p, std::mt19937_64& rng) {
  int64_t T = p.global_tokens(), RE = p.all_experts(), H = p.hidden, W = p.width(), I = p.inter, K = p.top_k;
  Global g;
  g.x = HostTensor(p.dtype, {T, H});
  g.wr = HostTensor(p.dtype, {RE, H});
  g.rbias = HostTensor(MOEKIT_DTYPE_FP32, {RE});
  g.w1 = HostTensor(p.dtype, {RE, W, H});
  g.b1 = HostTensor(p.dtype, {RE, W});
  g.w2 = HostTensor(p.dtype, {RE, H, I});
  g.b2 = HostTensor(p.dtype, {RE, H});
  g.dout = HostTensor(p.dtype, {T, H});
  g.x.fill_uniform(rng, 1.0);
  g.wr.fill_uniform(rng, 1.0 / std::sqrt(double(H)));
  g.rbias.fill_uniform(rng, 0.1);
  g.w1.fill_uniform(rng, 1.0 / std::sqrt(double(H)));
  g.b1.fill_uniform(rng, 0.1);
  g.w2.fill_uniform(rng, 1.0 / std::sqrt(double(I)));
  g.b2.fill_uniform(rng, 0.1);
  g.dout.fill_uniform(rng, 1.0);
  if (p.hot_expert >= 0) {
    for (int64_t t = 0; t < T; ++t) g.x.set(t * H, 1.0);
    for (int64_t e = 0; e < RE; ++e) g.wr.set(e * H, e == p.hot_expert ? 8.0 : 0.0);
  }

  ReferenceHandle handle(1);
  moekit_moe_desc_t d = layer_desc(p, std::max<int64_t>(T, 1), RE);
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_moe_plan_create(handle.handle, &d, &plan));
  AlignedBuffer ws = moekit_test::workspace_buffer(plan), saved = moekit_test::saved_buffer(plan);
  g.out = HostTensor(p.dtype, {T, H});
  g.scores = HostTensor(p.score_dtype(), {T, K});
  g.indices = HostTensor(MOEKIT_DTYPE_INT32, {T, K});
  moekit_moe_fwd_args_t f;
  moekit_moe_fwd_args_init(&f);
  f.x = g.x.view();
  f.w_router = g.wr.view();
  if (p.router == MOEKIT_ROUTER_SIGMOID) f.router_bias = g.rbias.view();
  f.w1 = g.w1.view();
  f.w2 = g.w2.view();
  if (p.biases) {
    f.b1 = g.b1.view();
    f.b2 = g.b2.view();
  }
  f.out = g.out.view();
  f.scores = g.scores.view();
  f.indices = g.indices.view();
  MOEKIT_REQUIRE_OK(moekit_moe_forward(plan, &f, saved.data(), saved.size(), ws.data(), ws.size(), nullptr));
  make_gradients(g, p, T, RE);
  moekit_moe_bwd_args_t b;
  moekit_moe_bwd_args_init(&b);
  bind_backward(b, f, g.dout, g, p.biases);
  MOEKIT_REQUIRE_OK(moekit_moe_backward(plan, &b, saved.data(), saved.size(), ws.data(), ws.size(), nullptr));
  moekit_plan_destroy(plan);
  return g;
}

// Rows [begin, begin + rows) of a tensor whose rows are `width` wide.
HostTensor rows_of(const HostTensor& t, int64_t begin, int64_t rows) {
  std::vector<int64_t> shape = t.shape();
  shape[0] = rows;
  HostTensor s(t.dtype(), shape);
  int64_t w = t.row_width();
  for (int64_t i = 0; i < rows * w; ++i) s.set(i, t.get(begin * w + i));
  return s;
}

void put_rows(HostTensor& dst, const HostTensor& src, int64_t begin) {
  int64_t w = src.row_width();
  for (int64_t i = 0; i < src.numel(); ++i) dst.set(begin * w + i, src.get(i));
}

// What every rank returns, put back into global tensors (dw_router summed over the ranks in float64).
struct EpResult {
  HostTensor out, scores, indices, dx, dw1, db1, dw2, db2;
  std::vector<double> dwr;
  std::vector<int64_t> dropped;
  std::vector<int> failures;
};

struct RankRun {
  HostTensor out, scores, indices, dropped, dx, dwr, dw1, db1, dw2, db2;
  std::string error;
};

void run_rank(const Problem& p, const Global& g, moekit_ep_local_group_t group, int rank, moekit_handle_t handle,
              RankRun& r) {
  auto fail = [&](const char* what) { r.error = std::string(what) + ": " + [] {
    char buf[1024];
    moekit_ep_get_last_error(buf, sizeof buf);
    return std::string(buf);
  }(); };
  int64_t begin = std::accumulate(p.tokens.begin(), p.tokens.begin() + rank, int64_t{0});
  int64_t T = p.tokens[static_cast<size_t>(rank)], E = p.experts, K = p.top_k, H = p.hidden;
  int64_t max_tokens = std::max<int64_t>(1, *std::max_element(p.tokens.begin(), p.tokens.end()));
  moekit_ep_comm_t comm = nullptr;
  if (moekit_ep_comm_create_local(group, rank, &comm) != MOEKIT_SUCCESS) return fail("comm");
  moekit_ep_desc_t d;
  moekit_ep_desc_init(&d);
  d.layer = layer_desc(p, max_tokens, E);
  d.mode = p.mode;
  d.capacity = p.capacity;
  moekit_ep_plan_t plan = nullptr;
  if (moekit_ep_plan_create(handle, comm, &d, &plan) != MOEKIT_SUCCESS) {
    moekit_ep_comm_destroy(comm);
    return fail("plan");
  }
  size_t ws_bytes = 0, saved_bytes = 0;
  moekit_ep_plan_sizes(plan, &ws_bytes, &saved_bytes);
  AlignedBuffer ws(ws_bytes), saved(saved_bytes);

  HostTensor x = rows_of(g.x, begin, T), dout = rows_of(g.dout, begin, T);
  HostTensor w1 = rows_of(g.w1, rank * E, E), b1 = rows_of(g.b1, rank * E, E), w2 = rows_of(g.w2, rank * E, E),
             b2 = rows_of(g.b2, rank * E, E);
  r.out = HostTensor(p.dtype, {T, H});
  r.scores = HostTensor(p.score_dtype(), {T, K});
  r.indices = HostTensor(MOEKIT_DTYPE_INT32, {T, K});
  r.dropped = HostTensor(MOEKIT_DTYPE_INT32, {1});
  r.out.poison();
  moekit_ep_fwd_args_t f;
  moekit_ep_fwd_args_init(&f);
  f.x = x.view();
  f.w_router = const_cast<HostTensor&>(g.wr).view();
  if (p.router == MOEKIT_ROUTER_SIGMOID) f.router_bias = const_cast<HostTensor&>(g.rbias).view();
  f.w1 = w1.view();
  f.w2 = w2.view();
  if (p.biases) {
    f.b1 = b1.view();
    f.b2 = b2.view();
  }
  f.out = r.out.view();
  f.scores = r.scores.view();
  f.indices = r.indices.view();
  f.dropped = r.dropped.view();
  if (moekit_ep_forward(plan, &f, saved.data(), saved.size(), ws.data(), ws.size(), nullptr) != MOEKIT_SUCCESS) {
    fail("forward");
  } else {
    make_gradients(r, p, T, E);
    for (HostTensor* t : {&r.dx, &r.dwr, &r.dw1, &r.db1, &r.dw2, &r.db2}) t->poison();
    moekit_ep_bwd_args_t b;
    moekit_ep_bwd_args_init(&b);
    bind_backward(b, f, dout, r, p.biases);
    if (moekit_ep_backward(plan, &b, saved.data(), saved.size(), ws.data(), ws.size(), nullptr) != MOEKIT_SUCCESS)
      fail("backward");
  }
  moekit_ep_plan_destroy(plan);
  moekit_ep_comm_destroy(comm);
}

EpResult run_ep(const Problem& p, const Global& g) {
  moekit_ep_local_group_t group = nullptr;
  REQUIRE(moekit_ep_local_group_create(p.ranks, &group) == MOEKIT_SUCCESS);
  std::vector<RankRun> runs(static_cast<size_t>(p.ranks));
  // NOTE: the handles are made here: ReferenceHandle asserts through Catch2, which is not thread-safe.
  std::vector<std::unique_ptr<ReferenceHandle>> handles;
  for (int r = 0; r < p.ranks; ++r) handles.push_back(std::make_unique<ReferenceHandle>(1));
  std::vector<std::thread> threads;
  for (int r = 0; r < p.ranks; ++r)
    threads.emplace_back([&, r] { run_rank(p, g, group, r, handles[size_t(r)]->handle, runs[size_t(r)]); });
  for (std::thread& t : threads) t.join();
  moekit_ep_local_group_destroy(group);
  for (const RankRun& r : runs) {
    INFO(r.error);
    REQUIRE(r.error.empty());
  }

  int64_t T = p.global_tokens(), RE = p.all_experts(), H = p.hidden, W = p.width(), I = p.inter, K = p.top_k;
  EpResult e;
  e.out = HostTensor(p.dtype, {T, H});
  e.scores = HostTensor(p.score_dtype(), {T, K});
  e.indices = HostTensor(MOEKIT_DTYPE_INT32, {T, K});
  e.dx = HostTensor(p.dtype, {T, H});
  e.dw1 = HostTensor(p.dtype, {RE, W, H});
  e.db1 = HostTensor(p.dtype, {RE, W});
  e.dw2 = HostTensor(p.dtype, {RE, H, I});
  e.db2 = HostTensor(p.dtype, {RE, H});
  e.dwr.assign(static_cast<size_t>(RE * H), 0.0);
  int64_t begin = 0;
  for (int r = 0; r < p.ranks; ++r) {
    RankRun& run = runs[static_cast<size_t>(r)];
    put_rows(e.out, run.out, begin);
    put_rows(e.scores, run.scores, begin);
    put_rows(e.indices, run.indices, begin);
    put_rows(e.dx, run.dx, begin);
    put_rows(e.dw1, run.dw1, r * p.experts);
    put_rows(e.dw2, run.dw2, r * p.experts);
    if (p.biases) {
      put_rows(e.db1, run.db1, r * p.experts);
      put_rows(e.db2, run.db2, r * p.experts);
    }
    std::vector<double> dwr = run.dwr.values();
    for (size_t i = 0; i < dwr.size(); ++i) e.dwr[i] += dwr[i];
    e.dropped.push_back(static_cast<int64_t>(run.dropped.get(0)));
    begin += p.tokens[static_cast<size_t>(r)];
  }
  return e;
}

void require_close(const char* name, const std::vector<double>& got, const std::vector<double>& want, int64_t width,
                   moekit_dtype_t dtype) {
  moekit_test::ErrorMetrics m = moekit_test::compare(got, want, width);
  INFO(name << ": " << moekit_test::describe(m));
  REQUIRE_FALSE(m.any_nan);
  REQUIRE(moekit_test::within(m, moekit_test::bounds_for(dtype)));
}

void require_same(const char* name, const HostTensor& got, const HostTensor& want, bool bitwise) {
  if (bitwise) {
    INFO(name << " must be bitwise equal to the single-rank layer's: " <<
         moekit_test::describe(moekit_test::compare(got.values(), want.values(), got.row_width())));
    REQUIRE(got.bytes_equal(want));
  } else {
    require_close(name, got.values(), want.values(), got.row_width(), got.dtype());
  }
}

// Exact mode: everything against the single-rank layer.
void check_exact(const Problem& p, uint64_t seed) {
  INFO(p.describe());
  std::mt19937_64 rng(seed);
  Global g = make_global(p, rng);
  EpResult e = run_ep(p, g);
  bool bitwise = p.dtype == MOEKIT_DTYPE_FP32 && !p.biases;
  REQUIRE(e.indices.bytes_equal(g.indices));
  REQUIRE(e.scores.bytes_equal(g.scores));
  require_same("out", e.out, g.out, bitwise);
  require_same("dx", e.dx, g.dx, bitwise);
  require_same("dw1", e.dw1, g.dw1, bitwise);
  require_same("dw2", e.dw2, g.dw2, bitwise);
  if (p.biases) {
    require_same("db1", e.db1, g.db1, false);
    require_same("db2", e.db2, g.db2, false);
  }
  require_close("dw_router (summed over the ranks)", e.dwr, g.dwr.values(), p.hidden, p.dtype);
  for (int64_t d : e.dropped) REQUIRE(d == 0);
}

}  // namespace

TEST_CASE("ep layer over 1, 2 and 4 in-process ranks matches the single-rank MoE layer (fp32 bitwise)", "[ep]") {
  for (int ranks : {1, 2, 4}) {
    Problem p;
    p.ranks = ranks;
    p.tokens.clear();
    for (int r = 0; r < ranks; ++r) p.tokens.push_back(5 + 3 * r);
    check_exact(p, 11 + static_cast<uint64_t>(ranks));
  }
}

TEST_CASE("ep layer: biases, sigmoid router, GEGLU, non-gated, fp64 and bf16 within SPEC bounds", "[ep]") {
  Problem a;
  a.ranks = 2;
  a.biases = true;
  a.router = MOEKIT_ROUTER_SIGMOID;
  a.dtype = MOEKIT_DTYPE_FP64;
  check_exact(a, 21);
  Problem b;
  b.ranks = 4;
  b.tokens = {6, 9, 4, 8};
  b.experts = 2;
  b.top_k = 3;
  b.activation = MOEKIT_ACT_GEGLU;
  b.router = MOEKIT_ROUTER_TOPK_SOFTMAX;
  b.dtype = MOEKIT_DTYPE_BF16;
  b.biases = true;
  check_exact(b, 22);
  Problem c;
  c.ranks = 2;
  c.activation = MOEKIT_ACT_RELU2;
  check_exact(c, 23);
}

TEST_CASE("ep layer: one expert takes every token, empty experts, ranks receiving nothing, T = 1 on a rank", "[ep]") {
  Problem p;
  p.ranks = 4;
  p.tokens = {1, 6, 3, 5};
  p.experts = 2;
  p.top_k = 1;
  p.hot_expert = 5;  // on rank 2: ranks 0, 1 and 3 receive nothing
  check_exact(p, 31);
  p.top_k = 2;
  p.hot_expert = 0;  // every token's first choice on rank 0; the second spread
  p.tokens = {4, 1, 1, 7};
  check_exact(p, 32);
}

namespace {

// The capacity mode: which pairs the rule drops, from the returned indices; out and the expert weight gradients
// against moekit_token_experts on the kept pairs only.
void check_capacity(const Problem& p, uint64_t seed) {
  INFO(p.describe());
  std::mt19937_64 rng(seed);
  Global g = make_global(p, rng);
  EpResult e = run_ep(p, g);
  REQUIRE(e.indices.bytes_equal(g.indices));
  int64_t T = p.global_tokens(), K = p.top_k, RE = p.all_experts(), H = p.hidden;

  // Per source rank, the rows bound for one rank in (expert, token) order; those past the capacity are dropped.
  std::vector<int64_t> idx = moekit_test::as_integers(e.indices);
  std::vector<int32_t> kept(static_cast<size_t>(T * K), 1);
  int64_t begin = 0, total_dropped = 0;
  for (int r = 0; r < p.ranks; ++r) {
    int64_t rows_dropped = 0;
    for (int d = 0; d < p.ranks; ++d) {
      int64_t n = 0;
      for (int64_t ex = d * p.experts; ex < (d + 1) * p.experts; ++ex)
        for (int64_t t = begin; t < begin + p.tokens[size_t(r)]; ++t)
          for (int64_t k = 0; k < K; ++k)
            if (idx[size_t(t * K + k)] == ex && n++ >= p.capacity) {
              kept[size_t(t * K + k)] = 0;
              ++rows_dropped;
            }
    }
    REQUIRE(e.dropped[size_t(r)] == rows_dropped);
    total_dropped += rows_dropped;
    begin += p.tokens[size_t(r)];
  }
  REQUIRE(total_dropped > 0);  // the case must exercise the drops

  ReferenceHandle handle(1);
  moekit_moe_desc_t d = layer_desc(p, T, RE);
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_token_experts_plan_create(handle.handle, &d, &plan));
  AlignedBuffer ws = moekit_test::workspace_buffer(plan), saved = moekit_test::saved_buffer(plan);
  HostTensor topk(MOEKIT_DTYPE_INT32, {T, K});
  for (int64_t i = 0; i < T * K; ++i) topk.set(i, kept[size_t(i)] ? double(idx[size_t(i)]) : -1.0);
  HostTensor out(p.dtype, {T, H});
  moekit_token_experts_fwd_args_t f;
  moekit_token_experts_fwd_args_init(&f);
  f.x = g.x.view();
  f.topk_idx = topk.view();
  f.topk_weights = e.scores.view();
  f.w1 = g.w1.view();
  f.w2 = g.w2.view();
  f.out = out.view();
  MOEKIT_REQUIRE_OK(moekit_token_experts_forward(plan, &f, saved.data(), saved.size(), ws.data(), ws.size(), nullptr));
  require_same("out (kept pairs)", e.out, out, false);
  for (int64_t t = 0; t < T; ++t) {
    bool any = false;
    for (int64_t k = 0; k < K; ++k) any = any || kept[size_t(t * K + k)];
    if (!any)
      for (int64_t h = 0; h < H; ++h) REQUIRE(e.out.get(t * H + h) == 0.0);
  }
  HostTensor dx(p.dtype, {T, H}), dw1(p.dtype, {RE, p.width(), H}), dw2(p.dtype, {RE, H, p.inter});
  moekit_token_experts_bwd_args_t b;
  moekit_token_experts_bwd_args_init(&b);
  b.x = f.x;
  b.topk_idx = f.topk_idx;
  b.topk_weights = f.topk_weights;
  b.w1 = f.w1;
  b.w2 = f.w2;
  b.dout = g.dout.view();
  b.dx = dx.view();
  b.dw1 = dw1.view();
  b.dw2 = dw2.view();
  MOEKIT_REQUIRE_OK(moekit_token_experts_backward(plan, &b, saved.data(), saved.size(), ws.data(), ws.size(),
                                                  nullptr));
  require_same("dw1 (kept pairs)", e.dw1, dw1, false);
  require_same("dw2 (kept pairs)", e.dw2, dw2, false);
  moekit_plan_destroy(plan);
}

}  // namespace

TEST_CASE("ep capacity mode: pairs over capacity are dropped, counted, and add nothing", "[ep]") {
  Problem p;
  p.ranks = 2;
  p.tokens = {9, 6};
  p.mode = MOEKIT_EP_CAPACITY;
  p.capacity = 4;
  check_capacity(p, 41);
  p.ranks = 4;
  p.tokens = {8, 1, 5, 7};
  p.experts = 2;
  p.top_k = 1;
  p.hot_expert = 3;  // every token to rank 1: the drops leave whole tokens with zero rows
  p.capacity = 2;
  check_capacity(p, 42);
}

TEST_CASE("ep capacity mode with room for every pair equals the exact mode", "[ep]") {
  Problem p;
  p.ranks = 2;
  p.mode = MOEKIT_EP_CAPACITY;
  p.capacity = 7 * 2;  // T * K of the larger rank
  check_exact(p, 51);
}

TEST_CASE("ep layer: bad arguments give their status and a message naming the argument", "[ep]") {
  auto message = [] {
    char buf[512];
    moekit_ep_get_last_error(buf, sizeof buf);
    return std::string(buf);
  };
  ReferenceHandle handle(1);
  moekit_ep_local_group_t group = nullptr;
  REQUIRE(moekit_ep_local_group_create(0, &group) == MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(message().find("ranks") != std::string::npos);
  REQUIRE(moekit_ep_local_group_create(1, &group) == MOEKIT_SUCCESS);
  moekit_ep_comm_t comm = nullptr;
  REQUIRE(moekit_ep_comm_create_local(group, 1, &comm) == MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(message().find("rank") != std::string::npos);
  REQUIRE(moekit_ep_comm_create_local(group, 0, &comm) == MOEKIT_SUCCESS);
  int dummy = 0;
  if (!moekit_ep_has_nccl()) {
    moekit_ep_comm_t nccl = nullptr;
    REQUIRE(moekit_ep_comm_create_nccl(&dummy, &nccl) == MOEKIT_STATUS_NOT_SUPPORTED);
    REQUIRE(message().find("NCCL") != std::string::npos);
  }

  Problem p;
  p.ranks = 1;
  p.tokens = {4};
  moekit_ep_desc_t d;
  moekit_ep_desc_init(&d);
  d.layer = layer_desc(p, 4, p.experts);
  moekit_ep_plan_t plan = nullptr;
  d.layer.router_experts = 5;
  REQUIRE(moekit_ep_plan_create(handle.handle, comm, &d, &plan) == MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(message().find("desc.layer.router_experts") != std::string::npos);
  d.layer.router_experts = p.all_experts();
  d.mode = MOEKIT_EP_CAPACITY;
  REQUIRE(moekit_ep_plan_create(handle.handle, comm, &d, &plan) == MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(message().find("desc.capacity") != std::string::npos);
  d.mode = 7;
  REQUIRE(moekit_ep_plan_create(handle.handle, comm, &d, &plan) == MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(message().find("desc.mode") != std::string::npos);
  d.mode = MOEKIT_EP_EXACT;
  d.struct_size = 3;
  REQUIRE(moekit_ep_plan_create(handle.handle, comm, &d, &plan) == MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(message().find("desc") != std::string::npos);
  d.struct_size = sizeof d;
  d.layer.intermediate = 0;  // an inner plan's own check, named through the inner operation
  REQUIRE(moekit_ep_plan_create(handle.handle, comm, &d, &plan) == MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(message().find("intermediate") != std::string::npos);
  d.layer.intermediate = p.inter;
  REQUIRE(moekit_ep_plan_create(handle.handle, comm, &d, &plan) == MOEKIT_SUCCESS);

  size_t ws_bytes = 0, saved_bytes = 0;
  REQUIRE(moekit_ep_plan_sizes(plan, &ws_bytes, &saved_bytes) == MOEKIT_SUCCESS);
  REQUIRE(ws_bytes > 0);
  REQUIRE(saved_bytes > 0);
  AlignedBuffer ws(ws_bytes), saved(saved_bytes);
  std::mt19937_64 rng(61);
  Global g = make_global(p, rng);
  HostTensor out(p.dtype, {4, p.hidden}), wrong(p.dtype, {4, p.hidden + 1});
  moekit_ep_fwd_args_t f;
  moekit_ep_fwd_args_init(&f);
  f.x = g.x.view();
  f.w_router = g.wr.view();
  f.w1 = g.w1.view();
  f.w2 = g.w2.view();
  f.out = out.view();
  out.poison();
  HostTensor before = out;
  f.x = wrong.view();
  REQUIRE(moekit_ep_forward(plan, &f, saved.data(), saved.size(), ws.data(), ws.size(), nullptr) ==
          MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(message().find("x:") != std::string::npos);
  f.x = g.x.view();
  f.w1 = g.w2.view();
  REQUIRE(moekit_ep_forward(plan, &f, saved.data(), saved.size(), ws.data(), ws.size(), nullptr) ==
          MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(message().find("w1:") != std::string::npos);
  f.w1 = g.w1.view();
  REQUIRE(moekit_ep_forward(plan, &f, saved.data(), saved.size(), ws.data(), ws.size() - 1, nullptr) ==
          MOEKIT_STATUS_INSUFFICIENT_WORKSPACE);
  REQUIRE(message().find("workspace") != std::string::npos);
  REQUIRE(moekit_ep_forward(plan, &f, saved.data(), saved.size() - 1, ws.data(), ws.size(), nullptr) ==
          MOEKIT_STATUS_INSUFFICIENT_WORKSPACE);
  REQUIRE(message().find("saved") != std::string::npos);
  REQUIRE(out.bytes_equal(before));  // nothing written by a failed call
  REQUIRE(moekit_ep_forward(nullptr, &f, saved.data(), saved.size(), ws.data(), ws.size(), nullptr) ==
          MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(message().find("plan") != std::string::npos);
  REQUIRE(moekit_ep_forward(plan, &f, saved.data(), saved.size(), ws.data(), ws.size(), nullptr) == MOEKIT_SUCCESS);

  moekit_ep_bwd_args_t b;
  moekit_ep_bwd_args_init(&b);
  b.x = f.x;
  b.dout = g.dout.view();
  b.w_router = f.w_router;
  b.w1 = f.w1;
  b.w2 = f.w2;
  REQUIRE(moekit_ep_backward(plan, &b, saved.data(), saved.size(), ws.data(), ws.size(), nullptr) ==
          MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(message().find("dx:") != std::string::npos);

  // The saved buffer must be what this plan's forward filled, on as many tokens.
  HostTensor dx(p.dtype, {4, p.hidden});
  b.dx = dx.view();
  b.compute_weight_grad = 0;
  moekit_ep_plan_t other = nullptr;
  REQUIRE(moekit_ep_plan_create(handle.handle, comm, &d, &other) == MOEKIT_SUCCESS);
  AlignedBuffer other_saved(saved_bytes);
  dx.poison();
  const HostTensor dx_before = dx;
  REQUIRE(moekit_ep_backward(plan, &b, other_saved.data(), other_saved.size(), ws.data(), ws.size(), nullptr) ==
          MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(message().find("saved: not filled by a forward") != std::string::npos);
  REQUIRE(moekit_ep_forward(other, &f, other_saved.data(), other_saved.size(), ws.data(), ws.size(), nullptr) ==
          MOEKIT_SUCCESS);
  REQUIRE(moekit_ep_backward(plan, &b, other_saved.data(), other_saved.size(), ws.data(), ws.size(), nullptr) ==
          MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(message().find("saved: filled by the forward of another expert-parallel plan") != std::string::npos);
  HostTensor x3(p.dtype, {3, p.hidden}), dout3(p.dtype, {3, p.hidden}), dx3(p.dtype, {3, p.hidden});
  x3.fill_uniform(rng, 1.0);
  dout3.fill_uniform(rng, 1.0);
  moekit_ep_bwd_args_t b3 = b;
  b3.x = x3.view();
  b3.dout = dout3.view();
  b3.dx = dx3.view();
  REQUIRE(moekit_ep_backward(plan, &b3, saved.data(), saved.size(), ws.data(), ws.size(), nullptr) ==
          MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(message().find("saved: the forward ran on 4 tokens, this call has 3") != std::string::npos);
  REQUIRE(dx.bytes_equal(dx_before));
  REQUIRE(moekit_ep_backward(plan, &b, saved.data(), saved.size(), ws.data(), ws.size(), nullptr) == MOEKIT_SUCCESS);
  REQUIRE(moekit_ep_plan_destroy(other) == MOEKIT_SUCCESS);

  REQUIRE(moekit_ep_plan_destroy(plan) == MOEKIT_SUCCESS);
  REQUIRE(moekit_ep_comm_destroy(comm) == MOEKIT_SUCCESS);
  REQUIRE(moekit_ep_local_group_destroy(group) == MOEKIT_SUCCESS);
  REQUIRE(moekit_ep_plan_destroy(nullptr) == MOEKIT_SUCCESS);
}
