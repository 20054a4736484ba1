// Blocking follows the classic CPU GEMM layout: an output tile of up to kRowBlocksPerTile*kMc rows x kNc columns is
// one parallel task; inside it the reduction runs in blocks of kKc; each block packs B into kNr-column panels once,
// then A into kMr-row panels kMc rows at a time (zero padded), and the micro-kernel keeps a kMr x kNr block of C in
// registers while it streams both panels. The A block (kMc x kKc) stays in L2, one B panel (kKc x kNr) in L1.
#include "src/reference/matmul.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>

#include "src/reference/parallel.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace moekit {
inline namespace v0 {
namespace ref {

namespace {

constexpr int64_t kMr = 6;
constexpr int64_t kNr = 8;
constexpr int64_t kKc = 256;
constexpr int64_t kMc = 96;   // a multiple of kMr
constexpr int64_t kNc = 512;  // a multiple of kNr

// c [kMr, kNr] (row stride ldc) = (load_c ? c : 0) + fma chain over p of a[p*kMr + i] * b[p*kNr + j].
using MicroKernel = void (*)(int64_t kc, const double* a, const double* b, double* c, int64_t ldc, bool load_c);

void micro_kernel_portable(int64_t kc, const double* a, const double* b, double* c, int64_t ldc, bool load_c) {
  double acc[kMr][kNr];
  for (int64_t i = 0; i < kMr; ++i)
    for (int64_t j = 0; j < kNr; ++j) acc[i][j] = load_c ? c[i * ldc + j] : 0.0;
  for (int64_t p = 0; p < kc; ++p)
    for (int64_t i = 0; i < kMr; ++i)
      for (int64_t j = 0; j < kNr; ++j) acc[i][j] = std::fma(a[p * kMr + i], b[p * kNr + j], acc[i][j]);
  for (int64_t i = 0; i < kMr; ++i)
    for (int64_t j = 0; j < kNr; ++j) c[i * ldc + j] = acc[i][j];
}

#if defined(__x86_64__)
// The same chain as micro_kernel_portable, four lanes at a time: 12 accumulators, 2 B vectors, 1 A broadcast.
__attribute__((target("avx2,fma"))) void micro_kernel_avx2(int64_t kc, const double* a, const double* b, double* c,
                                                           int64_t ldc, bool load_c) {
  __m256d acc[kMr][2];
#pragma GCC unroll 6
  for (int64_t i = 0; i < kMr; ++i) {
    acc[i][0] = load_c ? _mm256_loadu_pd(c + i * ldc) : _mm256_setzero_pd();
    acc[i][1] = load_c ? _mm256_loadu_pd(c + i * ldc + 4) : _mm256_setzero_pd();
  }
  for (int64_t p = 0; p < kc; ++p) {
    __m256d b0 = _mm256_loadu_pd(b + p * kNr);
    __m256d b1 = _mm256_loadu_pd(b + p * kNr + 4);
#pragma GCC unroll 6
    for (int64_t i = 0; i < kMr; ++i) {
      __m256d ai = _mm256_broadcast_sd(a + p * kMr + i);
      acc[i][0] = _mm256_fmadd_pd(ai, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_pd(ai, b1, acc[i][1]);
    }
  }
#pragma GCC unroll 6
  for (int64_t i = 0; i < kMr; ++i) {
    _mm256_storeu_pd(c + i * ldc, acc[i][0]);
    _mm256_storeu_pd(c + i * ldc + 4, acc[i][1]);
  }
}
#endif

MicroKernel select_micro_kernel() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return micro_kernel_avx2;
#endif
  return micro_kernel_portable;
}

int64_t row_of(const MatrixView& v, int64_t i) { return v.row_index ? v.row_index[i] : i; }
int64_t col_of(const MatrixView& v, int64_t j) { return v.col_index ? v.col_index[j] : j; }

// A rows [i0, i0+mc) x columns [p0, p0+kc) into ceil(mc/kMr) panels; panel q holds (r, p) at [q*kc*kMr + p*kMr + r],
// rows past mc zero.
void pack_a(const MatrixView& a, int64_t i0, int64_t mc, int64_t p0, int64_t kc, double* dst,
            std::vector<int64_t>& col_offset) {
  // NOTE: rows contiguous in k (the common case) skip the per-column offset table.
  bool unit_columns = !a.col_index && a.col_stride == 1;
  if (!unit_columns)
    for (int64_t p = 0; p < kc; ++p) col_offset[static_cast<size_t>(p)] = col_of(a, p0 + p) * a.col_stride;
  for (int64_t q = 0; q * kMr < mc; ++q) {
    int64_t live = std::min(kMr, mc - q * kMr);
    const double* rows[kMr];
    for (int64_t r = 0; r < live; ++r)
      rows[r] = a.data + row_of(a, i0 + q * kMr + r) * a.row_stride + (unit_columns ? p0 : 0);
    double* panel = dst + q * kc * kMr;
    if (unit_columns) {
      for (int64_t p = 0; p < kc; ++p)
        for (int64_t r = 0; r < live; ++r) panel[p * kMr + r] = rows[r][p];
    } else {
      for (int64_t p = 0; p < kc; ++p)
        for (int64_t r = 0; r < live; ++r) panel[p * kMr + r] = rows[r][col_offset[static_cast<size_t>(p)]];
    }
    for (int64_t p = 0; p < kc; ++p)
      for (int64_t r = live; r < kMr; ++r) panel[p * kMr + r] = 0.0;
  }
}

// B rows [p0, p0+kc) x columns [j0, j0+nc) into ceil(nc/kNr) panels; panel q holds (p, c) at [q*kc*kNr + p*kNr + c],
// columns past nc zero. Reads follow the contiguous direction of B: rows (x, W as [K, N]) or columns (W^T).
void pack_b(const MatrixView& b, int64_t p0, int64_t kc, int64_t j0, int64_t nc, double* dst,
            std::vector<int64_t>& col_offset) {
  bool unit_columns = !b.col_index && b.col_stride == 1;
  bool unit_rows = !b.row_index && !b.col_index && std::llabs(b.row_stride) < std::llabs(b.col_stride);
  if (!unit_columns)
    for (int64_t j = 0; j < nc; ++j) col_offset[static_cast<size_t>(j)] = col_of(b, j0 + j) * b.col_stride;
  for (int64_t q = 0; q * kNr < nc; ++q) {
    int64_t live = std::min(kNr, nc - q * kNr);
    double* panel = dst + q * kc * kNr;
    if (unit_rows) {
      const double* columns[kNr];
      for (int64_t c = 0; c < live; ++c) columns[c] = b.data + col_offset[static_cast<size_t>(q * kNr + c)];
      for (int64_t p = 0; p < kc; ++p)
        for (int64_t c = 0; c < live; ++c) panel[p * kNr + c] = columns[c][(p0 + p) * b.row_stride];
    } else {
      for (int64_t p = 0; p < kc; ++p) {
        const double* row = b.data + row_of(b, p0 + p) * b.row_stride;
        if (unit_columns) {
          const double* from = row + j0 + q * kNr;
          for (int64_t c = 0; c < live; ++c) panel[p * kNr + c] = from[c];
        } else {
          for (int64_t c = 0; c < live; ++c) panel[p * kNr + c] = row[col_offset[static_cast<size_t>(q * kNr + c)]];
        }
      }
    }
    for (int64_t p = 0; p < kc; ++p)
      for (int64_t c = live; c < kNr; ++c) panel[p * kNr + c] = 0.0;
  }
}

// One parallel task: columns [j0, j0 + kNc) of rows [i0, i_end) of one product. Each packed B block serves up to
// kRowBlocksPerTile A blocks, so B is packed once per tile rather than once per kMc rows.
constexpr int64_t kRowBlocksPerTile = 4;

struct Tile {
  const MatmulTask* task;
  int64_t i0, i_end, j0;
};

// NOTE: a and b are left uninitialised: packing writes every element the micro-kernel reads (padding included), and
// zeroing 1.2 MB a call, with the page faults that come with it, was most of the time of a small product.
struct PackBuffers {
  std::unique_ptr<double[]> a{new double[static_cast<size_t>(kMc * kKc)]};
  std::unique_ptr<double[]> b{new double[static_cast<size_t>(kNc * kKc)]};
  std::vector<int64_t> offsets = std::vector<int64_t>(static_cast<size_t>(std::max(kKc, kNc)));
};

// C rows [i0, i0+mc) x columns [j0, j0+nc) from the packed blocks.
void multiply_packed(const MatmulTask& t, int64_t i0, int64_t mc, int64_t j0, int64_t nc, int64_t kc, bool load_c,
                     const PackBuffers& buffers, MicroKernel kernel) {
  for (int64_t jr = 0; jr < nc; jr += kNr) {
    int64_t nr = std::min(kNr, nc - jr);
    const double* b_panel = buffers.b.get() + (jr / kNr) * kc * kNr;
    for (int64_t ir = 0; ir < mc; ir += kMr) {
      int64_t mr = std::min(kMr, mc - ir);
      const double* a_panel = buffers.a.get() + (ir / kMr) * kc * kMr;
      double* c = t.c + (i0 + ir) * t.ldc + j0 + jr;
      if (mr == kMr && nr == kNr) {
        kernel(kc, a_panel, b_panel, c, t.ldc, load_c);
        continue;
      }
      double edge[kMr * kNr];
      if (load_c)
        for (int64_t i = 0; i < mr; ++i) std::memcpy(edge + i * kNr, c + i * t.ldc, sizeof(double) * nr);
      kernel(kc, a_panel, b_panel, edge, kNr, load_c);
      for (int64_t i = 0; i < mr; ++i) std::memcpy(c + i * t.ldc, edge + i * kNr, sizeof(double) * nr);
    }
  }
}

void run_tile(const Tile& tile, PackBuffers& buffers, MicroKernel kernel) {
  const MatmulTask& t = *tile.task;
  int64_t nc = std::min(kNc, t.n - tile.j0);
  if (t.k == 0) {
    if (!t.accumulate)
      for (int64_t i = tile.i0; i < tile.i_end; ++i) std::fill_n(t.c + i * t.ldc + tile.j0, nc, 0.0);
    return;
  }
  for (int64_t p0 = 0; p0 < t.k; p0 += kKc) {
    int64_t kc = std::min(kKc, t.k - p0);
    bool load_c = t.accumulate || p0 > 0;
    pack_b(t.b, p0, kc, tile.j0, nc, buffers.b.get(), buffers.offsets);
    for (int64_t i0 = tile.i0; i0 < tile.i_end; i0 += kMc) {
      int64_t mc = std::min(kMc, tile.i_end - i0);
      pack_a(t.a, i0, mc, p0, kc, buffers.a.get(), buffers.offsets);
      multiply_packed(t, i0, mc, tile.j0, nc, kc, load_c, buffers, kernel);
    }
  }
}

}  // namespace

void matmul(const std::vector<MatmulTask>& tasks) {
  static const MicroKernel kernel = select_micro_kernel();
  std::vector<Tile> tiles;
  for (const MatmulTask& task : tasks)
    for (int64_t j0 = 0; j0 < task.n; j0 += kNc)
      for (int64_t i0 = 0; i0 < task.m; i0 += kMc * kRowBlocksPerTile)
        tiles.push_back(Tile{&task, i0, std::min(task.m, i0 + kMc * kRowBlocksPerTile), j0});
  // NOTE: tiles are handed out first come, first served (their sizes vary with the groups); which thread computes
  // a tile does not change its bits.
  std::atomic<size_t> next{0};
  parallel_for(std::min<int64_t>(thread_count(), static_cast<int64_t>(tiles.size())), [&](int64_t, int64_t) {
    PackBuffers buffers;
    for (size_t i = next++; i < tiles.size(); i = next++) run_tile(tiles[i], buffers, kernel);
  });
}

void matmul(const MatmulTask& task) { matmul(std::vector<MatmulTask>{task}); }

}  // namespace ref
}  // namespace v0
}  // namespace moekit
