// The sparse SwiGLU FFN layer (docs/math.md section 7) through the C ABI on the reference backend, against the dense
// masked formula written in the test: a dense SwiGLU over all F neurons whose non-selected neurons' product is zeroed,
// and its masked backward. The selection is the group-selection building block's (checked on its own elsewhere); here
// the layer must report the same groups and compute everything else from them.
#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "layer_reference.h"
#include "src/numeric.h"

using layer_test::require_matches;
using moekit_test::HostTensor;
using moekit_test::AlignedBuffer;
using moekit_test::PlanOwner;
using moekit_test::ReferenceHandle;

namespace {

double sig(double z) { return 1.0 / (1.0 + std::exp(-z)); }

struct Config {
  int64_t tokens = 11, d_model = 24, d_ff = 64, group_size = 16, top_groups = 2, subsample = 0;
  moekit_dtype_t dtype = MOEKIT_DTYPE_BF16;
  double beta_out = 0;
  bool lb_bias = false;

  int64_t groups() const { return d_ff / group_size; }
  std::string describe() const {
    std::ostringstream s;
    s << "T " << tokens << " D " << d_model << " F " << d_ff << " G " << group_size << " kg " << top_groups << " spg "
      << subsample << " dtype " << dtype << " beta_out " << beta_out << " lb_bias " << lb_bias;
    return s.str();
  }
};

struct SparseFfn {
  Config c;
  PlanOwner plan;
  AlignedBuffer saved{0};
  HostTensor x, wg, wu, wd, subsample_rows, lb_bias, out, groups, counts, dout, dx, dwg, dwu, dwd;

  SparseFfn(moekit_handle_t handle, const Config& config, std::mt19937_64& rng) : c(config) {
    moekit_sparse_ffn_desc_t d;
    moekit_sparse_ffn_desc_init(&d);
    d.max_tokens = c.tokens;
    d.d_model = c.d_model;
    d.d_ff = c.d_ff;
    d.group_size = c.group_size;
    d.top_groups = c.top_groups;
    d.subsample = c.subsample;
    d.dtype = c.dtype;
    MOEKIT_REQUIRE_OK(moekit_sparse_ffn_plan_create(handle, &d, &plan.plan));
    size_t bytes = 0;
    MOEKIT_REQUIRE_OK(moekit_plan_saved_size(plan.plan, &bytes));
    saved = AlignedBuffer(bytes);
    const int64_t T = c.tokens, D = c.d_model, F = c.d_ff, NG = c.groups();
    x = HostTensor(c.dtype, {T, D});
    wg = HostTensor(c.dtype, {F, D});
    wu = HostTensor(c.dtype, {F, D});
    wd = HostTensor(c.dtype, {D, F});
    x.fill_uniform(rng, 1.0);
    wg.fill_uniform(rng, 2.0 / std::sqrt(double(D)));
    wu.fill_uniform(rng, 2.0 / std::sqrt(double(D)));
    wd.fill_uniform(rng, 2.0 / std::sqrt(double(c.top_groups * c.group_size)));
    subsample_rows = HostTensor(MOEKIT_DTYPE_INT32, {NG, std::max<int64_t>(c.subsample, 1)});
    if (c.subsample > 0) {
      std::vector<int32_t> rows(static_cast<size_t>(NG * c.subsample));
      MOEKIT_REQUIRE_OK(moekit_subsample_rows(7, NG, c.group_size, c.subsample, rows.data()));
      for (size_t i = 0; i < rows.size(); ++i) subsample_rows.set(static_cast<int64_t>(i), rows[i]);
    }
    lb_bias = HostTensor(MOEKIT_DTYPE_FP32, {NG});
    lb_bias.fill_uniform(rng, 0.3);
    out = HostTensor(c.dtype, {T, D});
    out.fill_uniform(rng, 1.0);
    groups = HostTensor(MOEKIT_DTYPE_INT32, {T, c.top_groups});
    counts = HostTensor(MOEKIT_DTYPE_INT32, {NG});
    dout = HostTensor(c.dtype, {T, D});
    dout.fill_uniform(rng, 1.0);
    dx = HostTensor(c.dtype, {T, D});
    dwg = HostTensor(c.dtype, {F, D});
    dwu = HostTensor(c.dtype, {F, D});
    dwd = HostTensor(c.dtype, {D, F});
  }

  // With beta_out = 0, out is poisoned first; otherwise it keeps its values.
  moekit_status_t forward() {
    if (c.beta_out == 0) out.poison();
    groups.poison();
    counts.poison();
    moekit_sparse_ffn_fwd_args_t a;
    moekit_sparse_ffn_fwd_args_init(&a);
    a.x = x.view();
    a.w_gate = wg.view();
    a.w_up = wu.view();
    a.w_down = wd.view();
    if (c.subsample > 0) a.subsample_rows = subsample_rows.view();
    if (c.lb_bias) a.lb_bias = lb_bias.view();
    a.out = out.view();
    a.groups = groups.view();
    a.counts = counts.view();
    a.beta_out = c.beta_out;
    return moekit_sparse_ffn_forward(plan.plan, &a, saved.data(), saved.size(), nullptr, 0, nullptr);
  }

  moekit_status_t backward(void* saved_data, size_t saved_bytes) {
    for (HostTensor* g : {&dx, &dwg, &dwu, &dwd}) g->poison();
    moekit_sparse_ffn_bwd_args_t a;
    moekit_sparse_ffn_bwd_args_init(&a);
    a.x = x.view();
    a.w_gate = wg.view();
    a.w_up = wu.view();
    a.w_down = wd.view();
    a.dout = dout.view();
    a.dx = dx.view();
    a.dw_gate = dwg.view();
    a.dw_up = dwu.view();
    a.dw_down = dwd.view();
    return moekit_sparse_ffn_backward(plan.plan, &a, saved_data, saved_bytes, nullptr, 0, nullptr);
  }

  // The group-selection building block on the same inputs.
  std::vector<double> selected_groups(moekit_handle_t handle) {
    moekit_sparse_ffn_desc_t d;
    moekit_sparse_ffn_desc_init(&d);
    d.max_tokens = c.tokens;
    d.d_model = c.d_model;
    d.d_ff = c.d_ff;
    d.group_size = c.group_size;
    d.top_groups = c.top_groups;
    d.subsample = c.subsample;
    d.dtype = c.dtype;
    PlanOwner select;
    MOEKIT_REQUIRE_OK(moekit_group_select_plan_create(handle, &d, &select.plan));
    HostTensor selected(MOEKIT_DTYPE_INT32, {c.tokens, c.top_groups});
    moekit_group_select_args_t a;
    moekit_group_select_args_init(&a);
    a.x = x.view();
    a.w_gate = wg.view();
    if (c.subsample > 0) a.subsample_rows = subsample_rows.view();
    if (c.lb_bias) a.lb_bias = lb_bias.view();
    a.groups = selected.view();
    MOEKIT_REQUIRE_OK(moekit_group_select(select.plan, &a, nullptr, 0, nullptr));
    return selected.values();
  }
};

// The dense masked SwiGLU of every token, forward and backward.
struct DenseMasked {
  const Config& c;
  std::vector<double> x, wg, wu, wd, dout;
  std::vector<std::vector<bool>> selected;  // [T][F]
  std::vector<double> gate, up, p;          // [T, F], p zero where not selected

  DenseMasked(SparseFfn& layer, const std::vector<double>& groups)
      : c(layer.c), x(layer.x.values()), wg(layer.wg.values()), wu(layer.wu.values()), wd(layer.wd.values()),
        dout(layer.dout.values()) {
    const int64_t T = c.tokens, D = c.d_model, F = c.d_ff;
    selected.assign(static_cast<size_t>(T), std::vector<bool>(static_cast<size_t>(F), false));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < c.top_groups; ++j) {
        int64_t g = static_cast<int64_t>(groups[static_cast<size_t>(t * c.top_groups + j)]);
        for (int64_t n = g * c.group_size; n < (g + 1) * c.group_size; ++n)
          selected[static_cast<size_t>(t)][static_cast<size_t>(n)] = true;
      }
    gate.assign(static_cast<size_t>(T * F), 0.0);
    up = gate;
    p = gate;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < F; ++n) {
        double sg = 0, su = 0;
        for (int64_t k = 0; k < D; ++k) {
          sg += x[static_cast<size_t>(t * D + k)] * wg[static_cast<size_t>(n * D + k)];
          su += x[static_cast<size_t>(t * D + k)] * wu[static_cast<size_t>(n * D + k)];
        }
        size_t at = static_cast<size_t>(t * F + n);
        gate[at] = round(sg);
        up[at] = round(su);
        if (selected[static_cast<size_t>(t)][static_cast<size_t>(n)])
          p[at] = round(gate[at] * sig(gate[at]) * up[at]);
      }
  }

  double round(double v) const { return moekit::round_to(v, c.dtype); }

  std::vector<double> forward(const std::vector<double>& out_before) const {
    const int64_t T = c.tokens, D = c.d_model, F = c.d_ff;
    std::vector<double> out(static_cast<size_t>(T * D));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < D; ++d) {
        double sum = 0;
        for (int64_t n = 0; n < F; ++n) sum += p[static_cast<size_t>(t * F + n)] * wd[static_cast<size_t>(d * F + n)];
        size_t at = static_cast<size_t>(t * D + d);
        out[at] = round((c.beta_out != 0 ? c.beta_out * out_before[at] : 0.0) + sum);
      }
    return out;
  }

  struct Gradients {
    std::vector<double> dx, dwg, dwu, dwd;
  };
  Gradients backward() const {
    const int64_t T = c.tokens, D = c.d_model, F = c.d_ff;
    Gradients g;
    g.dx.assign(static_cast<size_t>(T * D), 0.0);
    g.dwg.assign(static_cast<size_t>(F * D), 0.0);
    g.dwu = g.dwg;
    g.dwd = g.dwg;
    std::vector<double> dgate(static_cast<size_t>(F)), dup(static_cast<size_t>(F));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t n = 0; n < F; ++n) {
        size_t at = static_cast<size_t>(t * F + n);
        dgate[static_cast<size_t>(n)] = dup[static_cast<size_t>(n)] = 0;
        if (!selected[static_cast<size_t>(t)][static_cast<size_t>(n)]) continue;
        double dp = 0;
        for (int64_t d = 0; d < D; ++d) dp += dout[static_cast<size_t>(t * D + d)] * wd[static_cast<size_t>(d * F + n)];
        double s = sig(gate[at]);
        dgate[static_cast<size_t>(n)] = round(dp * up[at] * s * (1 + gate[at] * (1 - s)));
        dup[static_cast<size_t>(n)] = round(dp * gate[at] * s);
      }
      for (int64_t d = 0; d < D; ++d) {
        double sum = 0;
        for (int64_t n = 0; n < F; ++n)
          sum += dgate[static_cast<size_t>(n)] * wg[static_cast<size_t>(n * D + d)] +
                 dup[static_cast<size_t>(n)] * wu[static_cast<size_t>(n * D + d)];
        g.dx[static_cast<size_t>(t * D + d)] = round(sum);
      }
      for (int64_t n = 0; n < F; ++n)
        for (int64_t d = 0; d < D; ++d) {
          g.dwg[static_cast<size_t>(n * D + d)] += dgate[static_cast<size_t>(n)] * x[static_cast<size_t>(t * D + d)];
          g.dwu[static_cast<size_t>(n * D + d)] += dup[static_cast<size_t>(n)] * x[static_cast<size_t>(t * D + d)];
          g.dwd[static_cast<size_t>(d * F + n)] += dout[static_cast<size_t>(t * D + d)] * p[static_cast<size_t>(t * F + n)];
        }
    }
    for (std::vector<double>* v : {&g.dwg, &g.dwu, &g.dwd})
      for (double& value : *v) value = round(value);
    return g;
  }
};

void check_layer(moekit_handle_t handle, const Config& c, std::mt19937_64& rng) {
  INFO(c.describe());
  SparseFfn layer(handle, c, rng);
  std::vector<double> out_before = layer.out.values();
  MOEKIT_REQUIRE_OK(layer.forward());
  std::vector<double> groups = layer.groups.values();
  REQUIRE(groups == layer.selected_groups(handle));
  std::vector<double> counts(static_cast<size_t>(c.groups()), 0.0);
  for (double g : groups) counts[static_cast<size_t>(g)] += 1;
  REQUIRE(layer.counts.values() == counts);

  DenseMasked ref(layer, groups);
  require_matches(layer.out.values(), ref.forward(out_before), c.dtype, "out");

  MOEKIT_REQUIRE_OK(layer.backward(layer.saved.data(), layer.saved.size()));
  DenseMasked::Gradients g = ref.backward();
  require_matches(layer.dx.values(), g.dx, c.dtype, "dx");
  require_matches(layer.dwg.values(), g.dwg, c.dtype, "dw_gate");
  require_matches(layer.dwu.values(), g.dwu, c.dtype, "dw_up");
  require_matches(layer.dwd.values(), g.dwd, c.dtype, "dw_down");
  // Rows (columns of Wd) of groups no token selected get exactly 0.
  for (int64_t group = 0; group < c.groups(); ++group) {
    if (counts[static_cast<size_t>(group)] != 0) continue;
    for (int64_t n = group * c.group_size; n < (group + 1) * c.group_size; ++n) {
      for (int64_t d = 0; d < c.d_model; ++d) {
        REQUIRE(layer.dwg.get(n * c.d_model + d) == 0.0);
        REQUIRE(layer.dwd.get(d * c.d_ff + n) == 0.0);
      }
    }
  }
}

}  // namespace

TEST_CASE("sparse ffn forward and backward equal the dense masked SwiGLU (bf16 and fp64)", "[sparse_ffn]") {
  ReferenceHandle handle;
  std::mt19937_64 rng(401);
  for (moekit_dtype_t dtype : {MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP64}) {
    Config c;
    c.dtype = dtype;
    check_layer(handle.handle, c, rng);
    c.beta_out = 1.0;
    c.lb_bias = true;
    check_layer(handle.handle, c, rng);
  }
}

TEST_CASE("sparse ffn: subsampled energies, one group per token, many groups (some never selected), fp16",
          "[sparse_ffn]") {
  ReferenceHandle handle;
  std::mt19937_64 rng(402);
  Config c;
  c.subsample = 4;
  check_layer(handle.handle, c, rng);
  c = Config{};
  c.top_groups = 1;
  c.tokens = 3;
  c.d_ff = 256;  // 16 groups for 3 tokens: most groups are never selected
  check_layer(handle.handle, c, rng);
  c = Config{};
  c.dtype = MOEKIT_DTYPE_FP16;
  c.group_size = 32;
  c.d_ff = 128;
  c.top_groups = 3;
  check_layer(handle.handle, c, rng);
}

TEST_CASE("sparse ffn backward rejects a saved buffer from another plan", "[sparse_ffn]") {
  ReferenceHandle handle;
  std::mt19937_64 rng(403);
  Config c;
  SparseFfn first(handle.handle, c, rng), second(handle.handle, c, rng);
  MOEKIT_REQUIRE_OK(first.forward());
  MOEKIT_REQUIRE_OK(second.forward());
  REQUIRE(second.backward(first.saved.data(), first.saved.size()) == MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(moekit_test::last_error().rfind("saved", 0) == 0);
  REQUIRE(std::isnan(second.dx.get(0)));
  REQUIRE(std::isnan(second.dwg.get(0)));
}
