#include "src/reference/grouped_gemm.h"

#include <vector>

#include "moekit/moekit.h"
#include "src/numeric.h"
#include "src/reference/matmul.h"
#include "src/reference/parallel.h"

namespace moekit {
inline namespace v0 {
namespace ref {

namespace {

// Grouped rows per parallel chunk of an epilogue: enough work to pay for a thread.
constexpr int64_t kEpilogueRowsPerChunk = 64;

// Calls body(e, r) for every grouped row r of group e, rows spread over the reference threads.
template <typename Body>
void for_each_grouped_row(int64_t groups, const int64_t* offsets, Body body) {
  int64_t first = offsets[0];
  int64_t rows = offsets[groups] - first;
  parallel_for(
      rows,
      [&](int64_t begin, int64_t end) {
        int64_t e = 0;
        for (int64_t i = begin; i < end; ++i) {
          int64_t r = first + i;
          while (offsets[e + 1] <= r) ++e;
          body(e, r);
        }
      },
      kEpilogueRowsPerChunk);
}

}  // namespace

GroupedMatrix weights_nk(const double* w, int64_t n, int64_t k) { return GroupedMatrix{w, n * k, 1, k}; }
GroupedMatrix weights_kn(const double* w, int64_t k, int64_t n) { return GroupedMatrix{w, k * n, n, 1}; }

void varlen_m_product(int64_t groups, const int64_t* offsets, int64_t n, int64_t k, const GroupedRows& a,
                      const GroupedMatrix& b, double* out, int64_t ldo, bool accumulate) {
  std::vector<MatmulTask> tasks;
  for (int64_t e = 0; e < groups; ++e) {
    int64_t begin = offsets[e];
    int64_t rows = offsets[e + 1] - begin;
    if (rows == 0) continue;
    MatmulTask task;
    task.m = rows;
    task.n = n;
    task.k = k;
    task.a.row_stride = a.stride;
    if (a.gather) {
      task.a.data = a.data;
      task.a.row_index = a.gather + begin;
    } else {
      task.a.data = a.data + begin * a.stride;
    }
    task.b = MatrixView{b.data + e * b.group_stride, b.row_stride, b.col_stride, nullptr, nullptr};
    task.c = out + begin * ldo;
    task.ldc = ldo;
    task.accumulate = accumulate;
    tasks.push_back(task);
  }
  matmul(tasks);
}

void varlen_k_product(int64_t groups, const int64_t* offsets, int64_t m, int64_t n, const GroupedRows& a,
                      const GroupedRows& b, double* out, int64_t out_group_stride, int64_t ldo) {
  std::vector<MatmulTask> tasks;
  for (int64_t e = 0; e < groups; ++e) {
    int64_t begin = offsets[e];
    MatmulTask task;
    task.m = m;
    task.n = n;
    task.k = offsets[e + 1] - begin;
    // A_e^T: element (i, p) is a_row(begin + p)[i].
    task.a.row_stride = 1;
    task.a.col_stride = a.stride;
    if (a.gather) {
      task.a.data = a.data;
      task.a.col_index = a.gather + begin;
    } else {
      task.a.data = a.data + begin * a.stride;
    }
    task.b.row_stride = b.stride;
    if (b.gather) {
      task.b.data = b.data;
      task.b.row_index = b.gather + begin;
    } else {
      task.b.data = b.data + begin * b.stride;
    }
    task.c = out + e * out_group_stride;
    task.ldc = ldo;
    tasks.push_back(task);
  }
  matmul(tasks);
}

void store_epilogue(int64_t groups, const int64_t* offsets, int64_t n, const double* product, double alpha,
                    const double* bias, double beta, int32_t dtype, double* c) {
  for_each_grouped_row(groups, offsets, [&](int64_t e, int64_t r) {
    const double* p = product + r * n;
    double* out = c + r * n;
    for (int64_t j = 0; j < n; ++j) {
      double v = alpha * p[j];
      if (bias) v += bias[e * n + j];
      if (beta != 0.0) v += beta * out[j];
      out[j] = round_to(v, dtype);
    }
  });
}

void gated_epilogue(const ActivationSpec& act, int32_t dtype, int64_t groups, const int64_t* offsets,
                    const double* product, double alpha, const double* bias, double* h, double* a) {
  int64_t width = h_width(act);
  for_each_grouped_row(groups, offsets, [&](int64_t e, int64_t r) {
    const double* p = product + r * width;
    double* h_row = h + r * width;
    for (int64_t j = 0; j < width; ++j) {
      double v = alpha * p[j];
      if (bias) v += bias[e * width + j];
      h_row[j] = round_to(v, dtype);
    }
    double* a_row = a + r * act.width;
    activation_forward(act, h_row, a_row);
    for (int64_t j = 0; j < act.width; ++j) a_row[j] = round_to(a_row[j], dtype);
  });
}

void dgated_epilogue(const ActivationSpec& act, int32_t dtype, int64_t groups, const int64_t* offsets,
                     const double* product, double alpha, const DgatedRows& rows) {
  int64_t width = h_width(act);
  int64_t first = offsets[0];
  int64_t count = offsets[groups] - first;
  parallel_for(
      count,
      [&](int64_t begin, int64_t end) {
        std::vector<double> da(static_cast<size_t>(act.width));
        std::vector<double> a(static_cast<size_t>(act.width));
        for (int64_t i = begin; i < end; ++i) {
          int64_t r = first + i;
          int64_t pair = rows.pair_idx ? rows.pair_idx[r] : r;
          double s = rows.row_scale ? rows.row_scale[pair] : 1.0;
          const double* h_row = rows.h + r * width;
          const double* p = product + r * act.width;
          activation_forward(act, h_row, a.data());
          double ds = 0.0;
          for (int64_t j = 0; j < act.width; ++j) {
            double d = alpha * p[j];
            ds += d * a[static_cast<size_t>(j)];
            da[static_cast<size_t>(j)] = s * d;
          }
          if (rows.dscores) rows.dscores[pair] = ds;
          double* dh_row = rows.dh + r * width;
          activation_backward(act, h_row, da.data(), dh_row);
          for (int64_t j = 0; j < width; ++j) dh_row[j] = round_to(dh_row[j], dtype);
          double* a_row = rows.a_scaled + r * act.width;
          for (int64_t j = 0; j < act.width; ++j) a_row[j] = round_to(s * a[static_cast<size_t>(j)], dtype);
        }
      },
      kEpilogueRowsPerChunk);
}

void grouped_gemm(const GroupedGemmSpec& spec, const GroupedGemmOperands& io) {
  const int64_t* offsets = io.offsets;
  if (spec.mode == MOEKIT_GEMM_VARLEN_K) {
    // C[e] [k, n] = alpha * A_e^T B_e + beta * C[e]
    GroupedRows a{io.a, spec.k, spec.gather == MOEKIT_GEMM_GATHER_A ? io.gather_idx : nullptr};
    GroupedRows b{io.b, spec.n, spec.gather == MOEKIT_GEMM_GATHER_B ? io.gather_idx : nullptr};
    int64_t size = spec.groups * spec.k * spec.n;
    std::vector<double> product(static_cast<size_t>(size));
    varlen_k_product(spec.groups, offsets, spec.k, spec.n, a, b, product.data(), spec.k * spec.n, spec.n);
    for (int64_t i = 0; i < size; ++i) {
      double v = io.alpha * product[static_cast<size_t>(i)];
      if (io.beta != 0.0) v += io.beta * io.c[i];
      io.c[i] = v;
    }
    return;
  }
  bool gated_epilogues = spec.epilogue == MOEKIT_EPILOGUE_GATED || spec.epilogue == MOEKIT_EPILOGUE_DGATED;
  // DGATED multiplies into dA, as wide as a; every other epilogue produces n columns.
  int64_t width = spec.epilogue == MOEKIT_EPILOGUE_DGATED ? spec.act.width : spec.n;
  GroupedRows a{io.a, spec.k, spec.gather == MOEKIT_GEMM_GATHER_A ? io.gather_idx : nullptr};
  GroupedMatrix b = spec.b_layout == MOEKIT_GEMM_B_KN ? weights_kn(io.b, spec.k, width)
                                                     : weights_nk(io.b, width, spec.k);
  std::vector<double> product(static_cast<size_t>(offsets[spec.groups] * width));
  varlen_m_product(spec.groups, offsets, width, spec.k, a, b, product.data(), width);
  if (!gated_epilogues) {
    const double* bias = spec.epilogue == MOEKIT_EPILOGUE_BIAS ? io.bias : nullptr;
    store_epilogue(spec.groups, offsets, spec.n, product.data(), io.alpha, bias, io.beta, MOEKIT_DTYPE_FP64, io.c);
  } else if (spec.epilogue == MOEKIT_EPILOGUE_GATED) {
    gated_epilogue(spec.act, spec.dtype, spec.groups, offsets, product.data(), io.alpha, io.bias, io.c, io.act);
  } else {
    DgatedRows rows;
    rows.h = io.h;
    rows.row_scale = io.row_scale;
    rows.pair_idx = io.pair_idx;
    rows.dh = io.c;
    rows.a_scaled = io.act;
    rows.dscores = io.dscores;
    dgated_epilogue(spec.act, spec.dtype, spec.groups, offsets, product.data(), io.alpha, rows);
  }
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
