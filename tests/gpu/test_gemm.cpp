// CUDA grouped GEMM (docs/math.md section 5) against the reference backend through the C ABI, with section 9's
// metrics (whole tensor, per group, per row): varlen M with every epilogue (STORE, BIAS, GATED, DGATED), every
// activation and GLU layout, both B layouts, gathered and plain A; varlen K with no gather, gather A and gather B,
// storage or fp32 output, beta 0 and 1; bf16 and fp16; both tile shapes (MOEKIT_GEMM_TILE); counts of 0, 1,
// tile - 1, tile and tile + 1, skewed counts, one group taking every row; outputs poisoned before each call (rows
// past the valid count and dscores entries of other pairs stay untouched); bitwise determinism over three reruns;
// NOT_SUPPORTED for what the kernels cannot take. [large]: the SonicMoE test shapes (T = 8192) against a GPU oracle
// (cuBLASLt per group + simple kernels, tests/gpu/gemm_oracle.h); a gathered x [600000, 4096] past 2^31 elements
// (varlen M with STORE and GATED, dW1 by varlen K with x as the gathered B), sampled rows against float64 on the host.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu/device_array.h"
#include "gpu/gemm_oracle.h"
#include "gpu/gpu_util.h"
#include "cuda/common/activation_kind.h"
#include "cuda/gemm/gemm_config.h"
#include "src/numeric.h"

using namespace moekit_test;

namespace {

constexpr const char* kTiles[] = {"128x256", "128x128"};
const int32_t kActivations[] = {MOEKIT_ACT_SWIGLU, MOEKIT_ACT_GEGLU, MOEKIT_ACT_REGLU, MOEKIT_ACT_SWIGLU_OAI,
                                MOEKIT_ACT_GELU,   MOEKIT_ACT_RELU,  MOEKIT_ACT_SILU,  MOEKIT_ACT_RELU2};

// The device the wgmma kernel is written for, for its capability checks (SM count unused there).
constexpr moekit::GemmDevice kHopper{132, 9, 0};

// One grouped GEMM call: the descriptor's switches and the group sizes.
struct Case {
  int32_t mode = MOEKIT_GEMM_VARLEN_M;
  int32_t b_layout = MOEKIT_GEMM_B_NK;
  int32_t gather = MOEKIT_GEMM_GATHER_NONE;
  int32_t epilogue = MOEKIT_EPILOGUE_STORE;
  int32_t activation = MOEKIT_ACT_SWIGLU;
  int32_t glu_layout = MOEKIT_GLU_CONCAT;
  moekit_dtype_t dtype = MOEKIT_DTYPE_BF16;
  moekit_dtype_t out_dtype = MOEKIT_DTYPE_BF16;
  double alpha = 1.0, beta = 0.0;
  bool bias = false;
  bool gather_int64 = false;
  int64_t n = 272;  // desc.n
  int64_t k = 200;  // desc.k
  std::vector<int64_t> counts = {0, 1, 129, 127, 0, 128, 37};
  int64_t extra_rows = 5;  // grouped rows past offsets[E]: poisoned, never read or written
  int64_t sources = 300;   // rows of a gathered source
  const char* tile = nullptr;

  std::string name() const {
    std::string s = mode == MOEKIT_GEMM_VARLEN_K ? "varlen K" : "varlen M";
    s += " epilogue " + std::to_string(epilogue) + " act " + std::to_string(activation) + " glu " +
         std::to_string(glu_layout) + " b_layout " + std::to_string(b_layout) + " gather " + std::to_string(gather) +
         " dtype " + std::to_string(dtype) + " out " + std::to_string(out_dtype) + " beta " + std::to_string(beta) +
         " bias " + std::to_string(bias) + " n " + std::to_string(n) + " k " + std::to_string(k) + " tile " +
         (tile ? tile : "auto") + " counts";
    for (int64_t c : counts) s += " " + std::to_string(c);
    return s;
  }
};

// The tensors of one call on the host. Outputs are poisoned (or random for beta != 0).
struct Inputs {
  Case cs;
  moekit_gemm_desc_t desc{};
  int64_t rows = 0, valid = 0;
  std::vector<int64_t> offsets;
  bool dgated = false, gated = false;
  int64_t act_width = 0;
  HostTensor a, b, offsets_t, gather_idx, bias, c, h, act, row_scale, pair_idx, dscores;
};

Inputs make_inputs(std::mt19937_64& rng, const Case& cs) {
  Inputs in;
  in.cs = cs;
  const int64_t groups = static_cast<int64_t>(cs.counts.size());
  in.offsets.assign(1, 0);
  for (int64_t c : cs.counts) in.offsets.push_back(in.offsets.back() + c);
  in.valid = in.offsets.back();
  in.rows = std::max<int64_t>(in.valid + cs.extra_rows, 1);
  in.dgated = cs.epilogue == MOEKIT_EPILOGUE_DGATED;
  in.gated = cs.epilogue == MOEKIT_EPILOGUE_GATED;
  const bool glu = moekit::is_gated_activation(cs.activation);
  in.act_width = glu ? cs.n / 2 : cs.n;

  moekit_gemm_desc_t& d = in.desc;
  moekit_gemm_desc_init(&d);
  d.mode = cs.mode;
  d.b_layout = cs.b_layout;
  d.gather = cs.gather;
  d.epilogue = cs.epilogue;
  d.activation = cs.activation;
  d.glu_layout = cs.glu_layout;
  d.glu_limit = 1.5;  // NOTE: small, so SWIGLU_OAI's clamps are hit by O(1) values
  d.groups = groups;
  d.max_rows = in.rows;
  d.gather_rows = cs.sources;
  d.n = cs.n;
  d.k = cs.k;
  d.dtype = cs.dtype;
  d.out_dtype = cs.out_dtype;

  in.offsets_t = HostTensor(MOEKIT_DTYPE_INT32, {groups + 1});
  for (int64_t e = 0; e <= groups; ++e) in.offsets_t.set(e, static_cast<double>(in.offsets[static_cast<size_t>(e)]));
  const bool gathered = cs.gather != MOEKIT_GEMM_GATHER_NONE;
  if (gathered) {
    in.gather_idx = HostTensor(cs.gather_int64 ? MOEKIT_DTYPE_INT64 : MOEKIT_DTYPE_INT32, {in.rows});
    in.gather_idx.poison();
    std::uniform_int_distribution<int64_t> source(0, cs.sources - 1);
    for (int64_t r = 0; r < in.valid; ++r) in.gather_idx.set(r, static_cast<double>(source(rng)));
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // A grouped (not gathered) operand: rows past the valid count are NaN, so reading one would show.
  auto grouped_operand = [&](int64_t width, double scale) {
    HostTensor t(cs.dtype, {in.rows, width});
    t.fill_uniform(rng, scale);
    for (int64_t i = in.valid * width; i < in.rows * width; ++i) t.set(i, nan);
    return t;
  };
  auto output = [&](moekit_dtype_t dtype, std::vector<int64_t> shape, bool random) {
    HostTensor t(dtype, std::move(shape));
    if (random) {
      t.fill_uniform(rng, 1.0);
      for (int64_t i = in.valid * t.row_width(); cs.mode == MOEKIT_GEMM_VARLEN_M && i < t.numel(); ++i) t.set(i, nan);
    } else {
      t.poison();
    }
    return t;
  };

  if (cs.mode == MOEKIT_GEMM_VARLEN_K) {
    // C[e] [k, n] sums about rows/E products: B scaled so C is O(1).
    const double per_group = std::max<double>(1.0, static_cast<double>(in.valid) / static_cast<double>(groups));
    const double scale = 3.0 / std::sqrt(per_group);
    if (cs.gather == MOEKIT_GEMM_GATHER_A) {
      in.a = HostTensor(cs.dtype, {cs.sources, cs.k});
      in.a.fill_uniform(rng, 1.0);
    } else {
      in.a = grouped_operand(cs.k, 1.0);
    }
    if (cs.gather == MOEKIT_GEMM_GATHER_B) {
      in.b = HostTensor(cs.dtype, {cs.sources, cs.n});
      in.b.fill_uniform(rng, scale);
    } else {
      in.b = grouped_operand(cs.n, scale);
    }
    in.c = output(cs.out_dtype, {groups, cs.k, cs.n}, cs.beta != 0);
    return in;
  }

  if (gathered) {
    in.a = HostTensor(cs.dtype, {cs.sources, cs.k});
    in.a.fill_uniform(rng, 1.0);
  } else {
    in.a = grouped_operand(cs.k, 1.0);
  }
  const int64_t b_width = in.dgated ? in.act_width : cs.n;
  in.b = cs.b_layout == MOEKIT_GEMM_B_NK ? HostTensor(cs.dtype, {groups, b_width, cs.k})
                                          : HostTensor(cs.dtype, {groups, cs.k, b_width});
  in.b.fill_uniform(rng, 3.0 / std::sqrt(static_cast<double>(cs.k)));
  if (cs.bias) {
    in.bias = HostTensor(cs.dtype, {groups, cs.n});
    in.bias.fill_uniform(rng, 1.0);
  }
  in.c = output(in.gated || in.dgated ? cs.dtype : cs.out_dtype, {in.rows, cs.n}, cs.beta != 0);
  if (in.gated || in.dgated) in.act = output(cs.dtype, {in.rows, in.act_width}, false);
  if (in.dgated) {
    in.h = grouped_operand(cs.n, 2.5);
    in.row_scale = HostTensor(MOEKIT_DTYPE_FP32, {in.rows});
    std::uniform_real_distribution<double> score(0.1, 1.0);
    for (int64_t i = 0; i < in.rows; ++i) in.row_scale.set(i, score(rng));
    // Rows take distinct pairs in a random order; rows past the valid count hold poison.
    std::vector<int64_t> pairs(static_cast<size_t>(in.rows));
    std::iota(pairs.begin(), pairs.end(), 0);
    std::shuffle(pairs.begin(), pairs.end(), rng);
    in.pair_idx = HostTensor(MOEKIT_DTYPE_INT32, {in.rows});
    in.pair_idx.poison();
    for (int64_t r = 0; r < in.valid; ++r) in.pair_idx.set(r, static_cast<double>(pairs[static_cast<size_t>(r)]));
    in.dscores = output(MOEKIT_DTYPE_FP32, {in.rows}, false);
  }
  return in;
}

// The tensors of a call as views (host or device copies), absent ones left absent.
struct Views {
  moekit_tensor_t a{}, b{}, offsets{}, gather_idx{}, bias{}, c{}, h{}, act{}, row_scale{}, pair_idx{}, dscores{};
};

moekit_gemm_args_t make_args(const Inputs& in, const Views& v) {
  moekit_gemm_args_t args;
  moekit_gemm_args_init(&args);
  args.a = v.a;
  args.b = v.b;
  args.offsets = v.offsets;
  if (in.cs.gather != MOEKIT_GEMM_GATHER_NONE) args.gather_idx = v.gather_idx;
  if (in.cs.bias) args.bias = v.bias;
  args.c = v.c;
  if (in.dgated) {
    args.h = v.h;
    args.row_scale = v.row_scale;
    args.pair_idx = v.pair_idx;
    args.dscores = v.dscores;
  }
  if (in.gated || in.dgated) args.act = v.act;
  args.alpha = in.cs.alpha;
  args.beta = in.cs.beta;
  return args;
}

struct Outputs {
  HostTensor c, act, dscores;
};

Outputs run_reference(moekit_handle_t handle, const Inputs& in) {
  Inputs io = in;  // outputs are written in place
  moekit_plan_t plan = nullptr;
  MOEKIT_REQUIRE_OK(moekit_gemm_plan_create(handle, &in.desc, &plan));
  Views v;
  v.a = io.a.view();
  v.b = io.b.view();
  v.offsets = io.offsets_t.view();
  if (in.cs.gather != MOEKIT_GEMM_GATHER_NONE) v.gather_idx = io.gather_idx.view();
  if (in.cs.bias) v.bias = io.bias.view();
  v.c = io.c.view();
  if (in.dgated) {
    v.h = io.h.view();
    v.row_scale = io.row_scale.view();
    v.pair_idx = io.pair_idx.view();
    v.dscores = io.dscores.view();
  }
  if (in.gated || in.dgated) v.act = io.act.view();
  size_t bytes = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan, &bytes));
  AlignedBuffer workspace(bytes);
  const moekit_gemm_args_t args = make_args(in, v);
  MOEKIT_REQUIRE_OK(moekit_gemm(plan, &args, workspace.data(), bytes, nullptr));
  moekit_plan_destroy(plan);
  return Outputs{io.c, io.act, io.dscores};
}

// Plan creation with MOEKIT_GEMM_TILE set to `tile` (nullptr: the heuristic's choice).
moekit_plan_t cuda_plan(moekit_handle_t handle, const moekit_gemm_desc_t& desc, const char* tile) {
  const ScopedEnv forced_tile("MOEKIT_GEMM_TILE", tile);
  moekit_plan_t plan = nullptr;
  const moekit_status_t status = moekit_gemm_plan_create(handle, &desc, &plan);
  INFO(moekit_status_string(status) << ": " << last_error());
  REQUIRE(status == MOEKIT_SUCCESS);
  return plan;
}

// Fresh device copies of every tensor, one CUDA call on `stream`, the outputs downloaded.
Outputs run_cuda(moekit_handle_t handle, const Inputs& in, cudaStream_t stream = nullptr) {
  moekit_plan_t plan = cuda_plan(handle, in.desc, in.cs.tile);
  const bool gathered = in.cs.gather != MOEKIT_GEMM_GATHER_NONE;
  DeviceTensor a(in.a), b(in.b), offsets(in.offsets_t), c(in.c);
  DeviceTensor gather_idx, bias, h, act, row_scale, pair_idx, dscores;
  Views v;
  v.a = a.view();
  v.b = b.view();
  v.offsets = offsets.view();
  v.c = c.view();
  if (gathered) {
    gather_idx = DeviceTensor(in.gather_idx);
    v.gather_idx = gather_idx.view();
  }
  if (in.cs.bias) {
    bias = DeviceTensor(in.bias);
    v.bias = bias.view();
  }
  if (in.gated || in.dgated) {
    act = DeviceTensor(in.act);
    v.act = act.view();
  }
  if (in.dgated) {
    h = DeviceTensor(in.h);
    row_scale = DeviceTensor(in.row_scale);
    pair_idx = DeviceTensor(in.pair_idx);
    dscores = DeviceTensor(in.dscores);
    v.h = h.view();
    v.row_scale = row_scale.view();
    v.pair_idx = pair_idx.view();
    v.dscores = dscores.view();
  }
  size_t bytes = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan, &bytes));
  DeviceBuffer workspace(bytes);
  // Nothing may depend on the workspace's old contents.
  if (bytes > 0) CUDA_REQUIRE(cudaMemset(workspace.data(), 0xff, bytes));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  const moekit_gemm_args_t args = make_args(in, v);
  MOEKIT_REQUIRE_OK(moekit_gemm(plan, &args, workspace.data(), bytes, stream));
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  CUDA_REQUIRE(cudaGetLastError());
  moekit_plan_destroy(plan);
  Outputs out;
  out.c = c.download();
  if (in.gated || in.dgated) out.act = act.download();
  if (in.dgated) out.dscores = dscores.download();
  return out;
}

std::vector<double> first_rows(const HostTensor& t, int64_t rows) {
  std::vector<double> v = t.values();
  v.resize(static_cast<size_t>(rows * t.row_width()));
  return v;
}

// The rows [valid, rows) of two tensors are the same bytes (both still the poison the call was given).
bool same_tail(const HostTensor& out, const HostTensor& ref, int64_t valid) {
  const size_t row_bytes = static_cast<size_t>(out.row_width()) * dtype_size(out.dtype());
  const size_t skip = static_cast<size_t>(valid) * row_bytes;
  const size_t total = static_cast<size_t>(out.numel()) * dtype_size(out.dtype());
  return std::memcmp(static_cast<const uint8_t*>(out.data()) + skip, static_cast<const uint8_t*>(ref.data()) + skip,
                     total - skip) == 0;
}

void require_close(const std::vector<double>& out, const std::vector<double>& ref, int64_t width,
                   const std::vector<int64_t>& segments, moekit_dtype_t dtype, const char* what) {
  const ErrorMetrics m = compare(out, ref, width, segments);
  INFO(what << ": " << describe(m));
  REQUIRE_FALSE(m.any_nan);
  REQUIRE(within(m, bounds_for(dtype)));
}

// ds in grouped row order: entry r is dscores[pair_idx[r]].
std::vector<double> ds_by_row(const Inputs& in, const HostTensor& dscores) {
  std::vector<double> v;
  for (int64_t r = 0; r < in.valid; ++r) v.push_back(dscores.get(static_cast<int64_t>(in.pair_idx.get(r))));
  return v;
}

// Runs one case on both backends and checks every output, and that nothing outside the groups was written.
void check_case(Handles& handles, const Inputs& in) {
  INFO(in.cs.name());
  const Outputs ref = run_reference(handles.reference, in);
  const Outputs out = run_cuda(handles.cuda, in);
  const moekit_dtype_t dtype = in.cs.dtype;
  if (in.cs.mode == MOEKIT_GEMM_VARLEN_K) {
    std::vector<int64_t> segments;
    for (size_t e = 0; e <= in.cs.counts.size(); ++e) segments.push_back(static_cast<int64_t>(e) * in.cs.k);
    require_close(out.c.values(), ref.c.values(), in.cs.n, segments, dtype, "c");
    return;
  }
  require_close(first_rows(out.c, in.valid), first_rows(ref.c, in.valid), in.cs.n, in.offsets, dtype, "c");
  REQUIRE(same_tail(out.c, ref.c, in.valid));
  if (in.gated || in.dgated) {
    require_close(first_rows(out.act, in.valid), first_rows(ref.act, in.valid), in.act_width, in.offsets, dtype,
                  "act");
    REQUIRE(same_tail(out.act, ref.act, in.valid));
  }
  if (in.dgated) {
    require_close(ds_by_row(in, out.dscores), ds_by_row(in, ref.dscores), 1, in.offsets, dtype, "dscores");
    // Entries of pairs no valid row owns keep their poison.
    std::vector<bool> owned(static_cast<size_t>(in.rows), false);
    for (int64_t r = 0; r < in.valid; ++r) owned[static_cast<size_t>(in.pair_idx.get(r))] = true;
    for (int64_t p = 0; p < in.rows; ++p)
      if (!owned[static_cast<size_t>(p)]) REQUIRE(std::isnan(out.dscores.get(p)));
  }
}

// Every epilogue, activation and layout of varlen M for one (dtype, B layout, gather, tile).
std::vector<Case> varlen_m_cases(moekit_dtype_t dtype, int32_t b_layout, int32_t gather, const char* tile) {
  Case base;
  base.dtype = base.out_dtype = dtype;
  base.b_layout = b_layout;
  base.gather = gather;
  base.tile = tile;
  std::vector<Case> cases;
  Case c = base;
  cases.push_back(c);  // STORE, beta 0
  c.beta = 1.0;
  c.alpha = 0.5;
  c.out_dtype = MOEKIT_DTYPE_FP32;
  cases.push_back(c);  // STORE, beta 1, fp32 out
  c = base;
  c.epilogue = MOEKIT_EPILOGUE_BIAS;
  c.bias = true;
  cases.push_back(c);
  c.beta = 1.0;
  c.alpha = -0.75;
  cases.push_back(c);
  bool with_bias = false;
  for (int32_t epilogue : {MOEKIT_EPILOGUE_GATED, MOEKIT_EPILOGUE_DGATED})
    for (int32_t act : kActivations)
      for (int32_t layout : {MOEKIT_GLU_CONCAT, MOEKIT_GLU_INTERLEAVED}) {
        if (!moekit::is_gated_activation(act) && layout == MOEKIT_GLU_INTERLEAVED) continue;
        c = base;
        c.epilogue = epilogue;
        c.activation = act;
        c.glu_layout = layout;
        c.n = moekit::is_gated_activation(act) ? 272 : 136;
        c.alpha = epilogue == MOEKIT_EPILOGUE_DGATED ? 1.25 : 1.0;
        c.bias = epilogue == MOEKIT_EPILOGUE_GATED && (with_bias = !with_bias);
        cases.push_back(c);
      }
  // The MoE layer's DGATED (SwiGLU, CONCAT, alpha = 1), which the wgmma kernel runs through its own copy of the
  // epilogue loop.
  c = base;
  c.epilogue = MOEKIT_EPILOGUE_DGATED;
  c.n = 272;
  cases.push_back(c);
  return cases;
}

// Every gather, output dtype, beta, dtype and tile of varlen K, at m = 136 (desc.k) and n = 264.
std::vector<Case> varlen_k_cases() {
  std::vector<Case> cases;
  for (moekit_dtype_t dtype : {MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP16})
    for (int32_t gather : {MOEKIT_GEMM_GATHER_NONE, MOEKIT_GEMM_GATHER_A, MOEKIT_GEMM_GATHER_B})
      for (moekit_dtype_t out_dtype : {dtype, MOEKIT_DTYPE_FP32})
        for (double beta : {0.0, 1.0})
          for (const char* tile : kTiles) {
            Case cs;
            cs.mode = MOEKIT_GEMM_VARLEN_K;
            cs.dtype = dtype;
            cs.out_dtype = out_dtype;
            cs.gather = gather;
            cs.beta = beta;
            cs.alpha = beta != 0 ? 0.5 : 1.0;
            cs.k = 136;
            cs.n = 264;
            cs.tile = tile;
            cases.push_back(cs);
          }
  return cases;
}

void finish_uploads() { CUDA_REQUIRE(cudaDeviceSynchronize()); }

}  // namespace

TEST_CASE("gemm: varlen M, every epilogue, activation, GLU layout, B layout, gather, dtype and tile", "[gemm]") {
  Handles handles;
  std::mt19937_64 rng(1);
  int checked = 0;
  for (moekit_dtype_t dtype : {MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP16})
    for (int32_t b_layout : {MOEKIT_GEMM_B_NK, MOEKIT_GEMM_B_KN})
      for (int32_t gather : {MOEKIT_GEMM_GATHER_NONE, MOEKIT_GEMM_GATHER_A})
        for (const char* tile : kTiles)
          for (const Case& cs : varlen_m_cases(dtype, b_layout, gather, tile)) {
            check_case(handles, make_inputs(rng, cs));
            ++checked;
          }
  CHECK(checked == 16 * 29);
}

// The shapes the sm_90a wgmma kernel takes. varlen M (k and n multiples of 64; B [E, n, k] with STORE / BIAS /
// GATED, B [E, k, n] with STORE / BIAS / DGATED): every epilogue, activation and GLU layout it serves, both B
// layouts and dtypes, gathered or not, both tiles, counts of tile +- 1 and empty groups; GATED with a GLU has an
// activation width of 96, so the gate box of a 256-wide tile reaches into the up rows (computed, never stored).
// varlen K: below. The case forces the wgmma path (MOEKIT_GEMM_PATH=wgmma: DGATED and varlen K run on mma.sync by
// default) unless the caller forced mma, which then checks the mma.sync kernel on the same cases.
TEST_CASE("gemm: the wgmma kernel's shapes, every mode and epilogue it takes", "[gemm][wgmma]") {
  const char* forced = std::getenv("MOEKIT_GEMM_PATH");
  const bool caller_mma = forced != nullptr && std::string(forced) == "mma";
  Handles handles;
  std::mt19937_64 rng(5);
  // Case cs on fresh inputs under MOEKIT_GEMM_PATH=path (unless the caller forced mma.sync, which then runs it).
  const auto check_on = [&](const char* path, const Case& cs) {
    const Inputs in = make_inputs(rng, cs);
    REQUIRE(moekit::wgmma_capable(in.desc, kHopper));
    INFO("MOEKIT_GEMM_PATH " << path);
    const ScopedEnv forced_path("MOEKIT_GEMM_PATH", caller_mma ? "mma" : path);
    check_case(handles, in);
  };
  int checked = 0;
  // varlen M on the wgmma kernel alone and in clusters of 2 (wgmma_pair: pairs of row tiles sharing B by multicast,
  // or across a group boundary each loading its own; an odd tile count padded by one empty tile).
  for (const char* path : {"wgmma", "wgmma_pair"})
    for (moekit_dtype_t dtype : {MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP16})
      for (int32_t b_layout : {MOEKIT_GEMM_B_NK, MOEKIT_GEMM_B_KN})
        for (int32_t gather : {MOEKIT_GEMM_GATHER_NONE, MOEKIT_GEMM_GATHER_A})
          for (const char* tile : kTiles)
            for (Case cs : varlen_m_cases(dtype, b_layout, gather, tile)) {
              // The epilogue the wgmma kernel does not take with this B layout.
              const int32_t mma_only = b_layout == MOEKIT_GEMM_B_NK ? MOEKIT_EPILOGUE_DGATED : MOEKIT_EPILOGUE_GATED;
              if (cs.epilogue == mma_only) continue;
              cs.k = 192;
              // GATED / DGATED: n is h's width (2I for a GLU); DGATED's product is I = 192 wide, a GATED GLU's a 96.
              const bool glu = moekit::is_gated_activation(cs.activation);
              cs.n = cs.epilogue == MOEKIT_EPILOGUE_STORE || cs.epilogue == MOEKIT_EPILOGUE_BIAS ? 320
                     : cs.epilogue == MOEKIT_EPILOGUE_DGATED                                      ? (glu ? 384 : 192)
                     : glu                                                                        ? 192
                                                                                                  : 128;
              cs.counts = {0, 1, 129, 127, 0, 128, 37, 255, 257};
              check_on(path, cs);
              ++checked;
            }
  CHECK(checked == 2 * 8 * (16 + 17));  // per path, dtype, gather and tile: 16 cases with B [E, n, k], 17 with [E, k, n]
  // varlen K: every gather, output dtype and beta, both dtypes and tiles; m and n multiples of 8 only (the copies
  // zero-fill past them), reduction counts of 64 +- 1 per slice and empty groups; alone and paired (wgmma_pair: m
  // tiles 2i and 2i + 1 sharing B by multicast where the product pairs: C's m = 192, or n = 200 for the
  // transposed B-gathered problem, is 2 m tiles; the others run unpaired).
  for (const char* path : {"wgmma", "wgmma_pair"})
    for (Case cs : varlen_k_cases()) {
      if (cs.gather != MOEKIT_GEMM_GATHER_B) {
        cs.k = 192;
        cs.n = 320;
      } else {
        cs.n = 200;
      }
      cs.counts = {0, 1, 63, 65, 0, 128, 37, 255, 257};
      check_on(path, cs);
    }
}

// The TMA-store epilogues (varlen-M STORE, varlen K with beta = 0 and with the fp32 reduce-adds) where every
// persistent CTA walks 2-3 tiles (~290 of them) whose column tiles hold 4, 4 and 1 TMA boxes (n = 576 with 128 x 256
// tiles): a consumer's next tile may start on either of its two box buffers while earlier stores drain.
TEST_CASE("gemm: TMA-store epilogues over several tiles per CTA and odd box counts", "[gemm][wgmma]") {
  Handles handles;
  std::mt19937_64 rng(6);
  Case m;
  m.n = 576;
  m.k = 128;
  m.counts = {3000, 0, 4097, 5001, 127, 1};
  m.sources = 4096;
  m.tile = "128x256";
  for (int32_t gather : {MOEKIT_GEMM_GATHER_NONE, MOEKIT_GEMM_GATHER_A}) {
    m.gather = gather;
    check_case(handles, make_inputs(rng, m));
  }
  Case k;
  k.mode = MOEKIT_GEMM_VARLEN_K;
  k.gather = MOEKIT_GEMM_GATHER_B;
  k.n = 576;
  k.k = 2048;  // C's middle dim: 16 m tiles per group
  k.counts = {300, 0, 257, 129, 64, 1};
  k.tile = "128x256";
  check_case(handles, make_inputs(rng, k));
  k.out_dtype = MOEKIT_DTYPE_FP32;
  k.beta = 1.0;
  k.alpha = 0.5;
  check_case(handles, make_inputs(rng, k));
}

// GATED's TMA-store epilogue (a gated activation, CONCAT, alpha = 1, no bias, I a multiple of 64: h's gate and up
// boxes and a's from the registers) for every gated activation, both dtypes and tiles, gathered or not, over ~100-170
// tiles of which each persistent CTA may walk several: I = 320, so a 256-wide tile's last column tile holds one
// chunk of 64 activation columns (3 boxes, not 6); counts of 64 +- 1 and of tile +- 1 put consumers' 64 rows across
// group ends (those take the threads' epilogue), and the poisoned rows past the groups must stay untouched.
TEST_CASE("gemm: GATED's TMA-store epilogue for every gated activation, dtype and tile", "[gemm][wgmma]") {
  Handles handles;
  std::mt19937_64 rng(7);
  Case cs;
  cs.epilogue = MOEKIT_EPILOGUE_GATED;
  cs.glu_layout = MOEKIT_GLU_CONCAT;
  cs.n = 2 * 320;
  cs.k = 128;
  cs.counts = {1500, 0, 129, 2001, 127, 1, 64, 65, 255};
  cs.sources = 2048;
  int checked = 0;
  for (moekit_dtype_t dtype : {MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP16})
    for (int32_t activation : {MOEKIT_ACT_SWIGLU, MOEKIT_ACT_GEGLU, MOEKIT_ACT_REGLU, MOEKIT_ACT_SWIGLU_OAI})
      for (int32_t gather : {MOEKIT_GEMM_GATHER_NONE, MOEKIT_GEMM_GATHER_A})
        for (const char* tile : kTiles) {
          cs.dtype = cs.out_dtype = dtype;
          cs.activation = activation;
          cs.gather = gather;
          cs.tile = tile;
          const Inputs in = make_inputs(rng, cs);
          REQUIRE(moekit::wgmma_capable(in.desc, kHopper));
          check_case(handles, in);
          ++checked;
        }
  CHECK(checked == 2 * 4 * 2 * 2);
}

TEST_CASE("gemm: varlen K, every gather, output dtype, beta, dtype and tile", "[gemm]") {
  Handles handles;
  std::mt19937_64 rng(2);
  for (const Case& cs : varlen_k_cases()) check_case(handles, make_inputs(rng, cs));
}

// varlen K's wgmma kernel addresses a copied row as a 32-bit row times a 32-bit stride in bytes, so a call whose
// rows lie 2^31 values (4 GiB) apart runs on mma.sync: it must give the bits of the same call on compact rows with
// mma.sync forced (that kernel's arithmetic does not depend on strides).
TEST_CASE("gemm: varlen K with rows 4 GiB apart runs on mma.sync and gives its bits", "[gemm]") {
  Handles handles;
  std::mt19937_64 rng(17);
  Case cs;
  cs.mode = MOEKIT_GEMM_VARLEN_K;
  cs.k = 136;
  cs.n = 264;
  cs.counts = {1, 0, 2};
  cs.extra_rows = 0;
  const Inputs in = make_inputs(rng, cs);
  const Outputs compact = [&] {
    const ScopedEnv forced_path("MOEKIT_GEMM_PATH", "mma");
    return run_cuda(handles.cuda, in);
  }();

  const int64_t stride = int64_t{1} << 31;  // values of A's rows apart
  const size_t value_bytes = 2;
  DeviceBuffer wide_a(static_cast<size_t>((in.rows - 1) * stride + cs.k) * value_bytes);
  const auto* host_a = static_cast<const unsigned char*>(in.a.data());
  for (int64_t r = 0; r < in.rows; ++r)
    CUDA_REQUIRE(cudaMemcpy(static_cast<unsigned char*>(wide_a.data()) + r * stride * value_bytes,
                            host_a + r * cs.k * value_bytes, cs.k * value_bytes, cudaMemcpyHostToDevice));
  DeviceTensor b(in.b), offsets(in.offsets_t), c(in.c);
  Views v;
  const moekit_device_t device{MOEKIT_DEVICE_CUDA, 0};
  v.a = moekit_tensor_make(wide_a.data(), in.a.dtype(), 2, in.a.shape().data(), device);
  v.a.stride[0] = stride;
  v.b = b.view();
  v.offsets = offsets.view();
  v.c = c.view();
  moekit_plan_t plan = cuda_plan(handles.cuda, in.desc, nullptr);
  size_t bytes = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan, &bytes));
  DeviceBuffer workspace(bytes);
  const moekit_gemm_args_t args = make_args(in, v);
  MOEKIT_REQUIRE_OK(moekit_gemm(plan, &args, workspace.data(), bytes, nullptr));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  moekit_plan_destroy(plan);
  REQUIRE(c.download().bytes_equal(compact.c));
}

TEST_CASE("gemm: skewed counts, one group taking every row, all groups empty, int64 gather indices", "[gemm]") {
  Handles handles;
  std::mt19937_64 rng(3);
  const std::vector<std::vector<int64_t>> count_sets = {
      {0, 0, 700, 0, 3, 0, 1, 0}, {0, 0, 0, 0, 0, 513}, {0, 0, 0}, {255, 257, 1, 128, 383}};
  for (const auto& counts : count_sets)
    for (const char* tile : kTiles) {
      Case m;
      m.counts = counts;
      m.gather = MOEKIT_GEMM_GATHER_A;
      m.gather_int64 = true;
      m.tile = tile;
      m.sources = 97;
      check_case(handles, make_inputs(rng, m));
      Case w = m;  // the wgmma kernel's shapes: STORE with B [E, n, k], then DGATED with B [E, k, n]
      w.k = 192;
      w.n = 320;
      check_case(handles, make_inputs(rng, w));
      m.epilogue = MOEKIT_EPILOGUE_DGATED;
      m.b_layout = MOEKIT_GEMM_B_KN;
      check_case(handles, make_inputs(rng, m));
      w.epilogue = MOEKIT_EPILOGUE_DGATED;
      w.b_layout = MOEKIT_GEMM_B_KN;
      w.n = 384;
      check_case(handles, make_inputs(rng, w));
      Case k = m;
      k.mode = MOEKIT_GEMM_VARLEN_K;
      k.epilogue = MOEKIT_EPILOGUE_STORE;
      k.gather = MOEKIT_GEMM_GATHER_B;
      k.beta = 1.0;
      k.k = 64;
      check_case(handles, make_inputs(rng, k));
    }
}

TEST_CASE("gemm: small cases for the sanitizers", "[gemm][sanitize]") {
  Handles handles;
  std::mt19937_64 rng(4);
  Case cs;
  cs.counts = {0, 1, 129, 37};
  cs.k = 72;
  cs.n = 144;
  cs.gather = MOEKIT_GEMM_GATHER_A;
  cs.epilogue = MOEKIT_EPILOGUE_GATED;
  cs.bias = true;
  for (const char* tile : kTiles) {
    cs.tile = tile;
    check_case(handles, make_inputs(rng, cs));
    Case w = cs;  // k and n multiples of 64: the wgmma kernel's shapes
    w.k = 128;
    w.n = 192;
    w.counts = {0, 1, 129, 127, 37};
    check_case(handles, make_inputs(rng, w));
    // STORE: C by TMA stores where a consumer's 64 rows lie inside the group, by thread stores elsewhere.
    Case stored_rows = w;
    stored_rows.epilogue = MOEKIT_EPILOGUE_STORE;
    stored_rows.bias = false;
    stored_rows.counts = {0, 1, 129, 255, 128, 37};
    check_case(handles, make_inputs(rng, stored_rows));
    // GATED with h and a by TMA stores (CONCAT, alpha = 1, no bias, I = 192: three activation chunks, the last
    // 256-wide column tile holding one) where a consumer's 64 rows lie inside the group, by the threads elsewhere.
    Case gated_rows = stored_rows;
    gated_rows.epilogue = MOEKIT_EPILOGUE_GATED;
    gated_rows.n = 2 * 192;
    check_case(handles, make_inputs(rng, gated_rows));
    Case d = cs;
    d.epilogue = MOEKIT_EPILOGUE_DGATED;
    d.bias = false;
    d.b_layout = MOEKIT_GEMM_B_KN;
    d.glu_layout = MOEKIT_GLU_INTERLEAVED;
    check_case(handles, make_inputs(rng, d));
    Case wd = d;  // the wgmma kernel's DGATED: I = 128
    wd.k = 128;
    wd.n = 256;
    wd.counts = w.counts;
    check_case(handles, make_inputs(rng, wd));
    Case k = cs;
    k.mode = MOEKIT_GEMM_VARLEN_K;
    k.epilogue = MOEKIT_EPILOGUE_STORE;
    k.bias = false;
    k.gather = MOEKIT_GEMM_GATHER_B;
    k.beta = 1.0;
    check_case(handles, make_inputs(rng, k));
    // The wgmma kernel's TMA epilogues of varlen K: reduce-adds into an fp32 C (beta = 1), stores (beta = 0).
    Case added = k;
    added.out_dtype = MOEKIT_DTYPE_FP32;
    check_case(handles, make_inputs(rng, added));
    Case stored = k;
    stored.beta = 0.0;
    check_case(handles, make_inputs(rng, stored));
    // The same on paired CTAs (B by TMA multicast, barriers of both CTAs; C^T's 144 rows are 2 m tiles), unless the
    // caller forced mma.sync.
    const char* forced = std::getenv("MOEKIT_GEMM_PATH");
    if (forced == nullptr || std::string(forced) != "mma") {
      const ScopedEnv forced_path("MOEKIT_GEMM_PATH", "wgmma_pair");
      check_case(handles, make_inputs(rng, stored));
    }
  }
}

TEST_CASE("gemm: bitwise identical over three reruns, fresh buffers and a second stream", "[gemm]") {
  Handles handles;
  std::mt19937_64 rng(5);
  cudaStream_t stream = nullptr;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Case gated;
  gated.gather = MOEKIT_GEMM_GATHER_A;
  gated.epilogue = MOEKIT_EPILOGUE_GATED;
  gated.counts = {300, 0, 257, 64, 1000};
  Case dgated = gated;
  dgated.epilogue = MOEKIT_EPILOGUE_DGATED;
  dgated.b_layout = MOEKIT_GEMM_B_KN;
  Case wgrad = gated;
  wgrad.mode = MOEKIT_GEMM_VARLEN_K;
  wgrad.epilogue = MOEKIT_EPILOGUE_STORE;
  wgrad.gather = MOEKIT_GEMM_GATHER_B;
  wgrad.out_dtype = MOEKIT_DTYPE_FP32;
  for (const Case& cs : {gated, dgated, wgrad}) {
    INFO(cs.name());
    const Inputs in = make_inputs(rng, cs);
    const Outputs first = run_cuda(handles.cuda, in);
    finish_uploads();
    for (int rerun = 0; rerun < 3; ++rerun) {
      const Outputs again = run_cuda(handles.cuda, in, rerun == 2 ? stream : nullptr);
      REQUIRE(again.c.bytes_equal(first.c));
      if (in.gated || in.dgated) REQUIRE(again.act.bytes_equal(first.act));
      if (in.dgated) REQUIRE(again.dscores.bytes_equal(first.dscores));
    }
  }
  CUDA_REQUIRE(cudaStreamDestroy(stream));
}

// GATED and DGATED from k = 4096 on, and varlen K with at least 512 rows per group on average, run paired by default
// (choose_gemm_config): the paired kernel must give the single-CTA kernel's bits, and both the reference's values, on
// counts that are no tile multiple, an empty group and (varlen M) groups straddling pairs. varlen K: B gathered as in
// dW1 (run transposed: C^T's 512 rows are 4 m tiles), and A gathered (run as it is: C's m = 256, 2 m tiles), over
// 4,615 rows in 9 groups (512.8 per group), from 0 and 1 to 1,700, with partial last slices.
TEST_CASE("gemm: the default paired kernels give the single-CTA kernel's bits", "[gemm][wgmma]") {
  const char* forced = std::getenv("MOEKIT_GEMM_PATH");
  if (forced != nullptr && std::string(forced) == "mma") return;  // the mma.sync run of the suite has no pairs
  Handles handles;
  std::mt19937_64 rng(23);
  Case gated;
  gated.gather = MOEKIT_GEMM_GATHER_A;
  gated.epilogue = MOEKIT_EPILOGUE_GATED;
  gated.n = 512;
  gated.k = 4096;
  gated.counts = {300, 0, 257, 129, 1000, 1};
  Case dgated = gated;  // dA = dout W2 with W2 as [k = H, n = I]: n is h's width 2I
  dgated.epilogue = MOEKIT_EPILOGUE_DGATED;
  dgated.b_layout = MOEKIT_GEMM_B_KN;
  Case dw1;
  dw1.mode = MOEKIT_GEMM_VARLEN_K;
  dw1.gather = MOEKIT_GEMM_GATHER_B;
  dw1.k = 192;
  dw1.n = 512;
  dw1.counts = {1400, 0, 257, 129, 1000, 1, 63, 65, 1700};
  dw1.tile = "128x256";
  Case a_gathered = dw1;
  a_gathered.gather = MOEKIT_GEMM_GATHER_A;
  a_gathered.k = 256;
  a_gathered.n = 320;
  for (const Case& cs : {gated, dgated, dw1, a_gathered}) {
    INFO(cs.name());
    const Inputs in = make_inputs(rng, cs);
    const Outputs paired = [&] {
      const ScopedEnv default_path("MOEKIT_GEMM_PATH", nullptr);
      moekit_plan_t plan = cuda_plan(handles.cuda, in.desc, cs.tile);
      const std::string text = plan_description(plan);
      INFO(text);
      CHECK(text.find("2-CTA clusters") != std::string::npos);
      moekit_plan_destroy(plan);
      check_case(handles, in);
      return run_cuda(handles.cuda, in);
    }();
    const ScopedEnv single_path("MOEKIT_GEMM_PATH", "wgmma");
    const Outputs single = run_cuda(handles.cuda, in);
    REQUIRE(paired.c.bytes_equal(single.c));
    REQUIRE(paired.act.bytes_equal(single.act));
    if (in.dgated) REQUIRE(paired.dscores.bytes_equal(single.dscores));
  }
}

// Every kernel configuration a plan may hold for a product must give the same bits, so that which one runs (the
// heuristic, an override, a tuned choice) never changes a result: both tiles and both cluster sizes of the wgmma
// kernel, its ping-pong schedule, and both tiles of the mma.sync kernel, over counts that are no tile multiple and
// empty groups and sizes that are no multiple of 64, for every mode and epilogue (DGATED's dscores too: one partial
// per 64-column chunk, whatever the tile).
TEST_CASE("gemm: every tile and cluster candidate gives the same bits", "[gemm][wgmma]") {
  const char* forced = std::getenv("MOEKIT_GEMM_PATH");
  if (forced != nullptr && std::string(forced) == "mma") return;  // the suite's mma.sync run forces every path
  Handles handles;
  std::mt19937_64 rng(41);
  std::vector<Case> cases;
  Case base;
  base.k = 192;
  base.counts = {0, 1, 129, 127, 0, 128, 37, 255, 257};
  Case store = base;  // the down-projection's form, and with a bias
  store.n = 320;
  cases.push_back(store);
  store.epilogue = MOEKIT_EPILOGUE_BIAS;
  store.bias = true;
  cases.push_back(store);
  Case gated = base;  // the up-projection: x gathered, SwiGLU in the CONCAT layout, I = 192
  gated.gather = MOEKIT_GEMM_GATHER_A;
  gated.epilogue = MOEKIT_EPILOGUE_GATED;
  gated.n = 384;
  cases.push_back(gated);
  Case dgated = gated;  // dA = dout W2 with W2 as [k = H, n = I]
  dgated.epilogue = MOEKIT_EPILOGUE_DGATED;
  dgated.b_layout = MOEKIT_GEMM_B_KN;
  cases.push_back(dgated);
  Case dxe = store;  // dh W1 with W1 as [k = 2I, n = H]
  dxe.epilogue = MOEKIT_EPILOGUE_STORE;
  dxe.bias = false;
  dxe.b_layout = MOEKIT_GEMM_B_KN;
  cases.push_back(dxe);
  for (int32_t gather : {MOEKIT_GEMM_GATHER_A, MOEKIT_GEMM_GATHER_B}) {
    Case wgrad = base;  // dW2 (A gathered) and dW1 (B gathered); bf16 stores and fp32 accumulation
    wgrad.mode = MOEKIT_GEMM_VARLEN_K;
    wgrad.gather = gather;
    wgrad.k = 256;
    wgrad.n = 200;
    wgrad.counts = {0, 1, 63, 65, 0, 128, 37, 255, 257};
    cases.push_back(wgrad);
    wgrad.out_dtype = MOEKIT_DTYPE_FP32;
    wgrad.beta = 1.0;
    cases.push_back(wgrad);
  }
  Case tails = store;  // k and n multiples of 8, not of 64
  tails.epilogue = MOEKIT_EPILOGUE_STORE;
  tails.bias = false;
  tails.k = 136;
  tails.n = 264;
  cases.push_back(tails);
  struct Candidate {
    const char* path;
    const char* tile;
    const char* schedule;
  };
  const Candidate wgmma[] = {{"wgmma", "128x256", "cooperative"},     {"wgmma", "128x128", "cooperative"},
                             {"wgmma_pair", "128x256", "cooperative"}, {"wgmma_pair", "128x128", "cooperative"},
                             {"wgmma", "128x128", "pingpong"},         {"wgmma_pair", "128x128", "pingpong"}};
  const Candidate mma[] = {{"mma", "128x256", "cooperative"}, {"mma", "128x128", "cooperative"}};
  int compared = 0;
  for (const Case& cs : cases) {
    INFO(cs.name());
    const Inputs in = make_inputs(rng, cs);
    for (const auto& family : {std::vector<Candidate>(std::begin(wgmma), std::end(wgmma)),
                               std::vector<Candidate>(std::begin(mma), std::end(mma))}) {
      std::vector<Outputs> runs;
      for (const Candidate& candidate : family) {
        Inputs run = in;
        run.cs.tile = candidate.tile;
        const ScopedEnv path("MOEKIT_GEMM_PATH", candidate.path);
        const ScopedEnv schedule("MOEKIT_GEMM_SCHEDULE", candidate.schedule);
        runs.push_back(run_cuda(handles.cuda, run));
      }
      for (size_t i = 1; i < runs.size(); ++i) {
        INFO(family[i].path << " " << family[i].tile << " " << family[i].schedule << " against " << family[0].path
                            << " " << family[0].tile << " " << family[0].schedule);
        REQUIRE(runs[i].c.bytes_equal(runs[0].c));
        if (in.gated || in.dgated) REQUIRE(runs[i].act.bytes_equal(runs[0].act));
        if (in.dgated) REQUIRE(runs[i].dscores.bytes_equal(runs[0].dscores));
        ++compared;
      }
    }
  }
  CHECK(compared == 10 * (5 + 1));
}

TEST_CASE("gemm: what the CUDA kernels cannot take is NOT_SUPPORTED", "[gemm]") {
  Handles handles;
  moekit_gemm_desc_t d;
  moekit_gemm_desc_init(&d);
  d.groups = 4;
  d.max_rows = 64;
  d.n = 64;
  d.k = 64;
  moekit_plan_t plan = nullptr;
  d.dtype = MOEKIT_DTYPE_FP32;
  CHECK(moekit_gemm_plan_create(handles.cuda, &d, &plan) == MOEKIT_STATUS_NOT_SUPPORTED);
  d.dtype = MOEKIT_DTYPE_BF16;
  d.n = 20;
  CHECK(moekit_gemm_plan_create(handles.cuda, &d, &plan) == MOEKIT_STATUS_NOT_SUPPORTED);
  d.n = 64;
  d.k = 36;
  CHECK(moekit_gemm_plan_create(handles.cuda, &d, &plan) == MOEKIT_STATUS_NOT_SUPPORTED);
  d.k = 64;
  d.epilogue = MOEKIT_EPILOGUE_GATED;
  d.n = 72;  // activation width 36
  CHECK(moekit_gemm_plan_create(handles.cuda, &d, &plan) == MOEKIT_STATUS_NOT_SUPPORTED);
  // A row stride that is not a whole number of 16-byte vectors is refused at run time, nothing written.
  d.epilogue = MOEKIT_EPILOGUE_STORE;
  d.n = 64;
  MOEKIT_REQUIRE_OK(moekit_gemm_plan_create(handles.cuda, &d, &plan));
  DeviceBuffer a(64 * 68 * 2), b(4 * 64 * 64 * 2), c(64 * 64 * 2), offsets(5 * 4);
  const moekit_device_t dev{MOEKIT_DEVICE_CUDA, 0};
  moekit_gemm_args_t args;
  moekit_gemm_args_init(&args);
  const int64_t a_shape[2] = {64, 64}, b_shape[3] = {4, 64, 64}, c_shape[2] = {64, 64}, o_shape[1] = {5};
  args.a = moekit_tensor_make(a.data(), MOEKIT_DTYPE_BF16, 2, a_shape, dev);
  args.a.stride[0] = 68;
  args.b = moekit_tensor_make(b.data(), MOEKIT_DTYPE_BF16, 3, b_shape, dev);
  args.c = moekit_tensor_make(c.data(), MOEKIT_DTYPE_BF16, 2, c_shape, dev);
  args.offsets = moekit_tensor_make(offsets.data(), MOEKIT_DTYPE_INT32, 1, o_shape, dev);
  size_t bytes = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan, &bytes));
  DeviceBuffer workspace(bytes);
  CHECK(moekit_gemm(plan, &args, workspace.data(), bytes, nullptr) == MOEKIT_STATUS_NOT_SUPPORTED);
  moekit_plan_destroy(plan);
}

// ---------------------------------------------------------------------------------------------------------------
// [large]: the SonicMoE test shapes against the GPU oracle
// ---------------------------------------------------------------------------------------------------------------

namespace {

struct LayerShape {
  int64_t hidden, inter, experts, top_k;
};

// Random routing of T tokens to K distinct experts each, laid out as dispatch does (stable by expert).
struct Routing {
  std::vector<int64_t> offsets;  // [E+1]
  std::vector<int32_t> gather, pair;
};

Routing random_routing(std::mt19937_64& rng, int64_t tokens, int64_t experts, int64_t top_k) {
  std::vector<int64_t> expert_of(static_cast<size_t>(tokens * top_k));
  std::vector<int64_t> ids(static_cast<size_t>(experts));
  std::iota(ids.begin(), ids.end(), 0);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t k = 0; k < top_k; ++k) {
      std::uniform_int_distribution<int64_t> pick(k, experts - 1);
      std::swap(ids[static_cast<size_t>(k)], ids[static_cast<size_t>(pick(rng))]);
      expert_of[static_cast<size_t>(t * top_k + k)] = ids[static_cast<size_t>(k)];
    }
  }
  Routing r;
  r.offsets.assign(static_cast<size_t>(experts + 1), 0);
  for (int64_t e : expert_of) ++r.offsets[static_cast<size_t>(e + 1)];
  for (int64_t e = 0; e < experts; ++e) r.offsets[static_cast<size_t>(e + 1)] += r.offsets[static_cast<size_t>(e)];
  std::vector<int64_t> next(r.offsets.begin(), r.offsets.end() - 1);
  r.gather.resize(expert_of.size());
  r.pair.resize(expert_of.size());
  for (int64_t p = 0; p < static_cast<int64_t>(expert_of.size()); ++p) {
    const int64_t pos = next[static_cast<size_t>(expert_of[static_cast<size_t>(p)])]++;
    r.gather[static_cast<size_t>(pos)] = static_cast<int32_t>(p / top_k);
    r.pair[static_cast<size_t>(pos)] = static_cast<int32_t>(p);
  }
  return r;
}

// One moekit_gemm call on the CUDA handle with the heuristic's tile; returns the plan's description.
std::string cuda_gemm(moekit_handle_t handle, const moekit_gemm_desc_t& desc, const moekit_gemm_args_t& args) {
  moekit_plan_t plan = cuda_plan(handle, desc, nullptr);
  const std::string text = plan_description(plan);
  size_t bytes = 0;
  MOEKIT_REQUIRE_OK(moekit_plan_workspace_size(plan, &bytes));
  DeviceBuffer workspace(bytes);
  MOEKIT_REQUIRE_OK(moekit_gemm(plan, &args, workspace.data(), bytes, nullptr));
  CUDA_REQUIRE(cudaDeviceSynchronize());
  moekit_plan_destroy(plan);
  return text;
}

moekit_gemm_desc_t layer_desc(int32_t mode, int64_t experts, int64_t rows, int64_t tokens, int64_t n, int64_t k) {
  moekit_gemm_desc_t d;
  moekit_gemm_desc_init(&d);
  d.mode = mode;
  d.groups = experts;
  d.max_rows = rows;
  d.gather_rows = tokens;
  d.n = n;
  d.k = k;
  return d;
}

}  // namespace

TEST_CASE("gemm: the SonicMoE test shapes (T = 8192) against cuBLASLt per expert", "[gemm][large]") {
  Handles handles;
  cublasLtHandle_t lt = nullptr;
  REQUIRE(cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS);
  std::mt19937_64 rng(6);
  constexpr int64_t tokens = 8192;
  const moekit_dtype_t bf16 = MOEKIT_DTYPE_BF16;
  for (const LayerShape& s : {LayerShape{768, 256, 128, 8}, LayerShape{1536, 512, 64, 4},
                              LayerShape{4096, 256, 256, 16}, LayerShape{4096, 1024, 128, 8}}) {
    INFO("H " << s.hidden << " I " << s.inter << " E " << s.experts << " K " << s.top_k);
    const int64_t H = s.hidden, I = s.inter, E = s.experts, P = tokens * s.top_k;
    const Routing routing = random_routing(rng, tokens, E, s.top_k);
    std::vector<int32_t> offsets32(routing.offsets.begin(), routing.offsets.end());
    DeviceArray offsets = upload_int32(offsets32), gather = upload_int32(routing.gather),
                pair = upload_int32(routing.pair);
    DeviceArray x(bf16, {tokens, H}), w1(bf16, {E, 2 * I, H}), w2(bf16, {E, H, I}), dout(bf16, {tokens, H}),
        scores(MOEKIT_DTYPE_FP32, {P});
    x.fill(1.0, 11);
    w1.fill(3.0 / std::sqrt(static_cast<double>(H)), 12);
    w2.fill(3.0 / std::sqrt(static_cast<double>(I)), 13);
    dout.fill(1.0, 14);
    scores.fill(1.0, 15);
    DeviceArray xg(bf16, {P, H}), doutg(bf16, {P, H});
    device_gather_rows(x.data(), H, static_cast<const int32_t*>(gather.data()), P, xg.data());
    device_gather_rows(dout.data(), H, static_cast<const int32_t*>(gather.data()), P, doutg.data());
    auto per_expert = [&](int64_t n, int64_t k, const DeviceArray& a, int64_t lda, bool a_trans, const DeviceArray& b,
                          int64_t ldb, bool b_trans, int64_t b_group_stride, DeviceArray& out, bool varlen_k) {
      for (int64_t e = 0; e < E; ++e) {
        const int64_t lo = routing.offsets[static_cast<size_t>(e)], rows = routing.offsets[static_cast<size_t>(e + 1)] - lo;
        const auto* a_ptr = static_cast<const uint16_t*>(a.data()) + lo * lda;
        const auto* b_ptr = static_cast<const uint16_t*>(b.data()) + (varlen_k ? lo * ldb : e * b_group_stride);
        float* c_ptr = static_cast<float*>(out.data()) + (varlen_k ? e * n * k : lo * n);
        if (varlen_k)
          cublaslt_product(lt, bf16, k, n, rows, a_ptr, lda, true, b_ptr, ldb, false, c_ptr, n);
        else
          cublaslt_product(lt, bf16, rows, n, k, a_ptr, lda, a_trans, b_ptr, ldb, b_trans, c_ptr, n);
      }
      CUDA_REQUIRE(cudaDeviceSynchronize());
    };
    const std::vector<int64_t>& row_segments = routing.offsets;

    // 1. Up-projection, GATED SwiGLU (concat), x rows gathered, W1 [E, 2I, H].
    DeviceArray h(bf16, {P, 2 * I}), a(bf16, {P, I}), h_ref(bf16, {P, 2 * I}), a_ref(bf16, {P, I});
    {
      moekit_gemm_desc_t d = layer_desc(MOEKIT_GEMM_VARLEN_M, E, P, tokens, 2 * I, H);
      d.gather = MOEKIT_GEMM_GATHER_A;
      d.epilogue = MOEKIT_EPILOGUE_GATED;
      moekit_gemm_args_t args;
      moekit_gemm_args_init(&args);
      args.a = x.view();
      args.b = w1.view();
      args.offsets = offsets.view();
      args.gather_idx = gather.view();
      h.poison();
      a.poison();
      args.c = h.view();
      args.act = a.view();
      cuda_gemm(handles.cuda, d, args);
      DeviceArray product(MOEKIT_DTYPE_FP32, {P, 2 * I});
      per_expert(2 * I, H, xg, H, false, w1, H, true, 2 * I * H, product, false);
      device_gated_reference(static_cast<const float*>(product.data()), P, I, MOEKIT_ACT_SWIGLU, MOEKIT_GLU_CONCAT, 7.0f,
                             bf16, h_ref.data(), a_ref.data());
      require_close_device(h.data(), bf16, h_ref.data(), bf16, P, 2 * I, row_segments, bf16, "up-projection h");
      require_close_device(a.data(), bf16, a_ref.data(), bf16, P, I, row_segments, bf16, "up-projection a");
    }
    // 2. Down-projection, STORE: y = a W2[e]^T (NK, k = I).
    {
      moekit_gemm_desc_t d = layer_desc(MOEKIT_GEMM_VARLEN_M, E, P, tokens, H, I);
      DeviceArray y(bf16, {P, H}), product(MOEKIT_DTYPE_FP32, {P, H});
      moekit_gemm_args_t args;
      moekit_gemm_args_init(&args);
      args.a = a_ref.view();
      args.b = w2.view();
      args.offsets = offsets.view();
      y.poison();
      args.c = y.view();
      cuda_gemm(handles.cuda, d, args);
      per_expert(H, I, a_ref, I, false, w2, I, true, H * I, product, false);
      require_close_device(y.data(), bf16, product.data(), MOEKIT_DTYPE_FP32, P, H, row_segments, bf16,
                           "down-projection y");
    }
    // 3. DGATED: dA = dout[t] W2[e] (KN: W2 [E, H, I] as [k = H, n = I]), dout rows gathered.
    DeviceArray dh_ref(bf16, {P, 2 * I}), as_ref(bf16, {P, I});
    {
      moekit_gemm_desc_t d = layer_desc(MOEKIT_GEMM_VARLEN_M, E, P, tokens, 2 * I, H);
      d.gather = MOEKIT_GEMM_GATHER_A;
      d.b_layout = MOEKIT_GEMM_B_KN;
      d.epilogue = MOEKIT_EPILOGUE_DGATED;
      DeviceArray dh(bf16, {P, 2 * I}), as(bf16, {P, I}), ds(MOEKIT_DTYPE_FP32, {P}), ds_ref(MOEKIT_DTYPE_FP32, {P});
      moekit_gemm_args_t args;
      moekit_gemm_args_init(&args);
      args.a = dout.view();
      args.b = w2.view();
      args.offsets = offsets.view();
      args.gather_idx = gather.view();
      args.h = h_ref.view();
      args.row_scale = scores.view();
      args.pair_idx = pair.view();
      dh.poison();
      as.poison();
      ds.poison();
      args.c = dh.view();
      args.act = as.view();
      args.dscores = ds.view();
      cuda_gemm(handles.cuda, d, args);
      DeviceArray product(MOEKIT_DTYPE_FP32, {P, I});
      per_expert(I, H, doutg, H, false, w2, I, false, H * I, product, false);
      device_dgated_reference(static_cast<const float*>(product.data()), h_ref.data(),
                              static_cast<const float*>(scores.data()), static_cast<const int32_t*>(pair.data()), P, I,
                              MOEKIT_ACT_SWIGLU, MOEKIT_GLU_CONCAT, 7.0f, bf16, dh_ref.data(), as_ref.data(),
                              static_cast<float*>(ds_ref.data()));
      require_close_device(dh.data(), bf16, dh_ref.data(), bf16, P, 2 * I, row_segments, bf16, "dgated dh");
      require_close_device(as.data(), bf16, as_ref.data(), bf16, P, I, row_segments, bf16, "dgated a'");
      // Every pair is valid here, so ds is compared whole (pair order, one segment).
      require_close_device(ds.data(), MOEKIT_DTYPE_FP32, ds_ref.data(), MOEKIT_DTYPE_FP32, P, 1, {}, bf16, "dgated ds");
    }
    // 4. dx: dxe = dh W1[e] (KN: W1 [E, 2I, H] as [k = 2I, n = H]).
    {
      moekit_gemm_desc_t d = layer_desc(MOEKIT_GEMM_VARLEN_M, E, P, tokens, H, 2 * I);
      d.b_layout = MOEKIT_GEMM_B_KN;
      DeviceArray dxe(bf16, {P, H}), product(MOEKIT_DTYPE_FP32, {P, H});
      moekit_gemm_args_t args;
      moekit_gemm_args_init(&args);
      args.a = dh_ref.view();
      args.b = w1.view();
      args.offsets = offsets.view();
      dxe.poison();
      args.c = dxe.view();
      cuda_gemm(handles.cuda, d, args);
      per_expert(H, 2 * I, dh_ref, 2 * I, false, w1, H, false, 2 * I * H, product, false);
      require_close_device(dxe.data(), bf16, product.data(), MOEKIT_DTYPE_FP32, P, H, row_segments, bf16, "dx rows");
    }
    std::vector<int64_t> expert_segments;
    // 5. dW1[e] = dh_e^T x_e (varlen K, x rows gathered as B), fp32 out.
    {
      moekit_gemm_desc_t d = layer_desc(MOEKIT_GEMM_VARLEN_K, E, P, tokens, H, 2 * I);
      d.gather = MOEKIT_GEMM_GATHER_B;
      d.out_dtype = MOEKIT_DTYPE_FP32;
      DeviceArray dw1(MOEKIT_DTYPE_FP32, {E, 2 * I, H}), product(MOEKIT_DTYPE_FP32, {E, 2 * I, H});
      moekit_gemm_args_t args;
      moekit_gemm_args_init(&args);
      args.a = dh_ref.view();
      args.b = x.view();
      args.offsets = offsets.view();
      args.gather_idx = gather.view();
      dw1.poison();
      args.c = dw1.view();
      cuda_gemm(handles.cuda, d, args);
      per_expert(H, 2 * I, dh_ref, 2 * I, true, xg, H, false, 0, product, true);
      for (int64_t e = 0; e <= E; ++e) expert_segments.push_back(e * 2 * I);
      require_close_device(dw1.data(), MOEKIT_DTYPE_FP32, product.data(), MOEKIT_DTYPE_FP32, E * 2 * I, H,
                           expert_segments, bf16, "dW1");
    }
    // 6. dW2[e] = dout_e^T a'_e (varlen K, dout rows gathered as A), bf16 out.
    {
      moekit_gemm_desc_t d = layer_desc(MOEKIT_GEMM_VARLEN_K, E, P, tokens, I, H);
      d.gather = MOEKIT_GEMM_GATHER_A;
      DeviceArray dw2(bf16, {E, H, I}), product(MOEKIT_DTYPE_FP32, {E, H, I});
      moekit_gemm_args_t args;
      moekit_gemm_args_init(&args);
      args.a = dout.view();
      args.b = as_ref.view();
      args.offsets = offsets.view();
      args.gather_idx = gather.view();
      dw2.poison();
      args.c = dw2.view();
      cuda_gemm(handles.cuda, d, args);
      per_expert(I, H, doutg, H, true, as_ref, I, false, 0, product, true);
      expert_segments.clear();
      for (int64_t e = 0; e <= E; ++e) expert_segments.push_back(e * H);
      require_close_device(dw2.data(), bf16, product.data(), MOEKIT_DTYPE_FP32, E * H, I, expert_segments, bf16,
                           "dW2");
    }
  }
  cublasLtDestroy(lt);
}

namespace {

// The rows `rows` of the bf16 device tensor x [.., width], each copied from its own 64-bit byte offset.
std::vector<uint16_t> download_rows(const DeviceArray& x, int64_t width, const std::vector<int32_t>& rows) {
  const size_t row_values = static_cast<size_t>(width), row_bytes = row_values * 2;
  std::vector<uint16_t> v(rows.size() * row_values);
  cudaError_t status = cudaSuccess;
  for (size_t i = 0; i < rows.size() && status == cudaSuccess; ++i)
    status = cudaMemcpy(v.data() + i * row_values,
                        static_cast<const uint8_t*>(x.data()) + static_cast<size_t>(rows[i]) * row_bytes, row_bytes,
                        cudaMemcpyDeviceToHost);
  CUDA_REQUIRE(status);
  return v;
}

// The rows `rows` of a dense bf16 device tensor of `width` values per row, as doubles.
std::vector<double> sampled_rows(const DeviceArray& t, int64_t width, const std::vector<int64_t>& rows) {
  const std::vector<uint16_t> all = download_vector<uint16_t>(t.buffer, t.numel());
  std::vector<double> v;
  for (int64_t r : rows)
    for (int64_t j = 0; j < width; ++j) v.push_back(moekit::bf16_to_float(all[static_cast<size_t>(r * width + j)]));
  return v;
}

}  // namespace

// The MoE layer's gathered x past 2^31 elements: x [T = 600000, H = 4096] holds 2.46e9 values, so from source row
// 524288 on a gathered row's offset (row times H) is 2^31 or more. Groups 0-6 gather rows spread over all of x,
// group 7 only rows from 524288 on, its first row 524288 itself and its last T - 1. Every product runs on the wgmma
// kernel (checked on the plans' descriptions), which forms a gathered row's address in 64 bits: varlen M (the
// up-projection, W1 [E, 2I, H] with 2I = 256) with STORE and with GATED SwiGLU (CONCAT), and dW1 = dh^T x (varlen K,
// x rows gathered as B, a bf16 C with beta = 0: the transposed kernel, whose strides 256 and 4096 are below 2^31).
// Outputs are poisoned; sampled rows of C, h, a (every group's first and last, rows gathered from past 2^31) and of
// dW1 (8 per expert) are checked against float64 on the host, rounded as docs/math.md section 8 says, with section
// 9's metrics.
TEST_CASE("gemm: gathered x of 600000 x 4096 values, past 2^31 elements", "[gpu][gemm][large]") {
  constexpr int64_t T = 600000, H = 4096, I = 128, E = 8;
  constexpr int64_t wide = (int64_t{1} << 31) / H;  // the first source row at an offset of 2^31 values
  const moekit_dtype_t bf16 = MOEKIT_DTYPE_BF16;
  const std::vector<int64_t> counts = {1900, 2300, 2048, 1, 2175, 2000, 1960, 4000};
  std::vector<int64_t> offsets(1, 0);
  for (int64_t c : counts) offsets.push_back(offsets.back() + c);
  const int64_t P = offsets.back(), last_group = offsets[E - 1];
  const auto group_of = [&](int64_t r) {
    return static_cast<int64_t>(std::upper_bound(offsets.begin(), offsets.end(), r) - offsets.begin()) - 1;
  };
  std::vector<int32_t> source(static_cast<size_t>(P));
  for (int64_t r = 0; r < P; ++r) {
    const int64_t spread = (r * 104729 + 12345) % T, past = wide + ((r - last_group) * 7919) % (T - wide);
    source[static_cast<size_t>(r)] = static_cast<int32_t>(r < last_group ? spread : past);
  }
  source.back() = static_cast<int32_t>(T - 1);

  Handles handles;
  const ScopedEnv default_path("MOEKIT_GEMM_PATH", nullptr);
  DeviceArray x(bf16, {T, H}), w1(bf16, {E, 2 * I, H}), dh(bf16, {P, 2 * I});
  x.fill(1.0, 51);
  w1.fill(3.0 / std::sqrt(static_cast<double>(H)), 52);
  dh.fill(3.0 / std::sqrt(static_cast<double>(P / E)), 53);  // dW1 entries of about 1 at ~2048 rows per expert
  const DeviceArray offsets_d = upload_int32(std::vector<int32_t>(offsets.begin(), offsets.end())),
                    gather = upload_int32(source);
  const std::vector<uint16_t> xg = download_rows(x, H, source), w1_host = download_vector<uint16_t>(w1.buffer, w1.numel()),
                              dh_host = download_vector<uint16_t>(dh.buffer, dh.numel());
  const auto value = [](const std::vector<uint16_t>& v, int64_t i) {
    return static_cast<double>(moekit::bf16_to_float(v[static_cast<size_t>(i)]));
  };

  // varlen M: each group's first and last row, its first 3 rows gathered from past 2^31, and 23 more of group 7.
  std::vector<int64_t> rows;
  for (int64_t e = 0; e < E; ++e) {
    rows.push_back(offsets[e]);
    rows.push_back(offsets[e + 1] - 1);
    for (int64_t r = offsets[e], taken = 0; r < offsets[e + 1] && taken < 3; ++r)
      if (source[static_cast<size_t>(r)] >= wide) {
        rows.push_back(r);
        ++taken;
      }
  }
  for (int64_t i = 1; i < 24; ++i) rows.push_back(last_group + i * counts[E - 1] / 24);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  std::vector<int64_t> row_segments;
  for (int64_t o : offsets)
    row_segments.push_back(static_cast<int64_t>(std::lower_bound(rows.begin(), rows.end(), o) - rows.begin()));
  std::vector<double> h_ref, a_ref;  // h = round(x W1[e]^T), a = round(silu(gate) up) from the rounded h
  for (int64_t r : rows) {
    const int64_t e = group_of(r);
    for (int64_t n = 0; n < 2 * I; ++n) {
      double sum = 0;
      for (int64_t j = 0; j < H; ++j) sum += value(w1_host, (e * 2 * I + n) * H + j) * value(xg, r * H + j);
      h_ref.push_back(moekit::round_to(sum, bf16));
    }
    const double* h_row = &h_ref[h_ref.size() - static_cast<size_t>(2 * I)];
    for (int64_t j = 0; j < I; ++j) {
      const double gate = h_row[j], up = h_row[I + j];
      a_ref.push_back(moekit::round_to(gate / (1.0 + std::exp(-gate)) * up, bf16));
    }
  }
  moekit_gemm_desc_t d = layer_desc(MOEKIT_GEMM_VARLEN_M, E, P, T, 2 * I, H);
  d.gather = MOEKIT_GEMM_GATHER_A;
  moekit_gemm_args_t args;
  moekit_gemm_args_init(&args);
  args.a = x.view();
  args.b = w1.view();
  args.offsets = offsets_d.view();
  args.gather_idx = gather.view();
  const auto require_wgmma = [](const std::string& text) {
    INFO(text);
    REQUIRE(text.find("wgmma") != std::string::npos);
    REQUIRE(text.find("A cp.async gather") != std::string::npos);
    REQUIRE(text.find("mma.sync") == std::string::npos);
  };
  {
    DeviceArray c(bf16, {P, 2 * I});
    c.poison();
    args.c = c.view();
    require_wgmma(cuda_gemm(handles.cuda, d, args));
    require_close(sampled_rows(c, 2 * I, rows), h_ref, 2 * I, row_segments, bf16, "store c");
  }
  {
    d.epilogue = MOEKIT_EPILOGUE_GATED;
    DeviceArray h(bf16, {P, 2 * I}), a(bf16, {P, I});
    h.poison();
    a.poison();
    args.c = h.view();
    args.act = a.view();
    require_wgmma(cuda_gemm(handles.cuda, d, args));
    require_close(sampled_rows(h, 2 * I, rows), h_ref, 2 * I, row_segments, bf16, "gated h");
    require_close(sampled_rows(a, I, rows), a_ref, I, row_segments, bf16, "gated a");
  }

  // dW1[e] [2I, H] = dh_e^T x_e: 8 rows of each expert's dW1, every column.
  const int64_t dw_rows[] = {0, 1, 64, 127, 128, 191, 254, 255};
  std::vector<int64_t> dw_sampled, dw_segments(1, 0);
  std::vector<double> dw_ref;
  std::vector<double> x_row(static_cast<size_t>(H));
  for (int64_t e = 0; e < E; ++e) {
    std::vector<double> sums(std::size(dw_rows) * static_cast<size_t>(H), 0.0);
    for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) {
      for (int64_t j = 0; j < H; ++j) x_row[static_cast<size_t>(j)] = value(xg, r * H + j);
      for (size_t s = 0; s < std::size(dw_rows); ++s) {
        const double coefficient = value(dh_host, r * 2 * I + dw_rows[s]);
        double* sum = &sums[s * static_cast<size_t>(H)];
        for (size_t j = 0; j < x_row.size(); ++j) sum[j] += coefficient * x_row[j];
      }
    }
    for (double v : sums) dw_ref.push_back(moekit::round_to(v, bf16));
    for (int64_t i : dw_rows) dw_sampled.push_back(e * 2 * I + i);
    dw_segments.push_back(static_cast<int64_t>(dw_sampled.size()));
  }
  moekit_gemm_desc_t dw1_desc = layer_desc(MOEKIT_GEMM_VARLEN_K, E, P, T, H, 2 * I);
  dw1_desc.gather = MOEKIT_GEMM_GATHER_B;
  DeviceArray dw1(bf16, {E, 2 * I, H});
  dw1.poison();
  moekit_gemm_args_t dw1_args;
  moekit_gemm_args_init(&dw1_args);
  dw1_args.a = dh.view();
  dw1_args.b = x.view();
  dw1_args.offsets = offsets_d.view();
  dw1_args.gather_idx = gather.view();
  dw1_args.c = dw1.view();
  const std::string text = cuda_gemm(handles.cuda, dw1_desc, dw1_args);
  INFO(text);
  REQUIRE(text.find("if beta = 0, row strides < 2^31: wgmma") != std::string::npos);
  REQUIRE(text.find("transposed") != std::string::npos);
  require_close(sampled_rows(dw1, H, dw_sampled), dw_ref, H, dw_segments, bf16, "dW1");
}
