// The experts on token-major rows (moekit_token_experts_*) on the CUDA backend against the reference backend
// (docs/math.md sections 3.1, 4 and 9), on fresh random inputs with every output poisoned first: -1 and sentinel ids
// (>= E, far past it, negative), an expert with no pair, tokens with no local pair, one expert taking every pair,
// no local pair at all, N = 1, N = 0, N below the plan's bound, H and I not multiples of 64, int64 ids, rows of
// ids and weights further apart than K, non-gated activations, fp16, beta = 1 into fp32 weight gradients, split
// backward calls, inference. Then the CUDA MoE layer's bits on its own routing, bitwise determinism over reruns,
// buffer addresses and streams, and a CUDA graph captured once and replayed with new routing each time.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/replay_checks.h"
#include "gpu/two_backends.h"

using moekit_test::blocks_of;
using moekit_test::DeviceBuffer;
using moekit_test::DeviceTensor;
using moekit_test::Handles;
using moekit_test::HostTensor;
using moekit_test::Placement;
using moekit_test::require_close;

namespace {

// How a case's ids are drawn.
enum class Routing {
  random,      // local ids of every expert but `empty_expert`, sentinels, and two tokens with no local pair
  one_expert,  // every valid pair goes to expert 1; the others carry -1 or E
  none_local,  // every id is a sentinel
};

struct Config {
  int64_t tokens = 37, hidden = 64, inter = 40, experts = 6, top_k = 3;
  int64_t slack = 3;  // max_tokens = tokens + slack: a call may run fewer tokens than the bound
  int64_t pad = 0;    // extra elements at the end of each row of topk_idx and topk_weights
  int32_t activation = MOEKIT_ACT_SWIGLU;
  int32_t glu_layout = MOEKIT_GLU_CONCAT;
  bool biases = true;
  moekit_dtype_t dtype = MOEKIT_DTYPE_BF16;
  moekit_dtype_t index_dtype = MOEKIT_DTYPE_INT32;
  moekit_dtype_t weight_grad_dtype = MOEKIT_DTYPE_INVALID;  // INVALID: the storage dtype
  Routing routing = Routing::random;
  int64_t empty_expert = 2;     // Routing::random: the expert no pair goes to (-1: none)
  bool inference = false;       // forward only, no saved buffer
  bool split_backward = false;  // the weight gradients, then the input gradients, in two backward calls
  bool accumulate = false;      // beta_out and every gradient's beta = 1 over random old values

  bool gated() const { return activation < MOEKIT_ACT_GELU; }
  int64_t hw() const { return gated() ? 2 * inter : inter; }
  int64_t row() const { return top_k + pad; }  // elements per row of topk_idx and topk_weights
  moekit_dtype_t wg_dtype() const { return weight_grad_dtype == MOEKIT_DTYPE_INVALID ? dtype : weight_grad_dtype; }
  bool valid(int64_t id) const { return id >= 0 && id < experts; }
  std::string describe() const {
    std::ostringstream s;
    s << "N " << tokens << " (bound " << tokens + slack << ") H " << hidden << " I " << inter << " E " << experts
      << " K " << top_k << " pad " << pad << " act " << activation << " glu " << glu_layout << " biases " << biases
      << " dtype " << dtype << " ids " << index_dtype << " routing " << static_cast<int>(routing) << " empty "
      << empty_expert << (inference ? " inference" : "") << (split_backward ? " split backward" : "")
      << (accumulate ? " accumulate" : "") << " weight grads " << wg_dtype();
    return s.str();
  }
};

moekit_moe_desc_t layer_desc(const Config& c) {
  moekit_moe_desc_t d;
  moekit_moe_desc_init(&d);
  d.max_tokens = c.tokens + c.slack;
  d.hidden = c.hidden;
  d.intermediate = c.inter;
  d.router_experts = c.experts;
  d.experts = c.experts;
  d.top_k = c.top_k;
  d.activation = c.activation;
  d.glu_layout = c.glu_layout;
  d.glu_limit = 1.0;  // SWIGLU_OAI clamps often at this scale
  d.has_b1 = c.biases;
  d.has_b2 = c.biases;
  d.dtype = c.dtype;
  d.inference = c.inference;
  d.weight_grad_dtype = c.weight_grad_dtype;
  return d;
}

// Ids that drop their pair: "not on this rank", past the local range, far past it, negative.
std::vector<int64_t> sentinels(const Config& c) {
  std::vector<int64_t> values{-1, c.experts, c.experts + 2, -7, 1000};
  if (c.index_dtype == MOEKIT_DTYPE_INT64) values.push_back(int64_t{1} << 40);
  return values;
}

// [N, K] ids as the case's routing draws them.
std::vector<int64_t> draw_ids(const Config& c, std::mt19937_64& rng) {
  const int64_t N = c.tokens, K = c.top_k;
  const std::vector<int64_t> fill = sentinels(c);
  std::vector<int64_t> ids(static_cast<size_t>(N * K));
  std::uniform_int_distribution<size_t> pick_sentinel(0, fill.size() - 1);
  if (c.routing == Routing::none_local) {
    for (int64_t& id : ids) id = fill[pick_sentinel(rng)];
    return ids;
  }
  if (c.routing == Routing::one_expert) {
    for (size_t p = 0; p < ids.size(); ++p) ids[p] = p % 3 == 2 ? (p % 2 ? -1 : c.experts) : 1;
    return ids;
  }
  std::vector<int64_t> choices = fill;
  for (int64_t e = 0; e < c.experts; ++e)
    if (e != c.empty_expert) choices.insert(choices.end(), 3, e);  // local ids three times as often as a sentinel
  std::uniform_int_distribution<size_t> pick(0, choices.size() - 1);
  for (int64_t& id : ids) id = choices[pick(rng)];
  for (int64_t t : {int64_t{4}, int64_t{9}})
    if (t < N)
      for (int64_t k = 0; k < K; ++k) ids[static_cast<size_t>(t * K + k)] = fill[static_cast<size_t>(k) % fill.size()];
  return ids;
}

// topk_idx [N, K + pad]: the ids, padding with the valid id 0 (a read of it would add a pair).
HostTensor ids_tensor(const Config& c, const std::vector<int64_t>& ids) {
  HostTensor t(c.index_dtype, {c.tokens, c.row()});
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, 0);
  for (int64_t p = 0; p < c.tokens * c.top_k; ++p)
    t.set(p / c.top_k * c.row() + p % c.top_k, static_cast<double>(ids[static_cast<size_t>(p)]));
  return t;
}

// The caller's [N, K] view of a [N, K + pad] tensor.
moekit_tensor_t first_columns(moekit_tensor_t view, int64_t columns) {
  view.shape[1] = columns;
  return view;
}

// The inputs of a case, drawn once and given to both backends.
struct Inputs {
  std::vector<int64_t> ids;  // [N, K]
  HostTensor x, topk_idx, topk_weights, w1, b1, w2, b2, dout;
  HostTensor out0, dx0, dw10, db10, dw20, db20;  // old values for beta = 1

  Inputs(const Config& c, std::mt19937_64& rng) : ids(draw_ids(c, rng)) {
    const int64_t N = c.tokens, H = c.hidden, E = c.experts;
    x = HostTensor(c.dtype, {N, H});
    x.fill_uniform(rng, 1.0);
    topk_idx = ids_tensor(c, ids);
    // Uniform in [0.25, 1]; the padding and every dropped pair's weight are NaN: never read.
    topk_weights = HostTensor(MOEKIT_DTYPE_FP32, {N, c.row()});
    std::uniform_real_distribution<double> weight(0.25, 1.0);
    for (int64_t i = 0; i < topk_weights.numel(); ++i) topk_weights.set(i, NAN);
    for (int64_t p = 0; p < N * c.top_k; ++p)
      if (c.valid(ids[static_cast<size_t>(p)])) topk_weights.set(p / c.top_k * c.row() + p % c.top_k, weight(rng));
    w1 = HostTensor(c.dtype, {E, c.hw(), H});
    w1.fill_uniform(rng, 2.0 / std::sqrt(double(H)));
    b1 = HostTensor(c.dtype, {E, c.hw()});
    b1.fill_uniform(rng, 0.5);
    w2 = HostTensor(c.dtype, {E, H, c.inter});
    w2.fill_uniform(rng, 2.0 / std::sqrt(double(c.inter)));
    b2 = HostTensor(c.dtype, {E, H});
    b2.fill_uniform(rng, 0.5);
    dout = HostTensor(c.dtype, {N, H});
    dout.fill_uniform(rng, 1.0);
    const moekit_dtype_t wg = c.wg_dtype();
    out0 = HostTensor(c.dtype, {N, H});
    dx0 = HostTensor(c.dtype, {N, H});
    dw10 = HostTensor(wg, {E, c.hw(), H});
    db10 = HostTensor(wg, {E, c.hw()});
    dw20 = HostTensor(wg, {E, H, c.inter});
    db20 = HostTensor(wg, {E, H});
    for (HostTensor* t : {&out0, &dx0, &dw10, &db10, &dw20, &db20}) t->fill_uniform(rng, 0.5);
  }
};

struct Outputs {
  HostTensor out, dx, dweights, dw1, db1, dw2, db2;
};

// Forward, then (unless in inference mode) backward in one call or two on `handle`; `stream`: nullptr (the legacy
// default stream) or a non-blocking stream of the CUDA handle's device.
Outputs run_token_experts(moekit_handle_t handle, bool device, const Config& c, Inputs& in,
                          cudaStream_t stream = nullptr) {
  moekit_moe_desc_t d = layer_desc(c);
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_token_experts_plan_create(handle, &d, &plan));
  size_t saved_bytes = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_saved_size(plan, &saved_bytes));
  const auto [forward_bytes, backward_bytes] = moekit_test::layer_workspace_sizes(plan);

  Outputs o;
  o.out = in.out0;
  o.dx = in.dx0;
  o.dweights = HostTensor(MOEKIT_DTYPE_FP32, {c.tokens, c.top_k});
  o.dw1 = in.dw10;
  o.db1 = in.db10;
  o.dw2 = in.dw20;
  o.db2 = in.db20;
  o.dweights.poison();  // d(topk_weights) has no beta: always overwritten
  if (!c.accumulate)
    for (HostTensor* t : {&o.out, &o.dx, &o.dw1, &o.db1, &o.dw2, &o.db2}) t->poison();

  Placement at(device);
  moekit_token_experts_fwd_args_t f;
  moekit_token_experts_fwd_args_init(&f);
  f.x = at.put(in.x);
  f.topk_idx = first_columns(at.put(in.topk_idx), c.top_k);
  f.topk_weights = first_columns(at.put(in.topk_weights), c.top_k);
  f.w1 = at.put(in.w1);
  f.w2 = at.put(in.w2);
  if (c.biases) {
    f.b1 = at.put(in.b1);
    f.b2 = at.put(in.b2);
  }
  f.out = at.put(o.out);
  f.beta_out = c.accumulate ? 1.0 : 0.0;
  void* saved = saved_bytes ? at.buffer(saved_bytes) : nullptr;
  // Each direction gets a buffer of exactly its own size, so a carving past it is an out-of-bounds access.
  void* workspace = forward_bytes ? at.buffer(forward_bytes) : nullptr;
  MOEKIT_REQUIRE_OK(moekit_token_experts_forward(plan, &f, saved, saved_bytes, workspace, forward_bytes, stream));
  if (c.inference) {
    REQUIRE(saved_bytes == 0);
    at.fetch();
    moekit_plan_destroy(plan);
    return o;
  }

  moekit_token_experts_bwd_args_t b;
  moekit_token_experts_bwd_args_init(&b);
  b.x = f.x;
  b.topk_idx = f.topk_idx;
  b.topk_weights = f.topk_weights;
  b.w1 = f.w1;
  b.w2 = f.w2;
  b.dout = at.put(in.dout);
  b.dx = at.put(o.dx);
  b.dtopk_weights = at.put(o.dweights);
  b.dw1 = at.put(o.dw1);
  b.dw2 = at.put(o.dw2);
  if (c.biases) {
    b.b2 = f.b2;
    b.db1 = at.put(o.db1);
    b.db2 = at.put(o.db2);
  }
  b.beta_dx = b.beta_dw1 = b.beta_db1 = b.beta_dw2 = b.beta_db2 = c.accumulate ? 1.0 : 0.0;
  workspace = backward_bytes ? at.buffer(backward_bytes) : nullptr;
  if (c.split_backward) {
    // The weight gradients first: the saved buffer is only read, so any order works.
    b.compute_input_grad = 0;
    MOEKIT_REQUIRE_OK(moekit_token_experts_backward(plan, &b, saved, saved_bytes, workspace, backward_bytes, stream));
    b.compute_input_grad = 1;
    b.compute_weight_grad = 0;
  }
  MOEKIT_REQUIRE_OK(moekit_token_experts_backward(plan, &b, saved, saved_bytes, workspace, backward_bytes, stream));
  at.fetch();
  moekit_plan_destroy(plan);
  return o;
}

// The rows of `t` [rows, width] as vectors.
std::vector<double> row_of(const HostTensor& t, int64_t r) {
  const std::vector<double> v = t.values();
  const int64_t width = t.row_width();
  return std::vector<double>(v.begin() + r * width, v.begin() + (r + 1) * width);
}

void check_token_experts(const Config& c, uint64_t seed) {
  INFO(c.describe());
  std::mt19937_64 rng(seed);
  Inputs in(c, rng);
  Handles h;
  const Outputs ref = run_token_experts(h.reference, false, c, in);
  const Outputs gpu = run_token_experts(h.cuda, true, c, in);
  const int64_t N = c.tokens, K = c.top_k, E = c.experts;
  require_close("out", gpu.out, ref.out, c.dtype);
  // A token with no local pair gets exactly beta_out out: zeros, or the old row.
  for (int64_t t = 0; t < N; ++t) {
    bool any_local = false;
    for (int64_t k = 0; k < K; ++k) any_local = any_local || c.valid(in.ids[static_cast<size_t>(t * K + k)]);
    if (any_local) continue;
    INFO("token " << t << " has no local pair");
    REQUIRE(row_of(gpu.out, t) == row_of(ref.out, t));
    if (!c.inference) REQUIRE(row_of(gpu.dx, t) == row_of(ref.dx, t));
  }
  if (c.inference) return;
  require_close("dx", gpu.dx, ref.dx, c.dtype);
  require_close("dtopk_weights", gpu.dweights, ref.dweights, c.dtype);
  for (int64_t p = 0; p < N * K; ++p)
    if (!c.valid(in.ids[static_cast<size_t>(p)])) REQUIRE(gpu.dweights.get(p) == 0.0);
  require_close("dW1", gpu.dw1, ref.dw1, c.dtype, blocks_of(E, c.hw()));
  require_close("dW2", gpu.dw2, ref.dw2, c.dtype, blocks_of(E, c.hidden));
  if (c.biases) {
    require_close("db1", gpu.db1, ref.db1, c.dtype);
    require_close("db2", gpu.db2, ref.db2, c.dtype);
  }
}

void require_same_bits(const Outputs& a, const Outputs& b) {
  for (HostTensor Outputs::*tensor : {&Outputs::out, &Outputs::dx, &Outputs::dweights, &Outputs::dw1, &Outputs::db1,
                                      &Outputs::dw2, &Outputs::db2})
    REQUIRE((a.*tensor).bytes_equal(b.*tensor));
}

}  // namespace

TEST_CASE("CUDA token-major experts match the reference: sentinels, an empty expert, tokens with no local pair",
          "[gpu][layer][token_experts][sanitize]") {
  Config c;  // int32 ids, -1 / E / E+2 / -7 / 1000 dropped, expert 2 empty, tokens 4 and 9 with nothing local
  check_token_experts(c, 1);

  Config wide = c;  // int64 ids (1 << 40 among the sentinels), GeGLU with interleaved halves, no biases, fp16
  wide.index_dtype = MOEKIT_DTYPE_INT64;
  wide.activation = MOEKIT_ACT_GEGLU;
  wide.glu_layout = MOEKIT_GLU_INTERLEAVED;
  wide.biases = false;
  wide.dtype = MOEKIT_DTYPE_FP16;
  wide.empty_expert = 0;
  check_token_experts(wide, 2);

  Config apart = c;  // rows of ids and weights 5 elements further apart than K; K above E
  apart.pad = 5;
  apart.experts = 3;
  apart.top_k = 4;
  apart.empty_expert = -1;
  check_token_experts(apart, 3);
}

TEST_CASE("CUDA token-major experts match the reference: one expert takes every pair, nothing local, N = 1",
          "[gpu][layer][token_experts][sanitize]") {
  Config one;
  one.routing = Routing::one_expert;
  one.experts = 4;
  one.top_k = 2;
  check_token_experts(one, 11);

  Config none;  // every output is beta times its old value: zeros here, the old values with beta = 1
  none.routing = Routing::none_local;
  check_token_experts(none, 12);
  none.accumulate = true;
  check_token_experts(none, 13);

  Config single;
  single.tokens = 1;
  single.top_k = 4;
  single.experts = 8;
  single.empty_expert = -1;
  check_token_experts(single, 14);
}

TEST_CASE("CUDA token-major experts match the reference: H and I not multiples of 64, activations, options",
          "[gpu][layer][token_experts]") {
  Config odd;  // H = 72, I = 24 (2I = 48): no tile multiple anywhere
  odd.hidden = 72;
  odd.inter = 24;
  odd.tokens = 129;
  odd.slack = 0;
  check_token_experts(odd, 21);

  uint64_t seed = 30;
  for (int32_t activation : {MOEKIT_ACT_SWIGLU_OAI, MOEKIT_ACT_REGLU, MOEKIT_ACT_GELU, MOEKIT_ACT_RELU2}) {
    Config c;
    c.activation = activation;
    c.hidden = 136;
    c.inter = 56;
    c.index_dtype = activation == MOEKIT_ACT_GELU ? MOEKIT_DTYPE_INT64 : MOEKIT_DTYPE_INT32;
    check_token_experts(c, ++seed);
  }

  Config inference;
  inference.inference = true;
  check_token_experts(inference, 41);

  Config split;
  split.split_backward = true;
  check_token_experts(split, 42);

  Config accumulate;  // beta = 1 everywhere, fp32 weight gradients
  accumulate.accumulate = true;
  accumulate.weight_grad_dtype = MOEKIT_DTYPE_FP32;
  accumulate.split_backward = true;
  check_token_experts(accumulate, 43);
}

// What the CUDA kernels do not take is NOT_SUPPORTED at plan creation, with a message, and the reference backend
// serves the same descriptor: a framework can fall back to it.
TEST_CASE("CUDA token-major experts: fp32 storage and widths off 8 elements are not supported, and say so",
          "[gpu][layer][token_experts]") {
  Handles h;
  const auto refused = [&](const Config& c, const char* named) {
    INFO(c.describe());
    moekit_moe_desc_t d = layer_desc(c);
    moekit_plan_t plan = nullptr;
    REQUIRE(moekit_token_experts_plan_create(h.cuda, &d, &plan) == MOEKIT_STATUS_NOT_SUPPORTED);
    REQUIRE(plan == nullptr);
    REQUIRE(moekit_test::last_error().find(named) != std::string::npos);
    MOEKIT_REQUIRE_OK(moekit_token_experts_plan_create(h.reference, &d, &plan));
    moekit_plan_destroy(plan);
  };
  Config fp32;
  fp32.dtype = MOEKIT_DTYPE_FP32;
  refused(fp32, "dtype");
  Config hidden;
  hidden.hidden = 60;
  refused(hidden, "multiple of 8");
  Config inter;
  inter.inter = 20;
  refused(inter, "multiple of 8");
}

// N = 0 (an expert-parallel rank that received no token): nothing to compute, but the weight gradients are still
// beta times their old values, zeros with beta = 0.
TEST_CASE("CUDA token-major experts at N = 0 write zero weight gradients", "[gpu][layer][token_experts]") {
  Config empty;
  empty.tokens = 0;
  check_token_experts(empty, 51);
  empty.accumulate = true;
  check_token_experts(empty, 52);
}

namespace {

struct MoeOutputs {
  HostTensor out, scores, indices, dw1, db1, dw2, db2;
};

// The CUDA MoE layer of `c`'s experts as experts [expert_begin, expert_begin + E) of `router_experts`, on `in`'s x,
// expert weights and dout: its out, routing (global int64 ids, scores) and expert weight gradients.
MoeOutputs run_moe(moekit_handle_t cuda, const Config& c, Inputs& in, int64_t router_experts, int64_t expert_begin,
                   std::mt19937_64& rng) {
  moekit_moe_desc_t d = layer_desc(c);
  d.router_experts = router_experts;
  d.expert_begin = expert_begin;
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_moe_plan_create(cuda, &d, &plan));
  size_t saved_bytes = 0, workspace_bytes = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_saved_size(plan, &saved_bytes));
  MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan, &workspace_bytes));
  HostTensor wr(c.dtype, {router_experts, c.hidden}), dx(c.dtype, {c.tokens, c.hidden});
  HostTensor dwr(c.wg_dtype(), {router_experts, c.hidden});
  wr.fill_uniform(rng, 2.0 / std::sqrt(double(c.hidden)));
  MoeOutputs o{HostTensor(c.dtype, {c.tokens, c.hidden}),
               HostTensor(MOEKIT_DTYPE_FP32, {c.tokens, c.top_k}),
               HostTensor(MOEKIT_DTYPE_INT64, {c.tokens, c.top_k}),
               in.dw10,
               in.db10,
               in.dw20,
               in.db20};
  for (HostTensor* t : {&o.out, &o.scores, &o.indices, &o.dw1, &o.db1, &o.dw2, &o.db2, &dx, &dwr}) t->poison();

  Placement at(true);
  moekit_moe_fwd_args_t f;
  moekit_moe_fwd_args_init(&f);
  f.x = at.put(in.x);
  f.w_router = at.put(wr);
  f.w1 = at.put(in.w1);
  f.b1 = at.put(in.b1);
  f.w2 = at.put(in.w2);
  f.b2 = at.put(in.b2);
  f.out = at.put(o.out);
  f.scores = at.put(o.scores);
  f.indices = at.put(o.indices);
  void* saved = at.buffer(saved_bytes);
  void* workspace = at.buffer(workspace_bytes);
  MOEKIT_REQUIRE_OK(moekit_moe_forward(plan, &f, saved, saved_bytes, workspace, workspace_bytes, nullptr));
  moekit_moe_bwd_args_t b;
  moekit_moe_bwd_args_init(&b);
  b.x = f.x;
  b.dout = at.put(in.dout);
  b.w_router = f.w_router;
  b.w1 = f.w1;
  b.w2 = f.w2;
  b.b2 = f.b2;
  b.dx = at.put(dx);
  b.dw_router = at.put(dwr);
  b.dw1 = at.put(o.dw1);
  b.db1 = at.put(o.db1);
  b.dw2 = at.put(o.dw2);
  b.db2 = at.put(o.db2);
  MOEKIT_REQUIRE_OK(moekit_moe_backward(plan, &b, saved, saved_bytes, workspace, workspace_bytes, nullptr));
  at.fetch();
  moekit_plan_destroy(plan);
  return o;
}

}  // namespace

// The MoE layer's routing made local (its expert range becomes [0, E), every other id a sentinel) and its scores
// as the weights: the same dispatch, GEMMs, epilogues and combine on the same data, so the same bits.
TEST_CASE("CUDA token-major experts give the CUDA MoE layer's out and weight gradients bit for bit on its routing",
          "[gpu][layer][token_experts]") {
  for (moekit_dtype_t index_dtype : {MOEKIT_DTYPE_INT32, MOEKIT_DTYPE_INT64}) {
    Config c;
    c.tokens = 300;
    c.hidden = 128;
    c.inter = 72;
    c.experts = 6;
    c.top_k = 4;
    c.index_dtype = index_dtype;
    INFO(c.describe());
    std::mt19937_64 rng(61);
    Inputs in(c, rng);
    Handles h;
    const int64_t expert_begin = 3;
    const MoeOutputs moe = run_moe(h.cuda, c, in, 12, expert_begin, rng);

    const std::vector<int64_t> global = moekit_test::as_integers(moe.indices), fill = sentinels(c);
    size_t dropped = 0;
    for (size_t p = 0; p < global.size(); ++p) {
      const int64_t e = global[p] - expert_begin;
      in.ids[p] = c.valid(e) ? e : fill[dropped++ % fill.size()];
    }
    INFO(dropped << " of " << global.size() << " pairs dropped");
    REQUIRE(dropped > 0);
    REQUIRE(dropped < global.size());
    in.topk_idx = ids_tensor(c, in.ids);
    in.topk_weights = moe.scores;
    const Outputs te = run_token_experts(h.cuda, true, c, in);
    REQUIRE(te.out.bytes_equal(moe.out));
    REQUIRE(te.dw1.bytes_equal(moe.dw1));
    REQUIRE(te.dw2.bytes_equal(moe.dw2));
    REQUIRE(te.db1.bytes_equal(moe.db1));
    REQUIRE(te.db2.bytes_equal(moe.db2));
  }
}

// Each run places every tensor, the workspace and the saved buffer in fresh allocations (new addresses); the third
// runs on a non-blocking stream instead of the legacy one.
TEST_CASE("CUDA token-major experts are bitwise identical over three runs, across buffer addresses and streams",
          "[gpu][layer][token_experts]") {
  Config c;
  c.tokens = 300;
  c.hidden = 256;
  c.inter = 136;
  c.experts = 16;
  c.top_k = 4;
  c.pad = 3;
  std::mt19937_64 rng(71);
  Inputs in(c, rng);
  Handles h;
  cudaStream_t stream = nullptr;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const Outputs first = run_token_experts(h.cuda, true, c, in);
  for (int run = 0; run < 2; ++run) {
    const Outputs again = run_token_experts(h.cuda, true, c, in, run == 1 ? stream : nullptr);
    require_same_bits(first, again);
  }
  cudaStreamDestroy(stream);

  // The plan lists its building blocks.
  moekit_moe_desc_t d = layer_desc(c);
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_token_experts_plan_create(h.cuda, &d, &plan));
  const std::string text = moekit_test::plan_description(plan);
  INFO(text);
  for (const char* part : {"token-major experts layer", "\n  dispatch: ", "\n  combine: ", "\n  up: ", "\n  down: ",
                           "\n  dgated: ", "\n  dx: ", "\n  dW2: ", "\n  dW1: "})
    CHECK(text.find(part) != std::string::npos);
  moekit_plan_destroy(plan);
}

namespace {

constexpr int64_t kTokens = 200, kHidden = 128, kInter = 72, kExperts = 16, kTopK = 4;

// One layer's device state for tests/gpu/replay_checks.h: a plan, its workspace and saved buffer, the expert
// weights, and the per-call tensors; new_input draws new x, ids and weights, so new routing.
struct DeviceTokenExperts {
  Config c;
  moekit_plan_t plan = nullptr;
  DeviceBuffer workspace, saved;
  size_t workspace_bytes = 0, saved_bytes = 0;
  DeviceTensor x, topk_idx, topk_weights, w1, b1, w2, b2, out, dout, dx, dweights, dw1, db1, dw2, db2;

  DeviceTokenExperts(moekit_handle_t handle, std::mt19937_64& rng) {
    c.tokens = kTokens;
    c.slack = 0;
    c.hidden = kHidden;
    c.inter = kInter;
    c.experts = kExperts;
    c.top_k = kTopK;
    c.index_dtype = MOEKIT_DTYPE_INT64;
    c.empty_expert = -1;
    moekit_moe_desc_t d = layer_desc(c);
    MOEKIT_REQUIRE_OK(moekit_token_experts_plan_create(handle, &d, &plan));
    MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan, &workspace_bytes));
    MOEKIT_REQUIRE_OK(moekit_plan_saved_size(plan, &saved_bytes));
    workspace = DeviceBuffer(workspace_bytes);
    saved = DeviceBuffer(saved_bytes);
    Inputs in(c, rng);
    x = DeviceTensor(in.x);
    topk_idx = DeviceTensor(in.topk_idx);
    topk_weights = DeviceTensor(in.topk_weights);
    w1 = DeviceTensor(in.w1);
    b1 = DeviceTensor(in.b1);
    w2 = DeviceTensor(in.w2);
    b2 = DeviceTensor(in.b2);
    dout = DeviceTensor(in.dout);
    out = DeviceTensor(in.out0);
    dx = DeviceTensor(in.dx0);
    dweights = DeviceTensor(HostTensor(MOEKIT_DTYPE_FP32, {kTokens, kTopK}));
    dw1 = DeviceTensor(in.dw10);
    db1 = DeviceTensor(in.db10);
    dw2 = DeviceTensor(in.dw20);
    db2 = DeviceTensor(in.db20);
  }
  ~DeviceTokenExperts() { moekit_plan_destroy(plan); }

  // Forward + backward on `stream` (capturable: no synchronisation, no allocation); the first status that is not
  // SUCCESS. (No Catch2 assertion here: host threads call it.)
  moekit_status_t enqueue(cudaStream_t stream) {
    moekit_token_experts_fwd_args_t f;
    moekit_token_experts_fwd_args_init(&f);
    f.x = x.view();
    f.topk_idx = topk_idx.view();
    f.topk_weights = topk_weights.view();
    f.w1 = w1.view();
    f.b1 = b1.view();
    f.w2 = w2.view();
    f.b2 = b2.view();
    f.out = out.view();
    const moekit_status_t forward = moekit_token_experts_forward(plan, &f, saved.data(), saved_bytes,
                                                                 workspace.data(), workspace_bytes, stream);
    if (forward != MOEKIT_SUCCESS) return forward;
    moekit_token_experts_bwd_args_t b;
    moekit_token_experts_bwd_args_init(&b);
    b.x = f.x;
    b.topk_idx = f.topk_idx;
    b.topk_weights = f.topk_weights;
    b.w1 = f.w1;
    b.w2 = f.w2;
    b.b2 = f.b2;
    b.dout = dout.view();
    b.dx = dx.view();
    b.dtopk_weights = dweights.view();
    b.dw1 = dw1.view();
    b.db1 = db1.view();
    b.dw2 = dw2.view();
    b.db2 = db2.view();
    return moekit_token_experts_backward(plan, &b, saved.data(), saved_bytes, workspace.data(), workspace_bytes,
                                         stream);
  }

  void new_input(std::mt19937_64& rng) {
    const Inputs in(c, rng);
    x.upload(in.x);
    topk_idx.upload(in.topk_idx);
    topk_weights.upload(in.topk_weights);
  }

  // out, dx, dtopk_weights, dW1, db1, dW2, db2
  std::vector<HostTensor> results() const {
    return {out.download(), dx.download(), dweights.download(), dw1.download(),
            db1.download(), dw2.download(), db2.download()};
  }
};

}  // namespace

TEST_CASE("CUDA token-major experts: a captured forward + backward replays with new routing, bitwise as stream calls",
          "[gpu][layer][token_experts][graph][sanitize]") {
  moekit_handle_t handle = moekit_test::cuda_handle();
  std::mt19937_64 rng(81);
  {
    DeviceTokenExperts layer(handle, rng);
    moekit_test::require_graph_replays_like_stream_calls(layer, rng);
  }
  moekit_handle_destroy(handle);
}

TEST_CASE("CUDA token-major experts: two handles on two host threads and two streams give what each gives alone",
          "[gpu][layer][token_experts][threads]") {
  std::mt19937_64 rng(82);
  moekit_handle_t handles[2] = {moekit_test::cuda_handle(), moekit_test::cuda_handle()};
  {
    DeviceTokenExperts first(handles[0], rng), second(handles[1], rng);
    moekit_test::require_two_threads_like_alone(first, second);
  }
  for (moekit_handle_t h : handles) moekit_handle_destroy(h);
}
