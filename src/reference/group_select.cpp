// Grouped neuron selection of the sparse SwiGLU FFN (docs/math.md section 7): per-group gate energies, top-k groups per
// token, and the reference backend's group-select operation.
#include <cmath>
#include <string>
#include <vector>

#include "cuda/common/status_error.h"
#include "src/numeric.h"
#include "src/reference/blocks.h"
#include "src/reference/dense.h"
#include "src/reference/parallel.h"
#include "src/reference/reference_backend.h"

namespace moekit {
inline namespace v0 {
namespace ref {

namespace {

double silu(double z) { return z / (1.0 + std::exp(-z)); }

// The neuron ids each group's energy sums over: all G of the group, or its subsample rows.
std::vector<int64_t> energy_rows(const GroupSelectSpec& spec, const int64_t* subsample_rows) {
  int64_t G = spec.group_size, groups = spec.d_ff / G;
  int64_t per_group = spec.subsample > 0 ? spec.subsample : G;
  std::vector<int64_t> rows(static_cast<size_t>(groups * per_group));
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t j = 0; j < per_group; ++j) {
      int64_t n = spec.subsample > 0 ? subsample_rows[g * per_group + j] : g * G + j;
      if (n < g * G || n >= (g + 1) * G)
        throw_invalid("subsample_rows: row " + std::to_string(n) + " listed for group " + std::to_string(g) +
                      " lies outside the group's neurons [" + std::to_string(g * G) + ", " +
                      std::to_string((g + 1) * G) + ")");
      rows[static_cast<size_t>(g * per_group + j)] = n;
    }
  return rows;
}

}  // namespace

void group_select(const GroupSelectSpec& spec, int64_t tokens, const double* x, const double* w_gate,
                  const int64_t* subsample_rows, const double* lb_bias, int64_t* groups, int64_t* counts) {
  int64_t D = spec.d_model, G = spec.group_size, NG = spec.d_ff / G, kg = spec.top_groups;
  int64_t per_group = spec.subsample > 0 ? spec.subsample : G;
  double estimate_scale = static_cast<double>(G) / static_cast<double>(per_group);
  std::vector<int64_t> rows = energy_rows(spec, subsample_rows);

  // Each token is computed by one thread, in a fixed order: the result does not depend on the thread count.
  parallel_for(tokens, [&](int64_t begin, int64_t end) {
    std::vector<float> keys(static_cast<size_t>(NG));
    for (int64_t t = begin; t < end; ++t) {
      const double* xt = x + t * D;
      for (int64_t g = 0; g < NG; ++g) {
        double energy = 0;
        for (int64_t j = 0; j < per_group; ++j) {
          const double* w = w_gate + rows[static_cast<size_t>(g * per_group + j)] * D;
          double pre = 0;
          for (int64_t c = 0; c < D; ++c) pre += xt[c] * w[c];
          // The gate pre-activation is a rounding point (docs/math.md section 8): the energy reads the stored value.
          energy += std::fabs(silu(round_to(pre, spec.dtype)));
        }
        if (spec.subsample > 0) energy *= estimate_scale;
        if (lb_bias) energy *= std::exp(lb_bias[g]);
        keys[static_cast<size_t>(g)] = static_cast<float>(energy);
      }
      topk_descending(keys.data(), NG, kg, groups + t * kg);
    }
  });

  if (!counts) return;
  for (int64_t g = 0; g < NG; ++g) counts[g] = 0;
  for (int64_t i = 0; i < tokens * kg; ++i) ++counts[groups[i]];
}

void ReferenceBackend::group_select(const moekit_plan& plan, const moekit_group_select_args_t& args, Workspace,
                                    void*) {
  const moekit_sparse_ffn_desc_t& d = plan.sparse_ffn;
  GroupSelectSpec spec{d.d_model, d.d_ff, d.group_size, d.top_groups, d.subsample, d.dtype};
  int64_t tokens = args.x.shape[0];
  int64_t NG = d.d_ff / d.group_size;
  std::vector<double> x = read_values(args.x);
  std::vector<double> w_gate = read_values(args.w_gate);
  std::vector<int64_t> subsample_rows;
  if (d.subsample > 0) subsample_rows = read_indices(args.subsample_rows);
  std::vector<double> lb_bias;
  if (args.lb_bias.data) lb_bias = read_values(args.lb_bias);
  std::vector<int64_t> groups(static_cast<size_t>(tokens * d.top_groups));
  std::vector<int64_t> counts(static_cast<size_t>(NG));
  ref::group_select(spec, tokens, x.data(), w_gate.data(), d.subsample > 0 ? subsample_rows.data() : nullptr,
                    args.lb_bias.data ? lb_bias.data() : nullptr, groups.data(), counts.data());
  write_indices(args.groups, groups);
  if (args.counts.data) write_indices(args.counts, counts);
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
