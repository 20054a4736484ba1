// The CUDA router (docs/math.md section 1) against the reference backend through the C ABI: indices and counts
// identical (the selection is decided on the same fp32 keys), scores and dlogits within docs/math.md section 9's fp32
// bounds (the storage dtype's for a bf16/fp16 dlogits), over a shape table of token counts and E, every kind x
// renormalisation x dtype x index type, ties, -inf masks, 16-bit NaN/inf/signed zeros/subnormals, strided rows, the
// row-group shape edges; poisoned outputs; bitwise identical reruns and streams; and the auxiliary losses (values,
// dlogits, their aux part on its own scale, T = 0, empty experts, one expert taking every token, reruns).
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/gpu_util.h"
#include "gpu/two_backends.h"

using namespace moekit_test;

namespace {

enum class Values { random, ties, masked };

struct RouterCase {
  int64_t tokens, experts, top_k;
  moekit_router_kind_t kind;
  bool renormalize;
  moekit_dtype_t dtype;        // logits
  moekit_dtype_t index_dtype;  // int32 or int64
  Values values;
  moekit_dtype_t dlogits_dtype;  // fp32 or dtype
  bool accumulate;

  std::string name() const {
    static const char* kinds[] = {"SOFTMAX_TOPK", "TOPK_SOFTMAX", "TOPK", "SIGMOID"};
    static const char* patterns[] = {"random", "ties", "masked"};
    std::ostringstream s;
    s << "T=" << tokens << " E=" << experts << " K=" << top_k << " " << kinds[kind] << (renormalize ? "+renorm" : "")
      << " logits dtype " << dtype << " index dtype " << index_dtype << " " << patterns[static_cast<int>(values)]
      << " dlogits dtype " << dlogits_dtype << (accumulate ? " accumulate" : "");
    return s.str();
  }
};

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

// Logits for a case. Renormalised plain top-k needs positive values; the tie pattern draws from a handful of
// values (with both zeros) so most rows hold equal keys; the masked one sets ~40% to -inf, leaving each row at
// least K finite values (row 0 exactly K).
HostTensor make_logits(const RouterCase& c, std::mt19937_64& rng) {
  const bool positive = c.kind == MOEKIT_ROUTER_TOPK && c.renormalize;
  std::uniform_real_distribution<double> uniform(positive ? 0.05 : -3.0, positive ? 1.0 : 3.0);
  const std::vector<double> tie_values =
      positive ? std::vector<double>{0.25, 0.5, 0.75, 1.0} : std::vector<double>{-1.5, -0.5, -0.0, 0.0, 0.5, 1.0};
  std::uniform_int_distribution<size_t> pick(0, tie_values.size() - 1);
  std::bernoulli_distribution masked(0.4);
  HostTensor logits(c.dtype, {c.tokens, c.experts});
  for (int64_t t = 0; t < c.tokens; ++t) {
    std::vector<double> row(static_cast<size_t>(c.experts));
    for (double& v : row) v = c.values == Values::ties ? tie_values[pick(rng)] : uniform(rng);
    if (c.values == Values::masked) {
      std::vector<size_t> order(row.size());
      for (size_t e = 0; e < order.size(); ++e) order[e] = e;
      std::shuffle(order.begin(), order.end(), rng);
      for (size_t j = static_cast<size_t>(c.top_k); j < order.size(); ++j)
        if (t == 0 || masked(rng)) row[order[j]] = -INFINITY;
    }
    for (int64_t e = 0; e < c.experts; ++e) logits.set(t * c.experts + e, row[static_cast<size_t>(e)]);
  }
  return logits;
}

// The SIGMOID kind's selection bias [E] fp32: small, from a few values in the tie pattern so keys still tie.
HostTensor make_bias(const RouterCase& c, std::mt19937_64& rng) {
  HostTensor bias(MOEKIT_DTYPE_FP32, {c.experts});
  std::uniform_int_distribution<int> pick(-1, 1);
  std::uniform_real_distribution<double> uniform(-0.05, 0.05);
  for (int64_t e = 0; e < c.experts; ++e) bias.set(e, c.values == Values::ties ? 0.125 * pick(rng) : uniform(rng));
  return bias;
}

moekit_router_desc_t router_desc(int64_t experts, int64_t top_k, moekit_router_kind_t kind, moekit_dtype_t dtype,
                                 int64_t max_tokens, bool renormalize, double scale) {
  moekit_router_desc_t desc;
  moekit_router_desc_init(&desc);
  desc.max_tokens = std::max<int64_t>(max_tokens, 1);
  desc.experts = experts;
  desc.top_k = top_k;
  desc.kind = kind;
  desc.renormalize = renormalize ? 1 : 0;
  desc.scale = scale;
  desc.dtype = dtype;
  return desc;
}

// A router plan and its workspace (device memory for a CUDA handle: the forward's per-block counts).
struct Plan {
  moekit_plan_t plan = nullptr;
  size_t workspace_bytes = 0;
  std::vector<uint8_t> host_workspace;
  DeviceBuffer device_workspace;
  Plan(moekit_handle_t handle, bool on_device, const RouterCase& c, int64_t max_tokens, double scale)
      : Plan(handle, on_device, router_desc(c.experts, c.top_k, c.kind, c.dtype, max_tokens, c.renormalize, scale)) {}
  Plan(moekit_handle_t handle, bool on_device, const moekit_router_desc_t& desc) {
    MOEKIT_REQUIRE_OK(moekit_router_plan_create(handle, &desc, &plan));
    MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan, &workspace_bytes));
    if (on_device) {
      device_workspace = DeviceBuffer(workspace_bytes);
    } else {
      host_workspace.resize(workspace_bytes);
    }
  }
  ~Plan() { moekit_plan_destroy(plan); }
  void* workspace() { return device_workspace.data() ? device_workspace.data() : host_workspace.data(); }
};

struct ForwardOut {
  HostTensor scores, indices, counts;
};

constexpr double sigmoid_scale = 2.5;

ForwardOut reference_forward(const Handles& handles, const RouterCase& c, HostTensor& logits, HostTensor* bias) {
  Plan plan(handles.reference, false, c, c.tokens, sigmoid_scale);
  ForwardOut out{HostTensor(MOEKIT_DTYPE_FP32, {c.tokens, c.top_k}), HostTensor(c.index_dtype, {c.tokens, c.top_k}),
                 HostTensor(MOEKIT_DTYPE_INT32, {c.experts})};
  moekit_router_fwd_args_t args;
  moekit_router_fwd_args_init(&args);
  args.logits = logits.view();
  if (bias) args.bias = bias->view();
  args.scores = out.scores.view();
  args.indices = out.indices.view();
  args.counts = out.counts.view();
  MOEKIT_REQUIRE_OK(moekit_router_forward(plan.plan, &args, plan.workspace(), plan.workspace_bytes, nullptr));
  return out;
}

// The CUDA forward on device tensors (outputs poisoned first), downloaded. `logits` may be a strided view.
ForwardOut cuda_forward(const Handles& handles, const RouterCase& c, moekit_tensor_t logits, DeviceTensor* bias,
                        cudaStream_t stream) {
  // NOTE: a plan for more tokens than the call has: its workspace is larger than the call's grid needs.
  Plan plan(handles.cuda, true, c, c.tokens + 1000, sigmoid_scale);
  HostTensor scores(MOEKIT_DTYPE_FP32, {c.tokens, c.top_k}), indices(c.index_dtype, {c.tokens, c.top_k}),
      counts(MOEKIT_DTYPE_INT32, {c.experts});
  scores.poison();
  indices.poison();
  counts.poison();
  DeviceTensor d_scores(scores), d_indices(indices), d_counts(counts);
  moekit_router_fwd_args_t args;
  moekit_router_fwd_args_init(&args);
  args.logits = logits;
  if (bias) args.bias = bias->view();
  args.scores = d_scores.view();
  args.indices = d_indices.view();
  args.counts = d_counts.view();
  MOEKIT_REQUIRE_OK(moekit_router_forward(plan.plan, &args, plan.workspace(), plan.workspace_bytes, stream));
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  return ForwardOut{d_scores.download(), d_indices.download(), d_counts.download()};
}

double selection_key(const RouterCase& c, const HostTensor& logits, const HostTensor* bias, int64_t t, int64_t e) {
  const double x = logits.get(t * c.experts + e);
  if (c.kind != MOEKIT_ROUTER_SIGMOID) return x;
  return sigmoid(x) + (bias ? bias->get(e) : 0.0);
}

// Indices identical (SIGMOID: or a near-tie, docs/math.md section 9: competing keys within 1e-3 relative, computed in
// double); counts identical when every row agrees; scores within fp32 bounds over the rows that agree.
void check_forward(const RouterCase& c, const HostTensor& logits, const HostTensor* bias, const ForwardOut& ref,
                   const ForwardOut& out) {
  int64_t mismatched_rows = 0, near_tie_rows = 0;
  std::string first_mismatch;
  std::vector<double> ref_scores, out_scores;
  for (int64_t t = 0; t < c.tokens; ++t) {
    bool agree = true, near_tie = true;
    for (int64_t k = 0; k < c.top_k; ++k) {
      const int64_t a = static_cast<int64_t>(ref.indices.get(t * c.top_k + k));
      const int64_t b = static_cast<int64_t>(out.indices.get(t * c.top_k + k));
      if (a == b) continue;
      agree = false;
      const bool in_range = b >= 0 && b < c.experts;
      const double ka = selection_key(c, logits, bias, t, a);
      const double kb = in_range ? selection_key(c, logits, bias, t, b) : NAN;
      near_tie = near_tie && c.kind == MOEKIT_ROUTER_SIGMOID && in_range &&
                 std::abs(ka - kb) <= 1e-3 * std::max(std::abs(ka), std::abs(kb));
      if (first_mismatch.empty())
        first_mismatch = "token " + std::to_string(t) + " k " + std::to_string(k) + ": reference expert " +
                         std::to_string(a) + " (key " + std::to_string(ka) + "), CUDA " + std::to_string(b);
    }
    if (agree) {
      for (int64_t k = 0; k < c.top_k; ++k) {
        ref_scores.push_back(ref.scores.get(t * c.top_k + k));
        out_scores.push_back(out.scores.get(t * c.top_k + k));
      }
    } else if (near_tie) {
      ++near_tie_rows;
    } else {
      ++mismatched_rows;
    }
  }
  INFO(c.name());
  INFO("first differing selection: " << first_mismatch);
  REQUIRE(mismatched_rows == 0);
  if (c.kind != MOEKIT_ROUTER_SIGMOID) REQUIRE(near_tie_rows == 0);
  if (near_tie_rows == 0) REQUIRE(out.counts.bytes_equal(ref.counts));
  const ErrorMetrics m = compare(out_scores, ref_scores, c.top_k);
  INFO("scores: " << describe(m));
  REQUIRE(within(m, bounds_for(MOEKIT_DTYPE_FP32)));
}

moekit_router_bwd_args_t backward_args(moekit_tensor_t logits, moekit_tensor_t indices, moekit_tensor_t dscores,
                                       moekit_tensor_t dlogits, bool accumulate) {
  moekit_router_bwd_args_t args;
  moekit_router_bwd_args_init(&args);
  args.logits = logits;
  args.indices = indices;
  args.dscores = dscores;
  args.dlogits = dlogits;
  args.accumulate = accumulate ? 1 : 0;
  return args;
}

// The backward from the reference's own indices, on both backends: dlogits within the dlogits dtype's bounds.
void check_backward(const Handles& handles, const RouterCase& c, HostTensor& logits, DeviceTensor& d_logits,
                    HostTensor& indices, std::mt19937_64& rng) {
  HostTensor dscores(MOEKIT_DTYPE_FP32, {c.tokens, c.top_k});
  dscores.fill_uniform(rng, 1.0);
  HostTensor initial(c.dlogits_dtype, {c.tokens, c.experts});
  if (c.accumulate) {
    initial.fill_uniform(rng, 1.0);
  } else {
    initial.poison();
  }
  HostTensor ref = initial;
  {
    Plan plan(handles.reference, false, c, c.tokens, sigmoid_scale);
    moekit_router_bwd_args_t args =
        backward_args(logits.view(), indices.view(), dscores.view(), ref.view(), c.accumulate);
    MOEKIT_REQUIRE_OK(moekit_router_backward(plan.plan, &args, plan.workspace(), plan.workspace_bytes, nullptr));
  }
  DeviceTensor d_indices(indices), d_dscores(dscores), d_dlogits(initial);
  {
    Plan plan(handles.cuda, true, c, c.tokens, sigmoid_scale);
    moekit_router_bwd_args_t args =
        backward_args(d_logits.view(), d_indices.view(), d_dscores.view(), d_dlogits.view(), c.accumulate);
    MOEKIT_REQUIRE_OK(moekit_router_backward(plan.plan, &args, plan.workspace(), plan.workspace_bytes, nullptr));
  }
  const ErrorMetrics m = compare(d_dlogits.download().values(), ref.values(), c.experts);
  INFO(c.name());
  INFO("dlogits: " << describe(m));
  REQUIRE(within(m, bounds_for(c.dlogits_dtype)));
}

// Forward then (unless told not to) backward of one case on fresh inputs.
void run_case(const Handles& handles, const RouterCase& c, uint64_t seed, bool with_backward = true) {
  std::mt19937_64 rng(seed);
  HostTensor logits = make_logits(c, rng);
  HostTensor bias;
  const bool with_bias = c.kind == MOEKIT_ROUTER_SIGMOID && seed % 2 == 0;
  if (with_bias) bias = make_bias(c, rng);
  DeviceTensor d_logits(logits);
  DeviceTensor d_bias;
  if (with_bias) d_bias = DeviceTensor(bias);
  ForwardOut ref = reference_forward(handles, c, logits, with_bias ? &bias : nullptr);
  ForwardOut out = cuda_forward(handles, c, d_logits.view(), with_bias ? &d_bias : nullptr, nullptr);
  check_forward(c, logits, with_bias ? &bias : nullptr, ref, out);
  if (with_backward) check_backward(handles, c, logits, d_logits, ref.indices, rng);
}

const moekit_router_kind_t all_kinds[] = {MOEKIT_ROUTER_SOFTMAX_TOPK, MOEKIT_ROUTER_TOPK_SOFTMAX, MOEKIT_ROUTER_TOPK,
                                          MOEKIT_ROUTER_SIGMOID};

// The shape table; the options rotate with the case number so every one meets many shapes.
void run_shape_table(const std::vector<int64_t>& token_counts) {
  Handles handles;
  int64_t n = 0;
  for (int64_t T : token_counts)
    for (int64_t E : {3, 8, 128, 256, 4096})
      for (int64_t K : {1, 2, 8, 16}) {
        if (K > E) continue;
        RouterCase c{T,
                     E,
                     K,
                     all_kinds[n % 4],
                     (n / 4) % 2 == 1,
                     n % 3 == 0 ? MOEKIT_DTYPE_FP32 : MOEKIT_DTYPE_BF16,
                     n % 2 == 0 ? MOEKIT_DTYPE_INT64 : MOEKIT_DTYPE_INT32,
                     static_cast<Values>(n % 3 == 1 ? 0 : (n / 3) % 3),
                     n % 5 < 3 ? MOEKIT_DTYPE_FP32 : MOEKIT_DTYPE_INVALID,
                     n % 7 < 3};
        if (c.dlogits_dtype == MOEKIT_DTYPE_INVALID) c.dlogits_dtype = c.dtype;
        run_case(handles, c, static_cast<uint64_t>(1000 + n));
        ++n;
      }
}

}  // namespace

TEST_CASE("router forward and backward match the reference over the shape table (T <= 4096)", "[gpu][router]") {
  run_shape_table({1, 7, 4096});
}

TEST_CASE("router forward and backward match the reference at T = 32768 (E <= 256)", "[gpu][router]") {
  Handles handles;
  int64_t n = 0;
  for (int64_t E : {128, 256})
    for (moekit_router_kind_t kind : all_kinds) {
      RouterCase c{32768,
                   E,
                   n % 2 == 0 ? 8 : 16,
                   kind,
                   n % 3 == 1,
                   MOEKIT_DTYPE_BF16,
                   n % 2 == 0 ? MOEKIT_DTYPE_INT32 : MOEKIT_DTYPE_INT64,
                   static_cast<Values>(n % 3),
                   n % 2 == 0 ? MOEKIT_DTYPE_FP32 : MOEKIT_DTYPE_BF16,
                   n % 4 == 3};
      run_case(handles, c, static_cast<uint64_t>(2000 + n));
      ++n;
    }
}

TEST_CASE("router: every kind x renormalisation x dtype x index type x value pattern", "[gpu][router]") {
  Handles handles;
  int64_t n = 0;
  for (moekit_router_kind_t kind : all_kinds)
    for (bool renormalize : {false, true})
      for (moekit_dtype_t dtype : {MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP16, MOEKIT_DTYPE_FP32})
        for (moekit_dtype_t index_dtype : {MOEKIT_DTYPE_INT32, MOEKIT_DTYPE_INT64})
          for (Values values : {Values::random, Values::ties, Values::masked}) {
            RouterCase c{257, 256, 8, kind, renormalize, dtype, index_dtype, values,
                         n % 2 == 0 ? MOEKIT_DTYPE_FP32 : dtype, n % 3 == 0};
            run_case(handles, c, static_cast<uint64_t>(3000 + n));
            ++n;
          }
}

TEST_CASE("router: row-group shape edges (E from 1 to 8192, K up to 32)", "[sanitize][gpu][router]") {
  Handles handles;
  int64_t n = 0;
  for (int64_t E : {1, 31, 32, 33, 1000, 1024, 1025, 2048, 3000, 8192})
    for (int64_t K : {int64_t{1}, std::min<int64_t>(E, 32)}) {
      RouterCase c{33, E, K, all_kinds[n % 4], n % 3 == 2, n % 2 ? MOEKIT_DTYPE_BF16 : MOEKIT_DTYPE_FP32,
                   MOEKIT_DTYPE_INT32, static_cast<Values>(n % 3), MOEKIT_DTYPE_FP32, n % 2 == 1};
      run_case(handles, c, static_cast<uint64_t>(4000 + n));
      ++n;
    }
}

TEST_CASE("router: 16-bit logits at every warp width of the packed selection (E = 3 to 512)", "[gpu][router]") {
  Handles handles;
  int64_t n = 0;
  for (int64_t E : {3, 40, 100, 256, 300, 512})
    for (moekit_dtype_t dtype : {MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP16}) {
      RouterCase c{129, E, std::min<int64_t>(E, n % 2 == 0 ? 8 : 32), all_kinds[n % 4], n % 3 == 1, dtype,
                   MOEKIT_DTYPE_INT32, static_cast<Values>(n % 3), MOEKIT_DTYPE_FP32, false};
      run_case(handles, c, static_cast<uint64_t>(8000 + n));
      ++n;
    }
}

// NaN, +-inf, +-0, subnormals and +-max in 16-bit logits, some rows with fewer than K selectable keys (the
// reference fills them with the lowest excluded experts): indices and counts identical. Scores are not compared
// (NaN or inf inputs make them NaN on both sides). The keys are the logits themselves: SIGMOID's computed keys
// may tie within an ulp of exp, which the other cases allow for.
TEST_CASE("router: 16-bit special values select exactly as the reference", "[gpu][router]") {
  Handles handles;
  int64_t n = 0;
  for (int64_t E : {8, 33, 256, 300})
    for (moekit_dtype_t dtype : {MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP16})
      for (moekit_router_kind_t kind : {MOEKIT_ROUTER_SOFTMAX_TOPK, MOEKIT_ROUTER_TOPK_SOFTMAX, MOEKIT_ROUTER_TOPK}) {
        const int64_t T = 200, K = std::min<int64_t>(E, 8);
        const RouterCase c{T, E, K, kind, false, dtype, MOEKIT_DTYPE_INT32, Values::random, MOEKIT_DTYPE_FP32, false};
        std::mt19937_64 rng(9000 + static_cast<uint64_t>(n++));
        const double tiny = dtype == MOEKIT_DTYPE_BF16 ? 1e-39 : 1e-7;  // subnormal in the dtype
        const double big = dtype == MOEKIT_DTYPE_BF16 ? 3e38 : 65504.0;
        const std::vector<double> specials{NAN, -NAN, -INFINITY, INFINITY, -0.0, 0.0, tiny, -tiny, big, -big, 1.0, -1.0};
        std::uniform_int_distribution<size_t> pick(0, specials.size() - 1);
        std::uniform_real_distribution<double> uniform(-3.0, 3.0);
        std::uniform_int_distribution<int> style(0, 9);
        HostTensor logits(dtype, {T, E});
        for (int64_t t = 0; t < T; ++t) {
          const int row_style = style(rng);  // 0: 2 selectable keys (< K), 1-4: all specials, else a third
          for (int64_t e = 0; e < E; ++e) {
            double v = uniform(rng);
            if (row_style == 0) {
              v = e == 2 || e == E - 1 ? uniform(rng) : (e % 2 == 0 ? NAN : -INFINITY);
            } else if (row_style <= 4 || e % 3 == 0) {
              v = specials[pick(rng)];
            }
            logits.set(t * E + e, v);
          }
        }
        DeviceTensor d_logits(logits);
        ForwardOut ref = reference_forward(handles, c, logits, nullptr);
        ForwardOut out = cuda_forward(handles, c, d_logits.view(), nullptr, nullptr);
        INFO(c.name());
        int64_t first_row = -1;
        for (int64_t i = 0; i < T * K && first_row < 0; ++i)
          if (ref.indices.get(i) != out.indices.get(i)) first_row = i / K;
        INFO("first differing row: " << first_row);
        REQUIRE(out.indices.bytes_equal(ref.indices));
        REQUIRE(out.counts.bytes_equal(ref.counts));
      }
}

TEST_CASE("router: E above the kernels' limit is NOT_SUPPORTED at plan creation", "[gpu][router]") {
  Handles handles;
  moekit_router_desc_t desc;
  moekit_router_desc_init(&desc);
  desc.max_tokens = 4;
  desc.experts = 8193;
  desc.top_k = 2;
  moekit_plan_t plan = nullptr;
  REQUIRE(moekit_router_plan_create(handles.cuda, &desc, &plan) == MOEKIT_STATUS_NOT_SUPPORTED);
  REQUIRE(last_error().find("experts") != std::string::npos);
  desc.experts = 8192;
  MOEKIT_REQUIRE_OK(moekit_router_plan_create(handles.cuda, &desc, &plan));
  moekit_plan_destroy(plan);
}

TEST_CASE("router: strided logits and dlogits rows (no vector path), the padding untouched", "[sanitize][gpu][router]") {
  Handles handles;
  for (moekit_dtype_t dtype : {MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP32})
    for (moekit_router_kind_t kind : all_kinds) {
      const int64_t T = 100, E = 256, K = 8, pad = 3;
      RouterCase c{T, E, K, kind, true, dtype, MOEKIT_DTYPE_INT64, Values::random, MOEKIT_DTYPE_FP32, true};
      if (kind == MOEKIT_ROUTER_TOPK) c.renormalize = false;
      std::mt19937_64 rng(5000 + static_cast<uint64_t>(kind));
      HostTensor logits = make_logits(c, rng);
      HostTensor padded(dtype, {T, E + pad});
      padded.fill_uniform(rng, 1.0);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t e = 0; e < E; ++e) padded.set(t * (E + pad) + e, logits.get(t * E + e));
      DeviceTensor d_padded(padded);
      moekit_tensor_t view = d_padded.view();
      view.shape[1] = E;  // stride[0] stays E + pad

      ForwardOut ref = reference_forward(handles, c, logits, nullptr);
      ForwardOut out = cuda_forward(handles, c, view, nullptr, nullptr);
      check_forward(c, logits, nullptr, ref, out);

      HostTensor dscores(MOEKIT_DTYPE_FP32, {T, K});
      dscores.fill_uniform(rng, 1.0);
      HostTensor initial(MOEKIT_DTYPE_FP32, {T, E}), initial_padded(MOEKIT_DTYPE_FP32, {T, E + pad});
      initial.fill_uniform(rng, 1.0);
      initial_padded.poison();
      for (int64_t t = 0; t < T; ++t)
        for (int64_t e = 0; e < E; ++e) initial_padded.set(t * (E + pad) + e, initial.get(t * E + e));
      HostTensor ref_dlogits = initial;
      Plan ref_plan(handles.reference, false, c, T, sigmoid_scale);
      moekit_router_bwd_args_t ref_args =
          backward_args(logits.view(), ref.indices.view(), dscores.view(), ref_dlogits.view(), true);
      MOEKIT_REQUIRE_OK(moekit_router_backward(ref_plan.plan, &ref_args, ref_plan.workspace(), ref_plan.workspace_bytes, nullptr));

      DeviceTensor d_indices(ref.indices), d_dscores(dscores), d_dlogits(initial_padded);
      moekit_tensor_t dlogits_view = d_dlogits.view();
      dlogits_view.shape[1] = E;
      Plan plan(handles.cuda, true, c, T, sigmoid_scale);
      moekit_router_bwd_args_t args = backward_args(view, d_indices.view(), d_dscores.view(), dlogits_view, true);
      MOEKIT_REQUIRE_OK(moekit_router_backward(plan.plan, &args, plan.workspace(), plan.workspace_bytes, nullptr));
      HostTensor got_padded = d_dlogits.download();
      std::vector<double> got;
      int64_t padding_written = 0;
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t e = 0; e < E; ++e) got.push_back(got_padded.get(t * (E + pad) + e));
        for (int64_t e = E; e < E + pad; ++e) padding_written += std::isnan(got_padded.get(t * (E + pad) + e)) ? 0 : 1;
      }
      INFO(c.name());
      REQUIRE(padding_written == 0);
      const ErrorMetrics m = compare(got, ref_dlogits.values(), E);
      INFO("dlogits: " << describe(m));
      REQUIRE(within(m, bounds_for(MOEKIT_DTYPE_FP32)));
    }
}

TEST_CASE("router: bitwise identical over three reruns and across two streams", "[gpu][router]") {
  Handles handles;
  cudaStream_t streams[2];
  for (cudaStream_t& s : streams) CUDA_REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int64_t E : {256, 4096})
    for (moekit_router_kind_t kind : all_kinds) {
      RouterCase c{E == 256 ? 4096 : 512, E, 8, kind, kind != MOEKIT_ROUTER_TOPK, MOEKIT_DTYPE_BF16,
                   MOEKIT_DTYPE_INT32, Values::ties, MOEKIT_DTYPE_FP32, true};
      std::mt19937_64 rng(6000 + static_cast<uint64_t>(kind));
      HostTensor logits = make_logits(c, rng);
      DeviceTensor d_logits(logits);
      HostTensor dscores(MOEKIT_DTYPE_FP32, {c.tokens, c.top_k}), initial(MOEKIT_DTYPE_FP32, {c.tokens, E});
      dscores.fill_uniform(rng, 1.0);
      initial.fill_uniform(rng, 1.0);
      DeviceTensor d_dscores(dscores);
      std::vector<ForwardOut> forwards;
      std::vector<HostTensor> backwards;
      for (cudaStream_t stream : {static_cast<cudaStream_t>(nullptr), static_cast<cudaStream_t>(nullptr),
                                  static_cast<cudaStream_t>(nullptr), streams[0], streams[1]}) {
        forwards.push_back(cuda_forward(handles, c, d_logits.view(), nullptr, stream));
        DeviceTensor d_indices(forwards.back().indices), d_dlogits(initial);
        Plan plan(handles.cuda, true, c, c.tokens, sigmoid_scale);
        moekit_router_bwd_args_t args =
            backward_args(d_logits.view(), d_indices.view(), d_dscores.view(), d_dlogits.view(), true);
        MOEKIT_REQUIRE_OK(moekit_router_backward(plan.plan, &args, plan.workspace(), plan.workspace_bytes, stream));
        CUDA_REQUIRE(cudaStreamSynchronize(stream));
        backwards.push_back(d_dlogits.download());
      }
      INFO(c.name());
      for (size_t i = 1; i < forwards.size(); ++i) {
        REQUIRE(forwards[i].scores.bytes_equal(forwards[0].scores));
        REQUIRE(forwards[i].indices.bytes_equal(forwards[0].indices));
        REQUIRE(forwards[i].counts.bytes_equal(forwards[0].counts));
        REQUIRE(backwards[i].bytes_equal(backwards[0]));
      }
    }
  for (cudaStream_t s : streams) CUDA_REQUIRE(cudaStreamDestroy(s));
}

TEST_CASE("router at T = 32768, E = 4096 matches the reference (the second case forward only)", "[gpu][router][large]") {
  Handles handles;
  run_case(handles,
           RouterCase{32768, 4096, 8, MOEKIT_ROUTER_SOFTMAX_TOPK, false, MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_INT64,
                      Values::random, MOEKIT_DTYPE_FP32, false},
           7000);
  run_case(handles,
           RouterCase{32768, 4096, 16, MOEKIT_ROUTER_TOPK_SOFTMAX, true, MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_INT32,
                      Values::masked, MOEKIT_DTYPE_BF16, true},
           7001, false);
}

namespace {

// The auxiliary losses (docs/math.md section 1.1) of one case: coefficients, and the logits pattern's ugly shapes.
enum class AuxShape { random, unused, one_takes_all };

struct AuxCase {
  int64_t tokens, experts, top_k;
  moekit_router_kind_t kind;
  moekit_dtype_t dtype, dlogits_dtype;
  bool accumulate;
  double load_balance_coeff, z_loss_coeff;
  AuxShape shape;

  std::string name() const {
    std::ostringstream s;
    s << "T=" << tokens << " E=" << experts << " K=" << top_k << " kind " << kind << " dtype " << dtype
      << " dlogits dtype " << dlogits_dtype << (accumulate ? " accumulate" : "") << " lb " << load_balance_coeff
      << " z " << z_loss_coeff << " shape " << static_cast<int>(shape);
    return s.str();
  }
};

// A plan for more tokens than the call has; `losses_on` false: the same router without the losses.
moekit_router_desc_t aux_desc(const AuxCase& c, bool losses_on) {
  moekit_router_desc_t desc = router_desc(c.experts, c.top_k, c.kind, c.dtype, c.tokens + 300, false, 1.0);
  desc.load_balance_coeff = losses_on ? c.load_balance_coeff : 0;
  desc.z_loss_coeff = losses_on ? c.z_loss_coeff : 0;
  return desc;
}

HostTensor aux_logits(const AuxCase& c, std::mt19937_64& rng) {
  HostTensor logits(c.dtype, {c.tokens, c.experts});
  logits.fill_uniform(rng, 3.0);
  for (int64_t t = 0; t < c.tokens; ++t) {
    if (c.shape == AuxShape::unused) {
      // The upper half of the experts masked: nobody picks them (f = P = 0 there).
      for (int64_t e = std::max<int64_t>(c.top_k, c.experts / 2); e < c.experts; ++e)
        logits.set(t * c.experts + e, -INFINITY);
    } else if (c.shape == AuxShape::one_takes_all) {
      logits.set(t * c.experts + c.experts / 3, 8.0);
    }
  }
  return logits;
}

struct AuxResult {
  HostTensor indices, load_balance, z, dlogits;
};

// Forward (losses, indices) then backward (dlogits from the reference's indices, upstream gradients 0.75 and 3) on one
// backend. `losses_on` false: the same router without aux losses (for the aux part of dlogits).
AuxResult run_aux(moekit_handle_t handle, bool device, const AuxCase& c, const HostTensor& logits,
                  const HostTensor* indices, const HostTensor& dscores, const HostTensor& initial, bool losses_on,
                  cudaStream_t stream = nullptr) {
  Plan plan(handle, device, aux_desc(c, losses_on));
  AuxResult r{HostTensor(MOEKIT_DTYPE_INT32, {c.tokens, c.top_k}), HostTensor(MOEKIT_DTYPE_FP32, {1}),
              HostTensor(MOEKIT_DTYPE_FP32, {1}), initial};
  r.indices.poison();
  r.load_balance.poison();
  r.z.poison();
  HostTensor scores(MOEKIT_DTYPE_FP32, {c.tokens, c.top_k}), d_lb(MOEKIT_DTYPE_FP32, {1}), d_z(MOEKIT_DTYPE_FP32, {1});
  d_lb.set(0, 0.75);
  d_z.set(0, 3.0);
  HostTensor in_logits = logits, in_dscores = dscores, in_indices = indices ? *indices : r.indices;
  Placement at(device);
  moekit_router_fwd_args_t f;
  moekit_router_fwd_args_init(&f);
  f.logits = at.put(in_logits);
  f.scores = at.put(scores);
  f.indices = at.put(r.indices);
  if (losses_on && c.load_balance_coeff != 0) f.load_balance_loss = at.put(r.load_balance);
  if (losses_on && c.z_loss_coeff != 0) f.z_loss = at.put(r.z);
  MOEKIT_REQUIRE_OK(moekit_router_forward(plan.plan, &f, plan.workspace(), plan.workspace_bytes, stream));
  moekit_router_bwd_args_t b;
  moekit_router_bwd_args_init(&b);
  b.logits = f.logits;
  b.indices = indices ? at.put(in_indices) : f.indices;
  b.dscores = at.put(in_dscores);
  b.dlogits = at.put(r.dlogits);
  b.accumulate = c.accumulate ? 1 : 0;
  if (losses_on && c.load_balance_coeff != 0) b.dload_balance_loss = at.put(d_lb);
  if (losses_on && c.z_loss_coeff != 0) b.dz_loss = at.put(d_z);
  MOEKIT_REQUIRE_OK(moekit_router_backward(plan.plan, &b, plan.workspace(), plan.workspace_bytes, stream));
  at.fetch();
  return r;
}

void check_aux_case(const AuxCase& c, uint64_t seed) {
  INFO(c.name());
  std::mt19937_64 rng(seed);
  Handles h;
  HostTensor logits = aux_logits(c, rng);
  HostTensor dscores(MOEKIT_DTYPE_FP32, {c.tokens, c.top_k});
  dscores.fill_uniform(rng, 1.0);
  HostTensor initial(c.dlogits_dtype, {c.tokens, c.experts});
  if (c.accumulate) {
    initial.fill_uniform(rng, 1.0);
  } else {
    initial.poison();
  }
  const AuxResult ref = run_aux(h.reference, false, c, logits, nullptr, dscores, initial, true);
  const AuxResult gpu = run_aux(h.cuda, true, c, logits, &ref.indices, dscores, initial, true);
  REQUIRE(moekit_test::as_integers(gpu.indices) == moekit_test::as_integers(ref.indices));
  // The losses: fp32 terms summed in double on the GPU, against float64.
  if (c.load_balance_coeff != 0)
    CHECK(std::abs(gpu.load_balance.get(0) - ref.load_balance.get(0)) <= 1e-5 * std::abs(ref.load_balance.get(0)));
  if (c.z_loss_coeff != 0) CHECK(std::abs(gpu.z.get(0) - ref.z.get(0)) <= 1e-5 * std::abs(ref.z.get(0)));
  const ErrorMetrics m = compare(gpu.dlogits.values(), ref.dlogits.values(), c.experts);
  INFO("dlogits: " << describe(m));
  CHECK(within(m, bounds_for(c.dlogits_dtype)));

  // The aux part alone, on its own scale: (with - without) in fp32 on both backends. Each element may deviate by the
  // fp32 rounding of the larger term plus 1e-4 of the aux part's largest magnitude; no element may pass that.
  if (c.dlogits_dtype != MOEKIT_DTYPE_FP32) return;
  const AuxResult ref_off = run_aux(h.reference, false, c, logits, &ref.indices, dscores, initial, false);
  const AuxResult gpu_off = run_aux(h.cuda, true, c, logits, &ref.indices, dscores, initial, false);
  const std::vector<double> rw = ref.dlogits.values(), ro = ref_off.dlogits.values();
  const std::vector<double> gw = gpu.dlogits.values(), go = gpu_off.dlogits.values();
  double aux_scale = 0;
  for (size_t i = 0; i < rw.size(); ++i) aux_scale = std::max(aux_scale, std::abs(rw[i] - ro[i]));
  REQUIRE(aux_scale > 0);
  int64_t deviations = 0;
  double worst = 0;
  for (size_t i = 0; i < rw.size(); ++i) {
    const double bound = 4 * 0x1p-24 * (std::abs(gw[i]) + std::abs(go[i])) + 1e-4 * aux_scale;
    const double error = std::abs((gw[i] - go[i]) - (rw[i] - ro[i]));
    worst = std::max(worst, error / bound);
    if (error > bound) ++deviations;
  }
  INFO("aux part: worst deviation / bound " << worst << ", aux scale " << aux_scale);
  CHECK(deviations == 0);
}

}  // namespace

TEST_CASE("router aux losses match the reference: kinds, shapes, dtypes, T = 1, empty experts, one takes all",
          "[gpu][router][aux_losses]") {
  const AuxCase cases[] = {
      {1, 8, 2, MOEKIT_ROUTER_SOFTMAX_TOPK, MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP32, false, 0.01, 0.001, AuxShape::random},
      {7, 3, 1, MOEKIT_ROUTER_TOPK_SOFTMAX, MOEKIT_DTYPE_FP32, MOEKIT_DTYPE_FP32, true, 0.01, 0.001, AuxShape::random},
      {300, 64, 8, MOEKIT_ROUTER_SOFTMAX_TOPK, MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_BF16, false, 0.01, 0.001,
       AuxShape::unused},
      {513, 128, 8, MOEKIT_ROUTER_TOPK_SOFTMAX, MOEKIT_DTYPE_FP16, MOEKIT_DTYPE_FP16, true, 0.01, 0.001,
       AuxShape::random},
      {4096, 256, 8, MOEKIT_ROUTER_SOFTMAX_TOPK, MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP32, false, 0.01, 0.001,
       AuxShape::random},
      {1000, 16, 1, MOEKIT_ROUTER_SOFTMAX_TOPK, MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP32, true, 0.01, 0.001,
       AuxShape::one_takes_all},
      {257, 4096, 16, MOEKIT_ROUTER_TOPK_SOFTMAX, MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP32, false, 0.01, 0.001,
       AuxShape::random},
      {129, 8192, 4, MOEKIT_ROUTER_SOFTMAX_TOPK, MOEKIT_DTYPE_FP32, MOEKIT_DTYPE_FP32, false, 0.01, 0.0,
       AuxShape::unused},
      {200, 32, 4, MOEKIT_ROUTER_SIGMOID, MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP32, false, 0.0, 0.001, AuxShape::random},
      {200, 32, 4, MOEKIT_ROUTER_TOPK, MOEKIT_DTYPE_FP32, MOEKIT_DTYPE_FP32, true, 0.0, 0.001, AuxShape::random},
      {32768, 256, 8, MOEKIT_ROUTER_TOPK_SOFTMAX, MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_BF16, false, 0.01, 0.001,
       AuxShape::random},
  };
  uint64_t seed = 7000;
  for (const AuxCase& c : cases) check_aux_case(c, seed++);
}

TEST_CASE("router aux losses: T = 0 writes losses of 0", "[gpu][router][aux_losses]") {
  Handles h;
  const AuxCase c{0, 8, 2, MOEKIT_ROUTER_SOFTMAX_TOPK, MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP32, false, 0.01, 0.001,
                  AuxShape::random};
  HostTensor logits(c.dtype, {0, c.experts}), dscores(MOEKIT_DTYPE_FP32, {0, c.top_k});
  HostTensor initial(MOEKIT_DTYPE_FP32, {0, c.experts});
  const AuxResult gpu = run_aux(h.cuda, true, c, logits, nullptr, dscores, initial, true);
  CHECK(gpu.load_balance.get(0) == 0.0);
  CHECK(gpu.z.get(0) == 0.0);
}

TEST_CASE("router aux losses: bitwise identical over reruns and across two streams", "[gpu][router][aux_losses]") {
  Handles h;
  const AuxCase c{5000, 256, 8, MOEKIT_ROUTER_SOFTMAX_TOPK, MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_BF16, false, 0.01, 0.001,
                  AuxShape::random};
  std::mt19937_64 rng(7100);
  HostTensor logits = aux_logits(c, rng);
  HostTensor dscores(MOEKIT_DTYPE_FP32, {c.tokens, c.top_k});
  dscores.fill_uniform(rng, 1.0);
  HostTensor initial(c.dlogits_dtype, {c.tokens, c.experts});
  initial.poison();
  cudaStream_t stream = nullptr;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const AuxResult first = run_aux(h.cuda, true, c, logits, nullptr, dscores, initial, true);
  for (int run = 0; run < 3; ++run) {
    const AuxResult again = run_aux(h.cuda, true, c, logits, nullptr, dscores, initial, true, run == 2 ? stream : nullptr);
    REQUIRE(again.load_balance.bytes_equal(first.load_balance));
    REQUIRE(again.z.bytes_equal(first.z));
    REQUIRE(again.dlogits.bytes_equal(first.dlogits));
  }
  cudaStreamDestroy(stream);
}
