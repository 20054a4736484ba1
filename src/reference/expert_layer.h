// What the reference layers with experts share (the MoE layer, the experts alone, the experts on token-major rows):
// the expert weights read once, their gradients written with the call's betas, and the experts on routed pairs —
// docs/math.md section 3, steps 1 to 4, and section 4, steps 1 to 7: the MoE layer without its router.
#pragma once

#include <cstdint>
#include <vector>

#include "moekit/moekit.h"
#include "src/reference/blocks.h"
#include "src/reference/expert_mlp.h"
#include "src/reference/layer_io.h"

namespace moekit {
inline namespace v0 {
namespace ref {

ActivationSpec activation_spec(const moekit_moe_desc_t& d);

// Dense float64 copies of the expert weights; b1 / b2 are empty when not read.
struct ExpertWeights {
  std::vector<double> w1, b1, w2, b2;
  ExpertMlp mlp(const moekit_moe_desc_t& d) const;
};
// b1 / b2 are read when given (not nullptr) and the plan has them.
ExpertWeights read_expert_weights(const moekit_moe_desc_t& d, const moekit_tensor_t& w1, const moekit_tensor_t* b1,
                                  const moekit_tensor_t& w2, const moekit_tensor_t* b2);

// dW1, dW2 and, where the plan has the biases, db1, db2 of a backward, before the betas.
struct WeightGradients {
  std::vector<double> dw1, db1, dw2, db2;
};
// Writes them into the args' dw1, dw2, db1, db2 as grad = beta * grad + new.
template <class BwdArgs>
void write_weight_gradients(const moekit_moe_desc_t& d, const BwdArgs& args, WeightGradients& g) {
  write_accumulated(args.dw1, g.dw1, args.beta_dw1);
  write_accumulated(args.dw2, g.dw2, args.beta_dw2);
  if (d.has_b1) write_accumulated(args.db1, g.db1, args.beta_db1);
  if (d.has_b2) write_accumulated(args.db2, g.db2, args.beta_db2);
}

// T tokens with K choices each, the valid pairs grouped by local expert, and a weight (score) per pair.
struct RoutedPairs {
  int64_t tokens;
  int64_t top_k;
  const Csr& csr;
  const double* weights;  // [T*K]; a dropped pair's weight is never read
};

struct RoutedForward {
  std::vector<double> h;    // [valid pairs, h width], rounded: what the backward needs
  std::vector<double> out;  // [T, H] = beta_out * out + the weighted sum of the pairs' y; the write rounds it
};
// `out` is read only when beta_out != 0.
RoutedForward routed_forward(const moekit_moe_desc_t& d, const RoutedPairs& pairs, const std::vector<double>& x,
                             const ExpertWeights& w, const moekit_tensor_t& out, double beta_out);

struct RoutedGradients {
  std::vector<double> dweights;  // [T*K]: ds, rounded to the score dtype; 0 for a dropped pair
  std::vector<double> dx;        // [T, H] = beta_dx * dx + the sum of the pairs' dxe, rounded; input gradient only
  WeightGradients weights;       // weight gradient only
};
// From the forward's rounded h. `dx` is read only when the input gradient is asked for and beta_dx != 0.
RoutedGradients routed_backward(const moekit_moe_desc_t& d, const RoutedPairs& pairs, const double* h,
                                const std::vector<double>& x, const std::vector<double>& dout, const ExpertWeights& w,
                                bool input_grad, bool weight_grad, const moekit_tensor_t& dx, double beta_dx);

}  // namespace ref
}  // namespace v0
}  // namespace moekit
