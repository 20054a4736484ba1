// The experts alone on pre-grouped rows (moekit_experts_*): the expert MLP of the MoE layer with no router, no
// scores (scale 1) and no combine. Saved between forward and backward: the rounded h.
#include <algorithm>
#include <vector>

#include "moekit/moekit.h"
#include "src/reference/blocks.h"
#include "src/reference/dense.h"
#include "src/reference/expert_layer.h"
#include "src/reference/layer_io.h"
#include "src/reference/reference_backend.h"

namespace moekit {
inline namespace v0 {
namespace ref {

void ReferenceBackend::experts_forward(const moekit_plan& plan, const moekit_experts_fwd_args_t& args, void* saved,
                                       Workspace, void*) {
  const moekit_moe_desc_t& d = plan.moe;
  int64_t max_rows = args.x.shape[0];
  int64_t width = h_width(activation_spec(d));
  std::vector<int64_t> offsets = read_offsets("offsets", args.offsets, d.experts, max_rows);
  int64_t rows = offsets.back();

  std::vector<double> x = read_values(args.x, rows);
  ExpertWeights weights = read_expert_weights(d, args.w1, &args.b1, args.w2, &args.b2);
  std::vector<double> h(static_cast<size_t>(rows * width));
  std::vector<double> y(static_cast<size_t>(max_rows * d.hidden));
  GroupedRows x_rows{x.data(), d.hidden, nullptr};
  expert_mlp_forward(weights.mlp(d), offsets.data(), x_rows, h.data(), y.data());

  write_values(args.y, y, 0, rows);
  if (d.inference || saved == nullptr) return;
  ExpertsSavedLayout layout = experts_saved_layout(d, max_rows);
  write_saved_header(saved, plan.id, max_rows);
  std::copy(h.begin(), h.end(), saved_section<double>(saved, layout.h));
}

void ReferenceBackend::experts_backward(const moekit_plan& plan, const moekit_experts_bwd_args_t& args,
                                        const void* saved, Workspace, void*) {
  const moekit_moe_desc_t& d = plan.moe;
  int64_t max_rows = args.x.shape[0];
  check_saved_header(saved, plan.id, max_rows);
  bool input_grad = args.compute_input_grad != 0;
  bool weight_grad = args.compute_weight_grad != 0;
  if (!input_grad && !weight_grad) return;
  int64_t width = h_width(activation_spec(d));
  std::vector<int64_t> offsets = read_offsets("offsets", args.offsets, d.experts, max_rows);
  int64_t rows = offsets.back();
  const double* h = saved_section<double>(saved, experts_saved_layout(d, max_rows).h);

  std::vector<double> x = read_values(args.x, rows);
  std::vector<double> dy = read_values(args.dy, rows);
  ExpertWeights weights = read_expert_weights(d, args.w1, nullptr, args.w2, nullptr);
  ExpertMlp mlp = weights.mlp(d);
  GroupedRows dy_rows{dy.data(), d.hidden, nullptr};

  std::vector<double> dh(static_cast<size_t>(rows * width));
  std::vector<double> a(static_cast<size_t>(rows * d.intermediate));
  expert_mlp_dgated(mlp, offsets.data(), dy_rows, h, nullptr, nullptr, dh.data(), a.data(), nullptr);

  std::vector<double> dx;
  if (input_grad) {
    dx.resize(static_cast<size_t>(max_rows * d.hidden));
    expert_mlp_input_grad(mlp, offsets.data(), dh.data(), dx.data());
  }
  WeightGradients g;
  if (weight_grad) {
    g.dw1.resize(static_cast<size_t>(d.experts * width * d.hidden));
    g.dw2.resize(static_cast<size_t>(d.experts * d.hidden * d.intermediate));
    if (d.has_b1) g.db1.resize(static_cast<size_t>(d.experts * width));
    GroupedRows x_rows{x.data(), d.hidden, nullptr};
    expert_mlp_weight_grads(mlp, offsets.data(), dy_rows, a.data(), dh.data(), x_rows, g.dw1.data(),
                            d.has_b1 ? g.db1.data() : nullptr, g.dw2.data());
    if (d.has_b2) {
      g.db2.resize(static_cast<size_t>(d.experts * d.hidden));
      ref::db1(d.experts, d.hidden, offsets.data(), dy.data(), 0.0, g.db2.data());  // sum of dy: the scale is 1
    }
  }

  if (input_grad) write_accumulated(args.dx, dx, args.beta_dx, 0, rows);
  if (weight_grad) write_weight_gradients(d, args, g);
  spend_saved(saved, d);
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
