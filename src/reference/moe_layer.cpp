// The MoE layer (docs/math.md sections 3 and 4) on the reference backend: router GEMM, router and its auxiliary losses,
// dispatch, expert MLP on the grouped rows, combine; and its backward. Saved between the two: the router's logits,
// scores and indices and the rounded h; the dispatch is recomputed from the indices.
#include <algorithm>
#include <vector>

#include "moekit/moekit.h"
#include "src/reference/aux_losses.h"
#include "src/reference/blocks.h"
#include "src/reference/dense.h"
#include "src/reference/expert_layer.h"
#include "src/reference/layer_io.h"
#include "src/reference/matmul.h"
#include "src/reference/reference_backend.h"

namespace moekit {
inline namespace v0 {
namespace ref {

namespace {

RouterSpec router_spec(const moekit_moe_desc_t& d) {
  return RouterSpec{d.router_experts, d.top_k, d.router, d.renormalize != 0, d.router_scale};
}

// logits [T, RE] = round(x Wr^T), as F.linear stores them.
std::vector<double> router_logits(const moekit_moe_desc_t& d, int64_t tokens, const std::vector<double>& x,
                                  const std::vector<double>& w_router) {
  std::vector<double> logits(static_cast<size_t>(tokens * d.router_experts));
  MatmulTask task;
  task.m = tokens;
  task.n = d.router_experts;
  task.k = d.hidden;
  task.a = MatrixView{x.data(), d.hidden, 1, nullptr, nullptr};
  task.b = MatrixView{w_router.data(), 1, d.hidden, nullptr, nullptr};  // Wr^T
  task.c = logits.data();
  task.ldc = d.router_experts;
  matmul(task);
  round_all(logits, d.dtype);
  return logits;
}

}  // namespace

void ReferenceBackend::moe_forward(const moekit_plan& plan, const moekit_moe_fwd_args_t& args, void* saved,
                                   Workspace, void*) {
  const moekit_moe_desc_t& d = plan.moe;
  int64_t tokens = args.x.shape[0];
  int64_t pairs = tokens * d.top_k;

  std::vector<double> x = read_values(args.x);
  std::vector<double> logits = router_logits(d, tokens, x, read_values(args.w_router));
  std::vector<double> router_bias;
  if (present(args.router_bias)) router_bias = read_values(args.router_bias);
  std::vector<double> scores(static_cast<size_t>(pairs));
  std::vector<int64_t> indices(static_cast<size_t>(pairs));
  std::vector<int64_t> counts(static_cast<size_t>(d.router_experts));
  ref::router_forward(router_spec(d), tokens, logits.data(), router_bias.empty() ? nullptr : router_bias.data(),
                 scores.data(), indices.data(), counts.data());
  round_all(scores, score_dtype(d.dtype));
  Csr csr = dispatch_fixed(tokens, d.top_k, d.experts, d.expert_begin, indices.data());
  ExpertWeights weights = read_expert_weights(d, args.w1, &args.b1, args.w2, &args.b2);
  RoutedForward experts =
      routed_forward(d, RoutedPairs{tokens, d.top_k, csr, scores.data()}, x, weights, args.out, args.beta_out);

  const AuxLosses losses = aux_losses(aux_loss_spec(d), tokens, logits.data(), indices.data());
  write_values(args.out, experts.out);
  write_loss(args.load_balance_loss, losses.load_balance);
  write_loss(args.z_loss, losses.z);
  if (present(args.scores)) write_values(args.scores, scores);
  if (present(args.indices)) write_indices(args.indices, indices);
  if (present(args.counts)) write_indices(args.counts, counts);
  if (d.inference || saved == nullptr) return;
  MoeSavedLayout layout = moe_saved_layout(d, tokens);
  write_saved_header(saved, plan.id, tokens);
  std::copy(logits.begin(), logits.end(), saved_section<double>(saved, layout.logits));
  std::copy(scores.begin(), scores.end(), saved_section<double>(saved, layout.scores));
  std::copy(indices.begin(), indices.end(), saved_section<int64_t>(saved, layout.indices));
  std::copy(experts.h.begin(), experts.h.end(), saved_section<double>(saved, layout.h));
}

void ReferenceBackend::moe_backward(const moekit_plan& plan, const moekit_moe_bwd_args_t& args, const void* saved,
                                    Workspace, void*) {
  const moekit_moe_desc_t& d = plan.moe;
  int64_t tokens = args.x.shape[0];
  check_saved_header(saved, plan.id, tokens);
  bool input_grad = args.compute_input_grad != 0;
  bool weight_grad = args.compute_weight_grad != 0;
  if (!input_grad && !weight_grad) return;
  MoeSavedLayout layout = moe_saved_layout(d, tokens);
  const double* logits = saved_section<double>(saved, layout.logits);
  const double* scores = saved_section<double>(saved, layout.scores);
  const int64_t* indices = saved_section<int64_t>(saved, layout.indices);
  const double* h = saved_section<double>(saved, layout.h);
  Csr csr = dispatch_fixed(tokens, d.top_k, d.experts, d.expert_begin, indices);

  std::vector<double> x = read_values(args.x);
  std::vector<double> dout = read_values(args.dout);
  std::vector<double> w_router = read_values(args.w_router);
  ExpertWeights weights = read_expert_weights(d, args.w1, nullptr, args.w2, &args.b2);
  RoutedGradients g = routed_backward(d, RoutedPairs{tokens, d.top_k, csr, scores}, h, x, dout, weights, input_grad,
                                      weight_grad, args.dx, args.beta_dx);

  // Step 8's dlogits, rounded to the storage dtype before both router GEMMs.
  std::vector<double> dlogits(static_cast<size_t>(tokens * d.router_experts));
  ref::router_backward(router_spec(d), tokens, logits, indices, g.dweights.data(), dlogits.data());
  add_aux_loss_gradient(aux_loss_spec(d), tokens, logits, indices, upstream_gradient(args.dload_balance_loss),
                        upstream_gradient(args.dz_loss), dlogits.data());
  round_all(dlogits, d.dtype);

  if (input_grad) {
    MatmulTask router_term;  // dx += dlogits Wr
    router_term.m = tokens;
    router_term.n = d.hidden;
    router_term.k = d.router_experts;
    router_term.a = MatrixView{dlogits.data(), d.router_experts, 1, nullptr, nullptr};
    router_term.b = MatrixView{w_router.data(), d.hidden, 1, nullptr, nullptr};
    router_term.c = g.dx.data();
    router_term.ldc = d.hidden;
    router_term.accumulate = true;
    matmul(router_term);
  }

  std::vector<double> dw_router;
  if (weight_grad) {
    dw_router.resize(static_cast<size_t>(d.router_experts * d.hidden));
    MatmulTask router_grad;  // dWr = dlogits^T x
    router_grad.m = d.router_experts;
    router_grad.n = d.hidden;
    router_grad.k = tokens;
    router_grad.a = MatrixView{dlogits.data(), 1, d.router_experts, nullptr, nullptr};
    router_grad.b = MatrixView{x.data(), d.hidden, 1, nullptr, nullptr};
    router_grad.c = dw_router.data();
    router_grad.ldc = d.hidden;
    matmul(router_grad);
  }

  if (input_grad) write_values(args.dx, g.dx);
  if (weight_grad) {
    write_accumulated(args.dw_router, dw_router, args.beta_dw_router);
    write_weight_gradients(d, args, g.weights);
  }
  spend_saved(saved, d);
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
