// The CUDA grouped GEMM's configuration (docs/math.md section 5 for the math): every choice a launch makes — kernel
// family, tile, cluster, transposition, how A, B and C move — decided once when a plan is created, by a pure host
// function the CPU tests check, and only read by the launch. A few choices depend on facts of a call that a plan
// cannot know (beta, alpha, a bias, row strides); the configuration then holds one kernel per case, each with the
// facts it needs, so the launch picks a variant the plan already chose and never decides anything itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {

// The CTA tile shapes cuda/gemm/ is built for (M x N, reduction slices of 64).
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

// The kernel family: the mma.sync tile kernel (every mode, layout, gather, epilogue) or the sm_90a wgmma + TMA
// persistent kernel (cuda/gemm/grouped_gemm_wgmma_kernel.cuh).
enum class GemmPath : int32_t {
  mma_sync = 0,
  wgmma = 1,
};

// How the wgmma kernel's two consumer warpgroups share the work: cooperative, both on one tile (64 rows each, one
// epilogue after the other's main loop, at the same time); ping-pong, each its own 128-row tile, one's epilogue
// under the other's main loop (varlen M, 128x128 tiles).
enum class GemmSchedule : int32_t {
  cooperative = 0,
  pingpong = 1,
};
const char* gemm_schedule_name(GemmSchedule schedule);  // "cooperative", "pingpong"

// How an operand reaches shared memory.
enum class OperandMove : int32_t {
  cp_async = 0,         // copies by the threads (cp.async), rows in order
  cp_async_gather = 1,  // copies by the threads (cp.async) of the rows the gather index names
  tma = 2,              // the tensor memory accelerator, one box per slice (shared by a CTA pair by multicast)
};

// How the epilogue writes C (GATED: h and a).
enum class OutputMove : int32_t {
  threads = 0,         // each thread stores its values
  tma_store = 1,       // TMA stores from shared memory
  tma_reduce_add = 2,  // TMA reduce-adds into an fp32 C (beta = 1)
};

// Facts of a call that a kernel variant may require (a bit set).
enum GemmCallFact : uint32_t {
  kBetaZero = 1u << 0,         // beta == 0
  kBetaOne = 1u << 1,          // beta == 1
  kUnitAlphaNoBias = 1u << 2,  // alpha == 1 and no bias tensor
  kStrides32Bit = 1u << 3,     // A's and B's row strides below 2^31 elements (the wgmma varlen-K copies' offsets)
};

// One launch's complete choice.
struct GemmKernel {
  GemmPath path;
  GemmTile tile;
  GemmSchedule schedule;  // wgmma: the consumers' schedule
  int32_t cluster;       // CTAs per cluster: 1, or 2 sharing each B tile by TMA multicast (wgmma)
  bool transposed;       // varlen K run as C^T = B^T A (the gathered operand becomes A; C stored transposed by TMA)
  bool pad_tile_pairs;   // varlen M in clusters of 2: the row-tile list padded to an even count
  OperandMove a, b;      // as the kernel runs the product (after a transposition)
  OutputMove c;
  OperandMove epilogue;  // DGATED's h: by TMA (wgmma) or the threads; unused otherwise
  int32_t ctas;          // wgmma: the persistent grid's bound, the device's SM count
};

// A kernel and the call facts it needs.
struct GemmVariant {
  uint32_t needs;  // GemmCallFact bits
  GemmKernel kernel;
};

// The workspace of one grouped GEMM run (offsets in bytes, 256-byte aligned; unused parts have size 0), the same for
// every variant of a configuration.
struct GemmWorkspaceLayout {
  int64_t m_tiles;      // varlen M: bound of the row tiles of all groups together (each group's last may be partial)
  int64_t n_tiles;      // column tiles of the product
  size_t tile_count;    // int32 [1]: the row tiles of this call (varlen M)
  size_t tile_starts;   // int32 [E+1]: each group's first row tile (varlen M)
  size_t tile_list;     // int4 [m_tiles]: (group, first row, end row, 0) of every row tile (varlen M)
  int64_t ds_chunks;    // DGATED: 64-column chunks of the product, ds_partials' columns
  size_t ds_partials;   // fp32 [max_rows, ds_chunks]: DGATED's row dots dA . a, one per 64-column chunk
  size_t bytes;
};
// A plan's configuration: variants in order of preference; a call runs the first whose requirements it meets. The
// last needs nothing, so every call runs one of them.
struct GemmConfig {
  static constexpr int kMaxVariants = 3;
  GemmVariant variants[kMaxVariants];
  int32_t count;
  GemmWorkspaceLayout workspace;

  const GemmKernel& for_call(uint32_t facts) const;
};

// The device facts the choice reads, queried once per handle.
struct GemmDevice {
  int sm_count;
  int cc_major, cc_minor;
};

// The environment's overrides (read once, when a plan is created; see README's table):
//   MOEKIT_GEMM_PATH = "mma" (the mma.sync kernel everywhere), "wgmma" (the wgmma kernel wherever it can run, single
//   CTAs), "wgmma_pair" (the wgmma kernel in clusters of 2 wherever it can run and the product pairs);
//   MOEKIT_GEMM_TILE = "128x256" / "128x128";
//   MOEKIT_GEMM_SCHEDULE = "cooperative" / "pingpong" (varlen M on the wgmma kernel; ping-pong runs 128x128 tiles).
enum class GemmPathOverride : int32_t { none, mma, wgmma_single, wgmma_pair };
struct GemmOverrides {
  GemmPathOverride path;
  bool tile_forced;
  GemmTile tile;
  bool schedule_forced;
  GemmSchedule schedule;
};
GemmOverrides gemm_overrides_from_environment();

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
GemmShape gemm_shape(const moekit_gemm_desc_t& desc);

// The tile for a problem on a device with `sm_count` multiprocessors: 128x128 when the product is at most 128
// wide, when 256-wide tiles would pad the columns by more than an eighth over 128-wide ones, or when 128x256
// tiles would not fill one wave of the device; 128x256 otherwise (fewer operand bytes per FLOP).
GemmTile choose_gemm_tile(const GemmShape& shape, int sm_count);

// Whether the wgmma kernel can run the problem, on a device of compute capability 9.0 with bf16 / fp16 operands:
// varlen M with B [E, n, k] and STORE / BIAS / GATED or B [E, k, n] and STORE / BIAS / DGATED, k > 0 (k and n
// multiples of 8, as every CUDA grouped GEMM needs); or varlen K (STORE).
bool wgmma_capable(const moekit_gemm_desc_t& desc, const GemmDevice& device);

// The configuration of a validated descriptor (capi/ and plan_grouped_gemm have checked what the kernels need).
// By default: the wgmma kernel wherever it is capable (measured faster for every mode and epilogue it takes), with
// the tile, cluster and schedule of the table of measured winners (cuda/gemm/gemm_tuning.h; compute capability 9.0)
// where the descriptor's class has a row, else the heuristic's: choose_gemm_tile, clusters of 2 for GATED and DGATED
// with k >= 4096 and for varlen K with at least 512 rows per group on average (max_rows / groups) where the product
// pairs, and default_schedule's; the mma.sync kernel elsewhere. The overrides replace the path (and then the
// table's row), the tile and the schedule.
GemmConfig choose_gemm_config(const moekit_gemm_desc_t& desc, const GemmDevice& device, const GemmOverrides& env);

struct GemmTuningRow;
// The same with `table` in place of the library's table of measured winners (the CPU tests' own tables).
GemmConfig choose_gemm_config(const moekit_gemm_desc_t& desc, const GemmDevice& device, const GemmOverrides& env,
                              const std::vector<GemmTuningRow>& table);

// The configuration as one line of text ("store, B gathered, bf16 -> bf16: if beta = 0, row strides < 2^31: wgmma
// 128x256, 2-CTA clusters (B multicast), ...; otherwise: ...").
std::string describe_gemm_config(const moekit_gemm_desc_t& desc, const GemmConfig& config);

// The workspace layout of a configuration's variants (choose_gemm_config stores it in the configuration).
GemmWorkspaceLayout gemm_workspace_layout(const moekit_gemm_desc_t& desc, const GemmConfig& config);

}  // namespace v0
}  // namespace moekit
