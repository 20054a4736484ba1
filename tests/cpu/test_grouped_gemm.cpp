// The grouped GEMM of docs/math.md section 5 through the C ABI on the reference backend, against loops written here:
// every mode x epilogue x activation x GLU layout x B layout x gather, bf16 and fp64, alpha / beta, group sizes
// that include 0 and are no tile multiple, and rows past offsets[E] left untouched (poisoned).
//
// Operands are small multiples of 1/8, so every product and sum is exact in float64 whatever the order: the
// STORE / BIAS / varlen-K outputs and the gated h must then match bit for bit, and values that go through an
// activation (computed independently here) within one unit in the last place of the output dtype.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "common/test_util.h"
#include "src/numeric.h"
#include "src/reference/matmul.h"

using moekit_test::HostTensor;
using moekit_test::PlanOwner;
using moekit_test::ReferenceHandle;

namespace {

// ---- the activations, written independently of the library ----------------------------------------------

double sig(double z) { return 1.0 / (1.0 + std::exp(-z)); }
double gelu(double z) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * z * (1.0 + std::tanh(c * (z + 0.044715 * z * z * z)));
}
double gelu_d(double z) {
  const double c = std::sqrt(2.0 / M_PI);
  double u = c * (z + 0.044715 * z * z * z);
  double t = std::tanh(u);
  return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * z * z);
}

bool gated(int32_t act) { return act < 16; }

// One h row (width 2I gated, I otherwise) -> a [I] and, given da [I], dh.
struct ActRef {
  int32_t act, layout;
  double limit;
  int64_t inter;

  int64_t gate_at(int64_t j) const { return layout == MOEKIT_GLU_INTERLEAVED ? 2 * j : j; }
  int64_t up_at(int64_t j) const { return layout == MOEKIT_GLU_INTERLEAVED ? 2 * j + 1 : inter + j; }

  double forward(const double* h, int64_t j) const {
    if (!gated(act)) {
      double z = h[j];
      switch (act) {
        case MOEKIT_ACT_GELU: return gelu(z);
        case MOEKIT_ACT_RELU: return z > 0 ? z : 0;
        case MOEKIT_ACT_SILU: return z * sig(z);
        default: return z > 0 ? z * z : 0;
      }
    }
    double g = h[gate_at(j)], u = h[up_at(j)];
    switch (act) {
      case MOEKIT_ACT_SWIGLU: return g * sig(g) * u;
      case MOEKIT_ACT_GEGLU: return gelu(g) * u;
      case MOEKIT_ACT_REGLU: return (g > 0 ? g : 0) * u;
      default: {
        double gc = g < limit ? g : limit;
        double uc = u < -limit ? -limit : (u > limit ? limit : u);
        return gc * sig(1.702 * gc) * (uc + 1);
      }
    }
  }

  // Writes the gradient of element j into dh.
  void backward(const double* h, int64_t j, double da, double* dh) const {
    if (!gated(act)) {
      double z = h[j];
      switch (act) {
        case MOEKIT_ACT_GELU: dh[j] = da * gelu_d(z); return;
        case MOEKIT_ACT_RELU: dh[j] = z > 0 ? da : 0; return;
        case MOEKIT_ACT_SILU: dh[j] = da * sig(z) * (1 + z * (1 - sig(z))); return;
        default: dh[j] = z > 0 ? da * 2 * z : 0; return;
      }
    }
    double g = h[gate_at(j)], u = h[up_at(j)];
    double& dg = dh[gate_at(j)];
    double& du = dh[up_at(j)];
    switch (act) {
      case MOEKIT_ACT_SWIGLU:
        dg = da * u * sig(g) * (1 + g * (1 - sig(g)));
        du = da * g * sig(g);
        return;
      case MOEKIT_ACT_GEGLU:
        dg = da * u * gelu_d(g);
        du = da * gelu(g);
        return;
      case MOEKIT_ACT_REGLU:
        dg = g > 0 ? da * u : 0;
        du = da * (g > 0 ? g : 0);
        return;
      default: {
        double gc = g < limit ? g : limit;
        double uc = u < -limit ? -limit : (u > limit ? limit : u);
        double s = sig(1.702 * gc);
        dg = g <= limit ? da * (uc + 1) * (s + 1.702 * gc * s * (1 - s)) : 0;
        du = (u >= -limit && u <= limit) ? da * gc * s : 0;
      }
    }
  }
};

// ---- fixtures ----------------------------------------------------------------------------------------------

void fill_eighths(HostTensor& t, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> q(-8, 8);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, q(rng) / 8.0);
}

HostTensor index_tensor(moekit_dtype_t dtype, const std::vector<int64_t>& values) {
  HostTensor t(dtype, {static_cast<int64_t>(values.size())});
  for (size_t i = 0; i < values.size(); ++i) t.set(static_cast<int64_t>(i), static_cast<double>(values[i]));
  return t;
}

std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets{0};
  for (int64_t c : counts) offsets.push_back(offsets.back() + c);
  return offsets;
}

// |out - ref| within one unit in the last place of `dtype` (plus a floor for values near 0).
void require_close(const std::vector<double>& out, const std::vector<double>& ref, moekit_dtype_t dtype,
                   const char* what) {
  double rtol = dtype == MOEKIT_DTYPE_BF16 ? 1.0 / 128 : (dtype == MOEKIT_DTYPE_FP32 ? 1e-6 : 1e-12);
  double atol = dtype == MOEKIT_DTYPE_FP64 ? 1e-13 : 1e-6;
  REQUIRE(out.size() == ref.size());
  for (size_t i = 0; i < out.size(); ++i) {
    INFO(what << "[" << i << "] = " << out[i] << ", expected " << ref[i]);
    REQUIRE(std::abs(out[i] - ref[i]) <= rtol * std::abs(ref[i]) + atol);
  }
}

void require_equal(const std::vector<double>& out, const std::vector<double>& ref, const char* what) {
  REQUIRE(out.size() == ref.size());
  for (size_t i = 0; i < out.size(); ++i) {
    INFO(what << "[" << i << "] = " << out[i] << ", expected " << ref[i]);
    REQUIRE(out[i] == ref[i]);
  }
}

// Rows [from, rows) of t still hold the poison (NaN).
void require_poisoned_from(const HostTensor& t, int64_t from, const char* what) {
  for (int64_t i = from * t.row_width(); i < t.numel(); ++i) {
    INFO(what << " element " << i << " past the groups' rows was written");
    REQUIRE(std::isnan(t.get(i)));
  }
}

// ---- varlen M ----------------------------------------------------------------------------------------------

struct VarlenMCase {
  int32_t epilogue;
  int32_t activation;
  int32_t glu_layout;
  int32_t b_layout;
  bool gather;
  moekit_dtype_t dtype;
  std::vector<int64_t> counts;
  int64_t n;  // output width (h's width for GATED / DGATED)
  int64_t k;
  double alpha, beta;
  bool bias;  // GATED: optional bias

  std::string describe() const {
    std::ostringstream s;
    s << "epilogue " << epilogue << " act " << activation << " glu " << glu_layout << " b_layout " << b_layout
      << " gather " << gather << " dtype " << dtype << " n " << n << " k " << k << " alpha " << alpha << " beta "
      << beta << " bias " << bias;
    return s.str();
  }
};

void run_varlen_m(const ReferenceHandle& handle, const VarlenMCase& c, std::mt19937_64& rng) {
  INFO(c.describe());
  const int64_t E = static_cast<int64_t>(c.counts.size());
  const std::vector<int64_t> offsets = offsets_of(c.counts);
  const int64_t valid = offsets.back();
  const int64_t max_rows = valid + 3;  // rows past offsets[E] must stay untouched
  const int64_t sources = 11;          // rows of the gathered source
  const bool is_gated_epilogue = c.epilogue == MOEKIT_EPILOGUE_GATED || c.epilogue == MOEKIT_EPILOGUE_DGATED;
  const int64_t act_width = is_gated_epilogue && gated(c.activation) ? c.n / 2 : c.n;
  // The product's width: DGATED multiplies into dA, as wide as a.
  const int64_t bn = c.epilogue == MOEKIT_EPILOGUE_DGATED ? act_width : c.n;
  const ActRef act{c.activation, c.glu_layout, 1.5, act_width};

  moekit_gemm_desc_t desc;
  moekit_gemm_desc_init(&desc);
  desc.mode = MOEKIT_GEMM_VARLEN_M;
  desc.b_layout = c.b_layout;
  desc.gather = c.gather ? MOEKIT_GEMM_GATHER_A : MOEKIT_GEMM_GATHER_NONE;
  desc.epilogue = c.epilogue;
  desc.activation = c.activation;
  desc.glu_layout = c.glu_layout;
  desc.glu_limit = act.limit;
  desc.groups = E;
  desc.max_rows = max_rows;
  desc.gather_rows = sources;
  desc.n = c.n;
  desc.k = c.k;
  desc.dtype = c.dtype;
  PlanOwner plan;
  MOEKIT_REQUIRE_OK(moekit_gemm_plan_create(handle.handle, &desc, &plan.plan));

  std::vector<int64_t> gather(static_cast<size_t>(max_rows), 0);
  std::uniform_int_distribution<int64_t> source(0, sources - 1);
  for (int64_t r = 0; r < valid; ++r) gather[static_cast<size_t>(r)] = source(rng);
  HostTensor a(c.dtype, {c.gather ? sources : max_rows, c.k});
  fill_eighths(a, rng);
  HostTensor b(c.dtype, c.b_layout == MOEKIT_GEMM_B_NK ? std::vector<int64_t>{E, bn, c.k} : std::vector<int64_t>{E, c.k, bn});
  fill_eighths(b, rng);
  HostTensor bias(c.dtype, {E, c.n});
  fill_eighths(bias, rng);
  HostTensor out(c.dtype, {max_rows, c.n});
  fill_eighths(out, rng);
  for (int64_t i = valid * c.n; i < out.numel(); ++i) out.set(i, NAN);
  const std::vector<double> out_before = out.values();
  HostTensor act_out(c.dtype, {max_rows, act_width});
  act_out.poison();
  HostTensor h(c.dtype, {max_rows, c.n});
  fill_eighths(h, rng);
  moekit_dtype_t score_dtype = c.dtype == MOEKIT_DTYPE_FP64 ? MOEKIT_DTYPE_FP64 : MOEKIT_DTYPE_FP32;
  HostTensor row_scale(score_dtype, {max_rows});
  row_scale.fill_uniform(rng, 1.0);
  HostTensor dscores(score_dtype, {max_rows});
  dscores.poison();
  // pair_idx: a permutation of part of the pairs, so some dscores entries are not any row's pair.
  std::vector<int64_t> pair_idx(static_cast<size_t>(max_rows));
  for (int64_t r = 0; r < max_rows; ++r) pair_idx[static_cast<size_t>(r)] = (r * 5 + 2) % max_rows;
  HostTensor offsets_t = index_tensor(MOEKIT_DTYPE_INT32, offsets);
  HostTensor gather_t = index_tensor(MOEKIT_DTYPE_INT64, gather);
  HostTensor pair_t = index_tensor(MOEKIT_DTYPE_INT32, pair_idx);

  moekit_gemm_args_t args;
  moekit_gemm_args_init(&args);
  args.a = a.view();
  args.b = b.view();
  args.offsets = offsets_t.view();
  if (c.gather) args.gather_idx = gather_t.view();
  if (c.epilogue == MOEKIT_EPILOGUE_BIAS || (c.epilogue == MOEKIT_EPILOGUE_GATED && c.bias)) args.bias = bias.view();
  args.c = out.view();
  if (is_gated_epilogue) args.act = act_out.view();
  if (c.epilogue == MOEKIT_EPILOGUE_DGATED) {
    args.h = h.view();
    args.row_scale = row_scale.view();
    args.pair_idx = pair_t.view();
    args.dscores = dscores.view();
  }
  args.alpha = c.alpha;
  args.beta = c.beta;
  MOEKIT_REQUIRE_OK(moekit_gemm(plan.plan, &args, nullptr, 0, nullptr));

  // The reference, row by row.
  auto a_elem = [&](int64_t r, int64_t p) { return a.get((c.gather ? gather[static_cast<size_t>(r)] : r) * c.k + p); };
  auto b_elem = [&](int64_t e, int64_t p, int64_t j) {
    return c.b_layout == MOEKIT_GEMM_B_NK ? b.get((e * bn + j) * c.k + p) : b.get((e * c.k + p) * bn + j);
  };
  std::vector<double> ref_c(static_cast<size_t>(valid * c.n)), ref_act(static_cast<size_t>(valid * act_width));
  std::vector<double> got_c(ref_c.size()), got_act(ref_act.size());
  std::vector<double> ref_ds, got_ds;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t r = offsets[static_cast<size_t>(e)]; r < offsets[static_cast<size_t>(e + 1)]; ++r) {
      std::vector<double> prod(static_cast<size_t>(bn));
      for (int64_t j = 0; j < bn; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < c.k; ++p) sum += a_elem(r, p) * b_elem(e, p, j);
        prod[static_cast<size_t>(j)] = c.alpha * sum;
      }
      double* rc = ref_c.data() + r * c.n;
      double* ra = ref_act.data() + r * act_width;
      if (c.epilogue == MOEKIT_EPILOGUE_STORE || c.epilogue == MOEKIT_EPILOGUE_BIAS) {
        for (int64_t j = 0; j < c.n; ++j) {
          double v = prod[static_cast<size_t>(j)];
          if (c.epilogue == MOEKIT_EPILOGUE_BIAS) v += bias.get(e * c.n + j);
          if (c.beta != 0) v += c.beta * out_before[static_cast<size_t>(r * c.n + j)];
          rc[j] = moekit::round_to(v, c.dtype);
        }
      } else if (c.epilogue == MOEKIT_EPILOGUE_GATED) {
        for (int64_t j = 0; j < c.n; ++j)
          rc[j] = moekit::round_to(prod[static_cast<size_t>(j)] + (c.bias ? bias.get(e * c.n + j) : 0.0), c.dtype);
        for (int64_t j = 0; j < act_width; ++j) ra[j] = moekit::round_to(act.forward(rc, j), c.dtype);
      } else {
        std::vector<double> hrow(static_cast<size_t>(c.n));
        for (int64_t j = 0; j < c.n; ++j) hrow[static_cast<size_t>(j)] = h.get(r * c.n + j);
        int64_t pair = pair_idx[static_cast<size_t>(r)];
        double s = row_scale.get(pair);
        double ds = 0;
        for (int64_t j = 0; j < act_width; ++j) {
          double aj = act.forward(hrow.data(), j);
          ds += prod[static_cast<size_t>(j)] * aj;
          act.backward(hrow.data(), j, s * prod[static_cast<size_t>(j)], rc);
          ra[j] = moekit::round_to(s * aj, c.dtype);
        }
        for (int64_t j = 0; j < c.n; ++j) rc[j] = moekit::round_to(rc[j], c.dtype);
        ref_ds.push_back(moekit::round_to(ds, score_dtype));
        got_ds.push_back(dscores.get(pair));
      }
    }
  }
  for (size_t i = 0; i < got_c.size(); ++i) got_c[i] = out.get(static_cast<int64_t>(i));
  for (size_t i = 0; i < got_act.size(); ++i) got_act[i] = act_out.get(static_cast<int64_t>(i));

  if (c.epilogue == MOEKIT_EPILOGUE_DGATED) {
    require_close(got_c, ref_c, c.dtype, "dh");
    require_close(got_act, ref_act, c.dtype, "a'");
    require_close(got_ds, ref_ds, score_dtype, "dscores");
    // Entries of dscores that are no row's pair stay untouched.
    std::vector<bool> written(static_cast<size_t>(max_rows), false);
    for (int64_t r = 0; r < valid; ++r) written[static_cast<size_t>(pair_idx[static_cast<size_t>(r)])] = true;
    for (int64_t p = 0; p < max_rows; ++p)
      if (!written[static_cast<size_t>(p)]) REQUIRE(std::isnan(dscores.get(p)));
  } else {
    require_equal(got_c, ref_c, c.epilogue == MOEKIT_EPILOGUE_GATED ? "h" : "c");
    if (c.epilogue == MOEKIT_EPILOGUE_GATED) require_close(got_act, ref_act, c.dtype, "a");
  }
  require_poisoned_from(out, valid, "c");
  if (is_gated_epilogue) require_poisoned_from(act_out, valid, "act");
}

const int32_t kAllActivations[] = {MOEKIT_ACT_SWIGLU, MOEKIT_ACT_GEGLU, MOEKIT_ACT_REGLU, MOEKIT_ACT_SWIGLU_OAI,
                                   MOEKIT_ACT_GELU,   MOEKIT_ACT_RELU,  MOEKIT_ACT_SILU,  MOEKIT_ACT_RELU2};
const moekit_dtype_t kDtypes[] = {MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP64};

}  // namespace

TEST_CASE("grouped GEMM varlen M, STORE and BIAS: exact vs loops, both B layouts, gather, alpha/beta", "[gemm]") {
  ReferenceHandle handle;
  std::mt19937_64 rng(101);
  for (moekit_dtype_t dtype : kDtypes)
    for (int32_t epilogue : {MOEKIT_EPILOGUE_STORE, MOEKIT_EPILOGUE_BIAS})
      for (int32_t b_layout : {MOEKIT_GEMM_B_NK, MOEKIT_GEMM_B_KN})
        for (bool gather : {false, true})
          for (double beta : {0.0, 1.5}) {
            VarlenMCase c{epilogue, MOEKIT_ACT_SWIGLU, MOEKIT_GLU_CONCAT, b_layout, gather, dtype, {0, 5, 13, 0, 7},
                          12, 19, beta == 0 ? 1.0 : 0.5, beta, false};
            run_varlen_m(handle, c, rng);
          }
}

TEST_CASE("grouped GEMM varlen M: shapes past every cache block (rows > 96, k > 256, n > 512)", "[gemm]") {
  ReferenceHandle handle;
  std::mt19937_64 rng(102);
  for (moekit_dtype_t dtype : kDtypes) {
    VarlenMCase c{MOEKIT_EPILOGUE_STORE, MOEKIT_ACT_SWIGLU, MOEKIT_GLU_CONCAT, MOEKIT_GEMM_B_NK, true, dtype,
                  {0, 131, 7, 0, 98}, 523, 301, 1.0, 0.0, false};
    run_varlen_m(handle, c, rng);
  }
}

TEST_CASE("grouped GEMM varlen M, GATED: every activation and GLU layout, bias on/off", "[gemm]") {
  ReferenceHandle handle;
  std::mt19937_64 rng(103);
  for (moekit_dtype_t dtype : kDtypes)
    for (int32_t activation : kAllActivations)
      for (int32_t layout : {MOEKIT_GLU_CONCAT, MOEKIT_GLU_INTERLEAVED}) {
        if (!gated(activation) && layout == MOEKIT_GLU_INTERLEAVED) continue;
        for (bool bias : {false, true}) {
          VarlenMCase c{MOEKIT_EPILOGUE_GATED, activation, layout, MOEKIT_GEMM_B_NK, bias, dtype, {3, 0, 9, 4},
                        gated(activation) ? 14 : 7, 10, bias ? 1.0 : 0.75, 0.0, bias};
          run_varlen_m(handle, c, rng);
        }
      }
}

TEST_CASE("grouped GEMM varlen M, DGATED: every activation and GLU layout, dh, a' and ds in pair order", "[gemm]") {
  ReferenceHandle handle;
  std::mt19937_64 rng(104);
  for (moekit_dtype_t dtype : kDtypes)
    for (int32_t activation : kAllActivations)
      for (int32_t layout : {MOEKIT_GLU_CONCAT, MOEKIT_GLU_INTERLEAVED}) {
        if (!gated(activation) && layout == MOEKIT_GLU_INTERLEAVED) continue;
        for (int32_t b_layout : {MOEKIT_GEMM_B_KN, MOEKIT_GEMM_B_NK}) {
          VarlenMCase c{MOEKIT_EPILOGUE_DGATED, activation, layout, b_layout, b_layout == MOEKIT_GEMM_B_KN, dtype,
                        {3, 0, 9, 4}, gated(activation) ? 14 : 7, 10, b_layout == MOEKIT_GEMM_B_KN ? 1.0 : 0.5, 0.0,
                        false};
          run_varlen_m(handle, c, rng);
        }
      }
}

namespace {

struct VarlenKCase {
  int32_t gather;
  moekit_dtype_t dtype;
  moekit_dtype_t out_dtype;
  std::vector<int64_t> counts;
  int64_t m, n;
  double alpha, beta;
};

void run_varlen_k(const ReferenceHandle& handle, const VarlenKCase& c, std::mt19937_64& rng) {
  INFO("gather " << c.gather << " dtype " << c.dtype << " out " << c.out_dtype << " m " << c.m << " n " << c.n
                 << " alpha " << c.alpha << " beta " << c.beta);
  const int64_t E = static_cast<int64_t>(c.counts.size());
  const std::vector<int64_t> offsets = offsets_of(c.counts);
  const int64_t valid = offsets.back();
  const int64_t max_rows = valid + 2;
  const int64_t sources = 9;

  moekit_gemm_desc_t desc;
  moekit_gemm_desc_init(&desc);
  desc.mode = MOEKIT_GEMM_VARLEN_K;
  desc.gather = c.gather;
  desc.groups = E;
  desc.max_rows = max_rows;
  desc.gather_rows = sources;
  desc.n = c.n;
  desc.k = c.m;
  desc.dtype = c.dtype;
  desc.out_dtype = c.out_dtype;
  PlanOwner plan;
  MOEKIT_REQUIRE_OK(moekit_gemm_plan_create(handle.handle, &desc, &plan.plan));

  std::vector<int64_t> gather(static_cast<size_t>(max_rows), 0);
  std::uniform_int_distribution<int64_t> source(0, sources - 1);
  for (int64_t r = 0; r < valid; ++r) gather[static_cast<size_t>(r)] = source(rng);
  const bool gather_a = c.gather == MOEKIT_GEMM_GATHER_A, gather_b = c.gather == MOEKIT_GEMM_GATHER_B;
  HostTensor a(c.dtype, {gather_a ? sources : max_rows, c.m});
  HostTensor b(c.dtype, {gather_b ? sources : max_rows, c.n});
  fill_eighths(a, rng);
  fill_eighths(b, rng);
  // Rows past offsets[E] of a non-gathered operand are never read: NaN there must not reach C.
  if (!gather_a)
    for (int64_t i = valid * c.m; i < a.numel(); ++i) a.set(i, NAN);
  if (!gather_b)
    for (int64_t i = valid * c.n; i < b.numel(); ++i) b.set(i, NAN);
  HostTensor out(c.out_dtype, {E, c.m, c.n});
  if (c.beta != 0)
    fill_eighths(out, rng);
  else
    out.poison();
  const std::vector<double> out_before = out.values();
  HostTensor offsets_t = index_tensor(MOEKIT_DTYPE_INT32, offsets);
  HostTensor gather_t = index_tensor(MOEKIT_DTYPE_INT32, gather);

  moekit_gemm_args_t args;
  moekit_gemm_args_init(&args);
  args.a = a.view();
  args.b = b.view();
  args.offsets = offsets_t.view();
  if (c.gather != MOEKIT_GEMM_GATHER_NONE) args.gather_idx = gather_t.view();
  args.c = out.view();
  args.alpha = c.alpha;
  args.beta = c.beta;
  MOEKIT_REQUIRE_OK(moekit_gemm(plan.plan, &args, nullptr, 0, nullptr));

  std::vector<double> ref(static_cast<size_t>(E * c.m * c.n));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double sum = 0;
        for (int64_t r = offsets[static_cast<size_t>(e)]; r < offsets[static_cast<size_t>(e + 1)]; ++r) {
          int64_t ra = gather_a ? gather[static_cast<size_t>(r)] : r;
          int64_t rb = gather_b ? gather[static_cast<size_t>(r)] : r;
          sum += a.get(ra * c.m + i) * b.get(rb * c.n + j);
        }
        size_t at = static_cast<size_t>((e * c.m + i) * c.n + j);
        double v = c.alpha * sum + (c.beta != 0 ? c.beta * out_before[at] : 0.0);
        ref[at] = moekit::round_to(v, c.out_dtype);
      }
  require_equal(out.values(), ref, "c");
}

}  // namespace

TEST_CASE("grouped GEMM varlen K: exact vs loops, gather A / B / none, empty groups, alpha/beta, fp32 out", "[gemm]") {
  ReferenceHandle handle;
  std::mt19937_64 rng(105);
  for (moekit_dtype_t dtype : kDtypes)
    for (int32_t gather : {MOEKIT_GEMM_GATHER_NONE, MOEKIT_GEMM_GATHER_A, MOEKIT_GEMM_GATHER_B})
      for (double beta : {0.0, 1.0}) {
        moekit_dtype_t out_dtype = beta != 0 && dtype == MOEKIT_DTYPE_BF16 ? MOEKIT_DTYPE_FP32 : dtype;
        run_varlen_k(handle, VarlenKCase{gather, dtype, out_dtype, {0, 6, 17, 0, 3}, 10, 13, beta != 0 ? 0.5 : 1.0, beta},
                     rng);
      }
  // Past the cache blocks: a reduction of 300 rows in one group, C wider than one tile.
  run_varlen_k(handle, VarlenKCase{MOEKIT_GEMM_GATHER_B, MOEKIT_DTYPE_FP64, MOEKIT_DTYPE_FP64, {300, 0, 40}, 101, 530,
                                   1.0, 0.0},
               rng);
}

TEST_CASE("grouped GEMM: bad offsets and gather indices are INVALID_VALUE, nothing written", "[gemm]") {
  ReferenceHandle handle;
  moekit_gemm_desc_t desc;
  moekit_gemm_desc_init(&desc);
  desc.mode = MOEKIT_GEMM_VARLEN_M;
  desc.gather = MOEKIT_GEMM_GATHER_A;
  desc.groups = 2;
  desc.max_rows = 6;
  desc.gather_rows = 4;
  desc.n = 3;
  desc.k = 5;
  desc.dtype = MOEKIT_DTYPE_FP64;
  PlanOwner plan;
  MOEKIT_REQUIRE_OK(moekit_gemm_plan_create(handle.handle, &desc, &plan.plan));
  std::mt19937_64 rng(106);
  HostTensor a(MOEKIT_DTYPE_FP64, {4, 5}), b(MOEKIT_DTYPE_FP64, {2, 3, 5}), out(MOEKIT_DTYPE_FP64, {6, 3});
  a.fill_uniform(rng, 1.0);
  b.fill_uniform(rng, 1.0);
  out.poison();
  HostTensor gather = index_tensor(MOEKIT_DTYPE_INT32, {0, 1, 2, 3, 0, 1});
  moekit_gemm_args_t args;
  moekit_gemm_args_init(&args);
  args.a = a.view();
  args.b = b.view();
  args.gather_idx = gather.view();
  args.c = out.view();

  HostTensor decreasing = index_tensor(MOEKIT_DTYPE_INT32, {0, 4, 2});
  args.offsets = decreasing.view();
  REQUIRE(moekit_gemm(plan.plan, &args, nullptr, 0, nullptr) == MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(moekit_test::last_error().rfind("offsets", 0) == 0);

  HostTensor offsets = index_tensor(MOEKIT_DTYPE_INT32, {0, 2, 5});
  args.offsets = offsets.view();
  gather.set(3, 4);  // row 3 reads source row 4 of 4
  REQUIRE(moekit_gemm(plan.plan, &args, nullptr, 0, nullptr) == MOEKIT_STATUS_INVALID_VALUE);
  REQUIRE(moekit_test::last_error().rfind("gather_idx", 0) == 0);
  require_poisoned_from(out, 0, "c");
}

// The determinism contract of the reference matmul (reference/matmul.h): every output element is the fused
// multiply-add chain over ascending k, whatever the shape, strides, gathers, tiling and thread count.
TEST_CASE("reference matmul: each element is the ascending-k fma chain, bit for bit, for any strides and gathers",
          "[gemm]") {
  using moekit::ref::MatmulTask;
  using moekit::ref::MatrixView;
  std::mt19937_64 rng(107);
  std::uniform_real_distribution<double> value(-1.0, 1.0);
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t m = static_cast<int64_t>(rng() % 140) + 1, n = static_cast<int64_t>(rng() % 540) + 1;
    const int64_t k = trial % 10 == 0 ? 0 : static_cast<int64_t>(rng() % 400);
    const bool a_transposed = rng() & 1, b_transposed = rng() & 1, accumulate = rng() & 1;
    const bool a_gathered = rng() & 1, b_gathered = rng() & 1;
    const int64_t a_rows = m + 5, b_rows = k + 3, ldc = n + 2;
    std::vector<double> a(static_cast<size_t>(a_rows * (k + 1))), b(static_cast<size_t>(b_rows * (n + 1)));
    std::vector<double> c(static_cast<size_t>(m * ldc));
    for (double& v : a) v = value(rng);
    for (double& v : b) v = value(rng);
    for (double& v : c) v = value(rng);
    std::vector<int64_t> a_index(static_cast<size_t>(m)), b_index(static_cast<size_t>(k));
    for (int64_t& i : a_index) i = static_cast<int64_t>(rng() % static_cast<uint64_t>(a_rows));
    for (int64_t& i : b_index) i = static_cast<int64_t>(rng() % static_cast<uint64_t>(b_rows));
    MatmulTask task;
    task.m = m;
    task.n = n;
    task.k = k;
    // A [m, k]: stored [a_rows, k] row-major, or transposed as [k, a_rows] with the row index on its columns.
    task.a = a_transposed ? MatrixView{a.data(), 1, a_rows, nullptr, nullptr} : MatrixView{a.data(), k, 1, nullptr, nullptr};
    if (a_gathered) task.a.row_index = a_index.data();
    task.b = b_transposed ? MatrixView{b.data(), 1, b_rows, nullptr, nullptr} : MatrixView{b.data(), n, 1, nullptr, nullptr};
    if (b_gathered) task.b.row_index = b_index.data();
    task.c = c.data();
    task.ldc = ldc;
    task.accumulate = accumulate;
    auto element = [](const MatrixView& v, int64_t i, int64_t j) {
      int64_t row = v.row_index ? v.row_index[i] : i;
      return v.data[row * v.row_stride + j * v.col_stride];
    };
    std::vector<double> expected = c;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double sum = accumulate ? expected[static_cast<size_t>(i * ldc + j)] : 0.0;
        for (int64_t p = 0; p < k; ++p) sum = std::fma(element(task.a, i, p), element(task.b, p, j), sum);
        expected[static_cast<size_t>(i * ldc + j)] = sum;
      }
    moekit::ref::matmul(task);
    INFO("trial " << trial << ": m " << m << " n " << n << " k " << k << " a^T " << a_transposed << " b^T "
                  << b_transposed << " accumulate " << accumulate);
    REQUIRE(std::memcmp(c.data(), expected.data(), c.size() * sizeof(double)) == 0);
  }
}
