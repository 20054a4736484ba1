// Blocking follows the classic CPU GEMM layout: an output tile of kMc x kNc is one parallel task; inside it the
// reduction runs in blocks of kKc; each block packs A into kMr-row panels and B into kNr-column panels (zero
// padded), and the micro-kernel keeps a kMr x kNr block of C in registers while it streams both panels.
// The A panel block (kMc x kKc) stays in L2, one B panel (kKc x kNr) in L1.
#include "reference/matmul.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "reference/parallel.h"

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

// NOTE: a view whose columns are contiguous in memory is read column-major (the inner loop walks the
// contiguous direction) so transposed weights pack at memory speed.
bool columns_contiguous(const MatrixView& v) {
  return !v.row_index && std::llabs(v.row_stride) < std::llabs(v.col_stride);
}

// A rows [i0, i0+mc) x columns [p0, p0+kc) into ceil(mc/kMr) panels; panel q holds (r, p) at [q*kc*kMr + p*kMr + r].
void pack_a(const MatrixView& a, int64_t i0, int64_t mc, int64_t p0, int64_t kc, double* dst,
            std::vector<int64_t>& col_offset) {
  for (int64_t p = 0; p < kc; ++p) col_offset[static_cast<size_t>(p)] = col_of(a, p0 + p) * a.col_stride;
  bool by_column = columns_contiguous(a);
  for (int64_t q = 0; q * kMr < mc; ++q) {
    int64_t live = std::min(kMr, mc - q * kMr);
    const double* rows[kMr];
    for (int64_t r = 0; r < live; ++r) rows[r] = a.data + row_of(a, i0 + q * kMr + r) * a.row_stride;
    double* panel = dst + q * kc * kMr;
    if (by_column) {
      for (int64_t p = 0; p < kc; ++p)
        for (int64_t r = 0; r < live; ++r) panel[p * kMr + r] = rows[r][col_offset[static_cast<size_t>(p)]];
    } else {
      for (int64_t r = 0; r < live; ++r)
        for (int64_t p = 0; p < kc; ++p) panel[p * kMr + r] = rows[r][col_offset[static_cast<size_t>(p)]];
    }
    for (int64_t r = live; r < kMr; ++r)
      for (int64_t p = 0; p < kc; ++p) panel[p * kMr + r] = 0.0;
  }
}

// B rows [p0, p0+kc) x columns [j0, j0+nc) into ceil(nc/kNr) panels; panel q holds (p, c) at [q*kc*kNr + p*kNr + c].
void pack_b(const MatrixView& b, int64_t p0, int64_t kc, int64_t j0, int64_t nc, double* dst,
            std::vector<int64_t>& col_offset) {
  int64_t padded = (nc + kNr - 1) / kNr * kNr;
  for (int64_t j = 0; j < nc; ++j) col_offset[static_cast<size_t>(j)] = col_of(b, j0 + j) * b.col_stride;
  auto slot = [&](int64_t p, int64_t j) -> double& { return dst[(j / kNr) * kc * kNr + p * kNr + j % kNr]; };
  if (columns_contiguous(b)) {
    for (int64_t j = 0; j < nc; ++j) {
      const double* column = b.data + col_offset[static_cast<size_t>(j)];
      for (int64_t p = 0; p < kc; ++p) slot(p, j) = column[(p0 + p) * b.row_stride];
    }
  } else {
    for (int64_t p = 0; p < kc; ++p) {
      const double* row = b.data + row_of(b, p0 + p) * b.row_stride;
      for (int64_t j = 0; j < nc; ++j) slot(p, j) = row[col_offset[static_cast<size_t>(j)]];
    }
  }
  for (int64_t j = nc; j < padded; ++j)
    for (int64_t p = 0; p < kc; ++p) slot(p, j) = 0.0;
}

struct Tile {
  const MatmulTask* task;
  int64_t i0, j0;
};

struct PackBuffers {
  std::vector<double> a = std::vector<double>(static_cast<size_t>(kMc * kKc));
  std::vector<double> b = std::vector<double>(static_cast<size_t>(kNc * kKc));
  std::vector<int64_t> offsets = std::vector<int64_t>(static_cast<size_t>(std::max(kKc, kNc)));
};

void run_tile(const Tile& tile, PackBuffers& buffers, MicroKernel kernel) {
  const MatmulTask& t = *tile.task;
  int64_t mc = std::min(kMc, t.m - tile.i0);
  int64_t nc = std::min(kNc, t.n - tile.j0);
  if (t.k == 0) {
    if (!t.accumulate)
      for (int64_t i = 0; i < mc; ++i) std::fill_n(t.c + (tile.i0 + i) * t.ldc + tile.j0, nc, 0.0);
    return;
  }
  for (int64_t p0 = 0; p0 < t.k; p0 += kKc) {
    int64_t kc = std::min(kKc, t.k - p0);
    bool load_c = t.accumulate || p0 > 0;
    pack_a(t.a, tile.i0, mc, p0, kc, buffers.a.data(), buffers.offsets);
    pack_b(t.b, p0, kc, tile.j0, nc, buffers.b.data(), buffers.offsets);
    for (int64_t jr = 0; jr < nc; jr += kNr) {
      int64_t nr = std::min(kNr, nc - jr);
      const double* b_panel = buffers.b.data() + (jr / kNr) * kc * kNr;
      for (int64_t ir = 0; ir < mc; ir += kMr) {
        int64_t mr = std::min(kMr, mc - ir);
        const double* a_panel = buffers.a.data() + (ir / kMr) * kc * kMr;
        double* c = t.c + (tile.i0 + ir) * t.ldc + tile.j0 + jr;
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
}

}  // namespace

void matmul(const std::vector<MatmulTask>& tasks) {
  static const MicroKernel kernel = select_micro_kernel();
  std::vector<Tile> tiles;
  for (const MatmulTask& task : tasks)
    for (int64_t i0 = 0; i0 < task.m; i0 += kMc)
      for (int64_t j0 = 0; j0 < task.n; j0 += kNc) tiles.push_back(Tile{&task, i0, j0});
  parallel_for(static_cast<int64_t>(tiles.size()), [&](int64_t begin, int64_t end) {
    PackBuffers buffers;
    for (int64_t i = begin; i < end; ++i) run_tile(tiles[static_cast<size_t>(i)], buffers, kernel);
  });
}

void matmul(const MatmulTask& task) { matmul(std::vector<MatmulTask>{task}); }

}  // namespace ref
}  // namespace v0
}  // namespace moekit
