#include "cuda/gemm/gemm_config.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace moekit {
inline namespace v0 {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
size_t align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

bool gated_activation(int32_t activation) {
  return activation == MOEKIT_ACT_SWIGLU || activation == MOEKIT_ACT_GEGLU || activation == MOEKIT_ACT_REGLU ||
         activation == MOEKIT_ACT_SWIGLU_OAI;
}

// Column tiles of width bn covering the product, times the row tiles (or C tiles of every group for varlen K).
int64_t tile_count(const GemmShape& s, GemmTileShape t) {
  if (s.mode == MOEKIT_GEMM_VARLEN_K) return s.groups * ceil_div(s.m, t.bm) * ceil_div(s.n, t.bn);
  return ceil_div(s.max_rows, t.bm) * ceil_div(s.n, t.bn);
}

}  // namespace

GemmTileShape gemm_tile_shape(GemmTile tile) {
  return tile == GemmTile::m128_n256 ? GemmTileShape{128, 256} : GemmTileShape{128, 128};
}

const char* gemm_tile_name(GemmTile tile) { return tile == GemmTile::m128_n256 ? "128x256" : "128x128"; }

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
  s.n = d.epilogue == MOEKIT_EPILOGUE_DGATED && gated_activation(d.activation) ? d.n / 2 : d.n;
  return s;
}

GemmTile choose_gemm_tile(const GemmShape& s, int sm_count) {
  if (s.n <= 128) return GemmTile::m128_n128;
  // NOTE: e.g. n = 384 pads to 512 with 256-wide tiles (a third more MMA work) but not with 128-wide ones.
  if (ceil_div(s.n, 256) * 256 * 8 > ceil_div(s.n, 128) * 128 * 9) return GemmTile::m128_n128;
  if (tile_count(s, gemm_tile_shape(GemmTile::m128_n256)) < sm_count) return GemmTile::m128_n128;
  return GemmTile::m128_n256;
}

GemmTile choose_gemm_tile_or_override(const GemmShape& shape, int sm_count) {
  const char* forced = std::getenv("MOEKIT_GEMM_TILE");
  if (forced != nullptr) {
    for (GemmTile tile : {GemmTile::m128_n256, GemmTile::m128_n128})
      if (std::strcmp(forced, gemm_tile_name(tile)) == 0) return tile;
  }
  return choose_gemm_tile(shape, sm_count);
}

const char* gemm_path_name(GemmPath path) {
  return path == GemmPath::wgmma ? "wgmma" : path == GemmPath::wgmma_pair ? "wgmma_pair" : "mma";
}

bool wgmma_capable(const moekit_gemm_desc_t& d, int cc_major, int cc_minor) {
  const bool plain = d.epilogue == MOEKIT_EPILOGUE_STORE || d.epilogue == MOEKIT_EPILOGUE_BIAS;
  // GATED pairs columns of a K-major B (its CONCAT boxes); DGATED's B is the MN-major W2.
  const bool epilogue = d.b_layout == MOEKIT_GEMM_B_NK ? plain || d.epilogue == MOEKIT_EPILOGUE_GATED
                                                       : plain || d.epilogue == MOEKIT_EPILOGUE_DGATED;
  const bool dtype = d.dtype == MOEKIT_DTYPE_BF16 || d.dtype == MOEKIT_DTYPE_FP16;
  if (cc_major != 9 || cc_minor != 0 || !dtype) return false;
  // varlen K: TMA and the cp.async copies zero-fill past m and n, so any shape the planner takes.
  if (d.mode == MOEKIT_GEMM_VARLEN_K) return d.epilogue == MOEKIT_EPILOGUE_STORE;
  return d.mode == MOEKIT_GEMM_VARLEN_M && epilogue && d.k > 0 && d.k % 64 == 0 && gemm_shape(d).n % 64 == 0;
}

GemmPath choose_gemm_path(const moekit_gemm_desc_t& d, int cc_major, int cc_minor) {
  // NOTE: measured on the H200 against mma.sync: varlen K (weight gradients) 1.43-1.69x at the 24 bench shapes;
  // DGATED 1.22-1.38x at gemm.json's 12 shapes (h loaded by TMA into the ring, its epilogue loops rolled).
  if (!wgmma_capable(d, cc_major, cc_minor)) return GemmPath::mma_sync;
  // NOTE: the paired kernel against the single-CTA one (H200, same binary, builds taking turns; both give the same
  // bits), at k = 4096: GATED 1.008-1.096x on gemm_issue7 (5 rounds) and 0.993-1.026x on gemm.json (3 rounds), as
  // in the session before (0.987-1.032x); DGATED 1.031x on gemm_issue7 (5 rounds; 1.032x the session before) and
  // 0.986-1.092x on gemm.json. At k = 768 and 1536: GATED 0.954-1.012x, DGATED 0.965-0.988x. STORE and BIAS gained
  // nothing measurable from it (0.94-1.03x), so they stay single.
  const bool activated = d.epilogue == MOEKIT_EPILOGUE_GATED || d.epilogue == MOEKIT_EPILOGUE_DGATED;
  if (d.mode == MOEKIT_GEMM_VARLEN_M && activated && d.k >= 4096) return GemmPath::wgmma_pair;
  // NOTE: varlen K paired (launch_wgmma pairs what pairs_weight_gradient allows; B's L2 reads halved by multicast)
  // against single, same binary taking turns (H200, 5 rounds): gemm_issue7's dW1 at ~1024 rows per group 1.013x
  // (every round 1.004-1.040x), skewed 1.013x; at ~256 rows 0.952x (rounds 0.91-1.05x). Until the seventeenth
  // session the launch dropped the pairing of varlen K, so the earlier "paired" figures were of the single kernel.
  if (d.mode == MOEKIT_GEMM_VARLEN_K && d.max_rows >= 512 * d.groups) return GemmPath::wgmma_pair;
  return GemmPath::wgmma;
}

GemmPath choose_gemm_path_or_override(const moekit_gemm_desc_t& d, int cc_major, int cc_minor) {
  const char* forced = std::getenv("MOEKIT_GEMM_PATH");
  const auto is = [forced](GemmPath path) {
    return forced != nullptr && std::strcmp(forced, gemm_path_name(path)) == 0;
  };
  if (is(GemmPath::mma_sync)) return GemmPath::mma_sync;
  if ((is(GemmPath::wgmma) || is(GemmPath::wgmma_pair)) && wgmma_capable(d, cc_major, cc_minor))
    return is(GemmPath::wgmma_pair) ? GemmPath::wgmma_pair : GemmPath::wgmma;
  return choose_gemm_path(d, cc_major, cc_minor);
}

int32_t gemm_kernel_config(GemmTile tile, GemmPath path) {
  return static_cast<int32_t>(tile) | (static_cast<int32_t>(path) << 8);
}
GemmTile gemm_config_tile(int32_t kernel_config) { return static_cast<GemmTile>(kernel_config & 0xff); }
GemmPath gemm_config_path(int32_t kernel_config) { return static_cast<GemmPath>((kernel_config >> 8) & 0xff); }

GemmWorkspaceLayout gemm_workspace_layout(const moekit_gemm_desc_t& d, GemmTile tile, GemmPath path) {
  const GemmShape s = gemm_shape(d);
  const GemmTileShape t = gemm_tile_shape(tile);
  GemmWorkspaceLayout layout{};
  layout.n_tiles = ceil_div(s.n, t.bn);
  size_t offset = 0;
  if (d.mode == MOEKIT_GEMM_VARLEN_M) {
    // Each non-empty group adds at most one partial tile to ceil(rows / bm), at most min(E, rows) groups are
    // non-empty, and pairs pad an odd total with one empty tile.
    const int64_t non_empty = std::min(d.groups, d.max_rows);
    layout.pair_tiles = path == GemmPath::wgmma_pair;
    layout.m_tiles = (d.max_rows + non_empty * (t.bm - 1)) / t.bm + (layout.pair_tiles ? 1 : 0);
    layout.tile_count = offset;
    offset += align256(sizeof(int32_t));
    layout.tile_starts = offset;
    offset += align256(sizeof(int32_t) * static_cast<size_t>(d.groups + 1));
    layout.tile_list = offset;
    offset += align256(4 * sizeof(int32_t) * static_cast<size_t>(layout.m_tiles));
    if (d.epilogue == MOEKIT_EPILOGUE_DGATED) {
      layout.ds_partials = offset;
      offset += align256(sizeof(float) * static_cast<size_t>(d.max_rows) * static_cast<size_t>(layout.n_tiles));
    }
  }
  layout.bytes = offset;
  return layout;
}

}  // namespace v0
}  // namespace moekit
