#include "src/reference/expert_mlp.h"

#include <cstddef>
#include <vector>

#include "src/reference/blocks.h"

namespace moekit {
inline namespace v0 {
namespace ref {

void expert_mlp_forward(const ExpertMlp& mlp, const int64_t* offsets, const GroupedRows& x, double* h, double* y) {
  int64_t width = h_width(mlp.act);
  int64_t rows = offsets[mlp.experts];
  varlen_m_product(mlp.experts, offsets, width, mlp.hidden, x, weights_nk(mlp.w1, width, mlp.hidden), h, width);
  std::vector<double> a(static_cast<size_t>(rows * mlp.act.width));
  gated_epilogue(mlp.act, mlp.dtype, mlp.experts, offsets, h, 1.0, mlp.b1, h, a.data());
  GroupedRows a_rows{a.data(), mlp.act.width, nullptr};
  varlen_m_product(mlp.experts, offsets, mlp.hidden, mlp.act.width, a_rows,
                   weights_nk(mlp.w2, mlp.hidden, mlp.act.width), y, mlp.hidden);
  store_epilogue(mlp.experts, offsets, mlp.hidden, y, 1.0, mlp.b2, 0.0, mlp.dtype, y);
}

void expert_mlp_dgated(const ExpertMlp& mlp, const int64_t* offsets, const GroupedRows& dout, const double* h,
                       const double* scale, const int64_t* pair_idx, double* dh, double* a_scaled, double* ds) {
  int64_t rows = offsets[mlp.experts];
  std::vector<double> da(static_cast<size_t>(rows * mlp.act.width));
  // W2 [E, H, I] is B_e [K = H, N = I] as stored.
  varlen_m_product(mlp.experts, offsets, mlp.act.width, mlp.hidden, dout,
                   weights_kn(mlp.w2, mlp.hidden, mlp.act.width), da.data(), mlp.act.width);
  DgatedRows io;
  io.h = h;
  io.row_scale = scale;
  io.pair_idx = pair_idx;
  io.dh = dh;
  io.a_scaled = a_scaled;
  io.dscores = ds;
  dgated_epilogue(mlp.act, mlp.dtype, mlp.experts, offsets, da.data(), 1.0, io);
}

void expert_mlp_input_grad(const ExpertMlp& mlp, const int64_t* offsets, const double* dh, double* dxe) {
  int64_t width = h_width(mlp.act);
  GroupedRows dh_rows{dh, width, nullptr};
  varlen_m_product(mlp.experts, offsets, mlp.hidden, width, dh_rows, weights_kn(mlp.w1, width, mlp.hidden), dxe,
                   mlp.hidden);
}

void expert_mlp_weight_grads(const ExpertMlp& mlp, const int64_t* offsets, const GroupedRows& dout,
                             const double* a_scaled, const double* dh, const GroupedRows& x, double* dw1,
                             double* db1, double* dw2) {
  int64_t width = h_width(mlp.act);
  int64_t inter = mlp.act.width;
  GroupedRows a_rows{a_scaled, inter, nullptr};
  varlen_k_product(mlp.experts, offsets, mlp.hidden, inter, dout, a_rows, dw2, mlp.hidden * inter, inter);
  GroupedRows dh_rows{dh, width, nullptr};
  varlen_k_product(mlp.experts, offsets, width, mlp.hidden, dh_rows, x, dw1, width * mlp.hidden, mlp.hidden);
  if (db1) ref::db1(mlp.experts, width, offsets, dh, 0.0, db1);
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
