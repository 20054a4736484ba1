#include "cuda/gemm/gemm_config.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "cuda/common/alignment.h"
#include "cuda/common/activation_kind.h"
#include "cuda/gemm/gemm_tuning.h"

namespace moekit {
inline namespace v0 {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Column tiles of width bn covering the product, times the row tiles (or C tiles of every group for varlen K).
int64_t tile_count(const GemmShape& s, GemmTileShape t) {
  if (s.mode == MOEKIT_GEMM_VARLEN_K) return s.groups * ceil_div(s.m, t.bm) * ceil_div(s.n, t.bn);
  return ceil_div(s.max_rows, t.bm) * ceil_div(s.n, t.bn);
}

// Whether the defaults run the product in clusters of 2 (where it pairs).
// NOTE: measured on the H200, the paired kernel against the single-CTA one (same binary, taking turns, the same
// bits): GATED and DGATED at k = 4096 1.01-1.10x and 1.03x, at k = 768 and 1536 0.95-1.01x; STORE and BIAS
// 0.94-1.03x (so single); varlen K at ~1024 rows per group 1.013x, at ~256 0.952x.
bool pairs_by_default(const moekit_gemm_desc_t& d) {
  const bool activated = d.epilogue == MOEKIT_EPILOGUE_GATED || d.epilogue == MOEKIT_EPILOGUE_DGATED;
  if (d.mode == MOEKIT_GEMM_VARLEN_M) return activated && d.k >= 4096;
  return d.max_rows >= 512 * d.groups;
}

// Whether a varlen-K product, as the kernel runs it, pairs: B is the operand loaded by TMA, which the two CTAs of a
// pair share (m tiles 2i and 2i + 1 of one group, the same column tile), so B must not be the gathered operand, and
// each group's m tiles of bm rows pair up (an even count).
// The consumers' schedule of a varlen-M product on `tile` by default: ping-pong for STORE and BIAS at 128x128 tiles
// with k <= 1024, cooperative otherwise.
// NOTE: measured on the H200 (gemm.json's down and dxe shapes with 128x128 tiles forced, the same bits), ping-pong
// against cooperative at 128x128: 1.11x at k = 256, 1.16-1.17x at 512, 1.06x at 1024, 0.98-1.00x at 2048 and 4096;
// GATED 0.99-1.07x, DGATED 0.81-0.92x (its issue-bound epilogue runs on one warpgroup at a time). Against the
// cooperative 128x256 tile it loses everywhere (0.68-0.93x): per FLOP a 128x128 tile moves a third more operand bytes
// and a gathered A twice the producer's copies, so ping-pong runs only where the tile is 128x128 anyway.
GemmSchedule default_schedule(const moekit_gemm_desc_t& d, GemmTile tile) {
  const bool plain = d.epilogue == MOEKIT_EPILOGUE_STORE || d.epilogue == MOEKIT_EPILOGUE_BIAS;
  return tile == GemmTile::m128_n128 && plain && d.k <= 1024 ? GemmSchedule::pingpong : GemmSchedule::cooperative;
}

bool varlen_k_pairs(int32_t gather, int64_t m, int64_t bm) {
  return gather != MOEKIT_GEMM_GATHER_B && ceil_div(m, bm) % 2 == 0;
}

GemmKernel mma_sync_kernel(const moekit_gemm_desc_t& d, GemmTile tile) {
  GemmKernel k{};
  k.path = GemmPath::mma_sync;
  k.tile = tile;
  k.cluster = 1;
  k.a = d.gather == MOEKIT_GEMM_GATHER_A ? OperandMove::cp_async_gather : OperandMove::cp_async;
  k.b = d.gather == MOEKIT_GEMM_GATHER_B ? OperandMove::cp_async_gather : OperandMove::cp_async;
  k.c = OutputMove::threads;
  k.epilogue = OperandMove::cp_async;
  return k;
}

// The wgmma kernel of a varlen-M product: B by TMA, A by TMA unless gathered, DGATED's h by TMA; C by the threads
// (a variant may store it by TMA).
GemmKernel varlen_m_kernel(const moekit_gemm_desc_t& d, GemmTile tile, GemmSchedule schedule, bool paired,
                           int sm_count) {
  GemmKernel k{};
  k.path = GemmPath::wgmma;
  k.tile = schedule == GemmSchedule::pingpong ? GemmTile::m128_n128 : tile;
  k.schedule = schedule;
  k.cluster = paired ? 2 : 1;
  k.pad_tile_pairs = paired;
  k.a = d.gather == MOEKIT_GEMM_GATHER_A ? OperandMove::cp_async_gather : OperandMove::tma;
  k.b = OperandMove::tma;
  k.c = OutputMove::threads;
  k.epilogue = d.epilogue == MOEKIT_EPILOGUE_DGATED ? OperandMove::tma : OperandMove::cp_async;
  k.ctas = sm_count;
  return k;
}

// The wgmma kernel of a varlen-K product: the operand that is not gathered by TMA, the other by cp.async copies;
// `transposed` runs C^T = B^T A, so a gathered B becomes the gathered A.
GemmKernel varlen_k_kernel(const moekit_gemm_desc_t& d, GemmTile tile, bool transposed, bool want_pair, OutputMove c,
                           int sm_count) {
  const int32_t gather = transposed ? MOEKIT_GEMM_GATHER_A : d.gather;
  const int64_t m = transposed ? d.n : d.k;
  GemmKernel k{};
  k.path = GemmPath::wgmma;
  k.tile = tile;
  k.cluster = want_pair && varlen_k_pairs(gather, m, gemm_tile_shape(tile).bm) ? 2 : 1;
  k.transposed = transposed;
  const bool b_gathered = gather == MOEKIT_GEMM_GATHER_B;
  k.a = gather == MOEKIT_GEMM_GATHER_A ? OperandMove::cp_async_gather : b_gathered ? OperandMove::tma
                                                                                  : OperandMove::cp_async;
  k.b = b_gathered ? OperandMove::cp_async_gather : OperandMove::tma;
  k.c = c;
  k.epilogue = OperandMove::cp_async;
  k.ctas = sm_count;
  return k;
}

void add_variant(GemmConfig& config, uint32_t needs, const GemmKernel& kernel) {
  config.variants[config.count++] = GemmVariant{needs, kernel};
}

const char* move_name(OperandMove move) {
  switch (move) {
    case OperandMove::cp_async: return "cp.async";
    case OperandMove::cp_async_gather: return "cp.async gather";
    default: return "TMA";
  }
}

const char* output_name(OutputMove move) {
  switch (move) {
    case OutputMove::tma_store: return "TMA store";
    case OutputMove::tma_reduce_add: return "TMA reduce-add";
    default: return "thread stores";
  }
}

std::string facts_text(uint32_t facts) {
  std::string text;
  const auto add = [&text](const char* fact) { text += (text.empty() ? "" : ", ") + std::string(fact); };
  if (facts & kBetaZero) add("beta = 0");
  if (facts & kBetaOne) add("beta = 1");
  if (facts & kUnitAlphaNoBias) add("alpha = 1 and no bias");
  if (facts & kStrides32Bit) add("row strides < 2^31");
  return text;
}

std::string kernel_text(const moekit_gemm_desc_t& d, const GemmKernel& k) {
  std::string text = std::string(k.path == GemmPath::wgmma ? "wgmma " : "mma.sync ") + gemm_tile_name(k.tile);
  if (k.path == GemmPath::wgmma) {
    if (k.schedule == GemmSchedule::pingpong) text += " ping-pong";
    text += k.cluster == 2 ? ", 2-CTA clusters (B multicast)" : ", 1 CTA per cluster";
    text += ", " + std::to_string(k.ctas) + " persistent CTAs";
  }
  if (k.transposed) text += ", transposed (C^T = B^T A)";
  text += std::string(", A ") + move_name(k.a) + ", B " + move_name(k.b) + ", C " + output_name(k.c);
  if (d.epilogue == MOEKIT_EPILOGUE_DGATED) text += std::string(", h ") + move_name(k.epilogue);
  return text;
}

const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case MOEKIT_DTYPE_BF16: return "bf16";
    case MOEKIT_DTYPE_FP16: return "fp16";
    case MOEKIT_DTYPE_FP32: return "fp32";
    default: return "?";
  }
}

const char* epilogue_name(int32_t epilogue) {
  switch (epilogue) {
    case MOEKIT_EPILOGUE_BIAS: return "bias";
    case MOEKIT_EPILOGUE_GATED: return "gated";
    case MOEKIT_EPILOGUE_DGATED: return "dgated";
    default: return "store";
  }
}

const char* gather_name(int32_t gather) {
  return gather == MOEKIT_GEMM_GATHER_A ? ", A gathered" : gather == MOEKIT_GEMM_GATHER_B ? ", B gathered" : "";
}

GemmConfig choose_variants(const moekit_gemm_desc_t& d, const GemmDevice& device, const GemmOverrides& env,
                           const std::vector<GemmTuningRow>& table) {
  // A measured winner of the descriptor's class, where the table has one (compute capability 9.0; without a path
  // override), in place of the heuristic's tile, pairing and schedule.
  const bool measured_device = device.cc_major == 9 && device.cc_minor == 0;
  const GemmTuningRow* tuned =
      measured_device && env.path == GemmPathOverride::none ? find_gemm_tuning_row(table, d) : nullptr;
  const GemmTile tile = env.tile_forced ? env.tile
                        : tuned         ? tuned->tile
                                        : choose_gemm_tile(gemm_shape(d), device.sm_count);
  GemmConfig config{};
  const GemmKernel fallback = mma_sync_kernel(d, tile);
  // NOTE: measured on the H200 against mma.sync: varlen K (weight gradients) 1.43-1.69x at the bench's 24 shapes;
  // DGATED 1.22-1.38x at gemm.json's 12 shapes (h loaded by TMA into the ring, its epilogue loops rolled).
  if (env.path == GemmPathOverride::mma || !wgmma_capable(d, device)) {
    add_variant(config, 0, fallback);
    return config;
  }
  const bool paired = env.path == GemmPathOverride::wgmma_pair ||
                      (env.path == GemmPathOverride::none && (tuned ? tuned->cluster == 2 : pairs_by_default(d)));
  const bool out_fp32 = d.out_dtype == MOEKIT_DTYPE_FP32;
  if (d.mode == MOEKIT_GEMM_VARLEN_M) {
    const GemmSchedule schedule = env.schedule_forced ? env.schedule
                                  : tuned             ? tuned->schedule
                                                      : default_schedule(d, tile);
    const GemmKernel kernel = varlen_m_kernel(d, tile, schedule, paired, device.sm_count);
    GemmKernel by_tma = kernel;
    by_tma.c = OutputMove::tma_store;
    // STORE into C of the operand dtype by TMA when nothing is read back (beta = 0). GATED's h and a by TMA for a
    // gated activation in the CONCAT layout with alpha = 1 and no bias (the layer's up-projection), whose boxes of
    // 64 activation columns end at I (the gate's never reach into the up columns).
    if (d.epilogue == MOEKIT_EPILOGUE_STORE && !out_fp32 && d.n > 0) add_variant(config, kBetaZero, by_tma);
    if (d.epilogue == MOEKIT_EPILOGUE_GATED && is_gated_activation(d.activation) && d.glu_layout == MOEKIT_GLU_CONCAT &&
        d.n > 0 && (d.n / 2) % 64 == 0)
      add_variant(config, kUnitAlphaNoBias, by_tma);
    add_variant(config, 0, kernel);
    return config;
  }
  // varlen K: TMA stores for beta = 0 into C of the operand dtype, TMA reduce-adds for beta = 1 into an fp32 C. With
  // B gathered and C of the operand dtype it runs as its transpose C^T = B^T A, so the gathered rows are the 128-wide
  // A (half the copies of a 256-wide B per slice) and the other operand the 256-wide B loaded by TMA.
  const uint32_t by_tma = out_fp32 ? kBetaOne : kBetaZero;
  const OutputMove c = out_fp32 ? OutputMove::tma_reduce_add : OutputMove::tma_store;
  const bool transposed = d.gather == MOEKIT_GEMM_GATHER_B && !out_fp32;
  if (d.k > 0 && d.n > 0)
    add_variant(config, by_tma | kStrides32Bit, varlen_k_kernel(d, tile, transposed, paired, c, device.sm_count));
  add_variant(config, kStrides32Bit, varlen_k_kernel(d, tile, false, paired, OutputMove::threads, device.sm_count));
  // NOTE: the wgmma kernel's varlen-K copies address a row as a 32-bit row times a 32-bit stride in bytes; rows of
  // 2 Gi values or more take the mma.sync kernel, whose workspace is the same (none).
  add_variant(config, 0, fallback);
  return config;
}

}  // namespace

const GemmKernel& GemmConfig::for_call(uint32_t facts) const {
  for (int i = 0; i + 1 < count; ++i)
    if ((variants[i].needs & facts) == variants[i].needs) return variants[i].kernel;
  return variants[count - 1].kernel;
}

GemmTileShape gemm_tile_shape(GemmTile tile) {
  return tile == GemmTile::m128_n256 ? GemmTileShape{128, 256} : GemmTileShape{128, 128};
}

const char* gemm_tile_name(GemmTile tile) { return tile == GemmTile::m128_n256 ? "128x256" : "128x128"; }

const char* gemm_schedule_name(GemmSchedule schedule) {
  return schedule == GemmSchedule::pingpong ? "pingpong" : "cooperative";
}

GemmOverrides gemm_overrides_from_environment() {
  GemmOverrides o{};
  if (const char* path = std::getenv("MOEKIT_GEMM_PATH")) {
    if (std::strcmp(path, "mma") == 0) o.path = GemmPathOverride::mma;
    if (std::strcmp(path, "wgmma") == 0) o.path = GemmPathOverride::wgmma_single;
    if (std::strcmp(path, "wgmma_pair") == 0) o.path = GemmPathOverride::wgmma_pair;
  }
  if (const char* tile = std::getenv("MOEKIT_GEMM_TILE")) {
    for (GemmTile t : {GemmTile::m128_n256, GemmTile::m128_n128}) {
      if (std::strcmp(tile, gemm_tile_name(t)) == 0) {
        o.tile_forced = true;
        o.tile = t;
      }
    }
  }
  if (const char* schedule = std::getenv("MOEKIT_GEMM_SCHEDULE")) {
    for (GemmSchedule c : {GemmSchedule::cooperative, GemmSchedule::pingpong}) {
      if (std::strcmp(schedule, gemm_schedule_name(c)) == 0) {
        o.schedule_forced = true;
        o.schedule = c;
      }
    }
  }
  return o;
}

GemmShape gemm_shape(const moekit_gemm_desc_t& d) {
  GemmShape s{};
  s.mode = d.mode;
  s.groups = d.groups;
  s.max_rows = d.max_rows;
  if (d.mode == MOEKIT_GEMM_VARLEN_K) {
    s.m = d.k;
    s.n = d.n;
    return s;
  }
  s.k = d.k;
  s.n = d.epilogue == MOEKIT_EPILOGUE_DGATED && is_gated_activation(d.activation) ? d.n / 2 : d.n;
  return s;
}

GemmTile choose_gemm_tile(const GemmShape& s, int sm_count) {
  if (s.n <= 128) return GemmTile::m128_n128;
  // NOTE: e.g. n = 384 pads to 512 with 256-wide tiles (a third more MMA work) but not with 128-wide ones.
  if (ceil_div(s.n, 256) * 256 * 8 > ceil_div(s.n, 128) * 128 * 9) return GemmTile::m128_n128;
  if (tile_count(s, gemm_tile_shape(GemmTile::m128_n256)) < sm_count) return GemmTile::m128_n128;
  return GemmTile::m128_n256;
}

bool wgmma_capable(const moekit_gemm_desc_t& d, const GemmDevice& device) {
  const bool plain = d.epilogue == MOEKIT_EPILOGUE_STORE || d.epilogue == MOEKIT_EPILOGUE_BIAS;
  // GATED pairs columns of a K-major B (its CONCAT boxes); DGATED's B is the MN-major W2.
  const bool epilogue = d.b_layout == MOEKIT_GEMM_B_NK ? plain || d.epilogue == MOEKIT_EPILOGUE_GATED
                                                       : plain || d.epilogue == MOEKIT_EPILOGUE_DGATED;
  const bool dtype = d.dtype == MOEKIT_DTYPE_BF16 || d.dtype == MOEKIT_DTYPE_FP16;
  if (device.cc_major != 9 || device.cc_minor != 0 || !dtype) return false;
  // varlen K: TMA and the cp.async copies zero-fill past m and n, so any shape the planner takes.
  if (d.mode == MOEKIT_GEMM_VARLEN_K) return d.epilogue == MOEKIT_EPILOGUE_STORE;
  // varlen M: k and n multiples of 8 (plan_grouped_gemm's rule); the last slice's k tail and the last tile's columns
  // past n are zero-filled (TMA for the operands it loads, zero-sized cp.async copies for gathered rows) and never
  // stored.
  return d.mode == MOEKIT_GEMM_VARLEN_M && epilogue && d.k > 0;
}

GemmConfig choose_gemm_config(const moekit_gemm_desc_t& d, const GemmDevice& device, const GemmOverrides& env,
                              const std::vector<GemmTuningRow>& table) {
  GemmConfig config = choose_variants(d, device, env, table);
  config.workspace = gemm_workspace_layout(d, config);
  return config;
}

GemmConfig choose_gemm_config(const moekit_gemm_desc_t& d, const GemmDevice& device, const GemmOverrides& env) {
  return choose_gemm_config(d, device, env, builtin_gemm_tuning_table());
}

std::string describe_gemm_config(const moekit_gemm_desc_t& d, const GemmConfig& config) {
  std::string text = std::string(epilogue_name(d.epilogue)) + gather_name(d.gather) + ", " + dtype_name(d.dtype) +
                     " -> " + dtype_name(d.out_dtype) + ": ";
  for (int i = 0; i < config.count; ++i) {
    const GemmVariant& v = config.variants[i];
    if (config.count > 1)
      text += i + 1 < config.count ? "if " + facts_text(v.needs) + ": " : std::string("otherwise: ");
    text += kernel_text(d, v.kernel);
    if (i + 1 < config.count) text += "; ";
  }
  return text;
}

GemmWorkspaceLayout gemm_workspace_layout(const moekit_gemm_desc_t& d, const GemmConfig& config) {
  const GemmTileShape t = gemm_tile_shape(config.variants[0].kernel.tile);
  bool pad = false;
  for (int i = 0; i < config.count; ++i) pad = pad || config.variants[i].kernel.pad_tile_pairs;
  GemmWorkspaceLayout layout{};
  layout.n_tiles = ceil_div(gemm_shape(d).n, t.bn);
  // NOTE: one partial per 64-column chunk, not per tile, so the score gradient's sum does not depend on the tile.
  layout.ds_chunks = ceil_div(gemm_shape(d).n, 64);
  size_t offset = 0;
  if (d.mode == MOEKIT_GEMM_VARLEN_M) {
    // Each non-empty group adds at most one partial tile to ceil(rows / bm), at most min(E, rows) groups are
    // non-empty, and pairs pad an odd total with one empty tile.
    const int64_t non_empty = std::min(d.groups, d.max_rows);
    layout.m_tiles = (d.max_rows + non_empty * (t.bm - 1)) / t.bm + (pad ? 1 : 0);
    layout.tile_count = offset;
    offset += align_to_sections(sizeof(int32_t));
    layout.tile_starts = offset;
    offset += align_to_sections(sizeof(int32_t) * static_cast<size_t>(d.groups + 1));
    layout.tile_list = offset;
    offset += align_to_sections(4 * sizeof(int32_t) * static_cast<size_t>(layout.m_tiles));
    if (d.epilogue == MOEKIT_EPILOGUE_DGATED) {
      layout.ds_partials = offset;
      offset += align_to_sections(sizeof(float) * static_cast<size_t>(d.max_rows) *
                                  static_cast<size_t>(layout.ds_chunks));
    }
  }
  layout.bytes = offset;
  return layout;
}

}  // namespace v0
}  // namespace moekit
