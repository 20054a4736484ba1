// The expert MLP of docs/math.md sections 3 and 4 on grouped rows, in float64 with the rounding points of section 8:
// the part the MoE layer and the experts-only layer share. Built from the grouped GEMM pieces of
// reference/grouped_gemm.h, so a layer computes every value as the grouped GEMM operation would.
#pragma once

#include <cstdint>

#include "src/reference/activation.h"
#include "src/reference/grouped_gemm.h"

namespace moekit {
inline namespace v0 {
namespace ref {

// Dense float64 weights of the local experts.
struct ExpertMlp {
  int64_t experts;
  int64_t hidden;      // H
  ActivationSpec act;  // act.width = I
  int32_t dtype;       // storage dtype: the rounding points
  const double* w1;    // [E, h_width, H]
  const double* b1;    // [E, h_width] or nullptr
  const double* w2;    // [E, H, I]
  const double* b2;    // [E, H] or nullptr
};

// h [rows, h_width] = round(x_row W1[e]^T + b1[e]); a = round(act(h)); y [rows, H] = round(a W2[e]^T + b2[e]).
void expert_mlp_forward(const ExpertMlp& mlp, const int64_t* offsets, const GroupedRows& x, double* h, double* y);

// The dgated step (docs/math.md section 4, step 1): dA = dout_row W2[e]; with s = scale ? scale[pair(r)] : 1 and
// pair(r) = pair_idx ? pair_idx[r] : r: ds[pair(r)] = dA . act(h) (when ds != nullptr), dh = round(dact(h, s dA)),
// a_scaled = round(s act(h)).
void expert_mlp_dgated(const ExpertMlp& mlp, const int64_t* offsets, const GroupedRows& dout, const double* h,
                       const double* scale, const int64_t* pair_idx, double* dh, double* a_scaled, double* ds);

// dxe [rows, H] = dh W1[e] (unrounded: the caller rounds where the layer stores it).
void expert_mlp_input_grad(const ExpertMlp& mlp, const int64_t* offsets, const double* dh, double* dxe);

// dW2 [E, H, I] = sum dout_row^T a_scaled; dW1 [E, h_width, H] = sum dh^T x_row; db1 [E, h_width] = sum dh
// (db1 skipped when nullptr). Empty experts get 0.
void expert_mlp_weight_grads(const ExpertMlp& mlp, const int64_t* offsets, const GroupedRows& dout,
                             const double* a_scaled, const double* dh, const GroupedRows& x, double* dw1,
                             double* db1, double* dw2);

}  // namespace ref
}  // namespace v0
}  // namespace moekit
