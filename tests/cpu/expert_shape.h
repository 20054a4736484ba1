// The expert MLP of the experts-only tests (test_experts_layer.cpp on grouped rows, test_token_experts_layer.cpp on
// token-major rows): its sizes, activation, biases and dtype, the MoE descriptor made of them, its weight tensors
// and the gradients a backward is asked for.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>

#include "common/test_util.h"
#include "moekit/moekit.h"

namespace layer_test {

struct ExpertShape {
  int64_t hidden = 20, inter = 9;
  int32_t activation = MOEKIT_ACT_SWIGLU;
  int32_t glu_layout = MOEKIT_GLU_CONCAT;
  bool biases = true;
  moekit_dtype_t dtype = MOEKIT_DTYPE_BF16;

  bool gated() const { return activation < MOEKIT_ACT_GELU; }
  int64_t hw() const { return gated() ? 2 * inter : inter; }

  // `experts` experts, all local, for max_tokens rows with top_k pairs each; glu_limit 1.0.
  moekit_moe_desc_t desc(int64_t max_tokens, int64_t experts, int64_t top_k) const {
    moekit_moe_desc_t d;
    moekit_moe_desc_init(&d);
    d.max_tokens = max_tokens;
    d.hidden = hidden;
    d.intermediate = inter;
    d.router_experts = experts;
    d.experts = experts;
    d.top_k = top_k;
    d.activation = activation;
    d.glu_layout = glu_layout;
    d.glu_limit = 1.0;
    d.has_b1 = biases;
    d.has_b2 = biases;
    d.dtype = dtype;
    return d;
  }

  // w1 [E, HW, H], b1 [E, HW], w2 [E, H, I], b2 [E, H] in `type`: the weights or their gradients.
  void expert_tensors(moekit_dtype_t type, int64_t experts, moekit_test::HostTensor& w1, moekit_test::HostTensor& b1,
                      moekit_test::HostTensor& w2, moekit_test::HostTensor& b2) const {
    w1 = moekit_test::HostTensor(type, {experts, hw(), hidden});
    b1 = moekit_test::HostTensor(type, {experts, hw()});
    w2 = moekit_test::HostTensor(type, {experts, hidden, inter});
    b2 = moekit_test::HostTensor(type, {experts, hidden});
  }

  // The weights in `dtype`: w1 and w2 uniform in +-2 / sqrt(fan-in), the biases in +-0.5.
  void draw_weights(int64_t experts, std::mt19937_64& rng, moekit_test::HostTensor& w1, moekit_test::HostTensor& b1,
                    moekit_test::HostTensor& w2, moekit_test::HostTensor& b2) const {
    expert_tensors(dtype, experts, w1, b1, w2, b2);
    w1.fill_uniform(rng, 2.0 / std::sqrt(double(hidden)));
    b1.fill_uniform(rng, 0.5);
    w2.fill_uniform(rng, 2.0 / std::sqrt(double(inter)));
    b2.fill_uniform(rng, 0.5);
  }
};

// Which gradients a backward computes, with one beta for every gradient.
struct GradientRequest {
  bool input = true, weight = true;
  double beta = 0;

  // Into the backward arguments of moekit_experts_* or moekit_token_experts_*.
  template <class Args>
  void set(Args& a) const {
    a.compute_input_grad = input;
    a.compute_weight_grad = weight;
    a.beta_dx = a.beta_dw1 = a.beta_db1 = a.beta_dw2 = a.beta_db2 = beta;
  }
};

}  // namespace layer_test
