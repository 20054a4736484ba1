// The MoE layer and the experts-only layer on the CUDA backend against the reference backend (SPEC sections 3, 4,
// 9): forward outputs, routing, and every gradient, over activations, GLU layouts, router kinds, biases, dropped
// pairs, empty experts, one expert taking every token, T = 1, fp16; bitwise determinism over reruns.
//
// The router weights hold one power of two per row, so the logits x Wr^T are exact in both backends (the fp32
// cuBLASLt product and the float64 reference round to the same bf16 value) and both select the same experts; the
// router linear's gradients (dWr, the dlogits Wr part of dx) stay dense and are compared like the others.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_util.h"

using moekit_test::AlignedBuffer;
using moekit_test::DeviceBuffer;
using moekit_test::DeviceTensor;
using moekit_test::Handles;
using moekit_test::HostTensor;

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

  bool gated() const { return activation < MOEKIT_ACT_GELU; }
  int64_t hw() const { return gated() ? 2 * inter : inter; }
  std::string describe() const {
    std::ostringstream s;
    s << "act " << activation << " glu " << glu_layout << " router " << router << " renorm " << renormalize
      << " biases " << biases << " T " << tokens << " H " << hidden << " I " << inter << " E " << experts << "/"
      << router_experts << " e0 " << expert_begin << " K " << top_k << " dtype " << dtype << " beta_out "
      << beta_out << (one_expert_takes_all ? " one expert takes all" : "");
    return s.str();
  }
};

// The layer's inputs, drawn once and given to both backends.
struct Inputs {
  HostTensor x, wr, router_bias, w1, b1, w2, b2, out0, dout;

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
  }
};

struct Outputs {
  HostTensor out, scores, indices, counts, dx, dwr, dw1, db1, dw2, db2;
};

// Tensors for one backend: host tensors as they are, or device copies (poisoned outputs uploaded poisoned).
class Placement {
 public:
  explicit Placement(bool device) : device_(device) {}
  moekit_tensor_t put(HostTensor& t) {
    if (!device_) return t.view();
    device_tensors_.push_back(std::make_unique<DeviceTensor>(t));
    hosts_.push_back(&t);
    return device_tensors_.back()->view();
  }
  void* buffer(size_t bytes) {
    if (!device_) {
      host_buffers_.push_back(std::make_unique<AlignedBuffer>(bytes));
      return host_buffers_.back()->data();
    }
    device_buffers_.push_back(std::make_unique<DeviceBuffer>(bytes));
    return device_buffers_.back()->data();
  }
  // Copies every device tensor back into its host tensor.
  void fetch() {
    if (!device_) return;
    CUDA_REQUIRE(cudaDeviceSynchronize());
    for (size_t i = 0; i < hosts_.size(); ++i) *hosts_[i] = device_tensors_[i]->download();
  }

 private:
  bool device_;
  std::vector<std::unique_ptr<DeviceTensor>> device_tensors_;
  std::vector<HostTensor*> hosts_;
  std::vector<std::unique_ptr<DeviceBuffer>> device_buffers_;
  std::vector<std::unique_ptr<AlignedBuffer>> host_buffers_;
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
  return d;
}

// Forward then backward (input and weight gradients in one call) on `handle`.
Outputs run_moe(moekit_handle_t handle, bool device, const Config& c, Inputs& in) {
  const int64_t T = c.tokens, H = c.hidden, E = c.experts, RE = c.router_experts, K = c.top_k;
  moekit_moe_desc_t d = layer_desc(c);
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_moe_plan_create(handle, &d, &plan));
  size_t saved_bytes = 0, workspace_bytes = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_saved_size(plan, &saved_bytes));
  MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan, &workspace_bytes));

  Outputs o;
  o.out = c.beta_out != 0 ? in.out0 : HostTensor(c.dtype, {T, H});
  o.scores = HostTensor(MOEKIT_DTYPE_FP32, {T, K});
  o.indices = HostTensor(MOEKIT_DTYPE_INT64, {T, K});
  o.counts = HostTensor(MOEKIT_DTYPE_INT32, {RE});
  o.dx = HostTensor(c.dtype, {T, H});
  o.dwr = HostTensor(c.dtype, {RE, H});
  o.dw1 = HostTensor(c.dtype, {E, c.hw(), H});
  o.db1 = HostTensor(c.dtype, {E, c.hw()});
  o.dw2 = HostTensor(c.dtype, {E, H, c.inter});
  o.db2 = HostTensor(c.dtype, {E, H});
  for (HostTensor* t : {&o.scores, &o.indices, &o.counts, &o.dx, &o.dwr, &o.dw1, &o.db1, &o.dw2, &o.db2}) t->poison();
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
  void* saved = at.buffer(saved_bytes);
  void* workspace = workspace_bytes ? at.buffer(workspace_bytes) : nullptr;
  MOEKIT_REQUIRE_OK(moekit_moe_forward(plan, &f, saved, saved_bytes, workspace, workspace_bytes, nullptr));

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
  MOEKIT_REQUIRE_OK(moekit_moe_backward(plan, &b, saved, saved_bytes, workspace, workspace_bytes, nullptr));
  at.fetch();
  moekit_plan_destroy(plan);
  return o;
}

// Every `rows`-row block of t is a segment (one expert's slice of a weight gradient).
std::vector<int64_t> blocks_of(int64_t blocks, int64_t rows) {
  std::vector<int64_t> s;
  for (int64_t e = 0; e <= blocks; ++e) s.push_back(e * rows);
  return s;
}

void require_close(const char* name, const HostTensor& cuda, const HostTensor& ref, moekit_dtype_t dtype,
                   const std::vector<int64_t>& segments = {}) {
  const moekit_test::ErrorMetrics m = moekit_test::compare(cuda.values(), ref.values(), ref.row_width(), segments);
  INFO(name << ": " << moekit_test::describe(m));
  REQUIRE(moekit_test::within(m, moekit_test::bounds_for(dtype)));
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
  require_close("dx", gpu.dx, ref.dx, c.dtype);
  require_close("dWr", gpu.dwr, ref.dwr, c.dtype);
  require_close("dW1", gpu.dw1, ref.dw1, c.dtype, blocks_of(E, c.hw()));
  require_close("dW2", gpu.dw2, ref.dw2, c.dtype, blocks_of(E, c.hidden));
  if (c.biases) {
    require_close("db1", gpu.db1, ref.db1, c.dtype);
    require_close("db2", gpu.db2, ref.db2, c.dtype);
  }
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

TEST_CASE("CUDA MoE layer is bitwise identical over three runs", "[gpu][layer][moe]") {
  Config c;
  c.tokens = 300;
  c.hidden = 256;
  c.inter = 136;
  c.router_experts = c.experts = 16;
  c.top_k = 4;
  std::mt19937_64 rng(9);
  Inputs in(c, rng);
  Handles h;
  const Outputs first = run_moe(h.cuda, true, c, in);
  for (int run = 0; run < 2; ++run) {
    const Outputs again = run_moe(h.cuda, true, c, in);
    for (auto pair : {std::make_pair(&first.out, &again.out), std::make_pair(&first.dx, &again.dx),
                      std::make_pair(&first.dwr, &again.dwr), std::make_pair(&first.dw1, &again.dw1),
                      std::make_pair(&first.dw2, &again.dw2), std::make_pair(&first.db1, &again.db1)})
      REQUIRE(pair.first->bytes_equal(*pair.second));
  }
}
