// Host decisions of the CUDA grouped GEMM (docs/math.md section 5), pure functions so the CPU tests can check them:
// which tile shape a problem gets, and how the workspace is laid out for it. The plan calls both once; the run
// reads the plan's choice, so the workspace size and the kernels' layout cannot disagree.
#pragma once

#include <cstddef>
#include <cstdint>

#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {

// The CTA tile shapes cuda/gemm/ is built for (M x N, reduction slices of 64, 8 warps of 64x64 or 64x32).
enum class GemmTile : int32_t {
  m128_n256 = 0,
  m128_n128 = 1,
};

struct GemmTileShape {
  int64_t bm;  // rows of C per tile (varlen M: grouped rows; varlen K: C's middle dim)
  int64_t bn;  // columns of C per tile
};

GemmTileShape gemm_tile_shape(GemmTile tile);
const char* gemm_tile_name(GemmTile tile);  // "128x256", ...

// The GEMM's dimensions as the kernels see them. varlen M: C [rows, n] = A [rows, k] B_e; varlen K:
// C[e] [m, n] = A_e^T B_e over each group's rows.
struct GemmShape {
  int32_t mode;      // moekit_gemm_mode_t
  int64_t groups;    // E
  int64_t max_rows;  // bound of the grouped rows of a call
  int64_t m;         // varlen K only: C's middle dim (desc.k)
  int64_t n;         // the product's width: desc.n, or for DGATED the activation width (n/2 when gated)
  int64_t k;         // varlen M only: the reduction length
};

// The kernels' view of a validated descriptor.
GemmShape gemm_shape(const moekit_gemm_desc_t& desc);

// The tile for a problem on a device with `sm_count` multiprocessors: 128x128 when the product is at most 128
// wide, when 256-wide tiles would pad the columns by more than an eighth over 128-wide ones, or when 128x256
// tiles would not fill one wave of the device; 128x256 otherwise (fewer operand bytes per FLOP).
GemmTile choose_gemm_tile(const GemmShape& shape, int sm_count);

// choose_gemm_tile, unless the environment variable MOEKIT_GEMM_TILE names a tile ("128x256", "128x128"):
// then that one (tests use it to run every tile on small shapes).
GemmTile choose_gemm_tile_or_override(const GemmShape& shape, int sm_count);

// The kernel family of a grouped GEMM plan: the mma.sync tile kernel (every mode, layout, gather, epilogue) or
// the sm_90a wgmma + TMA persistent kernel (cuda/gemm/grouped_gemm_wgmma_kernel.cuh).
enum class GemmPath : int32_t {
  mma_sync = 0,
  wgmma = 1,
  wgmma_pair = 2,  // the wgmma kernel in clusters of 2 CTAs sharing each B tile by TMA multicast
};

const char* gemm_path_name(GemmPath path);  // "mma", "wgmma", "wgmma_pair"

// Whether the wgmma kernel can run the problem, on a device of compute capability 9.0 with bf16 / fp16 operands:
// varlen M with B [E, n, k] and STORE / BIAS / GATED or B [E, k, n] and STORE / BIAS / DGATED, k a positive multiple
// of 64, the product's width (gemm_shape's n: DGATED's activation width) a multiple of 64; or varlen K (STORE).
bool wgmma_capable(const moekit_gemm_desc_t& desc, int cc_major, int cc_minor);

// wgmma where it is capable (measured faster for every mode and epilogue it takes), paired (wgmma_pair) for GATED
// and DGATED with k >= 4096 (measured 1-3% faster there, the same bits) and for varlen K with at least 512 rows per
// group on average (max_rows / groups; ~1% faster at ~1024, the same bits), else mma_sync.
GemmPath choose_gemm_path(const moekit_gemm_desc_t& desc, int cc_major, int cc_minor);

// choose_gemm_path, unless the environment variable MOEKIT_GEMM_PATH names a path: "mma" always gives mma_sync;
// "wgmma" gives the single-CTA wgmma kernel wherever it is capable, DGATED included, and mma_sync elsewhere;
// "wgmma_pair" gives wgmma_pair wherever wgmma is capable (varlen K then runs paired where pairs_weight_gradient
// allows, else unpaired), else as "wgmma" (tests run every path on one build).
GemmPath choose_gemm_path_or_override(const moekit_gemm_desc_t& desc, int cc_major, int cc_minor);

// A plan's kernel choice packed into one int32 (moekit_plan::kernel_config): the tile in the low byte, the path
// in the next.
int32_t gemm_kernel_config(GemmTile tile, GemmPath path);
GemmTile gemm_config_tile(int32_t kernel_config);
GemmPath gemm_config_path(int32_t kernel_config);

// The workspace of one grouped GEMM run (offsets in bytes, 256-byte aligned; unused parts have size 0).
struct GemmWorkspaceLayout {
  int64_t m_tiles;      // varlen M: bound of the row tiles of all groups together (each group's last may be partial)
  int64_t n_tiles;      // column tiles of the product
  size_t tile_count;    // int32 [1]: the row tiles of this call (varlen M)
  size_t tile_starts;   // int32 [E+1]: each group's first row tile (varlen M)
  size_t tile_list;     // int4 [m_tiles]: (group, first row, end row, 0) of every row tile (varlen M)
  size_t ds_partials;   // fp32 [max_rows, n_tiles]: DGATED's per-tile row dots dA . a
  size_t bytes;
  bool pair_tiles;      // wgmma_pair: the row tiles padded to an even count (m_tiles counts the pad)
};

GemmWorkspaceLayout gemm_workspace_layout(const moekit_gemm_desc_t& desc, GemmTile tile,
                                          GemmPath path = GemmPath::mma_sync);

}  // namespace v0
}  // namespace moekit
