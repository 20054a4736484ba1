// The MoE layer and the experts-only layer on the CUDA backend against the reference backend (docs/math.md sections 3,
// 4, 9): forward outputs, routing, and every gradient, over activations, GLU layouts, router kinds, biases, dropped
// pairs, empty experts, one expert taking every token, T = 1, fp16; bitwise determinism over reruns.
//
// The router weights hold one power of two per row, so the logits x Wr^T are exact in both backends (the fp32
// cuBLASLt product and the float64 reference round to the same bf16 value) and both select the same experts; the
// router linear's gradients (dWr, the dlogits Wr part of dx) stay dense and are compared like the others.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/two_backends.h"
#include "src/numeric.h"

using moekit_test::blocks_of;
using moekit_test::Handles;
using moekit_test::HostTensor;
using moekit_test::Placement;
using moekit_test::require_close;

namespace {

struct Config {
  int32_t activation = MOEKIT_ACT_SWIGLU;
  int32_t glu_layout = MOEKIT_GLU_CONCAT;
  int32_t router = MOEKIT_ROUTER_SOFTMAX_TOPK;
  bool renormalize = false;
  bool biases = true;
  int64_t tokens = 37, hidden = 64, inter = 40, router_experts = 8, experts = 8, expert_begin = 0, top_k = 2;
  moekit_dtype_t dtype = MOEKIT_DTYPE_BF16;
  double beta_out = 0;
  bool one_expert_takes_all = false;
  bool inference = false;       // forward only, no saved buffer
  bool split_backward = false;  // the input gradient and the weight gradients in two backward calls
  bool accumulate = false;      // every gradient's beta = 1 over random old values (instead of poison)
  bool overwrite_saved = false; // backward_overwrites_saved: dh written over the saved h
  bool scratch_in_dw1 = false;  // backward_scratch_in_dw1: a' and dxe in dW1 first (one call, beta 0)
  moekit_dtype_t weight_grad_dtype = MOEKIT_DTYPE_INVALID;  // INVALID: the storage dtype
  // The router's auxiliary losses (docs/math.md section 1.1); their upstream gradients are 0.75 and 3.
  double load_balance_coeff = 0, z_loss_coeff = 0;

  moekit_dtype_t wg_dtype() const { return weight_grad_dtype == MOEKIT_DTYPE_INVALID ? dtype : weight_grad_dtype; }

  bool gated() const { return activation < MOEKIT_ACT_GELU; }
  int64_t hw() const { return gated() ? 2 * inter : inter; }
  std::string describe() const {
    std::ostringstream s;
    s << "act " << activation << " glu " << glu_layout << " router " << router << " renorm " << renormalize
      << " biases " << biases << " T " << tokens << " H " << hidden << " I " << inter << " E " << experts << "/"
      << router_experts << " e0 " << expert_begin << " K " << top_k << " dtype " << dtype << " beta_out "
      << beta_out << (one_expert_takes_all ? " one expert takes all" : "") << (inference ? " inference" : "")
      << (split_backward ? " split backward" : "") << (accumulate ? " accumulate" : "")
      << (overwrite_saved ? " overwrite saved" : "") << (scratch_in_dw1 ? " scratch in dW1" : "") << " weight grads "
      << wg_dtype() << " lb " << load_balance_coeff << " z " << z_loss_coeff;
    return s.str();
  }
};

// The layer's inputs, drawn once and given to both backends.
struct Inputs {
  HostTensor x, wr, router_bias, w1, b1, w2, b2, out0, dout;
  HostTensor dx0, dwr0, dw10, db10, dw20, db20;  // old gradients for beta = 1

  Inputs(const Config& c, std::mt19937_64& rng) {
    const int64_t T = c.tokens, H = c.hidden, E = c.experts, RE = c.router_experts;
    x = HostTensor(c.dtype, {T, H});
    x.fill_uniform(rng, 1.0);
    // One power of two per router row, in distinct columns: exact logits (see the file comment).
    wr = HostTensor(c.dtype, {RE, H});
    for (int64_t e = 0; e < RE; ++e)
      for (int64_t j = 0; j < H; ++j) wr.set(e * H + j, j == (e * 5 + 1) % H ? std::ldexp(1.0, int(e % 3)) : 0.0);
    if (c.one_expert_takes_all) {
      // Column 1 holds expert 0's only weight: make it the largest logit of every token.
      for (int64_t t = 0; t < T; ++t) x.set(t * H + 1, 4.0);
    }
    router_bias = HostTensor(MOEKIT_DTYPE_FP32, {RE});
    router_bias.fill_uniform(rng, 0.2);
    w1 = HostTensor(c.dtype, {E, c.hw(), H});
    w1.fill_uniform(rng, 2.0 / std::sqrt(double(H)));
    b1 = HostTensor(c.dtype, {E, c.hw()});
    b1.fill_uniform(rng, 0.5);
    w2 = HostTensor(c.dtype, {E, H, c.inter});
    w2.fill_uniform(rng, 2.0 / std::sqrt(double(c.inter)));
    b2 = HostTensor(c.dtype, {E, H});
    b2.fill_uniform(rng, 0.5);
    out0 = HostTensor(c.dtype, {T, H});
    out0.fill_uniform(rng, 1.0);
    dout = HostTensor(c.dtype, {T, H});
    dout.fill_uniform(rng, 1.0);
    const moekit_dtype_t wg = c.wg_dtype();
    dx0 = HostTensor(c.dtype, {T, H});
    dwr0 = HostTensor(wg, {RE, H});
    dw10 = HostTensor(wg, {E, c.hw(), H});
    db10 = HostTensor(wg, {E, c.hw()});
    dw20 = HostTensor(wg, {E, H, c.inter});
    db20 = HostTensor(wg, {E, H});
    for (HostTensor* g : {&dx0, &dwr0, &dw10, &db10, &dw20, &db20}) g->fill_uniform(rng, 0.5);
  }
};

struct Outputs {
  HostTensor out, scores, indices, counts, dx, dwr, dw1, db1, dw2, db2;
  size_t backward_workspace_bytes = 0;
  HostTensor load_balance_loss, z_loss;  // [1] fp32
};

moekit_moe_desc_t layer_desc(const Config& c) {
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
  d.dtype = c.dtype;
  d.inference = c.inference;
  d.weight_grad_dtype = c.weight_grad_dtype;
  d.backward_overwrites_saved = c.overwrite_saved;
  d.backward_scratch_in_dw1 = c.scratch_in_dw1;
  d.load_balance_coeff = c.load_balance_coeff;
  d.z_loss_coeff = c.z_loss_coeff;
  return d;
}

// Forward, then (unless in inference mode) backward in one call or two (split_backward) on `handle`.
// `stream`: nullptr (the legacy default stream) or a non-blocking stream of the CUDA handle's device.
// `after_planning`, if set, is called with the new plan before anything else.
Outputs run_moe(moekit_handle_t handle, bool device, const Config& c, Inputs& in, cudaStream_t stream = nullptr,
                const std::function<void(moekit_plan_t)>& after_planning = {}) {
  const int64_t T = c.tokens, H = c.hidden, RE = c.router_experts, K = c.top_k;
  moekit_moe_desc_t d = layer_desc(c);
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_moe_plan_create(handle, &d, &plan));
  if (after_planning) after_planning(plan);
  size_t saved_bytes = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_saved_size(plan, &saved_bytes));
  const auto [forward_bytes, backward_bytes] = moekit_test::layer_workspace_sizes(plan);
  if (c.inference) CHECK(backward_bytes == 0);

  Outputs o;
  o.backward_workspace_bytes = backward_bytes;
  o.out = c.beta_out != 0 ? in.out0 : HostTensor(c.dtype, {T, H});
  o.scores = HostTensor(MOEKIT_DTYPE_FP32, {T, K});
  o.indices = HostTensor(MOEKIT_DTYPE_INT64, {T, K});
  o.counts = HostTensor(MOEKIT_DTYPE_INT32, {RE});
  o.dx = in.dx0;
  o.dwr = in.dwr0;
  o.dw1 = in.dw10;
  o.db1 = in.db10;
  o.dw2 = in.dw20;
  o.db2 = in.db20;
  o.load_balance_loss = HostTensor(MOEKIT_DTYPE_FP32, {1});
  o.z_loss = HostTensor(MOEKIT_DTYPE_FP32, {1});
  HostTensor d_lb(MOEKIT_DTYPE_FP32, {1}), d_z(MOEKIT_DTYPE_FP32, {1});
  d_lb.set(0, 0.75);
  d_z.set(0, 3.0);
  for (HostTensor* t : {&o.scores, &o.indices, &o.counts, &o.load_balance_loss, &o.z_loss}) t->poison();
  if (!c.accumulate)
    for (HostTensor* t : {&o.dx, &o.dwr, &o.dw1, &o.db1, &o.dw2, &o.db2}) t->poison();
  if (c.beta_out == 0) o.out.poison();

  Placement at(device);
  moekit_moe_fwd_args_t f;
  moekit_moe_fwd_args_init(&f);
  f.x = at.put(in.x);
  f.w_router = at.put(in.wr);
  if (c.router == MOEKIT_ROUTER_SIGMOID) f.router_bias = at.put(in.router_bias);
  f.w1 = at.put(in.w1);
  f.w2 = at.put(in.w2);
  if (c.biases) {
    f.b1 = at.put(in.b1);
    f.b2 = at.put(in.b2);
  }
  f.out = at.put(o.out);
  f.scores = at.put(o.scores);
  f.indices = at.put(o.indices);
  f.counts = at.put(o.counts);
  f.beta_out = c.beta_out;
  if (c.load_balance_coeff != 0) f.load_balance_loss = at.put(o.load_balance_loss);
  if (c.z_loss_coeff != 0) f.z_loss = at.put(o.z_loss);
  void* saved = saved_bytes ? at.buffer(saved_bytes) : nullptr;
  // Each direction gets a buffer of exactly its own size, so a carving past it is an out-of-bounds access.
  void* workspace = forward_bytes ? at.buffer(forward_bytes) : nullptr;
  MOEKIT_REQUIRE_OK(moekit_moe_forward(plan, &f, saved, saved_bytes, workspace, forward_bytes, stream));
  if (c.inference) {
    REQUIRE(saved_bytes == 0);
    at.fetch();
    moekit_plan_destroy(plan);
    return o;
  }

  moekit_moe_bwd_args_t b;
  moekit_moe_bwd_args_init(&b);
  b.x = f.x;
  b.dout = at.put(in.dout);
  b.w_router = f.w_router;
  b.w1 = f.w1;
  b.w2 = f.w2;
  b.dx = at.put(o.dx);
  b.dw_router = at.put(o.dwr);
  b.dw1 = at.put(o.dw1);
  b.dw2 = at.put(o.dw2);
  if (c.biases) {
    b.b2 = f.b2;
    b.db1 = at.put(o.db1);
    b.db2 = at.put(o.db2);
  }
  workspace = backward_bytes ? at.buffer(backward_bytes) : nullptr;
  const double beta = c.accumulate ? 1.0 : 0.0;
  b.beta_dx = b.beta_dw_router = b.beta_dw1 = b.beta_db1 = b.beta_dw2 = b.beta_db2 = beta;
  if (c.load_balance_coeff != 0) b.dload_balance_loss = at.put(d_lb);
  if (c.z_loss_coeff != 0) b.dz_loss = at.put(d_z);
  if (c.split_backward) {
    // Weight gradients first, then the input gradient: the saved buffer is only read, so any order works.
    b.compute_input_grad = 0;
    MOEKIT_REQUIRE_OK(moekit_moe_backward(plan, &b, saved, saved_bytes, workspace, backward_bytes, stream));
    b.compute_input_grad = 1;
    b.compute_weight_grad = 0;
  }
  MOEKIT_REQUIRE_OK(moekit_moe_backward(plan, &b, saved, saved_bytes, workspace, backward_bytes, stream));
  at.fetch();
  moekit_plan_destroy(plan);
  return o;
}

void check_moe(const Config& c, uint64_t seed) {
  INFO(c.describe());
  std::mt19937_64 rng(seed);
  Inputs in(c, rng);
  Handles h;
  const Outputs ref = run_moe(h.reference, false, c, in);
  const Outputs gpu = run_moe(h.cuda, true, c, in);
  const int64_t E = c.experts;
  REQUIRE(moekit_test::as_integers(gpu.indices) == moekit_test::as_integers(ref.indices));
  REQUIRE(moekit_test::as_integers(gpu.counts) == moekit_test::as_integers(ref.counts));
  require_close("scores", gpu.scores, ref.scores, c.dtype);
  require_close("out", gpu.out, ref.out, c.dtype);
  // The losses: fp32 sums on the GPU of the same (exact) logits, against float64.
  if (c.load_balance_coeff != 0)
    CHECK(std::abs(gpu.load_balance_loss.get(0) - ref.load_balance_loss.get(0)) <=
          1e-5 * std::abs(ref.load_balance_loss.get(0)));
  if (c.z_loss_coeff != 0)
    CHECK(std::abs(gpu.z_loss.get(0) - ref.z_loss.get(0)) <= 1e-5 * std::abs(ref.z_loss.get(0)));
  if (c.inference) return;
  require_close("dx", gpu.dx, ref.dx, c.dtype);
  require_close("dWr", gpu.dwr, ref.dwr, c.dtype);
  require_close("dW1", gpu.dw1, ref.dw1, c.dtype, blocks_of(E, c.hw()));
  require_close("dW2", gpu.dw2, ref.dw2, c.dtype, blocks_of(E, c.hidden));
  if (c.biases) {
    require_close("db1", gpu.db1, ref.db1, c.dtype);
    require_close("db2", gpu.db2, ref.db2, c.dtype);
  }
}

// Two runs of one config agree to the bit in the output, the losses and the gradients of x, Wr, W1, W2 and b1.
void require_same_bits(const Outputs& a, const Outputs& b) {
  for (HostTensor Outputs::*tensor : {&Outputs::out, &Outputs::dx, &Outputs::dwr, &Outputs::dw1, &Outputs::dw2,
                                      &Outputs::db1, &Outputs::load_balance_loss, &Outputs::z_loss})
    REQUIRE((a.*tensor).bytes_equal(b.*tensor));
}

// Each run places every tensor, the workspace and the saved buffer in fresh allocations (new addresses); the
// third runs on a non-blocking stream instead of the legacy one.
void require_bitwise_reruns(const Config& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Inputs in(c, rng);
  Handles h;
  cudaStream_t stream = nullptr;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const Outputs first = run_moe(h.cuda, true, c, in);
  for (int run = 0; run < 2; ++run) {
    const Outputs again = run_moe(h.cuda, true, c, in, run == 1 ? stream : nullptr);
    require_same_bits(first, again);
  }
  cudaStreamDestroy(stream);
}

// The MoE layer without and with the Config flag `option`: the same bits in every output and gradient. Returns by
// how many bytes the flag shrinks the backward's workspace.
size_t moe_saving_with(Config c, Inputs& in, Handles& h, bool Config::*option) {
  c.*option = false;
  const Outputs plain = run_moe(h.cuda, true, c, in);
  c.*option = true;
  const Outputs with = run_moe(h.cuda, true, c, in);
  require_same_bits(plain, with);
  REQUIRE(with.dw2.bytes_equal(plain.dw2));
  REQUIRE(with.db2.bytes_equal(plain.db2));
  return plain.backward_workspace_bytes - with.backward_workspace_bytes;
}

}  // namespace

TEST_CASE("CUDA MoE layer matches the reference: activations, GLU layouts, biases", "[gpu][layer][moe]") {
  uint64_t seed = 100;
  for (int32_t activation : {MOEKIT_ACT_SWIGLU, MOEKIT_ACT_GEGLU, MOEKIT_ACT_REGLU, MOEKIT_ACT_SWIGLU_OAI,
                             MOEKIT_ACT_GELU, MOEKIT_ACT_RELU, MOEKIT_ACT_SILU, MOEKIT_ACT_RELU2})
    for (int32_t layout : {MOEKIT_GLU_CONCAT, MOEKIT_GLU_INTERLEAVED}) {
      if (activation >= MOEKIT_ACT_GELU && layout == MOEKIT_GLU_INTERLEAVED) continue;
      Config c;
      c.activation = activation;
      c.glu_layout = layout;
      c.biases = (seed % 2) == 0;
      check_moe(c, ++seed);
    }
}

TEST_CASE("CUDA MoE layer matches the reference: router kinds, dropped pairs, empty experts, T = 1, fp16",
          "[gpu][layer][moe][sanitize]") {
  Config c;
  c.router = MOEKIT_ROUTER_TOPK_SOFTMAX;
  c.renormalize = true;
  check_moe(c, 1);
  c.router = MOEKIT_ROUTER_SIGMOID;
  check_moe(c, 2);
  c.router = MOEKIT_ROUTER_TOPK;
  c.renormalize = false;
  check_moe(c, 3);

  Config dropped;  // experts 2..5 of 8 live here: pairs routed to the others are dropped
  dropped.router_experts = 8;
  dropped.experts = 4;
  dropped.expert_begin = 2;
  dropped.beta_out = 1;
  check_moe(dropped, 4);

  Config sparse;  // 16 experts for 5 tokens of 2 pairs: most experts are empty
  sparse.tokens = 5;
  sparse.router_experts = sparse.experts = 16;
  check_moe(sparse, 5);

  Config one;
  one.tokens = 1;
  one.top_k = 4;
  check_moe(one, 6);

  Config all;
  all.top_k = 1;
  all.one_expert_takes_all = true;
  check_moe(all, 7);

  Config half;
  half.dtype = MOEKIT_DTYPE_FP16;
  half.hidden = 136;
  half.inter = 72;
  check_moe(half, 8);
}

TEST_CASE("CUDA MoE layer: inference mode, split backward calls, beta = 1 accumulation, fp32 weight gradients",
          "[gpu][layer][moe][sanitize]") {
  Config inference;
  inference.inference = true;
  check_moe(inference, 11);

  Config split;
  split.split_backward = true;
  check_moe(split, 12);

  Config accumulate;
  accumulate.accumulate = true;
  accumulate.beta_out = 1;
  check_moe(accumulate, 13);

  Config fp32_grads;
  fp32_grads.weight_grad_dtype = MOEKIT_DTYPE_FP32;
  fp32_grads.accumulate = true;
  fp32_grads.split_backward = true;
  check_moe(fp32_grads, 14);
}

TEST_CASE("CUDA MoE layer is bitwise identical over three runs, across buffer addresses and streams",
          "[gpu][layer][moe]") {
  Config c;
  c.tokens = 300;
  c.hidden = 256;
  c.inter = 136;
  c.router_experts = c.experts = 16;
  c.top_k = 4;
  require_bitwise_reruns(c, 9);
}

// A plan's kernel choices are made when it is created and only read by its calls: the overrides changed after
// planning change no size, no description and no bit; a plan created under them takes them.
TEST_CASE("CUDA MoE layer: the environment after planning changes no size, description or bit",
          "[gpu][layer][moe]") {
  Config c;
  c.tokens = 300;
  c.hidden = 256;
  c.inter = 192;
  c.router_experts = c.experts = 16;
  c.top_k = 4;
  std::mt19937_64 rng(31);
  Inputs in(c, rng);
  Handles h;
  struct Seen {
    std::string text;
    size_t workspace = 0, saved = 0;
  };
  const auto record = [](moekit_plan_t plan, Seen& seen) {
    seen.text = moekit_test::plan_description(plan);
    MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan, &seen.workspace));
    MOEKIT_REQUIRE_OK(moekit_plan_saved_size(plan, &seen.saved));
  };
  const moekit_test::ScopedEnv default_path("MOEKIT_GEMM_PATH", nullptr), default_tile("MOEKIT_GEMM_TILE", nullptr);
  Seen planned, changed;
  const Outputs first = run_moe(h.cuda, true, c, in, nullptr, [&](moekit_plan_t plan) { record(plan, planned); });
  std::unique_ptr<moekit_test::ScopedEnv> path, tile;
  const Outputs again = run_moe(h.cuda, true, c, in, nullptr, [&](moekit_plan_t plan) {
    path = std::make_unique<moekit_test::ScopedEnv>("MOEKIT_GEMM_PATH", "mma");
    tile = std::make_unique<moekit_test::ScopedEnv>("MOEKIT_GEMM_TILE", "128x128");
    record(plan, changed);
  });
  INFO(planned.text);
  CHECK(changed.text == planned.text);
  CHECK(changed.workspace == planned.workspace);
  CHECK(changed.saved == planned.saved);
  require_same_bits(first, again);
  // The description lists every building block with its kernels (H = 256, I = 192: every GEMM on wgmma).
  for (const char* part : {"MoE layer", "\n  router: ", "\n  dispatch: ", "\n  combine: ", "\n  up: ",
                           "\n  down: ", "\n  dgated: ", "\n  dx: ", "\n  dW2: ", "\n  dW1: ", "wgmma 128x"})
    CHECK(planned.text.find(part) != std::string::npos);
  // Each grouped GEMM's preferred kernel is wgmma (mma.sync only as the varlen-K fallback for huge strides).
  std::istringstream lines(planned.text);
  for (std::string line; std::getline(lines, line);)
    if (line.find("grouped GEMM") != std::string::npos) CHECK(line.find("wgmma") < line.find("mma.sync"));
  // Created under the overrides, a plan takes them (still in force here).
  moekit_moe_desc_t d = layer_desc(c);
  moekit_plan_t forced = nullptr;
  MOEKIT_REQUIRE_OK(moekit_moe_plan_create(h.cuda, &d, &forced));
  const std::string forced_text = moekit_test::plan_description(forced);
  INFO(forced_text);
  CHECK(forced_text.find("mma.sync 128x128") != std::string::npos);
  CHECK(forced_text.find("wgmma") == std::string::npos);
  moekit_plan_destroy(forced);
}

namespace {

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

}  // namespace

// P = T K = 786432 grouped rows of H = 4096: the grouped tensors (y, dxe) hold 3 x 2^30 elements, so every offset
// into them past 2^31 must be 64-bit. Wr = 0 makes every logit 0: each token takes experts 0..7 (ties go to the lower id) with
// scores 1/8, and the router adds nothing to dx, so out and dx of a sample of tokens are checked against a
// per-token computation on the host (SwiGLU, rounding h, a, y and dxe as docs/math.md section 8 does).
TEST_CASE("CUDA MoE layer at T = 98304, K = 8, H = 4096: offsets past 2^31 elements", "[gpu][layer][moe][large]") {
  Config c;
  c.tokens = 98304;
  c.hidden = 4096;
  c.inter = 64;
  c.router_experts = c.experts = 16;
  c.top_k = 8;
  c.biases = true;
  std::mt19937_64 rng(98304);
  Inputs in(c, rng);
  for (int64_t i = 0; i < in.wr.numel(); ++i) in.wr.set(i, 0.0);
  Handles h;
  const Outputs gpu = run_moe(h.cuda, true, c, in);

  const int64_t H = c.hidden, I = c.inter, K = c.top_k;
  const std::vector<double> x = in.x.values(), w1 = in.w1.values(), b1 = in.b1.values(), w2 = in.w2.values(),
                            b2 = in.b2.values(), dout = in.dout.values();
  const std::vector<double> out = gpu.out.values(), dx = gpu.dx.values();
  auto at = [](const std::vector<double>& v, int64_t i) { return v[static_cast<size_t>(i)]; };
  std::vector<double> got_out, want_out, got_dx, want_dx;
  for (int64_t t : {int64_t{0}, int64_t{1}, int64_t{4097}, int64_t{65535}, int64_t{65536}, int64_t{98303}}) {
    std::vector<double> o(static_cast<size_t>(H), 0.0), g(static_cast<size_t>(H), 0.0);
    for (int64_t e = 0; e < K; ++e) {
      const double s = 1.0 / double(K);
      std::vector<double> hv(static_cast<size_t>(2 * I)), a(static_cast<size_t>(I)), dh(static_cast<size_t>(2 * I));
      for (int64_t r = 0; r < 2 * I; ++r) {
        double sum = at(b1, e * 2 * I + r);
        for (int64_t j = 0; j < H; ++j) sum += at(w1, (e * 2 * I + r) * H + j) * at(x, t * H + j);
        hv[static_cast<size_t>(r)] = moekit::round_to(sum, c.dtype);
      }
      for (int64_t r = 0; r < I; ++r) {
        const double gate = at(hv, r), up = at(hv, I + r), sg = sigmoid(gate);
        a[static_cast<size_t>(r)] = moekit::round_to(gate * sg * up, c.dtype);
        double da = 0;  // s (W2[e]^T dout_t)[r]
        for (int64_t j = 0; j < H; ++j) da += at(w2, (e * H + j) * I + r) * at(dout, t * H + j);
        da *= s;
        dh[static_cast<size_t>(r)] = moekit::round_to(da * up * sg * (1 + gate * (1 - sg)), c.dtype);
        dh[static_cast<size_t>(I + r)] = moekit::round_to(da * gate * sg, c.dtype);
      }
      for (int64_t j = 0; j < H; ++j) {
        double y = at(b2, e * H + j), back = 0;
        for (int64_t r = 0; r < I; ++r) y += at(w2, (e * H + j) * I + r) * at(a, r);
        for (int64_t r = 0; r < 2 * I; ++r) back += at(w1, (e * 2 * I + r) * H + j) * at(dh, r);
        o[static_cast<size_t>(j)] += s * moekit::round_to(y, c.dtype);
        g[static_cast<size_t>(j)] += moekit::round_to(back, c.dtype);
      }
    }
    for (int64_t j = 0; j < H; ++j) {
      want_out.push_back(at(o, j));
      want_dx.push_back(at(g, j));
      got_out.push_back(at(out, t * H + j));
      got_dx.push_back(at(dx, t * H + j));
    }
  }
  const std::vector<int64_t> indices = moekit_test::as_integers(gpu.indices);
  for (int64_t t : {int64_t{0}, int64_t{98303}})
    for (int64_t k = 0; k < K; ++k) REQUIRE(indices[static_cast<size_t>(t * K + k)] == k);
  for (auto* pair : {&got_out, &got_dx}) {
    const bool is_out = pair == &got_out;
    const moekit_test::ErrorMetrics m = moekit_test::compare(*pair, is_out ? want_out : want_dx, H);
    INFO((is_out ? "out" : "dx") << ": " << moekit_test::describe(m));
    REQUIRE(moekit_test::within(m, moekit_test::bounds_for(c.dtype)));
  }
}

namespace {

struct ExpertsOutputs {
  HostTensor y, dx, dw1, db1, dw2, db2;
  size_t backward_workspace_bytes = 0;
};

// The experts-only layer on grouped rows: forward then backward on `handle`.
ExpertsOutputs run_experts(moekit_handle_t handle, bool device, const Config& c, Inputs& in, HostTensor& offsets,
                           int64_t rows) {
  const int64_t H = c.hidden, E = c.experts;
  moekit_moe_desc_t d = layer_desc(c);
  d.max_tokens = rows;
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_experts_plan_create(handle, &d, &plan));
  size_t saved_bytes = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_saved_size(plan, &saved_bytes));
  const auto [forward_bytes, backward_bytes] = moekit_test::layer_workspace_sizes(plan);
  ExpertsOutputs o;
  o.backward_workspace_bytes = backward_bytes;
  o.y = HostTensor(c.dtype, {rows, H});
  o.dx = HostTensor(c.dtype, {rows, H});
  o.dw1 = HostTensor(c.dtype, {E, c.hw(), H});
  o.db1 = HostTensor(c.dtype, {E, c.hw()});
  o.dw2 = HostTensor(c.dtype, {E, H, c.inter});
  o.db2 = HostTensor(c.dtype, {E, H});
  for (HostTensor* t : {&o.y, &o.dx, &o.dw1, &o.db1, &o.dw2, &o.db2}) t->poison();

  Placement at(device);
  moekit_experts_fwd_args_t f;
  moekit_experts_fwd_args_init(&f);
  f.x = at.put(in.x);
  f.offsets = at.put(offsets);
  f.w1 = at.put(in.w1);
  f.w2 = at.put(in.w2);
  if (c.biases) {
    f.b1 = at.put(in.b1);
    f.b2 = at.put(in.b2);
  }
  f.y = at.put(o.y);
  void* saved = at.buffer(saved_bytes);
  void* workspace = forward_bytes ? at.buffer(forward_bytes) : nullptr;
  MOEKIT_REQUIRE_OK(moekit_experts_forward(plan, &f, saved, saved_bytes, workspace, forward_bytes, nullptr));
  moekit_experts_bwd_args_t b;
  moekit_experts_bwd_args_init(&b);
  b.x = f.x;
  b.offsets = f.offsets;
  b.w1 = f.w1;
  b.w2 = f.w2;
  b.dy = at.put(in.dout);
  b.dx = at.put(o.dx);
  b.dw1 = at.put(o.dw1);
  b.dw2 = at.put(o.dw2);
  if (c.biases) {
    b.db1 = at.put(o.db1);
    b.db2 = at.put(o.db2);
  }
  workspace = backward_bytes ? at.buffer(backward_bytes) : nullptr;
  MOEKIT_REQUIRE_OK(moekit_experts_backward(plan, &b, saved, saved_bytes, workspace, backward_bytes, nullptr));
  at.fetch();
  moekit_plan_destroy(plan);
  return o;
}

// The experts-only layer on c's rows, split evenly over the experts, without and with the Config flag `option`:
// the same bits. Returns by how many bytes the flag shrinks the backward's workspace.
size_t experts_saving_with(Config c, Inputs& in, Handles& h, bool Config::*option) {
  HostTensor offsets(MOEKIT_DTYPE_INT32, {c.experts + 1});
  for (int64_t i = 0; i <= c.experts; ++i) offsets.set(i, static_cast<double>(i * c.tokens / c.experts));
  c.*option = false;
  const ExpertsOutputs plain = run_experts(h.cuda, true, c, in, offsets, c.tokens);
  c.*option = true;
  const ExpertsOutputs with = run_experts(h.cuda, true, c, in, offsets, c.tokens);
  for (HostTensor ExpertsOutputs::*t : {&ExpertsOutputs::y, &ExpertsOutputs::dx, &ExpertsOutputs::dw1,
                                        &ExpertsOutputs::db1, &ExpertsOutputs::dw2, &ExpertsOutputs::db2})
    REQUIRE((plain.*t).bytes_equal(with.*t));
  return plain.backward_workspace_bytes - with.backward_workspace_bytes;
}

}  // namespace

// Grouped rows with counts 0, 1, 127, 128, 129 and others (tile +- 1 for both tile heights), three rows past
// offsets[E] that must stay untouched (poisoned: the comparison would see NaN).
TEST_CASE("CUDA experts-only layer matches the reference on grouped rows", "[gpu][layer][experts][sanitize]") {
  for (int32_t activation : {MOEKIT_ACT_SWIGLU, MOEKIT_ACT_RELU2}) {
    Config c;
    c.activation = activation;
    c.experts = c.router_experts = 8;
    const std::vector<int64_t> counts = {0, 1, 127, 128, 129, 0, 40, 255};
    int64_t grouped = 0;
    for (int64_t n : counts) grouped += n;
    c.tokens = grouped + 3;  // x, dy: the grouped rows and 3 past offsets[E]
    INFO(c.describe());
    std::mt19937_64 rng(77 + static_cast<uint64_t>(activation));
    Inputs in(c, rng);
    HostTensor offsets(MOEKIT_DTYPE_INT32, {c.experts + 1});
    int64_t at = 0;
    offsets.set(0, 0);
    for (int64_t e = 0; e < c.experts; ++e) offsets.set(e + 1, static_cast<double>(at += counts[static_cast<size_t>(e)]));
    Handles h;
    const ExpertsOutputs ref = run_experts(h.reference, false, c, in, offsets, c.tokens);
    const ExpertsOutputs gpu = run_experts(h.cuda, true, c, in, offsets, c.tokens);
    // Rows past offsets[E] are untouched: both sides keep the poison there, which compare() would count as NaN.
    const int64_t H = c.hidden;
    for (const HostTensor* t : {&gpu.y, &gpu.dx}) {
      const std::vector<double> v = t->values();
      for (int64_t i = grouped * H; i < c.tokens * H; ++i) REQUIRE(std::isnan(v[static_cast<size_t>(i)]));
    }
    auto grouped_rows = [&](const HostTensor& t) {
      HostTensor head(t.dtype(), {grouped, H});
      const std::vector<double> v = t.values();
      head.set_values(std::vector<double>(v.begin(), v.begin() + grouped * H));
      return head;
    };
    require_close("y", grouped_rows(gpu.y), grouped_rows(ref.y), c.dtype);
    require_close("dx", grouped_rows(gpu.dx), grouped_rows(ref.dx), c.dtype);
    require_close("dW1", gpu.dw1, ref.dw1, c.dtype, blocks_of(c.experts, c.hw()));
    require_close("dW2", gpu.dw2, ref.dw2, c.dtype, blocks_of(c.experts, c.hidden));
    require_close("db1", gpu.db1, ref.db1, c.dtype);
    require_close("db2", gpu.db2, ref.db2, c.dtype);
  }
}

// dh over the saved h: the same bits as with dh in the workspace, whose dh section ([P, h width]) is gone. I = 136
// leaves a partial tile in n; SWIGLU_OAI interleaved and RELU2 take the dgated epilogue's other layouts.
TEST_CASE("CUDA MoE layer: backward_overwrites_saved gives the same bits from a smaller workspace",
          "[gpu][layer][moe][sanitize]") {
  for (int32_t activation : {MOEKIT_ACT_SWIGLU, MOEKIT_ACT_SWIGLU_OAI, MOEKIT_ACT_RELU2}) {
    Config c;
    c.activation = activation;
    c.glu_layout = activation == MOEKIT_ACT_SWIGLU_OAI ? MOEKIT_GLU_INTERLEAVED : MOEKIT_GLU_CONCAT;
    c.tokens = 300;
    c.hidden = 256;
    c.inter = 136;
    c.router_experts = c.experts = 16;
    c.top_k = 4;
    INFO(c.describe());
    std::mt19937_64 rng(41);
    Inputs in(c, rng);
    Handles h;
    const size_t dh_bytes = static_cast<size_t>((c.tokens + 3) * c.top_k * c.hw()) * 2;
    REQUIRE(moe_saving_with(c, in, h, &Config::overwrite_saved) == (dh_bytes + 255) / 256 * 256);
    REQUIRE(experts_saving_with(c, in, h, &Config::overwrite_saved) > 0);
  }
}

// a' and dxe in the caller's dW1: the same bits as with them in the workspace, whose [P, max(I, H)] section is gone
// where dW1 [E, 2I, H] holds it, whole (8 * 272 * 256 elements against 160 * 256) or, the dxe GEMM and its combine
// then running on column halves of dx, as [P, max(I, H / 2)] (8 * 128 * 256 against 1612 * 128 in bf16; an fp32 dW1
// is twice as large: 4 * 80 * 64 fp32 elements hold 806 * 40 bf16 ones). Where dW1 holds neither (4 * 80 * 64 bf16
// against 806 * 40) the workspace keeps the section. With and without dh over the saved h; the experts-only layer
// loses its a' section ([P, I]) the same way.
TEST_CASE("CUDA MoE layer: backward_scratch_in_dw1 gives the same bits from a smaller workspace",
          "[gpu][layer][moe][sanitize]") {
  struct Shape {
    int64_t tokens, hidden, inter, experts, top_k;
    bool fits_bf16, fits_fp32;  // in a dW1 of that weight-gradient dtype
  };
  for (const Shape& s : {Shape{77, 256, 136, 8, 2, true, true}, Shape{400, 256, 64, 8, 4, true, true},
                         Shape{400, 64, 40, 4, 2, false, true}})
    for (bool overwrite : {false, true})
      for (moekit_dtype_t wg : {MOEKIT_DTYPE_INVALID, MOEKIT_DTYPE_FP32}) {
        Config c;
        c.tokens = s.tokens;
        c.hidden = s.hidden;
        c.inter = s.inter;
        c.router_experts = c.experts = s.experts;
        c.top_k = s.top_k;
        c.overwrite_saved = overwrite;
        c.weight_grad_dtype = wg;
        INFO(c.describe());
        std::mt19937_64 rng(43);
        Inputs in(c, rng);
        Handles h;
        const size_t section = static_cast<size_t>((c.tokens + 3) * c.top_k * std::max(c.inter, c.hidden)) * 2;
        const bool fits = wg == MOEKIT_DTYPE_FP32 ? s.fits_fp32 : s.fits_bf16;
        REQUIRE(moe_saving_with(c, in, h, &Config::scratch_in_dw1) == (fits ? (section + 255) / 256 * 256 : 0));
        if (wg != MOEKIT_DTYPE_INVALID) continue;
        // The experts-only layer: [P, I] only, which fits in every shape's dW1 (400 * 40 < 4 * 80 * 64).
        const size_t a_section = static_cast<size_t>(c.tokens * c.inter) * 2;
        REQUIRE(c.experts * c.hw() * c.hidden >= c.tokens * c.inter);
        REQUIRE(experts_saving_with(c, in, h, &Config::scratch_in_dw1) == (a_section + 255) / 256 * 256);
      }
  // Against the reference backend, which takes the same flag (and the same rules on the call).
  Config c;
  c.tokens = 77;
  c.hidden = 256;
  c.inter = 136;
  c.overwrite_saved = true;
  c.scratch_in_dw1 = true;
  check_moe(c, 44);
}

TEST_CASE("CUDA MoE layer with the auxiliary router losses matches the reference", "[gpu][layer][moe][aux_losses]") {
  // Coefficients large enough for the aux gradient to show in a bf16 dlogits next to the experts' term.
  Config c;
  c.load_balance_coeff = 1.0;
  c.z_loss_coeff = 0.1;
  check_moe(c, 31);
  c.router = MOEKIT_ROUTER_TOPK_SOFTMAX;
  c.renormalize = true;
  c.accumulate = true;
  check_moe(c, 32);

  Config sigmoid;  // the z-loss alone: the load-balancing loss needs a softmax kind
  sigmoid.router = MOEKIT_ROUTER_SIGMOID;
  sigmoid.z_loss_coeff = 0.1;
  check_moe(sigmoid, 33);

  Config dropped;  // f and P over every router expert, the dropped pairs' included
  dropped.router_experts = 8;
  dropped.experts = 4;
  dropped.expert_begin = 2;
  dropped.load_balance_coeff = 1.0;
  dropped.z_loss_coeff = 0.1;
  check_moe(dropped, 34);

  Config sparse;  // most experts empty
  sparse.tokens = 5;
  sparse.router_experts = sparse.experts = 16;
  sparse.load_balance_coeff = 1.0;
  check_moe(sparse, 35);

  Config one;
  one.tokens = 1;
  one.top_k = 4;
  one.load_balance_coeff = 1.0;
  one.z_loss_coeff = 0.1;
  check_moe(one, 36);

  Config all;
  all.top_k = 1;
  all.one_expert_takes_all = true;
  all.load_balance_coeff = 1.0;
  all.z_loss_coeff = 0.1;
  all.split_backward = true;
  check_moe(all, 37);

  Config large;  // more than one 256-row chunk of the losses' column sums, fp16
  large.tokens = 1100;
  large.router_experts = large.experts = 64;
  large.top_k = 8;
  large.dtype = MOEKIT_DTYPE_FP16;
  large.load_balance_coeff = 1.0;
  large.z_loss_coeff = 0.1;
  check_moe(large, 38);
}

TEST_CASE("CUDA MoE layer with the auxiliary router losses is bitwise identical over reruns and streams",
          "[gpu][layer][moe][aux_losses]") {
  Config c;
  c.tokens = 700;
  c.router_experts = c.experts = 16;
  c.top_k = 4;
  c.load_balance_coeff = 1.0;
  c.z_loss_coeff = 0.1;
  require_bitwise_reruns(c, 39);
}
