// The CUDA grouped GEMM's configuration (cuda/gemm/gemm_config.h), pure host functions checked without a GPU: the
// tile heuristic over a table of shapes, the problem shape DGATED and varlen K tile, the MOEKIT_GEMM_TILE and
// MOEKIT_GEMM_PATH overrides, the workspace layout's bounds, which problems the wgmma kernel takes and which run in
// clusters of 2, which kernel each call fact selects (C by TMA stores or reduce-adds, varlen K's transposition and
// pairing, the mma.sync fallback for row strides of 2^31 or more), GemmConfig::for_call and describe_gemm_config.
//
// Each call of a plan runs GemmConfig::for_call(facts); so every decision is checked as "the kernel a call with these
// facts runs". The sweep at the end compares that kernel, over thousands of problems, overrides, devices and calls,
// with the rules written out independently in expected_kernel below.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/gemm/gemm_config.h"
#include "cuda/gemm/gemm_tuning.h"

#if MOEKIT_WITH_CUDA
#include "cuda/gemm/grouped_gemm_wgmma.h"
#endif

using moekit::GemmConfig;
using moekit::GemmDevice;
using moekit::GemmKernel;
using moekit::GemmOverrides;
using moekit::GemmSchedule;
using moekit::GemmPath;
using moekit::GemmPathOverride;
using moekit::GemmShape;
using moekit::GemmTile;
using moekit::GemmVariant;
using moekit::GemmWorkspaceLayout;
using moekit::OperandMove;
using moekit::OutputMove;
using moekit::choose_gemm_config;
using moekit::choose_gemm_tile;
using moekit::describe_gemm_config;
using moekit::gemm_overrides_from_environment;
using moekit::gemm_shape;
using moekit::gemm_tile_shape;
using moekit::gemm_workspace_layout;
using moekit::wgmma_capable;
using moekit::kBetaOne;
using moekit::kBetaZero;
using moekit::kStrides32Bit;
using moekit::kUnitAlphaNoBias;

namespace {

constexpr int kSms = 132;
constexpr GemmDevice kH200{kSms, 9, 0};

GemmOverrides path_override(GemmPathOverride path) {
  GemmOverrides o{};
  o.path = path;
  return o;
}

GemmOverrides tile_override(GemmTile tile, GemmPathOverride path = GemmPathOverride::none) {
  GemmOverrides o = path_override(path);
  o.tile_forced = true;
  o.tile = tile;
  return o;
}

GemmOverrides schedule_override(GemmSchedule schedule, GemmOverrides o = GemmOverrides{}) {
  o.schedule_forced = true;
  o.schedule = schedule;
  return o;
}

GemmShape varlen_m(int64_t groups, int64_t rows, int64_t n, int64_t k) {
  return GemmShape{MOEKIT_GEMM_VARLEN_M, groups, rows, 0, n, k};
}
GemmShape varlen_k(int64_t groups, int64_t rows, int64_t m, int64_t n) {
  return GemmShape{MOEKIT_GEMM_VARLEN_K, groups, rows, m, n, 0};
}

// A bf16 -> bf16 descriptor (B [E, n, k], no gather, CONCAT).
moekit_gemm_desc_t desc(int32_t mode, int32_t epilogue, int32_t activation, int64_t groups, int64_t rows, int64_t n,
                        int64_t k) {
  moekit_gemm_desc_t d;
  moekit_gemm_desc_init(&d);
  d.mode = mode;
  d.epilogue = epilogue;
  d.activation = activation;
  d.groups = groups;
  d.max_rows = rows;
  d.gather_rows = rows;
  d.n = n;
  d.k = k;
  d.dtype = MOEKIT_DTYPE_BF16;
  d.out_dtype = MOEKIT_DTYPE_BF16;
  return d;
}

// The layer's up-projection: a gathered varlen-M GATED SwiGLU product in the CONCAT layout, I = 1024, over 8 groups
// and 4096 rows.
moekit_gemm_desc_t up_projection() {
  moekit_gemm_desc_t d = desc(MOEKIT_GEMM_VARLEN_M, MOEKIT_EPILOGUE_GATED, MOEKIT_ACT_SWIGLU, 8, 4096, 2048, 512);
  d.b_layout = MOEKIT_GEMM_B_NK;
  d.gather = MOEKIT_GEMM_GATHER_A;
  d.glu_layout = MOEKIT_GLU_CONCAT;
  return d;
}

// A weight gradient: varlen K over 8 groups and 4096 rows (512 per group), C [E, m = desc.k, n].
moekit_gemm_desc_t weight_gradient(int32_t gather, int64_t m, int64_t n) {
  moekit_gemm_desc_t d = desc(MOEKIT_GEMM_VARLEN_K, MOEKIT_EPILOGUE_STORE, MOEKIT_ACT_SWIGLU, 8, 4096, n, m);
  d.gather = gather;
  return d;
}

bool is_gated(int32_t activation) {
  return activation == MOEKIT_ACT_SWIGLU || activation == MOEKIT_ACT_GEGLU || activation == MOEKIT_ACT_REGLU ||
         activation == MOEKIT_ACT_SWIGLU_OAI;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

const char* path_name(GemmPath path) { return path == GemmPath::wgmma ? "wgmma" : "mma.sync"; }

std::string show(const GemmKernel& k) {
  return std::string(path_name(k.path)) + " tile " + std::to_string(static_cast<int>(k.tile)) + " cluster " +
         std::to_string(k.cluster) + (k.transposed ? " transposed" : "") + (k.pad_tile_pairs ? " pad" : "") +
         " a " + std::to_string(static_cast<int>(k.a)) + " b " + std::to_string(static_cast<int>(k.b)) + " c " +
         std::to_string(static_cast<int>(k.c)) + " epilogue " + std::to_string(static_cast<int>(k.epilogue)) +
         " ctas " + std::to_string(k.ctas) + (k.schedule == GemmSchedule::pingpong ? " pingpong" : "");
}

bool same_kernel(const GemmKernel& x, const GemmKernel& y) {
  return x.path == y.path && x.tile == y.tile && x.cluster == y.cluster && x.transposed == y.transposed &&
         x.pad_tile_pairs == y.pad_tile_pairs && x.a == y.a && x.b == y.b && x.c == y.c && x.epilogue == y.epilogue &&
         x.ctas == y.ctas && x.schedule == y.schedule;
}

bool same_layout(const GemmWorkspaceLayout& x, const GemmWorkspaceLayout& y) {
  return x.m_tiles == y.m_tiles && x.n_tiles == y.n_tiles && x.ds_chunks == y.ds_chunks &&
         x.tile_count == y.tile_count && x.tile_starts == y.tile_starts && x.tile_list == y.tile_list &&
         x.ds_partials == y.ds_partials && x.bytes == y.bytes;
}

// What every configuration holds, whatever the problem: 1 to 3 variants, each but the last requiring some fact and
// the last none (so every call runs one), one tile for all (the workspace is laid out for it), the mma.sync kernel
// only as the last variant, thread stores in the last variant (the one that must serve every call), the stored
// workspace that of gemm_workspace_layout. "" when it holds, else what broke.
std::string broken_invariant(const moekit_gemm_desc_t& d, const GemmConfig& c, const GemmDevice& device) {
  if (c.count < 1 || c.count > GemmConfig::kMaxVariants) return "count " + std::to_string(c.count);
  if (c.variants[c.count - 1].needs != 0) return "the last variant requires facts";
  if (c.variants[c.count - 1].kernel.c != OutputMove::threads) return "the last variant does not store by threads";
  for (int i = 0; i < c.count; ++i) {
    const GemmKernel& k = c.variants[i].kernel;
    const std::string at = "variant " + std::to_string(i) + ": ";
    if (i + 1 < c.count && c.variants[i].needs == 0) return at + "requires nothing but is not the last";
    if (k.tile != c.variants[0].kernel.tile) return at + "another tile than variant 0";
    if (k.path == GemmPath::mma_sync && i + 1 < c.count) return at + "mma.sync before the last variant";
    if (k.path == GemmPath::mma_sync && (k.cluster != 1 || k.transposed || k.pad_tile_pairs))
      return at + "mma.sync with a cluster, transposition or padding";
    if (k.path == GemmPath::wgmma && k.ctas != device.sm_count) return at + "persistent CTAs != the SM count";
    if (k.cluster != 1 && k.cluster != 2) return at + "cluster " + std::to_string(k.cluster);
    if (d.mode == MOEKIT_GEMM_VARLEN_M && k.transposed) return at + "varlen M transposed";
    if (d.mode == MOEKIT_GEMM_VARLEN_M && k.path == GemmPath::wgmma && k.pad_tile_pairs != (k.cluster == 2))
      return at + "varlen M pads iff paired broken";
    if (d.mode == MOEKIT_GEMM_VARLEN_K && k.pad_tile_pairs) return at + "varlen K pads row tiles";
  }
  if (!same_layout(c.workspace, gemm_workspace_layout(d, c))) return "the stored workspace layout differs";
  return "";
}

// The configuration, its invariants checked.
GemmConfig config(const moekit_gemm_desc_t& d, const GemmOverrides& env = GemmOverrides{},
                  const GemmDevice& device = kH200) {
  const GemmConfig c = choose_gemm_config(d, device, env);
  INFO(describe_gemm_config(d, c));
  CHECK(broken_invariant(d, c, device).empty());
  return c;
}

// Whether the configuration is one variant only: the wgmma kernel, C stored by the threads.
bool threads_only(const moekit_gemm_desc_t& d) {
  const GemmConfig g = config(d);
  return g.count == 1 && g.variants[0].kernel.path == GemmPath::wgmma && g.variants[0].kernel.c == OutputMove::threads;
}

// The facts of a call: beta, alpha and bias, row strides.
enum class Beta { zero, one, other };
struct Call {
  Beta beta;
  bool unit_alpha_no_bias;
  bool strides_32bit;
};

uint32_t facts(const Call& call) {
  uint32_t f = 0;
  if (call.beta == Beta::zero) f |= kBetaZero;
  if (call.beta == Beta::one) f |= kBetaOne;
  if (call.unit_alpha_no_bias) f |= kUnitAlphaNoBias;
  if (call.strides_32bit) f |= kStrides32Bit;
  return f;
}

// A call of the layer: beta = 0, alpha = 1, no bias, row strides below 2^31.
constexpr uint32_t kPlainCall = kBetaZero | kUnitAlphaNoBias | kStrides32Bit;

// The kernel a call runs, by the rules written out on their own (a row of the library's table of measured winners,
// on compute capability 9.0 without a path override, replaces the heuristic's tile, pairing and schedule):
//  - the path: MOEKIT_GEMM_PATH = "mma" or a problem the wgmma kernel cannot run: mma.sync; "wgmma": wgmma, single
//    CTAs; "wgmma_pair": wgmma in clusters of 2 (where the product pairs); by default wgmma, paired for GATED and
//    DGATED with k >= 4096 and for varlen K with max_rows >= 512 * groups;
//  - varlen M runs the schedule MOEKIT_GEMM_SCHEDULE names; by default ping-pong for STORE and BIAS at 128x128
//    tiles with k <= 1024, cooperative else; ping-pong always at 128x128 tiles;
//  - varlen M writes C by TMA stores for STORE with beta = 0 into C of the operand dtype, and GATED's h and a for a
//    gated activation in the CONCAT layout with alpha = 1, no bias and I = n/2 a multiple of 64; the threads store
//    every other product (BIAS, DGATED, ...); clusters of 2 pad the row-tile list;
//  - varlen K with row strides of 2^31 or more runs the mma.sync kernel; otherwise TMA stores for beta = 0 into C
//    of the operand dtype, TMA reduce-adds for beta = 1 into an fp32 C, thread stores else; with B gathered and C
//    stored by TMA in the operand dtype it runs transposed (the gathered operand becomes A, m = desc.n); it pairs
//    when pairing is wanted, B (as run) is not gathered and the m tiles of 128 rows come in an even count.
GemmKernel expected_kernel(const moekit_gemm_desc_t& d, const GemmDevice& device, const GemmOverrides& env,
                           const Call& call) {
  const moekit::GemmTuningRow* tuned = device.cc_major == 9 && device.cc_minor == 0 &&
                                               env.path == GemmPathOverride::none
                                           ? moekit::find_gemm_tuning_row(moekit::builtin_gemm_tuning_table(), d)
                                           : nullptr;
  const GemmTile tile = env.tile_forced ? env.tile
                        : tuned         ? tuned->tile
                                        : choose_gemm_tile(gemm_shape(d), device.sm_count);
  GemmKernel mma{};
  mma.path = GemmPath::mma_sync;
  mma.tile = tile;
  mma.cluster = 1;
  mma.a = d.gather == MOEKIT_GEMM_GATHER_A ? OperandMove::cp_async_gather : OperandMove::cp_async;
  mma.b = d.gather == MOEKIT_GEMM_GATHER_B ? OperandMove::cp_async_gather : OperandMove::cp_async;
  mma.c = OutputMove::threads;
  mma.epilogue = OperandMove::cp_async;
  if (env.path == GemmPathOverride::mma || !wgmma_capable(d, device)) return mma;
  const bool activated = d.epilogue == MOEKIT_EPILOGUE_GATED || d.epilogue == MOEKIT_EPILOGUE_DGATED;
  const bool default_pair = d.mode == MOEKIT_GEMM_VARLEN_M ? activated && d.k >= 4096
                                                            : d.max_rows >= 512 * d.groups;
  const bool pair = env.path == GemmPathOverride::wgmma_pair ||
                    (env.path == GemmPathOverride::none && (tuned ? tuned->cluster == 2 : default_pair));
  const bool c_fp32 = d.out_dtype == MOEKIT_DTYPE_FP32;
  GemmKernel k{};
  k.path = GemmPath::wgmma;
  k.tile = tile;
  k.ctas = device.sm_count;
  k.epilogue = OperandMove::cp_async;
  if (d.mode == MOEKIT_GEMM_VARLEN_M) {
    const bool plain = d.epilogue == MOEKIT_EPILOGUE_STORE || d.epilogue == MOEKIT_EPILOGUE_BIAS;
    const bool pingpong_default = tile == GemmTile::m128_n128 && plain && d.k <= 1024;
    k.schedule = env.schedule_forced ? env.schedule
                 : tuned             ? tuned->schedule
                 : pingpong_default  ? GemmSchedule::pingpong
                                     : GemmSchedule::cooperative;
    if (k.schedule == GemmSchedule::pingpong) k.tile = GemmTile::m128_n128;
    bool by_tma = false;
    if (d.epilogue == MOEKIT_EPILOGUE_GATED)
      by_tma = is_gated(d.activation) && d.glu_layout == MOEKIT_GLU_CONCAT && call.unit_alpha_no_bias && d.n > 0 &&
               (d.n / 2) % 64 == 0;
    if (d.epilogue == MOEKIT_EPILOGUE_STORE) by_tma = call.beta == Beta::zero && !c_fp32 && d.n > 0;
    k.cluster = pair ? 2 : 1;
    k.pad_tile_pairs = pair;
    k.a = d.gather == MOEKIT_GEMM_GATHER_A ? OperandMove::cp_async_gather : OperandMove::tma;
    k.b = OperandMove::tma;
    k.c = by_tma ? OutputMove::tma_store : OutputMove::threads;
    if (d.epilogue == MOEKIT_EPILOGUE_DGATED) k.epilogue = OperandMove::tma;
    return k;
  }
  if (!call.strides_32bit) return mma;
  const bool by_tma =
      ((call.beta == Beta::zero && !c_fp32) || (call.beta == Beta::one && c_fp32)) && d.k > 0 && d.n > 0;
  k.transposed = d.gather == MOEKIT_GEMM_GATHER_B && !c_fp32 && by_tma;
  const int32_t gather = k.transposed ? MOEKIT_GEMM_GATHER_A : d.gather;
  const int64_t m = k.transposed ? d.n : d.k;
  k.cluster = pair && gather != MOEKIT_GEMM_GATHER_B && ceil_div(m, 128) % 2 == 0 ? 2 : 1;
  k.a = gather == MOEKIT_GEMM_GATHER_A   ? OperandMove::cp_async_gather
        : gather == MOEKIT_GEMM_GATHER_B ? OperandMove::tma
                                         : OperandMove::cp_async;
  k.b = gather == MOEKIT_GEMM_GATHER_B ? OperandMove::cp_async_gather : OperandMove::tma;
  k.c = !by_tma ? OutputMove::threads : c_fp32 ? OutputMove::tma_reduce_add : OutputMove::tma_store;
  return k;
}

// The path as one word: the kernel family of the first variant, "_pair" when it runs in clusters of 2.
std::string path_of(const GemmConfig& c) {
  const GemmKernel& k = c.variants[0].kernel;
  if (k.path == GemmPath::mma_sync) return "mma";
  return k.cluster == 2 ? "wgmma_pair" : "wgmma";
}

// Every variant wgmma with `cluster` CTAs per cluster (varlen M: padded iff 2).
bool all_wgmma(const GemmConfig& c, int32_t cluster) {
  for (int i = 0; i < c.count; ++i)
    if (c.variants[i].kernel.path != GemmPath::wgmma || c.variants[i].kernel.cluster != cluster) return false;
  return true;
}

// Clears the overrides at the end of a test, even one that stopped at a failed REQUIRE.
struct ClearGemmEnvironment {
  ~ClearGemmEnvironment() {
    unsetenv("MOEKIT_GEMM_PATH");
    unsetenv("MOEKIT_GEMM_TILE");
    unsetenv("MOEKIT_GEMM_SCHEDULE");
  }
};

}  // namespace

TEST_CASE("gemm config: the heuristic's choices", "[gemm]") {
  constexpr int sms = kSms;
  // Wide products with thousands of tiles take 128x256.
  CHECK(choose_gemm_tile(varlen_m(128, 131072, 2048, 4096), sms) == GemmTile::m128_n256);
  CHECK(choose_gemm_tile(varlen_k(128, 131072, 2048, 4096), sms) == GemmTile::m128_n256);
  // At most 128 wide: 128x128.
  CHECK(choose_gemm_tile(varlen_m(128, 131072, 128, 4096), sms) == GemmTile::m128_n128);
  CHECK(choose_gemm_tile(varlen_k(8, 4096, 1024, 64), sms) == GemmTile::m128_n128);
  // 384 and 640 wide pad by a third / a fifth with 256-wide tiles, not at all with 128-wide ones.
  CHECK(choose_gemm_tile(varlen_m(64, 65536, 384, 1536), sms) == GemmTile::m128_n128);
  CHECK(choose_gemm_tile(varlen_m(64, 65536, 640, 1536), sms) == GemmTile::m128_n128);
  CHECK(choose_gemm_tile(varlen_m(64, 65536, 1280, 1536), sms) == GemmTile::m128_n256);
  // Fewer 128x256 tiles than SMs: the smaller tile fills more of the device.
  CHECK(choose_gemm_tile(varlen_m(4, 1024, 1024, 1024), sms) == GemmTile::m128_n128);
  CHECK(choose_gemm_tile(varlen_k(2, 1024, 512, 512), sms) == GemmTile::m128_n128);

  // The configuration takes the heuristic's tile for the descriptor's shape, in every variant, on either path.
  const moekit_gemm_desc_t wide = desc(MOEKIT_GEMM_VARLEN_M, MOEKIT_EPILOGUE_STORE, 0, 128, 131072, 2048, 4096);
  const moekit_gemm_desc_t small = desc(MOEKIT_GEMM_VARLEN_M, MOEKIT_EPILOGUE_STORE, 0, 4, 1024, 1024, 1024);
  for (GemmPathOverride path : {GemmPathOverride::none, GemmPathOverride::mma}) {
    const GemmConfig w = config(wide, path_override(path));
    const GemmConfig s = config(small, path_override(path));
    for (int i = 0; i < w.count; ++i) CHECK(w.variants[i].kernel.tile == GemmTile::m128_n256);
    for (int i = 0; i < s.count; ++i) CHECK(s.variants[i].kernel.tile == GemmTile::m128_n128);
  }
}

TEST_CASE("gemm config: DGATED tiles the activation width, varlen K the C matrix", "[gemm]") {
  const moekit_gemm_desc_t dgated =
      desc(MOEKIT_GEMM_VARLEN_M, MOEKIT_EPILOGUE_DGATED, MOEKIT_ACT_SWIGLU, 128, 65536, 2048, 4096);
  CHECK(gemm_shape(dgated).n == 1024);
  CHECK(gemm_shape(dgated).k == 4096);
  const moekit_gemm_desc_t plain =
      desc(MOEKIT_GEMM_VARLEN_M, MOEKIT_EPILOGUE_DGATED, MOEKIT_ACT_RELU, 128, 65536, 1024, 4096);
  CHECK(gemm_shape(plain).n == 1024);
  const moekit_gemm_desc_t wgrad =
      desc(MOEKIT_GEMM_VARLEN_K, MOEKIT_EPILOGUE_STORE, MOEKIT_ACT_SWIGLU, 8, 4096, 512, 256);
  CHECK(gemm_shape(wgrad).m == 256);
  CHECK(gemm_shape(wgrad).n == 512);
  // The workspace's column tiles cover the tiled width: 1024 / 256 for DGATED's 2048-wide h.
  moekit_gemm_desc_t dgated_kn = dgated;
  dgated_kn.b_layout = MOEKIT_GEMM_B_KN;
  CHECK(config(dgated_kn, tile_override(GemmTile::m128_n256)).workspace.n_tiles == 4);
}

TEST_CASE("gemm config: MOEKIT_GEMM_TILE overrides the heuristic", "[gemm]") {
  ClearGemmEnvironment clear;
  const moekit_gemm_desc_t wide = desc(MOEKIT_GEMM_VARLEN_M, MOEKIT_EPILOGUE_STORE, 0, 128, 131072, 2048, 4096);
  const auto tile_from_environment = [&wide] {
    return config(wide, gemm_overrides_from_environment()).variants[0].kernel.tile;
  };
  setenv("MOEKIT_GEMM_TILE", "128x128", 1);
  CHECK(gemm_overrides_from_environment().tile_forced);
  CHECK(gemm_overrides_from_environment().tile == GemmTile::m128_n128);
  CHECK(tile_from_environment() == GemmTile::m128_n128);
  setenv("MOEKIT_GEMM_TILE", "nonsense", 1);
  CHECK_FALSE(gemm_overrides_from_environment().tile_forced);
  CHECK(tile_from_environment() == GemmTile::m128_n256);
  unsetenv("MOEKIT_GEMM_TILE");
  CHECK_FALSE(gemm_overrides_from_environment().tile_forced);
  CHECK(tile_from_environment() == GemmTile::m128_n256);

  // Forcing the tile the heuristic would not take, on either path, in every variant.
  const moekit_gemm_desc_t small = desc(MOEKIT_GEMM_VARLEN_M, MOEKIT_EPILOGUE_STORE, 0, 4, 1024, 1024, 1024);
  setenv("MOEKIT_GEMM_TILE", "128x256", 1);
  CHECK(gemm_overrides_from_environment().tile == GemmTile::m128_n256);
  for (GemmPathOverride path : {GemmPathOverride::none, GemmPathOverride::mma}) {
    GemmOverrides env = gemm_overrides_from_environment();
    env.path = path;
    const GemmConfig c = config(small, env);
    for (int i = 0; i < c.count; ++i) CHECK(c.variants[i].kernel.tile == GemmTile::m128_n256);
  }
  unsetenv("MOEKIT_GEMM_TILE");
}

TEST_CASE("gemm config: MOEKIT_GEMM_PATH reads as the path override", "[gemm]") {
  ClearGemmEnvironment clear;
  unsetenv("MOEKIT_GEMM_PATH");
  CHECK(gemm_overrides_from_environment().path == GemmPathOverride::none);
  setenv("MOEKIT_GEMM_PATH", "mma", 1);
  CHECK(gemm_overrides_from_environment().path == GemmPathOverride::mma);
  setenv("MOEKIT_GEMM_PATH", "wgmma", 1);
  CHECK(gemm_overrides_from_environment().path == GemmPathOverride::wgmma_single);
  setenv("MOEKIT_GEMM_PATH", "wgmma_pair", 1);
  CHECK(gemm_overrides_from_environment().path == GemmPathOverride::wgmma_pair);
  setenv("MOEKIT_GEMM_PATH", "mma_sync", 1);  // not a name the override takes
  CHECK(gemm_overrides_from_environment().path == GemmPathOverride::none);
  unsetenv("MOEKIT_GEMM_PATH");
  CHECK(gemm_overrides_from_environment().path == GemmPathOverride::none);
  CHECK_FALSE(gemm_overrides_from_environment().tile_forced);
}

TEST_CASE("gemm config: MOEKIT_GEMM_SCHEDULE runs varlen M ping-pong at 128x128", "[gemm]") {
  ClearGemmEnvironment clear;
  CHECK_FALSE(gemm_overrides_from_environment().schedule_forced);
  setenv("MOEKIT_GEMM_SCHEDULE", "pingpong", 1);
  const GemmOverrides env = gemm_overrides_from_environment();
  CHECK(env.schedule_forced);
  CHECK(env.schedule == GemmSchedule::pingpong);
  setenv("MOEKIT_GEMM_SCHEDULE", "cooperative", 1);
  CHECK(gemm_overrides_from_environment().schedule == GemmSchedule::cooperative);
  setenv("MOEKIT_GEMM_SCHEDULE", "ping-pong", 1);  // not a name the override takes
  CHECK_FALSE(gemm_overrides_from_environment().schedule_forced);

  // Every varlen-M variant of the wgmma kernel, whatever tile the heuristic or MOEKIT_GEMM_TILE names; varlen K and
  // the mma.sync kernel stay cooperative.
  const moekit_gemm_desc_t wide = desc(MOEKIT_GEMM_VARLEN_M, MOEKIT_EPILOGUE_STORE, 0, 128, 131072, 2048, 4096);
  for (const GemmOverrides& o : {env, schedule_override(GemmSchedule::pingpong, tile_override(GemmTile::m128_n256))}) {
    const GemmConfig c = config(wide, o);
    for (int i = 0; i < c.count; ++i) {
      CHECK(c.variants[i].kernel.schedule == GemmSchedule::pingpong);
      CHECK(c.variants[i].kernel.tile == GemmTile::m128_n128);
    }
    CHECK(describe_gemm_config(wide, c).find("wgmma 128x128 ping-pong") != std::string::npos);
    CHECK(c.workspace.n_tiles == 2048 / 128);
  }
  // By default: ping-pong where the tile is 128x128 for STORE and BIAS with k <= 1024, nowhere else.
  const auto schedule = [](moekit_gemm_desc_t d, GemmOverrides o = GemmOverrides{}) {
    return config(d, o).variants[0].kernel.schedule;
  };
  moekit_gemm_desc_t narrow = desc(MOEKIT_GEMM_VARLEN_M, MOEKIT_EPILOGUE_STORE, 0, 64, 65536, 128, 1024);
  CHECK(schedule(narrow) == GemmSchedule::pingpong);
  narrow.epilogue = MOEKIT_EPILOGUE_BIAS;
  CHECK(schedule(narrow) == GemmSchedule::pingpong);
  narrow.k = 1032;
  CHECK(schedule(narrow) == GemmSchedule::cooperative);
  narrow.k = 512;
  CHECK(schedule(narrow, tile_override(GemmTile::m128_n256)) == GemmSchedule::cooperative);
  CHECK(schedule(wide) == GemmSchedule::cooperative);                                    // 128x256
  CHECK(schedule(wide, tile_override(GemmTile::m128_n128)) == GemmSchedule::cooperative);  // k = 4096
  moekit_gemm_desc_t gated = narrow;
  gated.epilogue = MOEKIT_EPILOGUE_GATED;
  gated.activation = MOEKIT_ACT_SWIGLU;
  CHECK(schedule(gated) == GemmSchedule::cooperative);
  const GemmConfig wgrad = config(desc(MOEKIT_GEMM_VARLEN_K, MOEKIT_EPILOGUE_STORE, 0, 8, 4096, 512, 256), env);
  for (int i = 0; i < wgrad.count; ++i) CHECK(wgrad.variants[i].kernel.schedule == GemmSchedule::cooperative);
  const GemmConfig mma = config(wide, [&] {
    GemmOverrides o = env;
    o.path = GemmPathOverride::mma;
    return o;
  }());
  CHECK(mma.variants[0].kernel.schedule == GemmSchedule::cooperative);
}

TEST_CASE("gemm config: the workspace holds every row tile and every DGATED partial", "[gemm]") {
  for (GemmTile tile : {GemmTile::m128_n256, GemmTile::m128_n128}) {
    for (GemmPathOverride path : {GemmPathOverride::mma, GemmPathOverride::wgmma_single,
                                  GemmPathOverride::wgmma_pair, GemmPathOverride::none}) {
      INFO("tile " << static_cast<int>(tile) << ", path override " << static_cast<int>(path));
      const GemmOverrides env = tile_override(tile, path);
      const int64_t bm = gemm_tile_shape(tile).bm, bn = gemm_tile_shape(tile).bn;
      // 7 groups of 1 row: 7 tiles, not ceil(7 / bm); one more, empty, when clusters of 2 pad the list.
      const GemmConfig small = config(desc(MOEKIT_GEMM_VARLEN_M, MOEKIT_EPILOGUE_STORE, 0, 7, 7, 64, 64), env);
      const bool small_pads = path == GemmPathOverride::wgmma_pair;  // STORE pairs only when asked to
      CHECK(small.variants[0].kernel.pad_tile_pairs == small_pads);
      CHECK(small.workspace.m_tiles == 7 + (small_pads ? 1 : 0));
      CHECK(small.workspace.ds_partials == 0);
      // Counts that are no tile multiple: the bound covers one partial tile per group (and the padding tile).
      moekit_gemm_desc_t d =
          desc(MOEKIT_GEMM_VARLEN_M, MOEKIT_EPILOGUE_DGATED, MOEKIT_ACT_SWIGLU, 128, 131072 + 77, 2048, 4096);
      d.b_layout = MOEKIT_GEMM_B_KN;  // the wgmma kernel's DGATED layout, so the path override applies
      const GemmConfig c = config(d, env);
      const GemmWorkspaceLayout& layout = c.workspace;
      const bool pads = path == GemmPathOverride::wgmma_pair || path == GemmPathOverride::none;  // k = 4096 pairs
      CHECK(c.variants[0].kernel.pad_tile_pairs == pads);
      const int64_t pad = pads ? 1 : 0;
      CHECK(layout.m_tiles >= (131072 + 77) / bm + 1 + pad);
      CHECK(layout.m_tiles <= (131072 + 77) / bm + 128 + pad);
      CHECK(layout.n_tiles == (1024 + bn - 1) / bn);
      CHECK(layout.tile_list % 256 == 0);
      CHECK(layout.ds_partials % 256 == 0);
      // One partial per row and 64-column chunk of the 1024-wide product, whatever the tile.
      CHECK(layout.ds_chunks == 1024 / 64);
      CHECK(layout.bytes >= layout.ds_partials + 4 * static_cast<size_t>((131072 + 77) * layout.ds_chunks));
      CHECK(layout.bytes >= layout.tile_list + 16 * static_cast<size_t>(layout.m_tiles));
      // varlen K needs no workspace, paired or not.
      CHECK(config(desc(MOEKIT_GEMM_VARLEN_K, MOEKIT_EPILOGUE_STORE, 0, 8, 4096, 512, 256), env).workspace.bytes == 0);
    }
  }

  // Pairing pads the row tiles to an even count: one more tile, never fewer bytes.
  const moekit_gemm_desc_t up = up_projection();
  const GemmConfig single = config(up, tile_override(GemmTile::m128_n256, GemmPathOverride::wgmma_single));
  const GemmConfig paired = config(up, tile_override(GemmTile::m128_n256, GemmPathOverride::wgmma_pair));
  CHECK_FALSE(single.variants[0].kernel.pad_tile_pairs);
  CHECK(paired.variants[0].kernel.pad_tile_pairs);
  CHECK(paired.workspace.m_tiles == single.workspace.m_tiles + 1);
  CHECK(paired.workspace.bytes >= single.workspace.bytes);
  // The bound counts the padding tile when any variant pads, whichever is variant 0.
  GemmConfig mixed = single;
  mixed.variants[mixed.count - 1].kernel.pad_tile_pairs = true;
  CHECK(gemm_workspace_layout(up, mixed).m_tiles == single.workspace.m_tiles + 1);
}

TEST_CASE("gemm config: the wgmma kernel takes only the varlen-M shapes it was written for", "[gemm]") {
  moekit_gemm_desc_t up = desc(MOEKIT_GEMM_VARLEN_M, MOEKIT_EPILOGUE_GATED, MOEKIT_ACT_SWIGLU, 128, 131072, 2048, 4096);
  up.b_layout = MOEKIT_GEMM_B_NK;
  const GemmDevice sm80{kSms, 8, 0}, sm100{kSms, 10, 0};
  CHECK(wgmma_capable(up, kH200));
  CHECK_FALSE(wgmma_capable(up, sm80));
  CHECK_FALSE(wgmma_capable(up, sm100));
  CHECK_FALSE(wgmma_capable(up, GemmDevice{kSms, 9, 1}));
  CHECK(path_of(config(up, {}, sm80)) == "mma");
  CHECK(path_of(config(up, {}, sm100)) == "mma");
  moekit_gemm_desc_t plain_up = up;  // the same shape with STORE
  plain_up.epilogue = MOEKIT_EPILOGUE_STORE;
  CHECK(path_of(config(plain_up)) == "wgmma");
  moekit_gemm_desc_t down = up;
  down.epilogue = MOEKIT_EPILOGUE_BIAS;
  down.n = 4096;
  down.k = 1024;
  CHECK(path_of(config(down)) == "wgmma");
  moekit_gemm_desc_t other = up;
  other.k = 4104;  // a multiple of 8, not of 64: the last slice's tail is zero-filled
  CHECK(wgmma_capable(other, kH200));
  CHECK(path_of(config(other)) == "wgmma_pair");  // GATED at k >= 4096
  other = up;
  other.n = 2056;  // the last column tile's columns past n are zero-filled and never stored
  CHECK(path_of(config(other)) == "wgmma_pair");
  other = up;
  other.b_layout = MOEKIT_GEMM_B_KN;  // GATED pairs the columns of a K-major B only
  CHECK(path_of(config(other)) == "mma");
  other = up;
  other.epilogue = MOEKIT_EPILOGUE_DGATED;  // DGATED reads an MN-major B only
  CHECK_FALSE(wgmma_capable(other, kH200));
  moekit_gemm_desc_t dgated = up;  // dA = dout W2, W2 [E, H, I] as [k = H, n = I]; desc n = h's width 2I = 2048
  dgated.b_layout = MOEKIT_GEMM_B_KN;
  dgated.epilogue = MOEKIT_EPILOGUE_DGATED;
  CHECK(wgmma_capable(dgated, kH200));
  CHECK_FALSE(wgmma_capable(dgated, sm80));
  CHECK(path_of(config(dgated, {}, sm80)) == "mma");
  dgated.n = 2 * 1000;  // I = 1000: a multiple of 8, not of 64
  CHECK(wgmma_capable(dgated, kH200));
  CHECK(path_of(config(dgated)) == "wgmma_pair");
  moekit_gemm_desc_t dxe = down;  // dxe = dh W1, W1 [E, 2I, H] as [k = 2I, n = H]
  dxe.b_layout = MOEKIT_GEMM_B_KN;
  dxe.epilogue = MOEKIT_EPILOGUE_STORE;
  CHECK(path_of(config(dxe)) == "wgmma");
  dxe.n = 4104;
  CHECK(path_of(config(dxe)) == "wgmma");
  other = up;
  other.dtype = MOEKIT_DTYPE_FP32;
  other.out_dtype = MOEKIT_DTYPE_FP32;
  CHECK_FALSE(wgmma_capable(other, kH200));
  CHECK(path_of(config(other)) == "mma");
  other = up;
  other.dtype = MOEKIT_DTYPE_FP16;
  other.out_dtype = MOEKIT_DTYPE_FP16;
  CHECK(wgmma_capable(other, kH200));
  // varlen K takes STORE at any shape the planner accepts, on sm_90 only.
  const moekit_gemm_desc_t wgrad =
      desc(MOEKIT_GEMM_VARLEN_K, MOEKIT_EPILOGUE_STORE, MOEKIT_ACT_SWIGLU, 8, 4096, 512, 256);
  CHECK(wgmma_capable(wgrad, kH200));
  CHECK_FALSE(wgmma_capable(wgrad, sm80));
  CHECK(path_of(config(wgrad, {}, sm80)) == "mma");
  moekit_gemm_desc_t odd_wgrad = wgrad;
  odd_wgrad.n = 1000;
  odd_wgrad.k = 1000;
  CHECK(wgmma_capable(odd_wgrad, kH200));

  // A problem the wgmma kernel cannot run is the one mma.sync kernel, whatever a call's facts.
  other = up;
  other.b_layout = MOEKIT_GEMM_B_KN;
  const GemmConfig mma = config(other);
  CHECK(mma.count == 1);
  CHECK(mma.variants[0].kernel.path == GemmPath::mma_sync);
  CHECK(mma.variants[0].kernel.a == OperandMove::cp_async);
  CHECK(mma.variants[0].kernel.b == OperandMove::cp_async);
  CHECK(mma.variants[0].kernel.c == OutputMove::threads);
  for (uint32_t f = 0; f < 16; ++f) CHECK(&mma.for_call(f) == &mma.variants[0].kernel);
}

TEST_CASE("gemm config: the default pairing table", "[gemm]") {
  moekit_gemm_desc_t up = desc(MOEKIT_GEMM_VARLEN_M, MOEKIT_EPILOGUE_GATED, MOEKIT_ACT_SWIGLU, 128, 131072, 2048, 4096);
  // The GATED up-projection runs paired from k = 4096 on, single below (DGATED too); every variant alike.
  const GemmConfig paired_up = config(up);
  CHECK(path_of(paired_up) == "wgmma_pair");
  CHECK(all_wgmma(paired_up, 2));
  moekit_gemm_desc_t short_up = up;
  short_up.k = 1536;
  CHECK(path_of(config(short_up)) == "wgmma");
  CHECK(all_wgmma(config(short_up), 1));
  short_up.k = 4032;
  CHECK(path_of(config(short_up)) == "wgmma");
  moekit_gemm_desc_t plain_up = up;  // STORE and BIAS stay single at any k
  plain_up.epilogue = MOEKIT_EPILOGUE_STORE;
  CHECK(path_of(config(plain_up)) == "wgmma");
  CHECK(all_wgmma(config(plain_up), 1));
  plain_up.epilogue = MOEKIT_EPILOGUE_BIAS;
  CHECK(path_of(config(plain_up)) == "wgmma");
  moekit_gemm_desc_t dgated = up;
  dgated.b_layout = MOEKIT_GEMM_B_KN;
  dgated.epilogue = MOEKIT_EPILOGUE_DGATED;
  CHECK(path_of(config(dgated)) == "wgmma_pair");  // k = H = 4096: paired, as GATED
  CHECK(all_wgmma(config(dgated), 2));
  moekit_gemm_desc_t short_dgated = dgated;
  short_dgated.k = 1536;
  CHECK(path_of(config(short_dgated)) == "wgmma");

  // varlen K pairs from 512 rows per group on average: 4096 rows over 8 groups pair, 4095 do not.
  const moekit_gemm_desc_t wgrad =
      desc(MOEKIT_GEMM_VARLEN_K, MOEKIT_EPILOGUE_STORE, MOEKIT_ACT_SWIGLU, 8, 4096, 512, 256);
  const GemmConfig paired_wgrad = config(wgrad);
  CHECK(path_of(paired_wgrad) == "wgmma_pair");
  REQUIRE(paired_wgrad.count == 3);
  CHECK(paired_wgrad.variants[1].kernel.cluster == 2);
  CHECK(paired_wgrad.variants[2].kernel.path == GemmPath::mma_sync);
  moekit_gemm_desc_t short_wgrad = wgrad;
  short_wgrad.max_rows = 4095;
  CHECK(path_of(config(short_wgrad)) == "wgmma");
  CHECK(config(short_wgrad).variants[1].kernel.cluster == 1);
}

TEST_CASE("gemm config: MOEKIT_GEMM_PATH replaces the path where the wgmma kernel can run", "[gemm]") {
  ClearGemmEnvironment clear;
  moekit_gemm_desc_t up = desc(MOEKIT_GEMM_VARLEN_M, MOEKIT_EPILOGUE_GATED, MOEKIT_ACT_SWIGLU, 128, 131072, 2048, 4096);
  moekit_gemm_desc_t short_up = up;
  short_up.k = 1536;
  moekit_gemm_desc_t store = up;
  store.epilogue = MOEKIT_EPILOGUE_STORE;
  moekit_gemm_desc_t dgated = up;
  dgated.b_layout = MOEKIT_GEMM_B_KN;
  dgated.epilogue = MOEKIT_EPILOGUE_DGATED;
  moekit_gemm_desc_t other = up;  // fp32 operands: never the wgmma kernel
  other.dtype = MOEKIT_DTYPE_FP32;
  other.out_dtype = MOEKIT_DTYPE_FP32;
  const moekit_gemm_desc_t wgrad =
      desc(MOEKIT_GEMM_VARLEN_K, MOEKIT_EPILOGUE_STORE, MOEKIT_ACT_SWIGLU, 8, 4096, 512, 256);
  moekit_gemm_desc_t short_wgrad = wgrad;
  short_wgrad.max_rows = 4095;
  moekit_gemm_desc_t odd_wgrad = wgrad;  // m = 1032: 9 m tiles, the last without a partner
  odd_wgrad.k = 1032;
  const auto path = [](const moekit_gemm_desc_t& d) { return path_of(config(d, gemm_overrides_from_environment())); };

  setenv("MOEKIT_GEMM_PATH", "wgmma", 1);
  CHECK(path(dgated) == "wgmma");
  CHECK(all_wgmma(config(dgated, gemm_overrides_from_environment()), 1));
  CHECK(path(up) == "wgmma");
  CHECK(path(wgrad) == "wgmma");
  CHECK(config(wgrad, gemm_overrides_from_environment()).variants[1].kernel.cluster == 1);
  CHECK(path(other) == "mma");
  setenv("MOEKIT_GEMM_PATH", "mma", 1);
  CHECK(path(up) == "mma");
  CHECK(config(up, gemm_overrides_from_environment()).count == 1);
  CHECK(path(wgrad) == "mma");
  CHECK(config(wgrad, gemm_overrides_from_environment()).count == 1);
  setenv("MOEKIT_GEMM_PATH", "wgmma_pair", 1);
  CHECK(path(up) == "wgmma_pair");
  CHECK(path(short_up) == "wgmma_pair");
  CHECK(path(store) == "wgmma_pair");
  CHECK(all_wgmma(config(store, gemm_overrides_from_environment()), 2));
  CHECK(path(dgated) == "wgmma_pair");
  // varlen K too, where the product pairs; the others run in single CTAs.
  CHECK(path(wgrad) == "wgmma_pair");
  CHECK(path(short_wgrad) == "wgmma_pair");
  CHECK(path(odd_wgrad) == "wgmma");
  CHECK(path(other) == "mma");
  unsetenv("MOEKIT_GEMM_PATH");
  CHECK(path(up) == "wgmma_pair");
  CHECK(path(short_up) == "wgmma");
  CHECK(path(store) == "wgmma");
  CHECK(path(short_wgrad) == "wgmma");
}

TEST_CASE("gemm config: GATED by TMA only for a gated activation, CONCAT, alpha 1, no bias, I % 64 == 0", "[gemm]") {
  const moekit_gemm_desc_t up = up_projection();
  const GemmConfig c = config(up);
  REQUIRE(c.count == 2);
  CHECK(c.variants[0].needs == kUnitAlphaNoBias);
  CHECK(c.variants[0].kernel.path == GemmPath::wgmma);
  CHECK(c.variants[0].kernel.c == OutputMove::tma_store);
  CHECK(c.variants[0].kernel.a == OperandMove::cp_async_gather);
  CHECK(c.variants[0].kernel.b == OperandMove::tma);
  // The fallback is the same wgmma kernel storing by the threads.
  GemmKernel by_threads = c.variants[0].kernel;
  by_threads.c = OutputMove::threads;
  CHECK(same_kernel(c.variants[1].kernel, by_threads));
  CHECK(c.for_call(kPlainCall).c == OutputMove::tma_store);
  CHECK(c.for_call(kBetaZero | kStrides32Bit).c == OutputMove::threads);  // alpha = 0.5, or a bias
  CHECK(c.for_call(kUnitAlphaNoBias).c == OutputMove::tma_store);        // row strides do not matter to varlen M

  for (int32_t kind : {MOEKIT_ACT_GEGLU, MOEKIT_ACT_REGLU, MOEKIT_ACT_SWIGLU_OAI}) {
    moekit_gemm_desc_t d = up;
    d.activation = kind;
    CHECK(config(d).for_call(kPlainCall).c == OutputMove::tma_store);
  }
  // Every other GATED: one wgmma variant by the threads.
  moekit_gemm_desc_t interleaved = up;
  interleaved.glu_layout = MOEKIT_GLU_INTERLEAVED;
  CHECK(threads_only(interleaved));
  moekit_gemm_desc_t narrow = up;
  narrow.n = 2 * 96;  // I = 96: n % 64 == 0 but I is not: a box would reach into the up columns
  CHECK(wgmma_capable(narrow, kH200));
  CHECK(threads_only(narrow));
  moekit_gemm_desc_t plain = up;
  plain.activation = MOEKIT_ACT_GELU;
  plain.n = 1024;
  CHECK(threads_only(plain));
  // A call without rows launches nothing on varlen M (run_grouped_gemm returns first), so no configuration case.
}

TEST_CASE("gemm config: varlen M STORE by TMA for beta = 0 into C of the operand dtype, BIAS and DGATED by the threads",
          "[gemm]") {
  moekit_gemm_desc_t store = up_projection();
  store.epilogue = MOEKIT_EPILOGUE_STORE;
  const GemmConfig c = config(store);
  REQUIRE(c.count == 2);
  CHECK(c.variants[0].needs == kBetaZero);
  CHECK(c.variants[0].kernel.c == OutputMove::tma_store);
  GemmKernel by_threads = c.variants[0].kernel;
  by_threads.c = OutputMove::threads;
  CHECK(same_kernel(c.variants[1].kernel, by_threads));
  CHECK(c.for_call(kPlainCall).c == OutputMove::tma_store);
  CHECK(c.for_call(kBetaZero | kStrides32Bit).c == OutputMove::tma_store);  // alpha and strides do not matter
  CHECK(c.for_call(kBetaOne | kUnitAlphaNoBias | kStrides32Bit).c == OutputMove::threads);  // accumulate: beta = 1
  CHECK(c.for_call(kUnitAlphaNoBias | kStrides32Bit).c == OutputMove::threads);   // beta = 0.5
  moekit_gemm_desc_t fp16 = store;
  fp16.dtype = MOEKIT_DTYPE_FP16;
  fp16.out_dtype = MOEKIT_DTYPE_FP16;
  CHECK(config(fp16).for_call(kPlainCall).c == OutputMove::tma_store);

  moekit_gemm_desc_t fp32_out = store;
  fp32_out.out_dtype = MOEKIT_DTYPE_FP32;
  CHECK(threads_only(fp32_out));
  moekit_gemm_desc_t bias = store;
  bias.epilogue = MOEKIT_EPILOGUE_BIAS;
  CHECK(threads_only(bias));
  moekit_gemm_desc_t dgated = up_projection();  // h's width 2I = 2048, the product's I = 1024
  dgated.epilogue = MOEKIT_EPILOGUE_DGATED;
  dgated.b_layout = MOEKIT_GEMM_B_KN;
  CHECK(threads_only(dgated));
  CHECK(config(dgated).variants[0].kernel.epilogue == OperandMove::tma);  // h loaded by TMA
}

TEST_CASE("gemm config: varlen K stores by TMA for beta = 0, reduce-adds into an fp32 C for beta = 1", "[gemm]") {
  const moekit_gemm_desc_t k = weight_gradient(MOEKIT_GEMM_GATHER_NONE, 512, 1024);
  const GemmConfig c = config(k);
  REQUIRE(c.count == 3);
  CHECK(c.variants[0].needs == (kBetaZero | kStrides32Bit));
  CHECK(c.variants[0].kernel.path == GemmPath::wgmma);
  CHECK(c.variants[0].kernel.c == OutputMove::tma_store);  // stores into C of the operand dtype
  CHECK(c.variants[1].needs == kStrides32Bit);
  CHECK(c.variants[1].kernel.path == GemmPath::wgmma);
  CHECK(c.variants[1].kernel.c == OutputMove::threads);
  CHECK_FALSE(c.variants[1].kernel.transposed);
  CHECK(c.variants[2].kernel.path == GemmPath::mma_sync);
  CHECK(c.for_call(kPlainCall).c == OutputMove::tma_store);
  CHECK(c.for_call(kBetaOne | kStrides32Bit).c == OutputMove::threads);  // beta = 1 into bf16: read by the threads
  CHECK(c.for_call(kStrides32Bit).c == OutputMove::threads);             // beta = 0.5

  moekit_gemm_desc_t added = k;  // reduce-adds into an fp32 C
  added.out_dtype = MOEKIT_DTYPE_FP32;
  const GemmConfig a = config(added);
  REQUIRE(a.count == 3);
  CHECK(a.variants[0].needs == (kBetaOne | kStrides32Bit));
  CHECK(a.variants[0].kernel.c == OutputMove::tma_reduce_add);
  CHECK(a.for_call(kBetaOne | kStrides32Bit).c == OutputMove::tma_reduce_add);
  CHECK(a.for_call(kStrides32Bit).c == OutputMove::threads);              // beta = 0.5
  CHECK(a.for_call(kBetaZero | kStrides32Bit).c == OutputMove::threads);  // beta = 0 into fp32: the threads store
  // Row strides of 2^31 elements or more: the mma.sync kernel, whatever beta.
  CHECK(c.for_call(kBetaZero | kUnitAlphaNoBias).path == GemmPath::mma_sync);
  CHECK(a.for_call(kBetaOne).path == GemmPath::mma_sync);
  CHECK(c.for_call(0).path == GemmPath::mma_sync);
  // C's group stride always maps by TMA: the call's checks make every row stride of C a multiple of 8 elements
  // (16 bytes), so no configuration case is left for a stride TMA could not take.
}

TEST_CASE("gemm config: varlen K with B gathered and a bf16 / fp16 C stored by TMA runs transposed", "[gemm]") {
  // dW1 = dh^T x, x gathered: C [E, 2I, H] with m = 2I = 512, n = H = 1024.
  const moekit_gemm_desc_t dw1 = weight_gradient(MOEKIT_GEMM_GATHER_B, 512, 1024);
  const GemmConfig c = config(dw1);
  REQUIRE(c.count == 3);
  const GemmKernel& t = c.variants[0].kernel;
  CHECK(c.variants[0].needs == (kBetaZero | kStrides32Bit));
  CHECK(t.transposed);
  CHECK(t.c == OutputMove::tma_store);
  CHECK(t.a == OperandMove::cp_async_gather);  // the gathered x is A of C^T = x^T dh
  CHECK(t.b == OperandMove::tma);
  // The threads' variant keeps C's own layout: B gathered, A by TMA.
  const GemmKernel& u = c.variants[1].kernel;
  CHECK_FALSE(u.transposed);
  CHECK(u.c == OutputMove::threads);
  CHECK(u.a == OperandMove::tma);
  CHECK(u.b == OperandMove::cp_async_gather);
  CHECK(c.variants[2].kernel.b == OperandMove::cp_async_gather);
  CHECK(c.for_call(kPlainCall).transposed);
  CHECK_FALSE(c.for_call(kBetaOne | kStrides32Bit).transposed);

  moekit_gemm_desc_t fp16 = dw1;
  fp16.dtype = MOEKIT_DTYPE_FP16;
  fp16.out_dtype = MOEKIT_DTYPE_FP16;
  CHECK(config(fp16).for_call(kPlainCall).transposed);
  moekit_gemm_desc_t fp32_out = dw1;  // fp32 reduce-adds stay in C's own layout
  fp32_out.out_dtype = MOEKIT_DTYPE_FP32;
  const GemmConfig f = config(fp32_out);
  CHECK(f.for_call(kBetaOne | kStrides32Bit).c == OutputMove::tma_reduce_add);
  for (int i = 0; i < f.count; ++i) CHECK_FALSE(f.variants[i].kernel.transposed);
  CHECK(f.variants[0].kernel.b == OperandMove::cp_async_gather);
  // dW2 = a^T dout with a gathered: A is already the gathered operand.
  const GemmConfig a_gathered = config(weight_gradient(MOEKIT_GEMM_GATHER_A, 512, 1024));
  for (int i = 0; i < a_gathered.count; ++i) CHECK_FALSE(a_gathered.variants[i].kernel.transposed);
  CHECK(a_gathered.variants[0].kernel.a == OperandMove::cp_async_gather);
  CHECK(a_gathered.variants[0].kernel.b == OperandMove::tma);
  const GemmConfig contiguous = config(weight_gradient(MOEKIT_GEMM_GATHER_NONE, 512, 1024));
  for (int i = 0; i < contiguous.count; ++i) CHECK_FALSE(contiguous.variants[i].kernel.transposed);
  CHECK(contiguous.variants[0].kernel.a == OperandMove::cp_async);
  CHECK(contiguous.variants[0].kernel.b == OperandMove::tma);
  const GemmConfig up = config(up_projection());
  for (int i = 0; i < up.count; ++i) CHECK_FALSE(up.variants[i].kernel.transposed);
  // The mma.sync path never transposes.
  const GemmConfig mma = config(dw1, path_override(GemmPathOverride::mma));
  CHECK(mma.count == 1);
  CHECK_FALSE(mma.variants[0].kernel.transposed);
}

TEST_CASE("gemm config: varlen K pairs where B is loaded by TMA and the m tiles pair up", "[gemm]") {
  const GemmOverrides pair = path_override(GemmPathOverride::wgmma_pair);
  for (const GemmOverrides& env : {GemmOverrides{}, pair}) {  // 512 rows per group: the defaults pair too
    INFO("path override " << static_cast<int>(env.path));
    // dW1 as the kernel runs it (transposed): x^T dh, x gathered as A, C^T's m = H = 1024: 8 m tiles of 128.
    const GemmConfig dw1 = config(weight_gradient(MOEKIT_GEMM_GATHER_B, 512, 1024), env);
    CHECK(dw1.variants[0].kernel.cluster == 2);
    CHECK(dw1.variants[1].kernel.cluster == 1);  // untransposed, B gathered: its TMA operand is A, not shared
    const GemmConfig dw1_odd = config(weight_gradient(MOEKIT_GEMM_GATHER_B, 512, 1032), env);  // H = 1032: 9
    CHECK(dw1_odd.variants[0].kernel.cluster == 1);
    const GemmConfig a_gathered = config(weight_gradient(MOEKIT_GEMM_GATHER_A, 1024, 512), env);
    CHECK(a_gathered.variants[0].kernel.cluster == 2);
    CHECK(a_gathered.variants[1].kernel.cluster == 2);
    const GemmConfig contiguous = config(weight_gradient(MOEKIT_GEMM_GATHER_NONE, 1024, 512), env);
    CHECK(contiguous.variants[0].kernel.cluster == 2);
    CHECK(contiguous.variants[1].kernel.cluster == 2);
    const GemmConfig partial = config(weight_gradient(MOEKIT_GEMM_GATHER_A, 1000, 512), env);  // 7 full + 1: 8
    CHECK(partial.variants[0].kernel.cluster == 2);
    const GemmConfig odd = config(weight_gradient(MOEKIT_GEMM_GATHER_A, 1032, 512), env);  // 9: the last alone
    CHECK(odd.variants[0].kernel.cluster == 1);
    CHECK(odd.variants[1].kernel.cluster == 1);
    // The fp32 beta = 1 dW1 keeps B gathered: its TMA operand is A, not shared.
    moekit_gemm_desc_t b_gathered = weight_gradient(MOEKIT_GEMM_GATHER_B, 1024, 512);
    b_gathered.out_dtype = MOEKIT_DTYPE_FP32;
    const GemmConfig b = config(b_gathered, env);
    for (int i = 0; i < b.count; ++i) CHECK(b.variants[i].kernel.cluster == 1);
    for (const GemmConfig* g : {&dw1, &a_gathered, &contiguous})
      for (int i = 0; i < g->count; ++i) CHECK_FALSE(g->variants[i].kernel.pad_tile_pairs);
  }
  // Pairing not wanted: single CTAs where the product would pair.
  moekit_gemm_desc_t few_rows = weight_gradient(MOEKIT_GEMM_GATHER_NONE, 1024, 512);
  few_rows.max_rows = 4095;
  CHECK(config(few_rows).variants[0].kernel.cluster == 1);
  CHECK(config(few_rows, pair).variants[0].kernel.cluster == 2);
  CHECK(config(weight_gradient(MOEKIT_GEMM_GATHER_NONE, 1024, 512), path_override(GemmPathOverride::wgmma_single))
            .variants[0]
            .kernel.cluster == 1);
  // varlen M pairs through its padded tile list instead, whatever its row tiles.
  moekit_gemm_desc_t up = up_projection();
  up.max_rows = 3 * 128;
  const GemmConfig paired_up = config(up, pair);
  CHECK(all_wgmma(paired_up, 2));
  for (int i = 0; i < paired_up.count; ++i) CHECK(paired_up.variants[i].kernel.pad_tile_pairs);
}

TEST_CASE("gemm config: for_call runs the first variant whose requirements the facts meet, else the last", "[gemm]") {
  const GemmConfig c = config(weight_gradient(MOEKIT_GEMM_GATHER_B, 512, 1024));
  REQUIRE(c.count == 3);
  for (uint32_t f = 0; f < 16; ++f) {
    int expected = c.count - 1;
    for (int i = c.count - 2; i >= 0; --i)
      if ((c.variants[i].needs & f) == c.variants[i].needs) expected = i;
    INFO("facts " << f);
    CHECK(&c.for_call(f) == &c.variants[expected].kernel);
  }
  CHECK(&c.for_call(kBetaZero | kStrides32Bit) == &c.variants[0].kernel);
  CHECK(&c.for_call(kBetaZero | kBetaOne | kUnitAlphaNoBias | kStrides32Bit) == &c.variants[0].kernel);
  CHECK(&c.for_call(kStrides32Bit | kBetaOne) == &c.variants[1].kernel);
  CHECK(&c.for_call(kBetaZero) == &c.variants[2].kernel);
  CHECK(&c.for_call(0) == &c.variants[2].kernel);

  // The last variant runs when no earlier one fits, whatever it requires itself.
  GemmConfig made = c;
  made.count = 2;
  made.variants[0].needs = kBetaOne;
  made.variants[1].needs = kUnitAlphaNoBias;
  CHECK(&made.for_call(0) == &made.variants[1].kernel);
  CHECK(&made.for_call(kBetaOne) == &made.variants[0].kernel);
  CHECK(&made.for_call(kBetaOne | kUnitAlphaNoBias) == &made.variants[0].kernel);
  made.count = 1;
  for (uint32_t f = 0; f < 16; ++f) CHECK(&made.for_call(f) == &made.variants[0].kernel);
}

TEST_CASE("gemm config: over a sweep of problems, overrides, devices and calls, each call runs the rules' kernel",
          "[gemm]") {
  // Descriptors of both modes, every epilogue, layout, gather, dtype and activation kind, widths and depths on
  // either side of the 64 multiples, 4096 and the pairing and tiling thresholds.
  std::vector<moekit_gemm_desc_t> descs;
  const std::pair<int64_t, int64_t> row_counts[] = {{8, 4096}, {8, 4095}, {128, 131072 + 77}, {7, 7}};
  for (int32_t dtype : {MOEKIT_DTYPE_BF16, MOEKIT_DTYPE_FP16, MOEKIT_DTYPE_FP32})
    for (const auto& [groups, rows] : row_counts) {
      for (int32_t epilogue :
           {MOEKIT_EPILOGUE_STORE, MOEKIT_EPILOGUE_BIAS, MOEKIT_EPILOGUE_GATED, MOEKIT_EPILOGUE_DGATED})
        for (int32_t layout : {MOEKIT_GEMM_B_NK, MOEKIT_GEMM_B_KN})
          for (int32_t gather : {MOEKIT_GEMM_GATHER_NONE, MOEKIT_GEMM_GATHER_A})
            for (int32_t activation : {MOEKIT_ACT_SWIGLU, MOEKIT_ACT_GEGLU, MOEKIT_ACT_GELU})
              for (int32_t glu : {MOEKIT_GLU_CONCAT, MOEKIT_GLU_INTERLEAVED})
                for (bool fp32_out : {false, true})
                  for (int64_t n : {128, 192, 384, 1040, 2048})
                    for (int64_t k : {64, 1000, 4032, 4096}) {
                      const bool activated = epilogue == MOEKIT_EPILOGUE_GATED || epilogue == MOEKIT_EPILOGUE_DGATED;
                      if (!activated && (activation != MOEKIT_ACT_SWIGLU || glu != MOEKIT_GLU_CONCAT)) continue;
                      if (activated && (fp32_out || (!is_gated(activation) && glu != MOEKIT_GLU_CONCAT))) continue;
                      moekit_gemm_desc_t d = desc(MOEKIT_GEMM_VARLEN_M, epilogue, activation, groups, rows, n, k);
                      d.b_layout = layout;
                      d.gather = gather;
                      d.glu_layout = glu;
                      d.dtype = dtype;
                      d.out_dtype = fp32_out ? MOEKIT_DTYPE_FP32 : dtype;
                      descs.push_back(d);
                    }
      for (int32_t gather : {MOEKIT_GEMM_GATHER_NONE, MOEKIT_GEMM_GATHER_A, MOEKIT_GEMM_GATHER_B})
        for (bool fp32_out : {false, true})
          for (int64_t n : {64, 512, 1000, 1024, 1032})
            for (int64_t m : {256, 512, 1000, 1024, 1032}) {
              moekit_gemm_desc_t d = desc(MOEKIT_GEMM_VARLEN_K, MOEKIT_EPILOGUE_STORE, 0, groups, rows, n, m);
              d.gather = gather;
              d.dtype = dtype;
              d.out_dtype = fp32_out ? MOEKIT_DTYPE_FP32 : dtype;
              descs.push_back(d);
            }
    }
  std::vector<GemmOverrides> overrides;
  for (GemmPathOverride path : {GemmPathOverride::none, GemmPathOverride::mma, GemmPathOverride::wgmma_single,
                                GemmPathOverride::wgmma_pair}) {
    overrides.push_back(path_override(path));
    overrides.push_back(tile_override(GemmTile::m128_n256, path));
    overrides.push_back(tile_override(GemmTile::m128_n128, path));
    for (GemmSchedule schedule : {GemmSchedule::cooperative, GemmSchedule::pingpong}) {
      overrides.push_back(schedule_override(schedule, path_override(path)));
      overrides.push_back(schedule_override(schedule, tile_override(GemmTile::m128_n256, path)));
    }
  }
  const GemmDevice devices[] = {kH200, GemmDevice{78, 9, 0}, GemmDevice{kSms, 8, 0}};
  std::vector<Call> calls;
  for (Beta beta : {Beta::zero, Beta::one, Beta::other})
    for (bool unit : {true, false})
      for (bool strides : {true, false}) calls.push_back(Call{beta, unit, strides});

  size_t checked = 0;
  std::vector<std::string> failures;
  for (const moekit_gemm_desc_t& d : descs)
    for (const GemmOverrides& env : overrides)
      for (const GemmDevice& device : devices) {
        const GemmConfig c = choose_gemm_config(d, device, env);
        const auto where = [&] {
          return "mode " + std::to_string(d.mode) + " epilogue " + std::to_string(d.epilogue) + " layout " +
                 std::to_string(d.b_layout) + " gather " + std::to_string(d.gather) + " activation " +
                 std::to_string(d.activation) + " glu " + std::to_string(d.glu_layout) + " dtype " +
                 std::to_string(d.dtype) + " -> " + std::to_string(d.out_dtype) + " E " + std::to_string(d.groups) +
                 " rows " + std::to_string(d.max_rows) + " n " + std::to_string(d.n) + " k " + std::to_string(d.k) +
                 " override " + std::to_string(static_cast<int>(env.path)) + "/" +
                 (env.tile_forced ? std::to_string(static_cast<int>(env.tile)) : std::string("-")) + " sm_" +
                 std::to_string(device.cc_major) + std::to_string(device.cc_minor) + " x" +
                 std::to_string(device.sm_count);
        };
        const std::string broken = broken_invariant(d, c, device);
        if (!broken.empty() && failures.size() < 20) failures.push_back(where() + ": " + broken);
        for (const Call& call : calls) {
          const GemmKernel expected = expected_kernel(d, device, env, call);
          const GemmKernel& got = c.for_call(facts(call));
          ++checked;
          if (!same_kernel(got, expected) && failures.size() < 20)
            failures.push_back(where() + " facts " + std::to_string(facts(call)) + ": expected " + show(expected) +
                               ", got " + show(got));
        }
      }
  INFO(checked << " calls checked");
  for (const std::string& failure : failures) UNSCOPED_INFO(failure);
  CHECK(failures.empty());
  CHECK(checked > 100000);
}

TEST_CASE("gemm config: describe_gemm_config names each variant's condition and kernel", "[gemm]") {
  const auto contains = [](const std::string& text, const char* part) {
    INFO(text);
    CHECK(text.find(part) != std::string::npos);
  };
  // Each variant's kernel, separated by "; ", each but the last after its condition, in the order for_call tries.
  const auto check_variants = [](const moekit_gemm_desc_t& d, const GemmConfig& c) {
    const std::string text = describe_gemm_config(d, c);
    INFO(text);
    int separators = 0;
    for (size_t at = text.find("; "); at != std::string::npos; at = text.find("; ", at + 1)) ++separators;
    CHECK(separators == c.count - 1);
    const size_t otherwise = text.find("otherwise: ");
    if (c.count == 1) {
      CHECK(otherwise == std::string::npos);
      CHECK(text.find("if ") == std::string::npos);
    } else {
      CHECK(otherwise != std::string::npos);
      CHECK(text.find("if ") < otherwise);
    }
  };

  moekit_gemm_desc_t store = up_projection();
  store.epilogue = MOEKIT_EPILOGUE_STORE;
  const GemmConfig s = config(store);
  const std::string s_text = describe_gemm_config(store, s);
  check_variants(store, s);
  contains(s_text, "store, A gathered, bf16 -> bf16: ");
  contains(s_text, "if beta = 0: wgmma 128x256");
  contains(s_text, "otherwise: wgmma 128x256");
  contains(s_text, "1 CTA per cluster");
  contains(s_text, "132 persistent CTAs");
  contains(s_text, "A cp.async gather, B TMA");
  CHECK(s_text.find("if beta = 0") < s_text.find("TMA store"));
  CHECK(s_text.find("TMA store") < s_text.find("otherwise"));
  CHECK(s_text.find("otherwise") < s_text.find("thread stores"));

  moekit_gemm_desc_t gated = up_projection();
  gated.k = 4096;
  const GemmConfig g = config(gated);
  const std::string g_text = describe_gemm_config(gated, g);
  check_variants(gated, g);
  contains(g_text, "gated, A gathered");
  contains(g_text, "if alpha = 1 and no bias: wgmma");
  contains(g_text, "2-CTA clusters");

  const moekit_gemm_desc_t dw1 = weight_gradient(MOEKIT_GEMM_GATHER_B, 512, 1024);
  const GemmConfig w = config(dw1);
  const std::string w_text = describe_gemm_config(dw1, w);
  check_variants(dw1, w);
  contains(w_text, "store, B gathered, bf16 -> bf16: ");
  contains(w_text, "if beta = 0, row strides < 2^31: wgmma 128x128");
  contains(w_text, "transposed");
  contains(w_text, "TMA store");
  contains(w_text, "if row strides < 2^31: wgmma 128x128");
  contains(w_text, "otherwise: mma.sync 128x128");
  CHECK(w_text.find("transposed") < w_text.find("if row strides"));  // only the first variant is transposed
  CHECK(w_text.find("transposed", w_text.find("if row strides")) == std::string::npos);

  moekit_gemm_desc_t added = dw1;
  added.out_dtype = MOEKIT_DTYPE_FP32;
  const std::string a_text = describe_gemm_config(added, config(added));
  contains(a_text, "bf16 -> fp32");
  contains(a_text, "if beta = 1, row strides < 2^31: ");
  contains(a_text, "TMA reduce-add");

  moekit_gemm_desc_t dgated = up_projection();
  dgated.epilogue = MOEKIT_EPILOGUE_DGATED;
  dgated.b_layout = MOEKIT_GEMM_B_KN;
  const GemmConfig dg = config(dgated);
  const std::string dg_text = describe_gemm_config(dgated, dg);
  check_variants(dgated, dg);
  contains(dg_text, "dgated");
  contains(dg_text, "h TMA");

  const GemmConfig mma = config(store, path_override(GemmPathOverride::mma));
  const std::string m_text = describe_gemm_config(store, mma);
  check_variants(store, mma);
  contains(m_text, "mma.sync 128x256");
  CHECK(m_text.find("wgmma") == std::string::npos);
  CHECK(m_text.find("persistent") == std::string::npos);

  const GemmConfig narrow = config(store, tile_override(GemmTile::m128_n128));
  contains(describe_gemm_config(store, narrow), "wgmma 128x128");
}

#if MOEKIT_WITH_CUDA
// The launch's transform of a transposed varlen-K problem (cuda/gemm/operand_tensor_maps.cu): A and B, m and n
// swapped, A gathered, C itself kept. CUDA builds only: the function lives with the TMA maps.
TEST_CASE("gemm config: a transposed weight gradient swaps A and B and keeps C", "[gemm]") {
  using moekit::cuda::gemm::GroupedGemmProblem;
  using moekit::cuda::gemm::transpose_weight_gradient;
  GroupedGemmProblem dw1{};
  dw1.mode = MOEKIT_GEMM_VARLEN_K;
  dw1.epilogue = MOEKIT_EPILOGUE_STORE;
  dw1.dtype = MOEKIT_DTYPE_BF16;
  dw1.groups = 8;
  dw1.rows = 4096;
  dw1.alpha = 1.0f;
  dw1.gather = MOEKIT_GEMM_GATHER_B;
  dw1.m = 512;
  dw1.n = 1024;
  dw1.c_group_stride = dw1.m * dw1.n;
  const uint16_t dh[1] = {0}, x[1] = {0};
  uint16_t c[1] = {0};
  dw1.a = dh;
  dw1.lda = 512;
  dw1.b = x;
  dw1.ldb = 1024;
  dw1.c = c;
  dw1.n_tiles = 4;
  const GroupedGemmProblem t = transpose_weight_gradient(dw1, 256);
  CHECK(t.a == static_cast<const void*>(x));
  CHECK(t.lda == 1024);
  CHECK(t.b == static_cast<const void*>(dh));
  CHECK(t.ldb == 512);
  CHECK(t.m == 1024);
  CHECK(t.n == 512);
  CHECK(t.gather == MOEKIT_GEMM_GATHER_A);
  CHECK(t.n_tiles == 2);
  CHECK(t.c_transposed);
  CHECK(t.c == dw1.c);
  CHECK(t.c_group_stride == dw1.c_group_stride);
  CHECK_FALSE(dw1.c_transposed);
}
#endif
