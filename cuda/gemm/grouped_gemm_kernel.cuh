// The grouped GEMM tile kernel (docs/math.md section 5) on the sm_80 tensor-core path that Hopper keeps: mma.sync
// m16n8k16 with fp32 accumulators, fragments by ldmatrix from XOR-swizzled shared memory, operands streamed by
// cp.async through a multi-stage ring. It is the correct fallback for every mode, layout, gather and epilogue.
//
// One CTA computes one BM x BN tile of C:
//   varlen M: a row tile from the tile list (one group's rows, never another's), one column tile; the K loop
//             runs over the reduction in slices of 64;
//   varlen K: one (group, m tile, n tile); the K loop runs over the group's rows (offsets read on the device).
// Rows outside the tile's group and columns past the matrix are zero-filled by the copies and never stored.
//
// Epilogue: the fp32 accumulators go through shared memory (the pipeline's buffers, reused), so every thread
// then handles 8 consecutive output values of one row with 16-byte loads and stores; the epilogue kind, the
// activation, the GLU layout, the bias and alpha/beta are run-time switches.
//
// Template parameters: the operand dtype T (__nv_bfloat16, __half), the tile configuration Cfg, and the
// operand layout Op (which operand is K-major).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/cp_async.cuh"
#include "cuda/common/cuda_check.h"
#include "cuda/common/mma_sync.cuh"
#include "cuda/common/storage.cuh"
#include "cuda/gemm/gemm_tile_parts.cuh"
#include "cuda/gemm/grouped_gemm.h"
#include "moekit/moekit.h"

namespace moekit {
inline namespace v0 {
namespace cuda {
namespace gemm {

template <int BM, int BN, int WarpsM, int WarpsN, int Stages>
struct TileConfig {
  static constexpr int bm = BM;
  static constexpr int bn = BN;
  static constexpr int bk = 64;  // reduction slice: one 128-byte swizzle row of a K-major tile
  static constexpr int warps_m = WarpsM;
  static constexpr int warps_n = WarpsN;
  static constexpr int stages = Stages;
  static constexpr int threads = 32 * WarpsM * WarpsN;
  static constexpr int warp_m = BM / WarpsM;
  static constexpr int warp_n = BN / WarpsN;
  static constexpr int mma_m = warp_m / 16;
  static constexpr int mma_n = warp_n / 8;
  static constexpr int a_stage_bytes = BM * bk * 2;
  static constexpr int b_stage_bytes = BN * bk * 2;
  static constexpr int pipeline_bytes = Stages * (a_stage_bytes + b_stage_bytes);
  // NOTE: 8 floats of padding per row: a half-warp's 8-byte fragment stores then cover 4 rows in 32 banks.
  static constexpr int staging_pitch = BN + 8;
  static constexpr int staging_bytes = BM * staging_pitch * 4;
  // varlen K with a gather: the source rows of the next reduction slices, kept in a ring after the tiles.
  static constexpr int ring_slots = 8;
  static constexpr int ring_offset = pipeline_bytes > staging_bytes ? pipeline_bytes : staging_bytes;
  static constexpr int shared_bytes = ring_offset + ring_slots * bk * 4;

  static_assert(warp_m % 16 == 0 && warp_n % 16 == 0, "a warp tile is whole 16x16 fragments in both dims");
  static_assert(BM % 64 == 0 && BN % 64 == 0, "MN-major tiles need 8 swizzle chunks per row");
  static_assert((BM * 8) % threads == 0 && (BN * 8) % threads == 0, "every thread copies the same chunk count");
  static_assert(threads % (BN / 8) == 0 && threads % (BM / 8) == 0, "MN-major copies keep one column per thread");
  static_assert(BN / 8 <= 32, "one row of the epilogue is at most one warp");
  static_assert(Stages >= 2, "a pipeline needs two stages");
  static_assert(Stages * bk <= threads && bk <= threads, "one thread loads each row index of the first stages");
  static_assert(ring_slots >= Stages + 1, "the ring holds the first stages' rows and the next one");
};

template <GemmTile Tile>
struct TileFor;
template <>
struct TileFor<GemmTile::m128_n256> {
  using type = TileConfig<128, 256, 2, 4, 4>;
};
template <>
struct TileFor<GemmTile::m128_n128> {
  using type = TileConfig<128, 128, 2, 4, 4>;
};

// ------------------------------------------------------------------------------------------------------------
// The kernel
// ------------------------------------------------------------------------------------------------------------

template <class T, class Cfg, Operands Op>
__global__ void __launch_bounds__(Cfg::threads, 1) grouped_gemm_kernel(const GroupedGemmProblem p) {
  constexpr bool varlen_k = Op == Operands::varlen_k;
  constexpr bool a_kmajor = !varlen_k;
  constexpr bool b_kmajor = Op == Operands::varlen_m_nk;
  constexpr int BM = Cfg::bm, BN = Cfg::bn, BK = Cfg::bk, S = Cfg::stages, threads = Cfg::threads;

  extern __shared__ __align__(128) unsigned char shared[];
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int wm = warp / Cfg::warps_n;
  const int wn = warp % Cfg::warps_n;

  // ---- The tile: its group, its rows (varlen M) or reduction rows (varlen K), its first C row and column ----
  int64_t group, row_begin, row_end, m0;
  int64_t n_tile;
  if constexpr (!varlen_k) {
    const int64_t m_tile = blockIdx.x / p.n_tiles;
    n_tile = blockIdx.x % p.n_tiles;
    if (m_tile >= *p.tile_count) return;
    const int4 info = reinterpret_cast<const int4*>(p.tile_list)[m_tile];
    group = info.x;
    row_begin = info.y;
    row_end = info.z;
    m0 = row_begin;
  } else {
    const int64_t m_tiles = (p.m + BM - 1) / BM;
    const int64_t per_group = m_tiles * p.n_tiles;
    group = blockIdx.x / per_group;
    const int64_t in_group = blockIdx.x % per_group;
    m0 = (in_group / p.n_tiles) * BM;
    n_tile = in_group % p.n_tiles;
    row_end = min(max(static_cast<int64_t>(p.offsets[group + 1]), int64_t{0}), p.rows);
    row_begin = min(max(static_cast<int64_t>(p.offsets[group]), int64_t{0}), row_end);
  }
  const int64_t n0 = n_tile * BN;
  // GATED with a gated activation in the CONCAT layout reads B's rows (NK) or columns (KN) in gate/up pairs.
  const bool concat_pairs = p.epilogue == MOEKIT_EPILOGUE_GATED && is_gated_activation(p.activation) &&
                            p.glu_layout == MOEKIT_GLU_CONCAT;

  const T* a_base = static_cast<const T*>(p.a);
  const T* b_base = static_cast<const T*>(p.b);
  if constexpr (!varlen_k) b_base += group * p.b_group_stride;
  const int64_t num_k_tiles = varlen_k ? (row_end - row_begin + BK - 1) / BK : (p.k + BK - 1) / BK;

  const uint32_t smem = shared_address(shared);
  const uint32_t smem_b = smem + S * Cfg::a_stage_bytes;

  // ---- Copy assignments: which 16-byte chunks of each stage this thread moves ----
  // K-major tiles: 8 chunks per row, rows tid/8 + i * threads/8. MN-major tiles: one column chunk per thread,
  // reduction rows tid/(width/8) + i * threads/(width/8).
  constexpr int a_copies = BM * BK / 8 / threads;
  constexpr int b_copies = BN * BK / 8 / threads;
  constexpr int a_row_step = a_kmajor ? threads / 8 : threads / (BM / 8);
  constexpr int b_row_step = b_kmajor ? threads / 8 : threads / (BN / 8);
  const int a_first = a_kmajor ? tid / 8 : tid / (BM / 8);   // first row (K-major) or reduction row (MN-major)
  const int a_chunk = a_kmajor ? tid % 8 : tid % (BM / 8);   // reduction chunk (K-major) or column chunk
  const int b_first = b_kmajor ? tid / 8 : tid / (BN / 8);
  const int b_chunk = b_kmajor ? tid % 8 : tid % (BN / 8);
  const uint32_t a_dst = a_kmajor ? kmajor_offset(a_first, a_chunk) : mnmajor_offset<BM>(a_first, a_chunk);
  const uint32_t b_dst = b_kmajor ? kmajor_offset(b_first, b_chunk) : mnmajor_offset<BN>(b_first, b_chunk);
  constexpr uint32_t a_dst_step = a_kmajor ? a_row_step * 128 : a_row_step * BM * 2;
  constexpr uint32_t b_dst_step = b_kmajor ? b_row_step * 128 : b_row_step * BN * 2;

  // varlen M: the source rows of this thread's A chunks (gathered or not) and B rows (NK; the gate/up pair
  // position for CONCAT), fixed for the tile, -1 outside the tile's group or past n.
  int32_t a_src[varlen_k ? 1 : a_copies];
  int32_t b_src[varlen_k || !b_kmajor ? 1 : b_copies];
  // varlen M, KN: B's column of this thread, -1 past n.
  int64_t b_col = 0;
  // varlen K: whether the columns of this thread's A and B chunks (fixed) are inside m / n.
  bool a_col_ok = true, b_col_ok = true;

  const bool gather_a = p.gather == MOEKIT_GEMM_GATHER_A;
  const bool gather_b = p.gather == MOEKIT_GEMM_GATHER_B;
  if constexpr (!varlen_k) {
#pragma unroll
    for (int i = 0; i < a_copies; ++i) {
      const int64_t r = m0 + a_first + i * a_row_step;
      a_src[i] = r < row_end ? static_cast<int32_t>(gather_a ? gather_row(p, r) : r) : -1;
    }
    if constexpr (b_kmajor) {
#pragma unroll
      for (int i = 0; i < b_copies; ++i) {
        const int64_t n = n0 + b_first + i * b_row_step;
        b_src[i] = n < p.n ? static_cast<int32_t>(concat_pairs ? concat_pair_column(n, p.act_width) : n) : -1;
      }
    } else {
      const int64_t n = n0 + 8 * b_chunk;
      b_col = n < p.n ? (concat_pairs ? concat_pair_column(n, p.act_width) : n) : -1;
    }
  } else {
    a_col_ok = m0 + 8 * a_chunk < p.m;
    b_col_ok = n0 + 8 * b_chunk < p.n;
  }

  // varlen K with a gather: gather_idx of reduction slice t sits in ring slot t % ring_slots, written one
  // iteration before the slice's copies are issued (the loop's barrier in between), so the index loads' latency
  // hides behind a slice of MMAs. Thread i < BK holds slice t + 1's index i in a register meanwhile.
  int32_t* ring = reinterpret_cast<int32_t*>(shared + Cfg::ring_offset);
  const bool gathered_rows = varlen_k && p.gather != MOEKIT_GEMM_GATHER_NONE;
  auto slice_index = [&](int64_t t, int i) -> int32_t {
    const int64_t r = row_begin + t * BK + i;
    return r < row_end ? static_cast<int32_t>(gather_row(p, r)) : 0;
  };
  int32_t next_index = 0;
  if (gathered_rows) {
    if (tid < S * BK) ring[((tid / BK) % Cfg::ring_slots) * BK + tid % BK] = slice_index(tid / BK, tid % BK);
    if (tid < BK) next_index = slice_index(S, tid);
    __syncthreads();
  }
  // The source row of reduction row i of slice t (varlen K), -1 past the group's end.
  auto slice_row = [&](int64_t t, int i, bool gathered) -> int64_t {
    const int64_t r = row_begin + t * BK + i;
    if (r >= row_end) return -1;
    return gathered ? ring[(t % Cfg::ring_slots) * BK + i] : r;
  };

  // Issues the copies of reduction slice t into ring slot `slot`.
  auto load_slice = [&](int slot, int64_t t) {
    const uint32_t a_slot = smem + slot * Cfg::a_stage_bytes;
    const uint32_t b_slot = smem_b + slot * Cfg::b_stage_bytes;
    if constexpr (!varlen_k) {
      const int64_t k = t * BK + 8 * a_chunk;  // A's reduction column (K-major)
      const bool k_ok = k < p.k;
#pragma unroll
      for (int i = 0; i < a_copies; ++i) {
        const bool ok = k_ok && a_src[i] >= 0;
        const T* src = a_base + (ok ? a_src[i] * p.lda + k : 0);
        cp_async_16(a_slot + a_dst + i * a_dst_step, src, ok);
      }
      if constexpr (b_kmajor) {
#pragma unroll
        for (int i = 0; i < b_copies; ++i) {
          const bool ok = k_ok && b_src[i] >= 0;
          const T* src = b_base + (ok ? b_src[i] * p.ldb + k : 0);
          cp_async_16(b_slot + b_dst + i * b_dst_step, src, ok);
        }
      } else {
#pragma unroll
        for (int i = 0; i < b_copies; ++i) {
          const int64_t kr = t * BK + b_first + i * b_row_step;
          const bool ok = b_col >= 0 && kr < p.k;
          const T* src = b_base + (ok ? kr * p.ldb + b_col : 0);
          cp_async_16(b_slot + b_dst + i * b_dst_step, src, ok);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < a_copies; ++i) {
        const int64_t row = slice_row(t, a_first + i * a_row_step, gather_a);
        const bool ok = a_col_ok && row >= 0;
        const T* src = a_base + (ok ? row * p.lda + m0 + 8 * a_chunk : 0);
        cp_async_16(a_slot + a_dst + i * a_dst_step, src, ok);
      }
#pragma unroll
      for (int i = 0; i < b_copies; ++i) {
        const int64_t row = slice_row(t, b_first + i * b_row_step, gather_b);
        const bool ok = b_col_ok && row >= 0;
        const T* src = b_base + (ok ? row * p.ldb + n0 + 8 * b_chunk : 0);
        cp_async_16(b_slot + b_dst + i * b_dst_step, src, ok);
      }
    }
  };

  float acc[Cfg::mma_m][Cfg::mma_n][4];
#pragma unroll
  for (int mi = 0; mi < Cfg::mma_m; ++mi)
#pragma unroll
    for (int ni = 0; ni < Cfg::mma_n; ++ni)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mi][ni][q] = 0.0f;

  // Tensor-core work on one ring slot: BK / 16 steps of (mma_m x mma_n) fragments.
  auto compute_slice = [&](int slot) {
    const uint32_t a_slot = smem + slot * Cfg::a_stage_bytes;
    const uint32_t b_slot = smem_b + slot * Cfg::b_stage_bytes;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t af[Cfg::mma_m][4];
      uint32_t bf[Cfg::mma_n][2];
#pragma unroll
      for (int mi = 0; mi < Cfg::mma_m; ++mi) {
        const int m = wm * Cfg::warp_m + mi * 16;
        if constexpr (a_kmajor) {
          ldmatrix_x4(af[mi], a_slot + kmajor_offset(m + (lane & 15), kk * 2 + (lane >> 4)));
        } else {
          const int k = kk * 16 + (lane & 7) + (lane >> 4) * 8;
          ldmatrix_x4_trans(af[mi], a_slot + mnmajor_offset<BM>(k, (m >> 3) + ((lane >> 3) & 1)));
        }
      }
#pragma unroll
      for (int nj = 0; nj < Cfg::mma_n; nj += 2) {
        const int n = wn * Cfg::warp_n + nj * 8;
        uint32_t r[4];
        if constexpr (b_kmajor) {
          ldmatrix_x4(r, b_slot + kmajor_offset(n + (lane & 7) + (lane >> 4) * 8, kk * 2 + ((lane >> 3) & 1)));
        } else {
          ldmatrix_x4_trans(r, b_slot + mnmajor_offset<BN>(kk * 16 + (lane & 15), (n >> 3) + (lane >> 4)));
        }
        bf[nj][0] = r[0];
        bf[nj][1] = r[1];
        bf[nj + 1][0] = r[2];
        bf[nj + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < Cfg::mma_m; ++mi)
#pragma unroll
        for (int ni = 0; ni < Cfg::mma_n; ++ni) mma_16816<T>(acc[mi][ni], af[mi], bf[ni][0], bf[ni][1]);
    }
  };

  // ---- Main loop: S-1 slices in flight while one is multiplied ----
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < num_k_tiles) load_slice(s, s);
    cp_async_commit();
  }
  int read_slot = 0, write_slot = S - 1;
  for (int64_t t = 0; t < num_k_tiles; ++t) {
    cp_async_wait<S - 2>();
    __syncthreads();  // slice t landed for every thread; slot write_slot is no longer read
    const int64_t next = t + S - 1;
    if (next < num_k_tiles) load_slice(write_slot, next);
    cp_async_commit();
    if (gathered_rows && tid < BK) {
      ring[((next + 1) % Cfg::ring_slots) * BK + tid] = next_index;
      next_index = slice_index(next + 2, tid);
    }
    compute_slice(read_slot);
    read_slot = read_slot + 1 == S ? 0 : read_slot + 1;
    write_slot = write_slot + 1 == S ? 0 : write_slot + 1;
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the ring: it becomes the staging tile

  // ---- Epilogue part 1: accumulators to the fp32 staging tile [BM][BN + 8] ----
  // GATED with a gated activation stages gate values in columns [0, BN/2) and up values in [BN/2, BN), by
  // activation column; everything else stages the product's columns as they are.
  float* staging = reinterpret_cast<float*>(shared);
  constexpr int pitch = Cfg::staging_pitch;
  const bool split_glu = !varlen_k && p.epilogue == MOEKIT_EPILOGUE_GATED && is_gated_activation(p.activation);
  const bool interleaved = p.glu_layout == MOEKIT_GLU_INTERLEAVED;
#pragma unroll
  for (int mi = 0; mi < Cfg::mma_m; ++mi)
#pragma unroll
    for (int ni = 0; ni < Cfg::mma_n; ++ni)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = wm * Cfg::warp_m + mi * 16 + (lane >> 2) + half * 8;
        const int col = wn * Cfg::warp_n + ni * 8 + 2 * (lane & 3);
        const float v0 = acc[mi][ni][2 * half], v1 = acc[mi][ni][2 * half + 1];
        float* line = staging + row * pitch;
        if (!split_glu) {
          *reinterpret_cast<float2*>(line + col) = make_float2(v0, v1);
        } else if (interleaved) {
          line[col / 2] = v0;
          line[BN / 2 + col / 2] = v1;
        } else {
          const int j = (col >> 4) * 8 + (col & 7);
          *reinterpret_cast<float2*>(line + ((col & 8) ? BN / 2 : 0) + j) = make_float2(v0, v1);
        }
      }
  __syncthreads();

  // ---- Epilogue part 2: 8 values of one row per thread; a row's threads are consecutive lanes ----
  const DeviceActivation act{p.activation, p.glu_limit};
  const int items_per_row = split_glu ? BN / 16 : BN / 8;
  const int rows_per_pass = threads / items_per_row;
  const int item = tid % items_per_row;
#pragma unroll 1
  for (int row = tid / items_per_row; row < BM; row += rows_per_pass) {
    const float* line = staging + row * pitch;
    if constexpr (varlen_k) {
      const int64_t m = m0 + row, col = n0 + 8 * item;
      if (m < p.m && col < p.n)
        epilogue_store<T>(p, line + 8 * item, group, group * p.c_group_stride + m * p.ldc + col, col);
    } else {
      const int64_t r = m0 + row;
      const bool row_ok = r < row_end;
      if (p.epilogue == MOEKIT_EPILOGUE_DGATED) {
        // Every lane of the row takes part in the sum, so the butterfly below sees all of them.
        const int64_t j = n0 + 8 * item;
        float dot = 0.0f;
        if (row_ok && j < p.n) {
          const float scale = pair_scale(p, r);
          dot = epilogue_dgated<T>(p, act, line + 8 * item, r, j, scale);
        }
        // Per 64-column chunk (8 lanes), the same butterfly as the wgmma kernel's: one partial per chunk, so the
        // score gradient's sum does not depend on the tile.
#pragma unroll
        for (int offset = 4; offset >= 1; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
        if (row_ok && item % 8 == 0 && j < p.n) p.ds_partials[r * p.ds_chunks + j / 64] = dot;
      } else if (!row_ok) {
        continue;
      } else if (split_glu) {
        const int64_t j = n0 / 2 + 8 * item;
        if (j < p.act_width) epilogue_gated_glu<T>(p, act, line + 8 * item, line + BN / 2 + 8 * item, group, r, j);
      } else {
        const int64_t col = n0 + 8 * item;
        if (col >= p.n) continue;
        if (p.epilogue == MOEKIT_EPILOGUE_GATED)
          epilogue_gated_plain<T>(p, act, line + 8 * item, group, r, col);
        else
          epilogue_store<T>(p, line + 8 * item, group, r * p.ldc + col, col);
      }
    }
  }
}

// The definition behind grouped_gemm.h's declaration; each grouped_gemm_<operands>_<dtype>_<tile>.cu explicitly
// instantiates one.
template <int32_t Dtype, GemmTile Tile, Operands Op>
void launch_gemm_tiles(const GroupedGemmProblem& p, cudaStream_t stream) {
  using T = typename StorageFor<Dtype>::type;
  using Cfg = typename TileFor<Tile>::type;
  const int64_t blocks = p.mode == MOEKIT_GEMM_VARLEN_K ? varlen_k_tile_count(p, Cfg::bm) : p.m_tiles * p.n_tiles;
  if (blocks == 0) return;
  auto kernel = grouped_gemm_kernel<T, Cfg, Op>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::shared_bytes),
             "grouped GEMM: shared memory opt-in");
  kernel<<<static_cast<unsigned>(blocks), Cfg::threads, Cfg::shared_bytes, stream>>>(p);
  check_launch("grouped GEMM: tile kernel");
}

}  // namespace gemm
}  // namespace cuda
}  // namespace v0
}  // namespace moekit
