#include "src/reference/expert_layer.h"

#include <cstddef>

#include "src/reference/dense.h"

namespace moekit {
inline namespace v0 {
namespace ref {

ActivationSpec activation_spec(const moekit_moe_desc_t& d) {
  return ActivationSpec{d.activation, d.glu_layout, d.glu_limit, d.intermediate};
}

ExpertMlp ExpertWeights::mlp(const moekit_moe_desc_t& d) const {
  return ExpertMlp{d.experts, d.hidden, activation_spec(d), d.dtype, w1.data(), b1.empty() ? nullptr : b1.data(),
                   w2.data(), b2.empty() ? nullptr : b2.data()};
}

ExpertWeights read_expert_weights(const moekit_moe_desc_t& d, const moekit_tensor_t& w1, const moekit_tensor_t* b1,
                                  const moekit_tensor_t& w2, const moekit_tensor_t* b2) {
  ExpertWeights w;
  w.w1 = read_values(w1);
  w.w2 = read_values(w2);
  if (b1 && d.has_b1) w.b1 = read_values(*b1);
  if (b2 && d.has_b2) w.b2 = read_values(*b2);
  return w;
}

RoutedForward routed_forward(const moekit_moe_desc_t& d, const RoutedPairs& pairs, const std::vector<double>& x,
                             const ExpertWeights& w, const moekit_tensor_t& out, double beta_out) {
  const Csr& csr = pairs.csr;
  int64_t rows = csr.expert_offsets.back();
  RoutedForward f;
  f.h.resize(static_cast<size_t>(rows * h_width(activation_spec(d))));
  std::vector<double> y(static_cast<size_t>(rows * d.hidden));
  GroupedRows x_rows{x.data(), d.hidden, csr.gather_idx.data()};
  expert_mlp_forward(w.mlp(d), csr.expert_offsets.data(), x_rows, f.h.data(), y.data());

  f.out = beta_out != 0.0 ? read_values(out) : std::vector<double>(static_cast<size_t>(pairs.tokens * d.hidden));
  combine(pairs.tokens, d.hidden, pairs.top_k, nullptr, y.data(), pairs.weights, csr.grouped_pos.data(), beta_out,
          f.out.data());
  return f;
}

RoutedGradients routed_backward(const moekit_moe_desc_t& d, const RoutedPairs& pairs, const double* h,
                                const std::vector<double>& x, const std::vector<double>& dout, const ExpertWeights& w,
                                bool input_grad, bool weight_grad, const moekit_tensor_t& dx, double beta_dx) {
  const Csr& csr = pairs.csr;
  const int64_t* offsets = csr.expert_offsets.data();
  int64_t rows = csr.expert_offsets.back();
  int64_t width = h_width(activation_spec(d));
  ExpertMlp mlp = w.mlp(d);
  GroupedRows dout_rows{dout.data(), d.hidden, csr.gather_idx.data()};
  RoutedGradients g;
  WeightGradients& wg = g.weights;

  // Section 4, step 1 (dgated) and the dout . b2 part of ds; dropped pairs keep ds = 0.
  g.dweights.assign(static_cast<size_t>(pairs.tokens * pairs.top_k), 0.0);
  std::vector<double> dh(static_cast<size_t>(rows * width));
  std::vector<double> a_scaled(static_cast<size_t>(rows * d.intermediate));
  expert_mlp_dgated(mlp, offsets, dout_rows, h, pairs.weights, csr.pair_idx.data(), dh.data(), a_scaled.data(),
                    g.dweights.data());
  if (d.has_b2 && weight_grad) wg.db2.resize(static_cast<size_t>(d.experts * d.hidden));
  if (d.has_b2)
    db2_ds(d.experts, d.hidden, offsets, csr.gather_idx.data(), csr.pair_idx.data(), dout.data(), pairs.weights,
           w.b2.data(), 0.0, wg.db2.empty() ? nullptr : wg.db2.data(), g.dweights.data());
  round_all(g.dweights, score_dtype(d.dtype));

  if (input_grad) {  // steps 4 and 7
    std::vector<double> dxe(static_cast<size_t>(rows * d.hidden));
    expert_mlp_input_grad(mlp, offsets, dh.data(), dxe.data());
    round_all(dxe, d.dtype);
    g.dx = beta_dx != 0.0 ? read_values(dx) : std::vector<double>(static_cast<size_t>(pairs.tokens * d.hidden));
    combine(pairs.tokens, d.hidden, pairs.top_k, nullptr, dxe.data(), nullptr, csr.grouped_pos.data(), beta_dx,
            g.dx.data());
    round_all(g.dx, d.dtype);
  }
  if (weight_grad) {  // steps 2, 5 and 6 (step 3 came with ds)
    wg.dw1.resize(static_cast<size_t>(d.experts * width * d.hidden));
    wg.dw2.resize(static_cast<size_t>(d.experts * d.hidden * d.intermediate));
    if (d.has_b1) wg.db1.resize(static_cast<size_t>(d.experts * width));
    GroupedRows x_rows{x.data(), d.hidden, csr.gather_idx.data()};
    expert_mlp_weight_grads(mlp, offsets, dout_rows, a_scaled.data(), dh.data(), x_rows, wg.dw1.data(),
                            d.has_b1 ? wg.db1.data() : nullptr, wg.dw2.data());
  }
  return g;
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
