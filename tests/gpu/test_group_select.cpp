// Sparse-FFN group selection and the load-balance update (docs/math.md section 7) on the CUDA backend against the
// reference backend, through the C ABI. Selections come from computed energies, so docs/math.md section 9 lets them
// differ at near-ties: where a token's groups differ, the test recomputes that token's energies in float64
// (the reference's formula) and accepts the difference only if, rank by rank, the two chosen groups' energies
// are within 1e-3 relative. Counts must be exactly the histogram of the groups returned. The load-balance
// update is float64 math on fp32 state and must equal the reference bit for bit.
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/gpu_util.h"
#include "src/numeric.h"

using namespace moekit_test;

namespace {

struct Shape {
  int64_t tokens, d_model, d_ff, group_size, top_groups, subsample;
  bool bias;
  moekit_dtype_t dtype;
  int64_t groups() const { return d_ff / group_size; }
};

std::string text(const Shape& s) {
  std::ostringstream o;
  o << "T=" << s.tokens << " D=" << s.d_model << " F=" << s.d_ff << " G=" << s.group_size << " kg=" << s.top_groups
    << " spg=" << s.subsample << " bias=" << s.bias << " dtype=" << (s.dtype == MOEKIT_DTYPE_BF16 ? "bf16" : "fp16");
  return o.str();
}

class Plan {
 public:
  Plan(moekit_handle_t handle, const Shape& s, int64_t max_tokens) {
    moekit_sparse_ffn_desc_t desc;
    moekit_sparse_ffn_desc_init(&desc);
    desc.max_tokens = max_tokens;
    desc.d_model = s.d_model;
    desc.d_ff = s.d_ff;
    desc.group_size = s.group_size;
    desc.top_groups = s.top_groups;
    desc.subsample = s.subsample;
    desc.dtype = s.dtype;
    MOEKIT_REQUIRE_OK(moekit_group_select_plan_create(handle, &desc, &plan_));
    MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan_, &workspace_bytes_));
  }
  ~Plan() { moekit_plan_destroy(plan_); }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  moekit_plan_t get() const { return plan_; }
  size_t workspace_bytes() const { return workspace_bytes_; }

 private:
  moekit_plan_t plan_ = nullptr;
  size_t workspace_bytes_ = 0;
};

// Weights and tokens of one (D, F, dtype), drawn once and reused by every shape of the sweep that has them (the
// draws, not the math, would otherwise dominate the test's time). Scaled so pre-activations are O(1).
struct Weights {
  HostTensor w_gate;
  std::vector<double> w_values;
  DeviceTensor device;
};

struct Tokens {
  HostTensor x;
  std::vector<double> x_values;
  DeviceTensor device;
};

struct Extras {  // subsample rows and the load-balance bias of one NG (and spg)
  HostTensor rows, bias;
  std::vector<int64_t> row_ids;
  std::vector<double> bias_values;
  DeviceTensor rows_device, bias_device;
};

Weights make_weights(int64_t d_ff, int64_t d_model, moekit_dtype_t dtype, std::mt19937_64& rng) {
  Weights w;
  w.w_gate = HostTensor(dtype, {d_ff, d_model});
  // Uniform x in [-1, 1] and w in [-s, s] give pre-activations of standard deviation sqrt(D) * s / 3 = 1.5.
  w.w_gate.fill_uniform(rng, 4.5 / std::sqrt(static_cast<double>(d_model)));
  w.w_values = w.w_gate.values();
  w.device = DeviceTensor(w.w_gate);
  return w;
}

Tokens make_tokens(int64_t tokens, int64_t d_model, moekit_dtype_t dtype, std::mt19937_64& rng) {
  Tokens t;
  t.x = HostTensor(dtype, {tokens, d_model});
  t.x.fill_uniform(rng, 1.0);
  t.x_values = t.x.values();
  t.device = DeviceTensor(t.x);
  return t;
}

Extras make_extras(int64_t groups, int64_t group_size, int64_t subsample, std::mt19937_64& rng) {
  Extras e;
  e.rows = HostTensor(MOEKIT_DTYPE_INT32, {groups, std::max<int64_t>(subsample, 1)});
  if (subsample > 0) {
    std::vector<int32_t> drawn(static_cast<size_t>(groups * subsample));
    MOEKIT_REQUIRE_OK(moekit_subsample_rows(rng(), groups, group_size, subsample, drawn.data()));
    for (size_t i = 0; i < drawn.size(); ++i) e.rows.set(static_cast<int64_t>(i), drawn[i]);
    e.row_ids.assign(drawn.begin(), drawn.end());
  }
  e.bias = HostTensor(MOEKIT_DTYPE_FP32, {groups});
  e.bias.fill_uniform(rng, 0.3);
  e.bias_values = e.bias.values();
  e.rows_device = DeviceTensor(e.rows);
  e.bias_device = DeviceTensor(e.bias);
  return e;
}

// en[g] for token t in float64, the reference's formula: (G / spg) * sum over the group's (subsample) rows of
// |silu(round(x_t . Wg_n))| * exp(bias[g]).
std::vector<double> token_energies(const Shape& s, const std::vector<double>& x, const Weights& w, const Extras& e,
                                   int64_t t) {
  const int64_t D = s.d_model, G = s.group_size, spg = s.subsample > 0 ? s.subsample : G;
  std::vector<double> energy(static_cast<size_t>(s.groups()));
  for (int64_t g = 0; g < s.groups(); ++g) {
    double sum = 0;
    for (int64_t j = 0; j < spg; ++j) {
      int64_t n = s.subsample > 0 ? e.row_ids[static_cast<size_t>(g * spg + j)] : g * G + j;
      double z = 0;
      for (int64_t c = 0; c < D; ++c)
        z += x[static_cast<size_t>(t * D + c)] * w.w_values[static_cast<size_t>(n * D + c)];
      z = moekit::round_to(z, s.dtype);
      sum += std::fabs(z / (1.0 + std::exp(-z)));
    }
    if (s.subsample > 0) sum *= static_cast<double>(G) / static_cast<double>(spg);
    if (s.bias) sum *= std::exp(e.bias_values[static_cast<size_t>(g)]);
    energy[static_cast<size_t>(g)] = sum;
  }
  return energy;
}

moekit_group_select_args_t select_args(const Shape& s, moekit_tensor_t x, moekit_tensor_t w_gate, Extras& e,
                                       bool on_device, moekit_tensor_t groups, moekit_tensor_t counts) {
  moekit_group_select_args_t args;
  moekit_group_select_args_init(&args);
  args.x = x;
  args.w_gate = w_gate;
  if (s.subsample > 0) args.subsample_rows = on_device ? e.rows_device.view() : e.rows.view();
  if (s.bias) args.lb_bias = on_device ? e.bias_device.view() : e.bias.view();
  args.groups = groups;
  args.counts = counts;
  return args;
}

// Runs the reference on the host tensors: groups [T, kg] and counts [NG].
std::pair<HostTensor, HostTensor> reference_select(Handles& h, const Shape& s, Tokens& tokens, Weights& w, Extras& e) {
  Plan plan(h.reference, s, s.tokens);
  std::vector<uint8_t> workspace(plan.workspace_bytes());
  HostTensor groups(MOEKIT_DTYPE_INT32, {s.tokens, s.top_groups}), counts(MOEKIT_DTYPE_INT32, {s.groups()});
  groups.poison();
  counts.poison();
  moekit_group_select_args_t args = select_args(s, tokens.x.view(), w.w_gate.view(), e, false, groups.view(),
                                                counts.view());
  MOEKIT_REQUIRE_OK(moekit_group_select(plan.get(), &args, workspace.empty() ? nullptr : workspace.data(),
                                        workspace.size(), nullptr));
  return {std::move(groups), std::move(counts)};
}

// Checks the CUDA groups of every token against the reference's (near-ties allowed, see the file comment), and
// the CUDA counts (when given) against the histogram of the CUDA groups. Returns the tokens whose groups differ.
int64_t check_selection(const Shape& s, const Tokens& tokens, const Weights& w, const Extras& e,
                        const HostTensor& want, const HostTensor& got, const HostTensor* counts) {
  const int64_t NG = s.groups(), kg = s.top_groups;
  std::vector<int64_t> histogram(static_cast<size_t>(NG), 0);
  int64_t differing = 0;
  std::string failure;
  for (int64_t t = 0; t < s.tokens && failure.empty(); ++t) {
    std::vector<int64_t> mine(static_cast<size_t>(kg)), theirs(static_cast<size_t>(kg));
    for (int64_t i = 0; i < kg; ++i) {
      mine[static_cast<size_t>(i)] = static_cast<int64_t>(got.get(t * kg + i));
      theirs[static_cast<size_t>(i)] = static_cast<int64_t>(want.get(t * kg + i));
    }
    for (int64_t g : mine) {
      if (g < 0 || g >= NG) failure = "token " + std::to_string(t) + ": group " + std::to_string(g) + " out of range";
      else ++histogram[static_cast<size_t>(g)];
    }
    std::vector<int64_t> sorted = mine;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
      failure = "token " + std::to_string(t) + ": a group is selected twice";
    if (!failure.empty() || mine == theirs) continue;
    ++differing;
    std::vector<double> energy = token_energies(s, tokens.x_values, w, e, t);
    for (int64_t i = 0; i < kg; ++i) {
      double a = energy[static_cast<size_t>(theirs[static_cast<size_t>(i)])];
      double b = energy[static_cast<size_t>(mine[static_cast<size_t>(i)])];
      if (!(std::fabs(a - b) <= 1e-3 * std::max(a, b))) {
        std::ostringstream o;
        o << "token " << t << " rank " << i << ": CUDA chose group " << mine[static_cast<size_t>(i)] << " (energy "
          << b << "), the reference group " << theirs[static_cast<size_t>(i)] << " (energy " << a
          << "): not a near-tie";
        failure = o.str();
      }
    }
  }
  INFO(text(s));
  INFO(failure);
  REQUIRE(failure.empty());
  if (counts) {
    std::vector<int64_t> got_counts(static_cast<size_t>(NG));
    for (int64_t g = 0; g < NG; ++g) got_counts[static_cast<size_t>(g)] = static_cast<int64_t>(counts->get(g));
    REQUIRE(got_counts == histogram);
  }
  // Near-ties are rare: a difference on many tokens is a bug that happens to stay under the tolerance.
  REQUIRE(differing <= std::max<int64_t>(2, s.tokens / 10));
  return differing;
}

// The shape table: every combination of the given token counts, D, F, G, kg, spg, bias and dtype
// (kg > NG skipped). Weights, tokens, subsample rows and bias are drawn once per (D, F, dtype), (T, D, dtype) and
// (NG, spg) and shared by the shapes that have them.
void sweep(const std::vector<int64_t>& token_counts, const std::vector<int64_t>& d_models,
           const std::vector<int64_t>& d_ffs) {
  Handles h;
  std::mt19937_64 rng(20240611);
  int64_t cases = 0, differing = 0;
  for (moekit_dtype_t dtype : {MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP16})
    for (int64_t D : d_models)
      for (int64_t F : d_ffs) {
        Weights w = make_weights(F, D, dtype, rng);
        for (int64_t T : token_counts) {
          Tokens tokens = make_tokens(T, D, dtype, rng);
          for (int64_t G : {16, 32, 64, 128})
            for (int64_t spg : {0, 8}) {
              Extras e = make_extras(F / G, G, spg, rng);
              for (int64_t kg : {1, 4})
                for (bool bias : {false, true}) {
                  Shape s{T, D, F, G, kg, spg, bias, dtype};
                  if (kg > s.groups()) continue;
                  auto [want_groups, want_counts] = reference_select(h, s, tokens, w, e);

                  Plan plan(h.cuda, s, T);
                  DeviceBuffer workspace(plan.workspace_bytes());
                  HostTensor poison_groups(MOEKIT_DTYPE_INT32, {T, kg}), poison_counts(MOEKIT_DTYPE_INT32, {F / G});
                  poison_groups.poison();
                  poison_counts.poison();
                  DeviceTensor groups(poison_groups), counts(poison_counts);
                  // Counts are optional: left out in a quarter of the shapes.
                  const bool with_counts = bias || kg > 1;
                  moekit_group_select_args_t args = select_args(s, tokens.device.view(), w.device.view(), e, true,
                                                                groups.view(), with_counts ? counts.view() : moekit_tensor_t{});
                  INFO(text(s));
                  MOEKIT_REQUIRE_OK(moekit_group_select(plan.get(), &args, workspace.data(), workspace.bytes(), nullptr));
                  CUDA_REQUIRE(cudaDeviceSynchronize());
                  HostTensor got_counts = counts.download();
                  differing += check_selection(s, tokens, w, e, want_groups, groups.download(),
                                               with_counts ? &got_counts : nullptr);
                  if (!with_counts) REQUIRE(got_counts.bytes_equal(poison_counts));
                  ++cases;
                }
            }
        }
      }
  WARN(cases << " shapes, " << differing << " tokens with a near-tie difference from the reference");
}

}  // namespace

TEST_CASE("CUDA group select matches the reference: small shapes", "[sanitize][gpu][group_select]") {
  sweep({1, 7}, {64}, {256});
}

TEST_CASE("CUDA group select matches the reference: the shape table", "[gpu][group_select][large]") {
  sweep({1, 7, 512}, {64, 1024}, {256, 4096});
}

TEST_CASE("CUDA group select runs several token chunks", "[gpu][group_select][large]") {
  // F = 4096 neurons in groups of 16 with all rows: 8 KiB of pre-activation per token, so the plan's 16 MiB chunk
  // holds 2048 tokens and 4100 tokens take three chunks (the last of 4 tokens); max_tokens is larger still.
  Handles h;
  std::mt19937_64 rng(77);
  const Shape s{4100, 64, 4096, 16, 4, 0, true, MOEKIT_DTYPE_BF16};
  Weights w = make_weights(s.d_ff, s.d_model, s.dtype, rng);
  Tokens tokens = make_tokens(s.tokens, s.d_model, s.dtype, rng);
  Extras e = make_extras(s.groups(), s.group_size, s.subsample, rng);
  auto [want_groups, want_counts] = reference_select(h, s, tokens, w, e);
  Plan plan(h.cuda, s, 6000);
  DeviceBuffer workspace(plan.workspace_bytes());
  HostTensor poison_groups(MOEKIT_DTYPE_INT32, {s.tokens, s.top_groups}), poison_counts(MOEKIT_DTYPE_INT32, {s.groups()});
  poison_groups.poison();
  poison_counts.poison();
  DeviceTensor groups(poison_groups), counts(poison_counts);
  moekit_group_select_args_t args =
      select_args(s, tokens.device.view(), w.device.view(), e, true, groups.view(), counts.view());
  MOEKIT_REQUIRE_OK(moekit_group_select(plan.get(), &args, workspace.data(), workspace.bytes(), nullptr));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  HostTensor got_counts = counts.download();
  check_selection(s, tokens, w, e, want_groups, groups.download(), &got_counts);
}

TEST_CASE("CUDA group select is bitwise reproducible over reruns, streams, workspaces and strided views",
          "[gpu][group_select]") {
  Handles h;
  std::mt19937_64 rng(4242);
  for (int64_t spg : {0, 8}) {
    const Shape s{512, 1024, 4096, 32, 4, spg, true, MOEKIT_DTYPE_BF16};
    INFO(text(s));
    Weights w = make_weights(s.d_ff, s.d_model, s.dtype, rng);
    Tokens tokens = make_tokens(s.tokens, s.d_model, s.dtype, rng);
    Extras e = make_extras(s.groups(), s.group_size, s.subsample, rng);
    auto [want_groups, want_counts] = reference_select(h, s, tokens, w, e);

    // x with a row stride of D + 8 and groups with a row stride of kg + 3; the padding must stay poisoned.
    const int64_t x_stride = s.d_model + 8, groups_stride = s.top_groups + 3;
    HostTensor x_padded(s.dtype, {s.tokens, x_stride});
    x_padded.fill_uniform(rng, 1.0);
    for (int64_t t = 0; t < s.tokens; ++t)
      for (int64_t c = 0; c < s.d_model; ++c) x_padded.set(t * x_stride + c, tokens.x.get(t * s.d_model + c));
    DeviceTensor x_device(x_padded);
    moekit_tensor_t x_view = x_device.view();
    x_view.shape[1] = s.d_model;
    HostTensor poison_groups(MOEKIT_DTYPE_INT32, {s.tokens, groups_stride}), poison_counts(MOEKIT_DTYPE_INT32, {s.groups()});
    poison_groups.poison();
    poison_counts.poison();
    DeviceTensor groups(poison_groups), counts(poison_counts);
    moekit_tensor_t groups_view = groups.view();
    groups_view.shape[1] = s.top_groups;

    Plan plan(h.cuda, s, s.tokens);
    DeviceBuffer workspace_a(plan.workspace_bytes()), workspace_b(plan.workspace_bytes() + 4096);
    cudaStream_t stream = nullptr;
    CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    moekit_group_select_args_t args = select_args(s, x_view, w.device.view(), e, true, groups_view, counts.view());

    std::vector<std::pair<HostTensor, HostTensor>> results;
    struct Run {
      void* workspace;
      size_t bytes;
      cudaStream_t stream;
    };
    // Three reruns on the default stream, one on another stream, one with another workspace (offset by 256 bytes
    // so every section sits at another address).
    const std::vector<Run> runs{{workspace_a.data(), workspace_a.bytes(), nullptr},
                                {workspace_a.data(), workspace_a.bytes(), nullptr},
                                {workspace_a.data(), workspace_a.bytes(), nullptr},
                                {workspace_a.data(), workspace_a.bytes(), stream},
                                {static_cast<char*>(workspace_b.data()) + 256, workspace_b.bytes() - 256, stream}};
    for (const Run& run : runs) {
      groups.upload(poison_groups);
      counts.upload(poison_counts);
      // A pageable upload may still be in flight when cudaMemcpy returns; the other stream must not overtake it.
      CUDA_REQUIRE(cudaDeviceSynchronize());
      MOEKIT_REQUIRE_OK(moekit_group_select(plan.get(), &args, run.workspace, run.bytes, run.stream));
      CUDA_REQUIRE(cudaDeviceSynchronize());
      results.emplace_back(groups.download(), counts.download());
    }
    CUDA_REQUIRE(cudaStreamDestroy(stream));
    for (size_t i = 1; i < results.size(); ++i) {
      INFO("run " << i);
      REQUIRE(results[i].first.bytes_equal(results[0].first));
      REQUIRE(results[i].second.bytes_equal(results[0].second));
    }

    const HostTensor& padded = results[0].first;
    HostTensor dense(MOEKIT_DTYPE_INT32, {s.tokens, s.top_groups});
    for (int64_t t = 0; t < s.tokens; ++t) {
      for (int64_t i = 0; i < s.top_groups; ++i) dense.set(t * s.top_groups + i, padded.get(t * groups_stride + i));
      for (int64_t i = s.top_groups; i < groups_stride; ++i)
        REQUIRE(padded.get(t * groups_stride + i) == poison_groups.get(t * groups_stride + i));
    }
    check_selection(s, tokens, w, e, want_groups, dense, &results[0].second);
  }
}

TEST_CASE("CUDA group select reports fp32 storage as not supported", "[gpu][group_select]") {
  Handles h;
  moekit_sparse_ffn_desc_t desc;
  moekit_sparse_ffn_desc_init(&desc);
  desc.max_tokens = 8;
  desc.d_model = 64;
  desc.d_ff = 256;
  desc.group_size = 32;
  desc.top_groups = 2;
  desc.dtype = MOEKIT_DTYPE_FP32;
  moekit_plan_t plan = nullptr;
  REQUIRE(moekit_group_select_plan_create(h.cuda, &desc, &plan) == MOEKIT_STATUS_NOT_SUPPORTED);
  REQUIRE(last_error().find("dtype") != std::string::npos);
}

namespace {

// Runs the load-balance update on both backends from the same counts, ema and bias; both must write the same
// bits.
void check_load_balance(Handles& h, const HostTensor& counts, const HostTensor& ema, const HostTensor& bias,
                        double tokens, int64_t top_groups, double momentum, double gamma, double bias_max) {
  auto args_for = [&](moekit_tensor_t c, moekit_tensor_t e, moekit_tensor_t b) {
    moekit_load_balance_args_t a;
    moekit_load_balance_args_init(&a);
    a.counts = c;
    a.ema = e;
    a.bias = b;
    a.tokens = tokens;
    a.top_groups = top_groups;
    a.momentum = momentum;
    a.gamma = gamma;
    a.bias_max = bias_max;
    return a;
  };
  HostTensor counts_host = counts, ema_ref = ema, bias_ref = bias;
  moekit_load_balance_args_t ref_args = args_for(counts_host.view(), ema_ref.view(), bias_ref.view());
  MOEKIT_REQUIRE_OK(moekit_load_balance_update(h.reference, &ref_args, nullptr));

  DeviceTensor counts_device(counts), ema_device(ema), bias_device(bias);
  moekit_load_balance_args_t cuda_args = args_for(counts_device.view(), ema_device.view(), bias_device.view());
  MOEKIT_REQUIRE_OK(moekit_load_balance_update(h.cuda, &cuda_args, nullptr));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  REQUIRE(ema_device.download().bytes_equal(ema_ref));
  REQUIRE(bias_device.download().bytes_equal(bias_ref));
  // The update did something: some bias moved.
  REQUIRE(!bias_ref.bytes_equal(bias));
}

}  // namespace

TEST_CASE("CUDA load-balance update equals the reference bit for bit", "[sanitize][gpu][load_balance]") {
  Handles h;
  std::mt19937_64 rng(99);
  for (moekit_dtype_t counts_dtype : {MOEKIT_DTYPE_INT32, MOEKIT_DTYPE_INT64, MOEKIT_DTYPE_FP32})
    for (int64_t groups : {64, 1000}) {
      INFO("counts dtype " << counts_dtype << ", NG " << groups);
      const int64_t top_groups = 4;
      const double tokens = 4096, target = static_cast<double>(top_groups) / static_cast<double>(groups);
      std::uniform_real_distribution<double> spread(0.0, 3.0);
      HostTensor counts(counts_dtype, {groups}), ema(MOEKIT_DTYPE_FP32, {groups}), bias(MOEKIT_DTYPE_FP32, {groups});
      {  // random counts, ema and bias with the trained defaults
        for (int64_t g = 0; g < groups; ++g) {
          counts.set(g, std::floor(spread(rng) * target * tokens));
          ema.set(g, spread(rng) * target);
          bias.set(g, (spread(rng) - 1.5) / 3.0);
        }
        check_load_balance(h, counts, ema, bias, tokens, top_groups, 0.99, 1e-3, 0.5);
      }
      {  // ema exactly at half and twice the target (left alone), just past them, and clamped bias
        // momentum 0: ema = counts / tokens, exact for these dyadic values when NG = 64 (target 1/16).
        for (int64_t g = 0; g < groups; ++g) {
          const double half = 0.5 * target * tokens, twice = 2 * target * tokens;
          const double choices[] = {std::round(half), std::round(half) - 1, std::round(twice), std::round(twice) + 1,
                                    std::round(target * tokens)};
          counts.set(g, choices[g % 5]);
          ema.set(g, 0.25);
          // Every fourth group starts near a clamp bound, in the direction its step would push it.
          double start = (g % 4 == 0) ? (g % 5 == 1 ? 0.4995 : -0.4995) : 0.1 * std::sin(static_cast<double>(g));
          bias.set(g, start);
        }
        check_load_balance(h, counts, ema, bias, tokens, top_groups, 0.0, 1e-3, 0.5);
        if (groups == 64) {
          // The reference's rules, spelled out for NG = 64: counts 128 / 4096 = target/2 and 512 / 4096 = 2 target
          // are left alone (strict), 127 raises the bias, 513 lowers it, and the clamp holds at 0.5.
          HostTensor e = ema, b = bias;
          moekit_load_balance_args_t a;
          moekit_load_balance_args_init(&a);
          HostTensor c = counts;
          a.counts = c.view();
          a.ema = e.view();
          a.bias = b.view();
          a.tokens = tokens;
          a.top_groups = top_groups;
          a.momentum = 0.0;
          a.gamma = 1e-3;
          a.bias_max = 0.5;
          MOEKIT_REQUIRE_OK(moekit_load_balance_update(h.reference, &a, nullptr));
          for (int64_t g = 0; g < groups; ++g) {
            const double before = static_cast<double>(static_cast<float>(bias.get(g)));
            double want = before;
            if (g % 5 == 1) want = std::min(before + 1e-3, 0.5);
            if (g % 5 == 3) want = std::max(before - 1e-3, -0.5);
            INFO("group " << g);
            REQUIRE(b.get(g) == static_cast<double>(static_cast<float>(want)));
          }
        }
      }
    }
}
