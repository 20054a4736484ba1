// The sparse SwiGLU FFN layer (docs/math.md section 7) on the CUDA backend against the reference backend: out, the
// selected groups and their counts, and the gradients of x, Wg, Wu and Wd, over G in {16, 32, 64, 128}, subsample rows
// on and off, the load-balance bias on and off, T = 1 and T = 37 (a multiple of nothing), beta flags, fp32 weight
// gradients, the input and weight gradients in two calls, fp16; inference mode; bitwise identity over three runs.
//
// Group selection may differ between backends at near-ties (docs/math.md section 9). This test builds inputs whose
// energies are well separated and then requires the same groups: x holds multiples of 1/8 and Wg small integers times
// one power of two, so every gate pre-activation x . Wg_n is an exact fp32 sum in any order and both backends round the
// same value to the storage dtype. The energies then differ only by the fp32 (CUDA) or float64 (reference) evaluation
// of |silu|, exp(bias) and the sums, about 1e-6 relative; a token whose kg + 1 largest energies (the reference's
// formula in float64) come within 1e-4 relative of each other is redrawn.
//
// Metrics (docs/math.md section 9): out and dx per token row; dWg and dWu [F, D] with each group's G rows as a segment;
// dWd [D, F] compared in the expert layout [NG, D, G] (each group's D rows of G as a segment). A group no token
// selected must keep exactly the reference's gradient (0, or the old value with beta = 1).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
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
  int64_t tokens = 37, d_model = 72, groups = 12, group_size = 32, top_groups = 3, subsample = 0;
  bool lb_bias = false;
  moekit_dtype_t dtype = MOEKIT_DTYPE_BF16;
  moekit_dtype_t weight_grad_dtype = MOEKIT_DTYPE_BF16;
  double beta_out = 0, beta_dx = 0, beta_dw = 0;
  bool split_backward = false;  // the input gradient and the weight gradients in two calls

  int64_t d_ff() const { return groups * group_size; }
  std::string describe() const {
    std::ostringstream s;
    s << "T " << tokens << " D " << d_model << " NG " << groups << " G " << group_size << " kg " << top_groups
      << " spg " << subsample << " lb_bias " << lb_bias << " dtype " << dtype << " dW dtype " << weight_grad_dtype
      << " beta out/dx/dW " << beta_out << "/" << beta_dx << "/" << beta_dw << (split_backward ? " split" : "");
    return s.str();
  }
};

// A uniform integer in [-bound, bound].
int64_t draw(std::mt19937_64& rng, int64_t bound) {
  return std::uniform_int_distribution<int64_t>(-bound, bound)(rng);
}

HostTensor uniform(moekit_dtype_t dtype, std::vector<int64_t> shape, double scale, std::mt19937_64& rng) {
  HostTensor t(dtype, std::move(shape));
  t.fill_uniform(rng, scale);
  return t;
}

// en[t, g] in float64 by docs/math.md section 7's formula, from the exact gate pre-activations rounded to
// the storage dtype.
std::vector<double> energies(const Config& c, const std::vector<double>& x_row, const std::vector<double>& w_gate,
                             const std::vector<int64_t>& rows, const std::vector<double>& bias) {
  const int64_t D = c.d_model, G = c.group_size, spg = c.subsample > 0 ? c.subsample : G;
  std::vector<double> en(static_cast<size_t>(c.groups));
  for (int64_t g = 0; g < c.groups; ++g) {
    double sum = 0;
    for (int64_t j = 0; j < spg; ++j) {
      const int64_t n = c.subsample > 0 ? rows[static_cast<size_t>(g * spg + j)] : g * G + j;
      double z = 0;
      for (int64_t k = 0; k < D; ++k) z += x_row[static_cast<size_t>(k)] * w_gate[static_cast<size_t>(n * D + k)];
      z = moekit::round_to(z, c.dtype);
      sum += std::fabs(z / (1.0 + std::exp(-z)));
    }
    if (c.subsample > 0) sum *= static_cast<double>(G) / static_cast<double>(spg);
    if (!bias.empty()) sum *= std::exp(bias[static_cast<size_t>(g)]);
    en[static_cast<size_t>(g)] = sum;
  }
  return en;
}

// The kg + 1 largest energies (or all, when kg = NG) are pairwise more than 1e-4 relative apart.
bool well_separated(const Config& c, std::vector<double> en) {
  std::sort(en.begin(), en.end(), std::greater<double>());
  const int64_t ranked = std::min(c.top_groups, c.groups - 1);
  for (int64_t i = 0; i < ranked; ++i)
    if (en[static_cast<size_t>(i)] - en[static_cast<size_t>(i + 1)] <= 1e-4 * en[static_cast<size_t>(i)]) return false;
  return true;
}

// The layer's inputs and the old values of its accumulated outputs, drawn once and given to both backends.
struct Inputs {
  HostTensor x, w_gate, w_up, w_down, rows, bias, dout, out0, dx0, dwg0, dwu0, dwd0;

  Inputs(const Config& c, std::mt19937_64& rng) {
    const int64_t T = c.tokens, D = c.d_model, F = c.d_ff(), NG = c.groups;
    // Wg = integers in [-32, 32] times a power of two near 4.5 / (32 sqrt(D)): gate pre-activations of about 1.5
    // standard deviation, every partial sum exact in fp32 (|x w| sums stay below 2^24 units of the quantum / 8).
    const double quantum = std::exp2(std::round(std::log2(4.5 / (32.0 * std::sqrt(double(D))))));
    w_gate = HostTensor(c.dtype, {F, D});
    for (int64_t i = 0; i < F * D; ++i) w_gate.set(i, double(draw(rng, 32)) * quantum);
    w_up = uniform(c.dtype, {F, D}, 3.0 / std::sqrt(double(D)), rng);
    w_down = uniform(c.dtype, {D, F}, 2.0 / std::sqrt(double(c.top_groups * c.group_size)), rng);
    rows = HostTensor(MOEKIT_DTYPE_INT32, {NG, std::max<int64_t>(c.subsample, 1)});
    std::vector<int64_t> row_ids;
    if (c.subsample > 0) {
      std::vector<int32_t> drawn(static_cast<size_t>(NG * c.subsample));
      MOEKIT_REQUIRE_OK(moekit_subsample_rows(rng(), NG, c.group_size, c.subsample, drawn.data()));
      for (size_t i = 0; i < drawn.size(); ++i) rows.set(static_cast<int64_t>(i), drawn[i]);
      row_ids.assign(drawn.begin(), drawn.end());
    }
    bias = uniform(MOEKIT_DTYPE_FP32, {NG}, 0.3, rng);
    const std::vector<double> bias_values = c.lb_bias ? bias.values() : std::vector<double>{};

    x = HostTensor(c.dtype, {T, D});
    const std::vector<double> wg = w_gate.values();
    std::vector<double> row(static_cast<size_t>(D));
    for (int64_t t = 0; t < T; ++t) {
      int tries = 0;
      do {
        REQUIRE(++tries < 1000);
        for (int64_t k = 0; k < D; ++k) row[static_cast<size_t>(k)] = double(draw(rng, 8)) / 8.0;
      } while (!well_separated(c, energies(c, row, wg, row_ids, bias_values)));
      for (int64_t k = 0; k < D; ++k) x.set(t * D + k, row[static_cast<size_t>(k)]);
    }

    dout = uniform(c.dtype, {T, D}, 1.0, rng);
    out0 = uniform(c.dtype, {T, D}, 1.0, rng);
    dx0 = uniform(c.dtype, {T, D}, 1.0, rng);
    dwg0 = uniform(c.weight_grad_dtype, {F, D}, 1.0, rng);
    dwu0 = uniform(c.weight_grad_dtype, {F, D}, 1.0, rng);
    dwd0 = uniform(c.weight_grad_dtype, {D, F}, 1.0, rng);
  }
};

struct Outputs {
  HostTensor out, groups, counts, dx, dwg, dwu, dwd;
};

moekit_sparse_ffn_desc_t layer_desc(const Config& c, bool inference) {
  moekit_sparse_ffn_desc_t d;
  moekit_sparse_ffn_desc_init(&d);
  d.max_tokens = c.tokens + 3;  // a call may run fewer tokens than the bound
  d.d_model = c.d_model;
  d.d_ff = c.d_ff();
  d.group_size = c.group_size;
  d.top_groups = c.top_groups;
  d.subsample = c.subsample;
  d.dtype = c.dtype;
  d.inference = inference;
  d.weight_grad_dtype = c.weight_grad_dtype;
  return d;
}

// `old` when beta != 0, else a poisoned tensor of its dtype and shape.
HostTensor initial(const HostTensor& old, double beta) {
  if (beta != 0) return old;
  HostTensor t(old.dtype(), old.shape());
  t.poison();
  return t;
}

// Forward, then (unless inference) the backward on `handle`: input and weight gradients in one call, or in two.
// `stream`: nullptr (the legacy default stream) or a non-blocking stream of the CUDA handle's device.
Outputs run_ffn(moekit_handle_t handle, bool device, const Config& c, Inputs& in, bool inference = false,
                cudaStream_t stream = nullptr) {
  const moekit_sparse_ffn_desc_t d = layer_desc(c, inference);
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_sparse_ffn_plan_create(handle, &d, &plan));
  size_t saved_bytes = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_saved_size(plan, &saved_bytes));
  const auto [forward_bytes, backward_bytes] = moekit_test::layer_workspace_sizes(plan);
  REQUIRE((saved_bytes == 0) == inference);
  if (inference) REQUIRE(backward_bytes == 0);  // the reference backend needs no workspace in either direction

  Outputs o;
  o.out = initial(in.out0, c.beta_out);
  o.groups = HostTensor(MOEKIT_DTYPE_INT32, {c.tokens, c.top_groups});
  o.groups.poison();
  o.counts = HostTensor(MOEKIT_DTYPE_INT32, {c.groups});
  o.counts.poison();
  o.dx = initial(in.dx0, c.beta_dx);
  o.dwg = initial(in.dwg0, c.beta_dw);
  o.dwu = initial(in.dwu0, c.beta_dw);
  o.dwd = initial(in.dwd0, c.beta_dw);

  Placement at(device);
  moekit_sparse_ffn_fwd_args_t f;
  moekit_sparse_ffn_fwd_args_init(&f);
  f.x = at.put(in.x);
  f.w_gate = at.put(in.w_gate);
  f.w_up = at.put(in.w_up);
  f.w_down = at.put(in.w_down);
  if (c.subsample > 0) f.subsample_rows = at.put(in.rows);
  if (c.lb_bias) f.lb_bias = at.put(in.bias);
  f.out = at.put(o.out);
  f.groups = at.put(o.groups);
  f.counts = at.put(o.counts);
  f.beta_out = c.beta_out;
  void* saved = inference ? nullptr : at.buffer(saved_bytes);
  // Each direction gets a buffer of exactly its own size, so a carving past it is an out-of-bounds access.
  void* workspace = forward_bytes ? at.buffer(forward_bytes) : nullptr;
  MOEKIT_REQUIRE_OK(moekit_sparse_ffn_forward(plan, &f, saved, saved_bytes, workspace, forward_bytes, stream));

  if (!inference) {
    moekit_sparse_ffn_bwd_args_t b;
    moekit_sparse_ffn_bwd_args_init(&b);
    b.x = f.x;
    b.w_gate = f.w_gate;
    b.w_up = f.w_up;
    b.w_down = f.w_down;
    b.dout = at.put(in.dout);
    b.dx = at.put(o.dx);
    b.dw_gate = at.put(o.dwg);
    b.dw_up = at.put(o.dwu);
    b.dw_down = at.put(o.dwd);
    b.beta_dx = c.beta_dx;
    b.beta_dw_gate = b.beta_dw_up = b.beta_dw_down = c.beta_dw;
    workspace = backward_bytes ? at.buffer(backward_bytes) : nullptr;
    if (c.split_backward) {
      b.compute_weight_grad = 0;
      MOEKIT_REQUIRE_OK(moekit_sparse_ffn_backward(plan, &b, saved, saved_bytes, workspace, backward_bytes, stream));
      b.compute_weight_grad = 1;
      b.compute_input_grad = 0;
    }
    MOEKIT_REQUIRE_OK(moekit_sparse_ffn_backward(plan, &b, saved, saved_bytes, workspace, backward_bytes, stream));
  }
  at.fetch();
  moekit_plan_destroy(plan);
  return o;
}

// dWd [D, F] in the expert layout [NG, D, G]: group g's rows are its G columns, one row per d.
std::vector<double> down_as_experts(const Config& c, const HostTensor& dwd) {
  const int64_t D = c.d_model, G = c.group_size, F = c.d_ff();
  std::vector<double> v(static_cast<size_t>(F * D));
  for (int64_t g = 0; g < c.groups; ++g)
    for (int64_t d = 0; d < D; ++d)
      for (int64_t j = 0; j < G; ++j) v[static_cast<size_t>((g * D + d) * G + j)] = dwd.get(d * F + g * G + j);
  return v;
}

// Groups no token selected keep exactly the reference's gradient rows (Wg, Wu) and columns (Wd).
void require_unselected_exact(const Config& c, const Outputs& gpu, const Outputs& ref) {
  std::vector<bool> selected(static_cast<size_t>(c.groups), false);
  for (int64_t g : moekit_test::as_integers(ref.groups)) selected[static_cast<size_t>(g)] = true;
  const int64_t D = c.d_model, G = c.group_size, F = c.d_ff();
  for (int64_t g = 0; g < c.groups; ++g) {
    if (selected[static_cast<size_t>(g)]) continue;
    INFO("unselected group " << g);
    for (int64_t j = g * G; j < (g + 1) * G; ++j)
      for (int64_t d = 0; d < D; ++d) {
        REQUIRE(gpu.dwg.get(j * D + d) == ref.dwg.get(j * D + d));
        REQUIRE(gpu.dwu.get(j * D + d) == ref.dwu.get(j * D + d));
        REQUIRE(gpu.dwd.get(d * F + j) == ref.dwd.get(d * F + j));
      }
  }
}

void check_ffn(const Config& c, uint64_t seed) {
  INFO(c.describe());
  std::mt19937_64 rng(seed);
  Inputs in(c, rng);
  Handles h;
  const Outputs ref = run_ffn(h.reference, false, c, in);
  const Outputs gpu = run_ffn(h.cuda, true, c, in);
  REQUIRE(moekit_test::as_integers(gpu.groups) == moekit_test::as_integers(ref.groups));
  REQUIRE(moekit_test::as_integers(gpu.counts) == moekit_test::as_integers(ref.counts));
  require_close("out", gpu.out, ref.out, c.dtype);
  require_close("dx", gpu.dx, ref.dx, c.dtype);
  // fp32 weight gradients of a bf16/fp16 layer use the layer dtype's bounds (docs/math.md section 9).
  const std::vector<int64_t> group_rows = blocks_of(c.groups, c.group_size);
  require_close("dWg", gpu.dwg, ref.dwg, c.dtype, group_rows);
  require_close("dWu", gpu.dwu, ref.dwu, c.dtype, group_rows);
  require_close("dWd", down_as_experts(c, gpu.dwd), down_as_experts(c, ref.dwd), c.group_size, c.dtype,
                blocks_of(c.groups, c.d_model));
  require_unselected_exact(c, gpu, ref);
}

}  // namespace

TEST_CASE("CUDA sparse FFN layer matches the reference: group sizes, subsample rows, load-balance bias",
          "[gpu][layer][sparse_ffn]") {
  uint64_t seed = 200;
  for (int64_t group_size : {16, 32, 64, 128})
    for (bool subsample : {false, true})
      for (bool lb_bias : {false, true}) {
        Config c;
        c.group_size = group_size;
        c.subsample = subsample ? group_size / 4 + 1 : 0;
        c.lb_bias = lb_bias;
        check_ffn(c, ++seed);
      }
}

TEST_CASE("CUDA sparse FFN layer matches the reference: T = 1, beta flags, fp32 weight gradients, split backward",
          "[gpu][layer][sparse_ffn][sanitize]") {
  Config one;  // one token: most groups unselected, their gradients exactly 0
  one.tokens = 1;
  one.groups = 16;
  one.top_groups = 2;
  check_ffn(one, 1);

  Config accumulate;  // out, dx and every weight gradient accumulated into old values
  accumulate.beta_out = accumulate.beta_dx = accumulate.beta_dw = 1;
  accumulate.tokens = 13;
  accumulate.groups = 40;  // 13 tokens x 3 groups < 40: some groups go unselected and must keep their old values
  check_ffn(accumulate, 2);

  Config fp32_grads;
  fp32_grads.weight_grad_dtype = MOEKIT_DTYPE_FP32;
  fp32_grads.beta_dw = 1;
  fp32_grads.lb_bias = true;
  check_ffn(fp32_grads, 3);

  Config split;
  split.split_backward = true;
  split.subsample = 7;
  check_ffn(split, 4);

  Config all_groups;  // kg = NG: every token takes every group
  all_groups.groups = 4;
  all_groups.top_groups = 4;
  all_groups.group_size = 16;
  check_ffn(all_groups, 5);

  Config half;
  half.dtype = half.weight_grad_dtype = MOEKIT_DTYPE_FP16;
  half.d_model = 136;
  half.group_size = 64;
  check_ffn(half, 6);
}

TEST_CASE("CUDA sparse FFN layer in inference mode gives the training forward's bits", "[gpu][layer][sparse_ffn]") {
  Config c;
  c.lb_bias = true;
  std::mt19937_64 rng(7);
  Inputs in(c, rng);
  Handles h;
  const Outputs training = run_ffn(h.cuda, true, c, in);
  const Outputs inference = run_ffn(h.cuda, true, c, in, true);
  REQUIRE(inference.out.bytes_equal(training.out));
  REQUIRE(inference.groups.bytes_equal(training.groups));
  REQUIRE(inference.counts.bytes_equal(training.counts));
  const Outputs ref = run_ffn(h.reference, false, c, in, true);
  REQUIRE(moekit_test::as_integers(inference.groups) == moekit_test::as_integers(ref.groups));
  require_close("out (inference)", inference.out, ref.out, c.dtype);
}

// Each run places every tensor, the workspace and the saved buffer in fresh allocations (new addresses); the
// third runs on a non-blocking stream instead of the legacy one.
TEST_CASE("CUDA sparse FFN layer is bitwise identical over three runs, across buffer addresses and streams",
          "[gpu][layer][sparse_ffn]") {
  Config c;
  c.tokens = 301;
  c.d_model = 128;
  c.groups = 24;
  c.top_groups = 4;
  c.lb_bias = true;
  std::mt19937_64 rng(8);
  Inputs in(c, rng);
  Handles h;
  cudaStream_t stream = nullptr;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const Outputs first = run_ffn(h.cuda, true, c, in);
  for (int run = 0; run < 2; ++run) {
    const Outputs again = run_ffn(h.cuda, true, c, in, false, run == 1 ? stream : nullptr);
    for (auto pair : {std::make_pair(&first.out, &again.out), std::make_pair(&first.groups, &again.groups),
                      std::make_pair(&first.counts, &again.counts), std::make_pair(&first.dx, &again.dx),
                      std::make_pair(&first.dwg, &again.dwg), std::make_pair(&first.dwu, &again.dwu),
                      std::make_pair(&first.dwd, &again.dwd)})
      REQUIRE(pair.first->bytes_equal(*pair.second));
  }
  cudaStreamDestroy(stream);
}

TEST_CASE("CUDA sparse FFN layer reports fp32 storage as not supported", "[gpu][layer][sparse_ffn]") {
  Config c;
  c.dtype = c.weight_grad_dtype = MOEKIT_DTYPE_FP32;
  const moekit_sparse_ffn_desc_t d = layer_desc(c, false);
  Handles h;
  moekit_plan_t plan = nullptr;
  REQUIRE(moekit_sparse_ffn_plan_create(h.cuda, &d, &plan) == MOEKIT_STATUS_NOT_SUPPORTED);
  REQUIRE(plan == nullptr);
}
