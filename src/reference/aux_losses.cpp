// docs/math.md section 1.1 in float64. Per row t: p = softmax(logits[t]) over all E (a masked -inf logit gives 0)
// and lse_t = logsumexp(logits[t]); f_e = counts_e / (T K) from the indices.
//   LB = a E sum_e f_e P_e,  P_e = (1/T) sum_t p[t,e]     dLB/dlogits[t,j] = (a E / T) p[t,j] (f_j - sum_e f_e p[t,e])
//   Z  = b (1/T) sum_t lse_t^2                            dZ/dlogits[t,j]  = (2 b / T) lse_t p[t,j]
#include "src/reference/aux_losses.h"

#include <algorithm>
#include <cmath>

#include "src/reference/dense.h"
#include "src/reference/layer_io.h"

namespace moekit {
inline namespace v0 {
namespace ref {

namespace {

// p [E] = softmax of one logits row; returns its logsumexp.
double softmax_row(const double* row, int64_t experts, double* p) {
  double max_value = -INFINITY;
  for (int64_t e = 0; e < experts; ++e) max_value = std::max(max_value, row[e]);
  double sum = 0;
  for (int64_t e = 0; e < experts; ++e) {
    p[e] = std::exp(row[e] - max_value);
    sum += p[e];
  }
  for (int64_t e = 0; e < experts; ++e) p[e] /= sum;
  return max_value + std::log(sum);
}

// f [E]: the fraction of the T*K selections that chose each expert.
std::vector<double> selection_fractions(const AuxLossSpec& spec, int64_t tokens, const int64_t* indices) {
  std::vector<double> f(static_cast<size_t>(spec.experts), 0.0);
  for (int64_t p = 0; p < tokens * spec.top_k; ++p)
    if (indices[p] >= 0 && indices[p] < spec.experts) f[static_cast<size_t>(indices[p])] += 1;
  for (double& v : f) v /= static_cast<double>(tokens * spec.top_k);
  return f;
}

}  // namespace

AuxLossSpec aux_loss_spec(const moekit_router_desc_t& d) {
  return AuxLossSpec{d.experts, d.top_k, d.load_balance_coeff, d.z_loss_coeff};
}

AuxLossSpec aux_loss_spec(const moekit_moe_desc_t& d) {
  return AuxLossSpec{d.router_experts, d.top_k, d.load_balance_coeff, d.z_loss_coeff};
}

AuxLosses aux_losses(const AuxLossSpec& spec, int64_t tokens, const double* logits, const int64_t* indices) {
  AuxLosses losses{0, 0};
  if (tokens == 0) return losses;
  const int64_t E = spec.experts;
  const std::vector<double> f = selection_fractions(spec, tokens, indices);
  std::vector<double> p(static_cast<size_t>(E)), mean_p(static_cast<size_t>(E), 0.0);
  double lse_squares = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    const double lse = softmax_row(logits + t * E, E, p.data());
    lse_squares += lse * lse;
    for (int64_t e = 0; e < E; ++e) mean_p[static_cast<size_t>(e)] += p[static_cast<size_t>(e)];
  }
  double f_dot_p = 0;
  for (int64_t e = 0; e < E; ++e) f_dot_p += f[static_cast<size_t>(e)] * (mean_p[static_cast<size_t>(e)] / tokens);
  losses.load_balance = spec.load_balance_coeff * static_cast<double>(E) * f_dot_p;
  losses.z = spec.z_loss_coeff * lse_squares / static_cast<double>(tokens);
  return losses;
}

void add_aux_loss_gradient(const AuxLossSpec& spec, int64_t tokens, const double* logits, const int64_t* indices,
                           double d_load_balance, double d_z, double* dlogits) {
  if (tokens == 0 || (spec.load_balance_coeff == 0 && spec.z_loss_coeff == 0)) return;
  const int64_t E = spec.experts;
  const std::vector<double> f = selection_fractions(spec, tokens, indices);
  const double lb_scale = d_load_balance * spec.load_balance_coeff * static_cast<double>(E) / tokens;
  const double z_scale = d_z * 2 * spec.z_loss_coeff / tokens;
  std::vector<double> p(static_cast<size_t>(E));
  for (int64_t t = 0; t < tokens; ++t) {
    const double lse = softmax_row(logits + t * E, E, p.data());
    double f_dot_p = 0;
    for (int64_t e = 0; e < E; ++e) f_dot_p += f[static_cast<size_t>(e)] * p[static_cast<size_t>(e)];
    double* out = dlogits + t * E;
    for (int64_t j = 0; j < E; ++j) {
      const double pj = p[static_cast<size_t>(j)];
      out[j] += lb_scale * pj * (f[static_cast<size_t>(j)] - f_dot_p) + z_scale * lse * pj;
    }
  }
}

double upstream_gradient(const moekit_tensor_t& t) { return present(t) ? read_values(t)[0] : 1.0; }

void write_loss(const moekit_tensor_t& t, double value) {
  if (present(t)) write_values(t, std::vector<double>{value});
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
