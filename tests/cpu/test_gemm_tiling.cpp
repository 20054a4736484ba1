// The CUDA grouped GEMM's host decisions (src/gemm_tiling.h), pure functions checked without a GPU: the tile
// heuristic over a table of shapes, the MOEKIT_GEMM_TILE override, the workspace layout's bounds, and the
// mma.sync / wgmma path choice with its MOEKIT_GEMM_PATH override.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>

#include "gemm_tiling.h"

using moekit::GemmPath;
using moekit::GemmShape;
using moekit::GemmTile;
using moekit::choose_gemm_path;
using moekit::choose_gemm_path_or_override;
using moekit::gemm_config_path;
using moekit::gemm_config_tile;
using moekit::gemm_kernel_config;
using moekit::gemm_shape;
using moekit::gemm_tile_shape;
using moekit::gemm_workspace_layout;
using moekit::wgmma_capable;

namespace {

GemmShape varlen_m(int64_t groups, int64_t rows, int64_t n, int64_t k) {
  return GemmShape{MOEKIT_GEMM_VARLEN_M, groups, rows, 0, n, k};
}
GemmShape varlen_k(int64_t groups, int64_t rows, int64_t m, int64_t n) {
  return GemmShape{MOEKIT_GEMM_VARLEN_K, groups, rows, m, n, 0};
}

moekit_gemm_desc_t desc(int32_t mode, int32_t epilogue, int32_t activation, int64_t groups, int64_t rows, int64_t n,
                        int64_t k) {
  moekit_gemm_desc_t d;
  moekit_gemm_desc_init(&d);
  d.mode = mode;
  d.epilogue = epilogue;
  d.activation = activation;
  d.groups = groups;
  d.max_rows = rows;
  d.n = n;
  d.k = k;
  return d;
}

}  // namespace

TEST_CASE("gemm tiling: the heuristic's choices", "[gemm]") {
  constexpr int sms = 132;
  // The layer-sized timing shapes (E = 128, P = 131072): wide products with thousands of tiles take 128x256.
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
}

TEST_CASE("gemm tiling: DGATED tiles the activation width, varlen K the C matrix", "[gemm]") {
  const moekit_gemm_desc_t dgated =
      desc(MOEKIT_GEMM_VARLEN_M, MOEKIT_EPILOGUE_DGATED, MOEKIT_ACT_SWIGLU, 128, 65536, 2048, 4096);
  CHECK(gemm_shape(dgated).n == 1024);
  CHECK(gemm_shape(dgated).k == 4096);
  const moekit_gemm_desc_t plain = desc(MOEKIT_GEMM_VARLEN_M, MOEKIT_EPILOGUE_DGATED, MOEKIT_ACT_RELU, 128, 65536, 1024, 4096);
  CHECK(gemm_shape(plain).n == 1024);
  const moekit_gemm_desc_t wgrad = desc(MOEKIT_GEMM_VARLEN_K, MOEKIT_EPILOGUE_STORE, MOEKIT_ACT_SWIGLU, 8, 4096, 512, 256);
  CHECK(gemm_shape(wgrad).m == 256);
  CHECK(gemm_shape(wgrad).n == 512);
}

TEST_CASE("gemm tiling: MOEKIT_GEMM_TILE overrides the heuristic", "[gemm]") {
  const GemmShape wide = varlen_m(128, 131072, 2048, 4096);
  setenv("MOEKIT_GEMM_TILE", "128x128", 1);
  CHECK(choose_gemm_tile_or_override(wide, 132) == GemmTile::m128_n128);
  setenv("MOEKIT_GEMM_TILE", "nonsense", 1);
  CHECK(choose_gemm_tile_or_override(wide, 132) == GemmTile::m128_n256);
  unsetenv("MOEKIT_GEMM_TILE");
  CHECK(choose_gemm_tile_or_override(wide, 132) == GemmTile::m128_n256);
}

TEST_CASE("gemm tiling: the workspace holds every row tile and every DGATED partial", "[gemm]") {
  for (GemmTile tile : {GemmTile::m128_n256, GemmTile::m128_n128}) {
    const int64_t bm = gemm_tile_shape(tile).bm, bn = gemm_tile_shape(tile).bn;
    // 7 groups of 1 row: 7 tiles, not ceil(7 / bm).
    moekit::GemmWorkspaceLayout small =
        gemm_workspace_layout(desc(MOEKIT_GEMM_VARLEN_M, MOEKIT_EPILOGUE_STORE, 0, 7, 7, 64, 64), tile);
    CHECK(small.m_tiles == 7);
    CHECK(small.ds_partials == 0);
    // Counts that are no tile multiple: the bound covers one partial tile per group.
    const moekit_gemm_desc_t d =
        desc(MOEKIT_GEMM_VARLEN_M, MOEKIT_EPILOGUE_DGATED, MOEKIT_ACT_SWIGLU, 128, 131072 + 77, 2048, 4096);
    const moekit::GemmWorkspaceLayout layout = gemm_workspace_layout(d, tile);
    CHECK(layout.m_tiles >= (131072 + 77) / bm + 1);
    CHECK(layout.m_tiles <= (131072 + 77) / bm + 128);
    CHECK(layout.n_tiles == (1024 + bn - 1) / bn);
    CHECK(layout.tile_list % 256 == 0);
    CHECK(layout.ds_partials % 256 == 0);
    CHECK(layout.bytes >= layout.ds_partials + 4 * static_cast<size_t>((131072 + 77) * layout.n_tiles));
    CHECK(layout.bytes >= layout.tile_list + 16 * static_cast<size_t>(layout.m_tiles));
    // varlen K needs no workspace.
    CHECK(gemm_workspace_layout(desc(MOEKIT_GEMM_VARLEN_K, MOEKIT_EPILOGUE_STORE, 0, 8, 4096, 512, 256), tile).bytes == 0);
  }
}

TEST_CASE("gemm tiling: the wgmma path takes only the varlen-M shapes it was written for", "[gemm]") {
  moekit_gemm_desc_t up = desc(MOEKIT_GEMM_VARLEN_M, MOEKIT_EPILOGUE_GATED, MOEKIT_ACT_SWIGLU, 128, 131072, 2048, 4096);
  up.dtype = MOEKIT_DTYPE_BF16;
  up.b_layout = MOEKIT_GEMM_B_NK;
  // The GATED up-projection runs paired from k = 4096 on, single below (DGATED too, below).
  CHECK(choose_gemm_path(up, 9, 0) == GemmPath::wgmma_pair);
  CHECK(choose_gemm_path(up, 8, 0) == GemmPath::mma_sync);
  CHECK(choose_gemm_path(up, 10, 0) == GemmPath::mma_sync);
  moekit_gemm_desc_t short_up = up;
  short_up.k = 1536;
  CHECK(choose_gemm_path(short_up, 9, 0) == GemmPath::wgmma);
  short_up.k = 4032;
  CHECK(choose_gemm_path(short_up, 9, 0) == GemmPath::wgmma);
  moekit_gemm_desc_t plain_up = up;  // the same shape with STORE
  plain_up.epilogue = MOEKIT_EPILOGUE_STORE;
  CHECK(choose_gemm_path(plain_up, 9, 0) == GemmPath::wgmma);
  moekit_gemm_desc_t down = up;
  down.epilogue = MOEKIT_EPILOGUE_BIAS;
  down.n = 4096;
  down.k = 1024;
  CHECK(choose_gemm_path(down, 9, 0) == GemmPath::wgmma);
  moekit_gemm_desc_t other = up;
  other.k = 4104;  // a multiple of 8, not of 64
  CHECK(choose_gemm_path(other, 9, 0) == GemmPath::mma_sync);
  other = up;
  other.n = 2056;
  CHECK(choose_gemm_path(other, 9, 0) == GemmPath::mma_sync);
  other = up;
  other.b_layout = MOEKIT_GEMM_B_KN;  // GATED pairs the columns of a K-major B only
  CHECK(choose_gemm_path(other, 9, 0) == GemmPath::mma_sync);
  other = up;
  other.epilogue = MOEKIT_EPILOGUE_DGATED;  // DGATED reads an MN-major B only
  CHECK(!wgmma_capable(other, 9, 0));
  moekit_gemm_desc_t dgated = up;  // dA = dout W2, W2 [E, H, I] as [k = H, n = I]; desc n = h's width 2I = 2048
  dgated.b_layout = MOEKIT_GEMM_B_KN;
  dgated.epilogue = MOEKIT_EPILOGUE_DGATED;
  CHECK(wgmma_capable(dgated, 9, 0));
  CHECK(choose_gemm_path(dgated, 9, 0) == GemmPath::wgmma_pair);  // k = H = 4096: paired, as GATED
  CHECK(choose_gemm_path(dgated, 8, 0) == GemmPath::mma_sync);
  moekit_gemm_desc_t short_dgated = dgated;
  short_dgated.k = 1536;
  CHECK(choose_gemm_path(short_dgated, 9, 0) == GemmPath::wgmma);
  setenv("MOEKIT_GEMM_PATH", "wgmma", 1);
  CHECK(choose_gemm_path_or_override(dgated, 9, 0) == GemmPath::wgmma);
  unsetenv("MOEKIT_GEMM_PATH");
  dgated.n = 2 * 1000;  // I = 1000: a multiple of 8, not of 64
  CHECK(!wgmma_capable(dgated, 9, 0));
  moekit_gemm_desc_t dxe = down;  // dxe = dh W1, W1 [E, 2I, H] as [k = 2I, n = H]
  dxe.b_layout = MOEKIT_GEMM_B_KN;
  dxe.epilogue = MOEKIT_EPILOGUE_STORE;
  CHECK(choose_gemm_path(dxe, 9, 0) == GemmPath::wgmma);
  dxe.n = 4104;
  CHECK(choose_gemm_path(dxe, 9, 0) == GemmPath::mma_sync);
  other = up;
  other.dtype = MOEKIT_DTYPE_FP32;
  CHECK(choose_gemm_path(other, 9, 0) == GemmPath::mma_sync);
  const moekit_gemm_desc_t wgrad = desc(MOEKIT_GEMM_VARLEN_K, MOEKIT_EPILOGUE_STORE, MOEKIT_ACT_SWIGLU, 8, 4096, 512, 256);
  CHECK(wgmma_capable(wgrad, 9, 0));
  CHECK(choose_gemm_path(wgrad, 9, 0) == GemmPath::wgmma_pair);  // 4096 rows over 8 groups: 512 per group, paired
  CHECK(choose_gemm_path(wgrad, 8, 0) == GemmPath::mma_sync);
  moekit_gemm_desc_t short_wgrad = wgrad;  // 4095 rows: fewer than 512 per group, single
  short_wgrad.max_rows = 4095;
  CHECK(choose_gemm_path(short_wgrad, 9, 0) == GemmPath::wgmma);
  CHECK(choose_gemm_path(short_wgrad, 8, 0) == GemmPath::mma_sync);

  setenv("MOEKIT_GEMM_PATH", "mma", 1);
  CHECK(choose_gemm_path_or_override(up, 9, 0) == GemmPath::mma_sync);
  setenv("MOEKIT_GEMM_PATH", "wgmma", 1);
  CHECK(choose_gemm_path_or_override(up, 9, 0) == GemmPath::wgmma);
  CHECK(choose_gemm_path_or_override(other, 9, 0) == GemmPath::mma_sync);
  setenv("MOEKIT_GEMM_PATH", "wgmma_pair", 1);
  CHECK(choose_gemm_path_or_override(up, 9, 0) == GemmPath::wgmma_pair);
  // varlen K too: the launch pairs the problems pairs_weight_gradient allows and runs the others unpaired.
  CHECK(choose_gemm_path_or_override(wgrad, 9, 0) == GemmPath::wgmma_pair);
  CHECK(choose_gemm_path_or_override(other, 9, 0) == GemmPath::mma_sync);
  unsetenv("MOEKIT_GEMM_PATH");

  // wgmma_pair pads the row tiles to an even count: one more tile.
  const moekit::GemmWorkspaceLayout single = moekit::gemm_workspace_layout(up, GemmTile::m128_n256, GemmPath::wgmma);
  const moekit::GemmWorkspaceLayout paired =
      moekit::gemm_workspace_layout(up, GemmTile::m128_n256, GemmPath::wgmma_pair);
  CHECK(!single.pair_tiles);
  CHECK(paired.pair_tiles);
  CHECK(paired.m_tiles == single.m_tiles + 1);
  CHECK(paired.bytes >= single.bytes);

  for (GemmTile tile : {GemmTile::m128_n256, GemmTile::m128_n128})
    for (GemmPath path : {GemmPath::mma_sync, GemmPath::wgmma}) {
      CHECK(gemm_config_tile(gemm_kernel_config(tile, path)) == tile);
      CHECK(gemm_config_path(gemm_kernel_config(tile, path)) == path);
    }
}
