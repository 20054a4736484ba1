// The grouped GEMM of docs/math.md section 5 on dense row-major float64 arrays: the two grouped products (varlen M,
// varlen K), the epilogues (store / bias, gated, dgated) with their rounding points, and grouped_gemm(), the
// whole moekit_gemm operation. The reference layers build on the same pieces, so the layer and the building
// block compute every value the same way.
//
// "Grouped rows" are numbered r = 0 .. offsets[E]-1; group e owns rows offsets[e] .. offsets[e+1]. Every
// function below reads and writes only rows of some group, so rows past offsets[E] are never touched.
#pragma once

#include <cstdint>

#include "src/reference/activation.h"

namespace moekit {
inline namespace v0 {
namespace ref {

// Rows of a grouped operand: grouped row r is data + row(r) * stride, row(r) = gather ? gather[r] : r.
struct GroupedRows {
  const double* data = nullptr;
  int64_t stride = 0;
  const int64_t* gather = nullptr;
};

// One matrix per group: group e's element (i, j) is data[e * group_stride + i * row_stride + j * col_stride].
struct GroupedMatrix {
  const double* data = nullptr;
  int64_t group_stride = 0;
  int64_t row_stride = 0;
  int64_t col_stride = 1;
};

// Weights stored [E, N, K] used as B_e [K, N] (the "NK" layout: x W^T), and weights stored [E, K, N].
GroupedMatrix weights_nk(const double* w, int64_t n, int64_t k);
GroupedMatrix weights_kn(const double* w, int64_t k, int64_t n);

// varlen M: for every grouped row r of group e, out[r * ldo + j] (+)= sum_p a_row(r)[p] * B_e(p, j), j < n, p < k.
void varlen_m_product(int64_t groups, const int64_t* offsets, int64_t n, int64_t k, const GroupedRows& a,
                      const GroupedMatrix& b, double* out, int64_t ldo, bool accumulate = false);

// varlen K: out_e(i, j) = out[e * out_group_stride + i * ldo + j] = sum over rows r of group e (ascending) of
// a_row(r)[i] * b_row(r)[j], i < m, j < n. An empty group gives 0.
void varlen_k_product(int64_t groups, const int64_t* offsets, int64_t m, int64_t n, const GroupedRows& a,
                      const GroupedRows& b, double* out, int64_t out_group_stride, int64_t ldo);

// Rounding points take a dtype; MOEKIT_DTYPE_FP64 means "no rounding".

// Store / bias epilogue on grouped rows of width n:
//   c[r] = round(alpha * product[r] + bias[e] + beta * c[r])
// bias [E, n] or nullptr; with beta == 0, c is not read. product may alias c.
void store_epilogue(int64_t groups, const int64_t* offsets, int64_t n, const double* product, double alpha,
                    const double* bias, double beta, int32_t dtype, double* c);

// Gated epilogue (docs/math.md section 3, steps 1-2): h[r] = round(alpha * product[r] + bias[e]) (width h_width(act)),
// a[r] = round(act(h[r])) (width act.width), computed from the rounded h. product may alias h.
void gated_epilogue(const ActivationSpec& act, int32_t dtype, int64_t groups, const int64_t* offsets,
                    const double* product, double alpha, const double* bias, double* h, double* a);

// Dgated epilogue (docs/math.md section 4, step 1) for grouped row r with scale s = row_scale ? row_scale[pair(r)] : 1,
// pair(r) = pair_idx ? pair_idx[r] : r, dA = alpha * product[r] (width act.width, never rounded):
//   a = act(h[r]) (unrounded); dscores[pair(r)] = dA . a (when dscores != nullptr);
//   dh[r] = round(dact(h[r], s * dA)); a_scaled[r] = round(s * a).
struct DgatedRows {
  const double* h = nullptr;          // [rows, h_width]
  const double* row_scale = nullptr;  // [pairs] or nullptr
  const int64_t* pair_idx = nullptr;  // [rows] or nullptr
  double* dh = nullptr;               // [rows, h_width]
  double* a_scaled = nullptr;         // [rows, act.width]
  double* dscores = nullptr;          // [pairs] or nullptr
};
void dgated_epilogue(const ActivationSpec& act, int32_t dtype, int64_t groups, const int64_t* offsets,
                     const double* product, double alpha, const DgatedRows& rows);

// The whole moekit_gemm operation (moekit.h, docs/math.md section 5) on dense arrays.
struct GroupedGemmSpec {
  int32_t mode;      // moekit_gemm_mode_t
  int32_t b_layout;  // moekit_gemm_b_layout_t (varlen M)
  int32_t gather;    // moekit_gemm_gather_t
  int32_t epilogue;  // moekit_gemm_epilogue_t
  ActivationSpec act;  // GATED / DGATED (act.width: the a width)
  int64_t groups;
  int64_t n;  // varlen M: output width (h's width for GATED / DGATED); varlen K: C's last dim
  int64_t k;  // varlen M: reduction length; varlen K: C's middle dim
  int32_t dtype;  // operand dtype: the rounding points of GATED / DGATED
};

struct GroupedGemmOperands {
  const double* a = nullptr;           // varlen M [rows, k]; varlen K [rows, k] (rows: source rows when gathered)
  const double* b = nullptr;           // varlen M [E, n', k] or [E, k, n']; varlen K [rows, n]
  const int64_t* offsets = nullptr;    // [E+1]
  const int64_t* gather_idx = nullptr; // [rows] with gather A or B
  const double* bias = nullptr;        // [E, n] or nullptr
  double* c = nullptr;                 // varlen M [rows, n] (C, h or dh); varlen K [E, k, n]
  const double* h = nullptr;           // DGATED [rows, n]
  double* act = nullptr;               // GATED a / DGATED a' [rows, act.width]
  const double* row_scale = nullptr;   // DGATED [pairs]
  const int64_t* pair_idx = nullptr;   // DGATED [rows]
  double* dscores = nullptr;           // DGATED [pairs]
  double alpha = 1.0;
  double beta = 0.0;
};

// Writes C (and act, dscores) of every group; C values of STORE / BIAS are left unrounded (the caller's store
// rounds them to the output dtype).
void grouped_gemm(const GroupedGemmSpec& spec, const GroupedGemmOperands& io);

}  // namespace ref
}  // namespace v0
}  // namespace moekit
