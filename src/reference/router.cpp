// The router (docs/math.md section 1): the four score functions, their backward, and the reference backend's router
// operations. Selection keys are fp32 (the contract); scores and gradients are float64.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cuda/common/status_error.h"
#include "src/reference/aux_losses.h"
#include "src/reference/blocks.h"
#include "src/reference/dense.h"
#include "src/reference/reference_backend.h"

namespace moekit {
inline namespace v0 {
namespace ref {

namespace {

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

// Softmax of the n values v[idx[0..n)] (idx == nullptr: v[0..n)), into out[0..n). -inf gives 0.
void softmax(const double* v, const int64_t* idx, int64_t n, double* out) {
  auto value = [&](int64_t j) { return idx ? v[idx[j]] : v[j]; };
  double max_value = -INFINITY;
  for (int64_t j = 0; j < n; ++j) max_value = std::max(max_value, value(j));
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    out[j] = std::exp(value(j) - max_value);
    sum += out[j];
  }
  for (int64_t j = 0; j < n; ++j) out[j] /= sum;
}

// The selection keys of one token's logits row, in fp32 as the contract requires.
void selection_keys(const RouterSpec& spec, const double* logits, const double* bias, float* keys) {
  for (int64_t e = 0; e < spec.experts; ++e) {
    if (spec.kind == MOEKIT_ROUTER_SIGMOID) {
      // A masked expert stays masked whatever its bias.
      keys[e] = logits[e] == -INFINITY ? -INFINITY
                                       : static_cast<float>(sigmoid(logits[e]) + (bias ? bias[e] : 0.0));
    } else {
      // TOPK_SOFTMAX selects on the logits: softmax is monotonic, so the order is the same without computing it.
      keys[e] = static_cast<float>(logits[e]);
    }
  }
}

// The selected values r_k the scores are made of (before renormalisation), for the kinds other than SOFTMAX_TOPK.
// TOPK_SOFTMAX also needs p over all E, returned in probs.
void selected_values(const RouterSpec& spec, const double* logits, const int64_t* idx, double* r,
                     std::vector<double>& probs) {
  int64_t K = spec.top_k;
  if (spec.kind == MOEKIT_ROUTER_TOPK_SOFTMAX) {
    probs.resize(static_cast<size_t>(spec.experts));
    softmax(logits, nullptr, spec.experts, probs.data());
    for (int64_t k = 0; k < K; ++k) r[k] = probs[static_cast<size_t>(idx[k])];
  } else if (spec.kind == MOEKIT_ROUTER_SIGMOID) {
    for (int64_t k = 0; k < K; ++k) r[k] = sigmoid(logits[idx[k]]);
  } else {
    for (int64_t k = 0; k < K; ++k) r[k] = logits[idx[k]];
  }
}

void check_indices(const RouterSpec& spec, const int64_t* idx) {
  for (int64_t k = 0; k < spec.top_k; ++k)
    if (idx[k] < 0 || idx[k] >= spec.experts)
      throw_invalid("indices: expert id " + std::to_string(idx[k]) + " outside [0, " +
                    std::to_string(spec.experts) + ")");
}

}  // namespace

void router_forward(const RouterSpec& spec, int64_t tokens, const double* logits, const double* bias,
                    double* scores, int64_t* indices, int64_t* counts) {
  int64_t E = spec.experts, K = spec.top_k;
  std::vector<float> keys(static_cast<size_t>(E));
  std::vector<double> r(static_cast<size_t>(K)), probs;
  if (counts)
    for (int64_t e = 0; e < E; ++e) counts[e] = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    const double* row = logits + t * E;
    int64_t* idx = indices + t * K;
    double* s = scores + t * K;
    selection_keys(spec, row, bias, keys.data());
    topk_descending(keys.data(), E, K, idx);
    if (counts)
      for (int64_t k = 0; k < K; ++k) ++counts[idx[k]];
    if (spec.kind == MOEKIT_ROUTER_SOFTMAX_TOPK) {
      softmax(row, idx, K, s);
      continue;
    }
    selected_values(spec, row, idx, r.data(), probs);
    double sum = 0;
    for (int64_t k = 0; k < K; ++k) sum += r[static_cast<size_t>(k)];
    double scale = spec.kind == MOEKIT_ROUTER_SIGMOID ? spec.scale : 1.0;
    for (int64_t k = 0; k < K; ++k) {
      double value = r[static_cast<size_t>(k)];
      s[k] = scale * (spec.renormalize ? value / sum : value);
    }
  }
}

void router_backward(const RouterSpec& spec, int64_t tokens, const double* logits, const int64_t* indices,
                     const double* dscores, double* dlogits) {
  int64_t E = spec.experts, K = spec.top_k;
  std::vector<double> r(static_cast<size_t>(K)), s(static_cast<size_t>(K)), dr(static_cast<size_t>(K)), probs;
  for (int64_t t = 0; t < tokens; ++t) {
    const double* row = logits + t * E;
    const int64_t* idx = indices + t * K;
    const double* g = dscores + t * K;
    double* out = dlogits + t * E;
    check_indices(spec, idx);
    for (int64_t e = 0; e < E; ++e) out[e] = 0;

    if (spec.kind == MOEKIT_ROUTER_SOFTMAX_TOPK) {
      softmax(row, idx, K, s.data());
      double g_dot_s = 0;
      for (int64_t k = 0; k < K; ++k) g_dot_s += g[k] * s[static_cast<size_t>(k)];
      for (int64_t k = 0; k < K; ++k) out[idx[k]] += s[static_cast<size_t>(k)] * (g[k] - g_dot_s);
      continue;
    }

    // The other kinds: s = scale * (renorm ? r / sum(r) : r); dr is the gradient w.r.t. the selected values r.
    // NOTE: docs/math.md's sum_j g_j s_j / scale is written as sum_j g_j r_j / sum(r): no division by scale.
    selected_values(spec, row, idx, r.data(), probs);
    double sum_r = 0;
    for (int64_t k = 0; k < K; ++k) sum_r += r[static_cast<size_t>(k)];
    double g_dot_normalised = 0;
    for (int64_t k = 0; k < K; ++k) g_dot_normalised += g[k] * (r[static_cast<size_t>(k)] / sum_r);
    double scale = spec.kind == MOEKIT_ROUTER_SIGMOID ? spec.scale : 1.0;
    for (int64_t k = 0; k < K; ++k)
      dr[static_cast<size_t>(k)] = scale * (spec.renormalize ? (g[k] - g_dot_normalised) / sum_r : g[k]);

    if (spec.kind == MOEKIT_ROUTER_TOPK_SOFTMAX) {
      // dlogits = p * (dr_scattered - c) over all E, with c = sum_k dr_k p[idx_k].
      double c = 0;
      for (int64_t k = 0; k < K; ++k) c += dr[static_cast<size_t>(k)] * r[static_cast<size_t>(k)];
      for (int64_t k = 0; k < K; ++k) out[idx[k]] += dr[static_cast<size_t>(k)];
      for (int64_t e = 0; e < E; ++e) out[e] = probs[static_cast<size_t>(e)] * (out[e] - c);
    } else if (spec.kind == MOEKIT_ROUTER_SIGMOID) {
      for (int64_t k = 0; k < K; ++k) {
        double q = r[static_cast<size_t>(k)];
        out[idx[k]] += dr[static_cast<size_t>(k)] * q * (1 - q);
      }
    } else {
      for (int64_t k = 0; k < K; ++k) out[idx[k]] += dr[static_cast<size_t>(k)];
    }
  }
}

namespace {

RouterSpec spec_of(const moekit_plan& plan) {
  const moekit_router_desc_t& d = plan.router;
  return RouterSpec{d.experts, d.top_k, d.kind, d.renormalize != 0, d.scale};
}

}  // namespace

void ReferenceBackend::router_forward(const moekit_plan& plan, const moekit_router_fwd_args_t& args, Workspace,
                                      void*) {
  RouterSpec spec = spec_of(plan);
  int64_t tokens = args.logits.shape[0];
  std::vector<double> logits = read_values(args.logits);
  std::vector<double> bias;
  bool has_bias = spec.kind == MOEKIT_ROUTER_SIGMOID && args.bias.data != nullptr;
  if (has_bias) bias = read_values(args.bias);
  std::vector<double> scores(static_cast<size_t>(tokens * spec.top_k));
  std::vector<int64_t> indices(scores.size());
  std::vector<int64_t> counts(static_cast<size_t>(spec.experts));
  ref::router_forward(spec, tokens, logits.data(), has_bias ? bias.data() : nullptr, scores.data(), indices.data(),
                      counts.data());
  const AuxLosses losses = aux_losses(aux_loss_spec(plan.router), tokens, logits.data(), indices.data());
  write_values(args.scores, scores);
  write_indices(args.indices, indices);
  if (args.counts.data) write_indices(args.counts, counts);
  write_loss(args.load_balance_loss, losses.load_balance);
  write_loss(args.z_loss, losses.z);
}

void ReferenceBackend::router_backward(const moekit_plan& plan, const moekit_router_bwd_args_t& args, Workspace,
                                       void*) {
  RouterSpec spec = spec_of(plan);
  int64_t tokens = args.logits.shape[0];
  std::vector<double> logits = read_values(args.logits);
  std::vector<int64_t> indices = read_indices(args.indices);
  std::vector<double> dscores = read_values(args.dscores);
  std::vector<double> dlogits(logits.size());
  ref::router_backward(spec, tokens, logits.data(), indices.data(), dscores.data(), dlogits.data());
  add_aux_loss_gradient(aux_loss_spec(plan.router), tokens, logits.data(), indices.data(),
                        upstream_gradient(args.dload_balance_loss), upstream_gradient(args.dz_loss), dlogits.data());
  if (args.accumulate) {
    std::vector<double> previous = read_values(args.dlogits);
    for (size_t i = 0; i < dlogits.size(); ++i) dlogits[i] += previous[i];
  }
  write_values(args.dlogits, dlogits);
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
