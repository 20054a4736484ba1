// The experts on token-major rows (moekit_token_experts_*): the MoE layer's experts and combine on the caller's
// local expert ids and weights, with no router. Its own dispatch groups the pairs (ids outside [0, E) drop theirs).
// Saved between forward and backward: the rounded h; the dispatch is recomputed from topk_idx.
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

namespace {

// Local ids: expert e is id e, so the dispatch's range starts at 0.
Csr local_dispatch(const moekit_moe_desc_t& d, int64_t tokens, const moekit_tensor_t& topk_idx) {
  std::vector<int64_t> ids = read_indices(topk_idx);
  return dispatch_fixed(tokens, d.top_k, d.experts, 0, ids.data());
}

}  // namespace

void ReferenceBackend::token_experts_forward(const moekit_plan& plan, const moekit_token_experts_fwd_args_t& args,
                                             void* saved, Workspace, void*) {
  const moekit_moe_desc_t& d = plan.moe;
  int64_t tokens = args.x.shape[0];
  Csr csr = local_dispatch(d, tokens, args.topk_idx);
  std::vector<double> x = read_values(args.x);
  std::vector<double> weights = read_values(args.topk_weights);
  ExpertWeights experts = read_expert_weights(d, args.w1, &args.b1, args.w2, &args.b2);
  RoutedForward f =
      routed_forward(d, RoutedPairs{tokens, d.top_k, csr, weights.data()}, x, experts, args.out, args.beta_out);

  write_values(args.out, f.out);
  if (d.inference || saved == nullptr) return;
  ExpertsSavedLayout layout = experts_saved_layout(d, tokens * d.top_k);
  write_saved_header(saved, plan.id, tokens);
  std::copy(f.h.begin(), f.h.end(), saved_section<double>(saved, layout.h));
}

void ReferenceBackend::token_experts_backward(const moekit_plan& plan, const moekit_token_experts_bwd_args_t& args,
                                              const void* saved, Workspace, void*) {
  const moekit_moe_desc_t& d = plan.moe;
  int64_t tokens = args.x.shape[0];
  check_saved_header(saved, plan.id, tokens);
  bool input_grad = args.compute_input_grad != 0;
  bool weight_grad = args.compute_weight_grad != 0;
  if (!input_grad && !weight_grad) return;
  const double* h = saved_section<double>(saved, experts_saved_layout(d, tokens * d.top_k).h);
  Csr csr = local_dispatch(d, tokens, args.topk_idx);
  std::vector<double> x = read_values(args.x);
  std::vector<double> dout = read_values(args.dout);
  std::vector<double> weights = read_values(args.topk_weights);
  ExpertWeights experts = read_expert_weights(d, args.w1, nullptr, args.w2, &args.b2);
  RoutedGradients g = routed_backward(d, RoutedPairs{tokens, d.top_k, csr, weights.data()}, h, x, dout, experts,
                                      input_grad, weight_grad, args.dx, args.beta_dx);

  if (input_grad) {
    write_values(args.dx, g.dx);
    if (present(args.dtopk_weights)) write_values(args.dtopk_weights, g.dweights);
  }
  if (weight_grad) write_weight_gradients(d, args, g.weights);
  spend_saved(saved, d);
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
