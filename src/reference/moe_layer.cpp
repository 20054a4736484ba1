// The MoE layer (docs/math.md sections 3 and 4) on the reference backend: router GEMM, router, dispatch, expert MLP on
// the grouped rows, combine; and its backward. Saved between the two: the router's logits, scores and indices and the
// rounded h; the dispatch is recomputed from the indices.
#include <algorithm>
#include <vector>

#include "moekit/moekit.h"
#include "src/reference/blocks.h"
#include "src/reference/dense.h"
#include "src/reference/expert_mlp.h"
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

ActivationSpec activation_spec(const moekit_moe_desc_t& d) {
  return ActivationSpec{d.activation, d.glu_layout, d.glu_limit, d.intermediate};
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

// Views of the weights the backward and forward read, converted once.
struct ExpertWeights {
  std::vector<double> w1, b1, w2, b2;
  ExpertMlp mlp(const moekit_moe_desc_t& d) const {
    return ExpertMlp{d.experts, d.hidden, activation_spec(d), d.dtype, w1.data(), b1.empty() ? nullptr : b1.data(),
                     w2.data(), b2.empty() ? nullptr : b2.data()};
  }
};

}  // namespace

void ReferenceBackend::moe_forward(const moekit_plan& plan, const moekit_moe_fwd_args_t& args, void* saved,
                                   Workspace, void*) {
  const moekit_moe_desc_t& d = plan.moe;
  int64_t tokens = args.x.shape[0];
  int64_t pairs = tokens * d.top_k;
  int64_t width = h_width(activation_spec(d));

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
  int64_t rows = csr.expert_offsets.back();

  ExpertWeights weights;
  weights.w1 = read_values(args.w1);
  weights.w2 = read_values(args.w2);
  if (d.has_b1) weights.b1 = read_values(args.b1);
  if (d.has_b2) weights.b2 = read_values(args.b2);
  std::vector<double> h(static_cast<size_t>(rows * width));
  std::vector<double> y(static_cast<size_t>(rows * d.hidden));
  GroupedRows x_rows{x.data(), d.hidden, csr.gather_idx.data()};
  expert_mlp_forward(weights.mlp(d), csr.expert_offsets.data(), x_rows, h.data(), y.data());

  std::vector<double> out = args.beta_out != 0.0 ? read_values(args.out)
                                                 : std::vector<double>(static_cast<size_t>(tokens * d.hidden));
  ref::combine(tokens, d.hidden, d.top_k, nullptr, y.data(), scores.data(), csr.grouped_pos.data(), args.beta_out,
          out.data());

  write_values(args.out, out);
  if (present(args.scores)) write_values(args.scores, scores);
  if (present(args.indices)) write_indices(args.indices, indices);
  if (present(args.counts)) write_indices(args.counts, counts);
  if (d.inference || saved == nullptr) return;
  MoeSavedLayout layout = moe_saved_layout(d, tokens);
  write_saved_header(saved, plan.id, tokens);
  std::copy(logits.begin(), logits.end(), saved_section<double>(saved, layout.logits));
  std::copy(scores.begin(), scores.end(), saved_section<double>(saved, layout.scores));
  std::copy(indices.begin(), indices.end(), saved_section<int64_t>(saved, layout.indices));
  std::copy(h.begin(), h.end(), saved_section<double>(saved, layout.h));
}

void ReferenceBackend::moe_backward(const moekit_plan& plan, const moekit_moe_bwd_args_t& args, const void* saved,
                                    Workspace, void*) {
  const moekit_moe_desc_t& d = plan.moe;
  int64_t tokens = args.x.shape[0];
  check_saved_header(saved, plan.id, tokens);
  bool input_grad = args.compute_input_grad != 0;
  bool weight_grad = args.compute_weight_grad != 0;
  if (!input_grad && !weight_grad) return;
  int64_t pairs = tokens * d.top_k;
  int64_t width = h_width(activation_spec(d));

  MoeSavedLayout layout = moe_saved_layout(d, tokens);
  const double* logits = saved_section<double>(saved, layout.logits);
  const double* scores = saved_section<double>(saved, layout.scores);
  const int64_t* indices = saved_section<int64_t>(saved, layout.indices);
  const double* h = saved_section<double>(saved, layout.h);
  Csr csr = dispatch_fixed(tokens, d.top_k, d.experts, d.expert_begin, indices);
  const int64_t* offsets = csr.expert_offsets.data();
  int64_t rows = csr.expert_offsets.back();

  std::vector<double> x = read_values(args.x);
  std::vector<double> dout = read_values(args.dout);
  std::vector<double> w_router = read_values(args.w_router);
  ExpertWeights weights;
  weights.w1 = read_values(args.w1);
  weights.w2 = read_values(args.w2);
  if (d.has_b2) weights.b2 = read_values(args.b2);
  ExpertMlp mlp = weights.mlp(d);
  GroupedRows dout_rows{dout.data(), d.hidden, csr.gather_idx.data()};
  GroupedRows x_rows{x.data(), d.hidden, csr.gather_idx.data()};

  // Step 1 (dgated) and the dout . b2 part of ds; dropped pairs keep ds = 0.
  std::vector<double> ds(static_cast<size_t>(pairs), 0.0);
  std::vector<double> dh(static_cast<size_t>(rows * width));
  std::vector<double> a_scaled(static_cast<size_t>(rows * d.intermediate));
  expert_mlp_dgated(mlp, offsets, dout_rows, h, scores, csr.pair_idx.data(), dh.data(), a_scaled.data(), ds.data());
  std::vector<double> db2;
  if (d.has_b2 && weight_grad) db2.resize(static_cast<size_t>(d.experts * d.hidden));
  if (d.has_b2)
    ref::db2_ds(d.experts, d.hidden, offsets, csr.gather_idx.data(), csr.pair_idx.data(), dout.data(), scores,
           weights.b2.data(), 0.0, db2.empty() ? nullptr : db2.data(), ds.data());
  round_all(ds, score_dtype(d.dtype));

  // Step 8's dlogits, rounded to the storage dtype before both router GEMMs.
  std::vector<double> dlogits(static_cast<size_t>(tokens * d.router_experts));
  ref::router_backward(router_spec(d), tokens, logits, indices, ds.data(), dlogits.data());
  round_all(dlogits, d.dtype);

  std::vector<double> dx;
  if (input_grad) {
    std::vector<double> dxe(static_cast<size_t>(rows * d.hidden));
    expert_mlp_input_grad(mlp, offsets, dh.data(), dxe.data());
    round_all(dxe, d.dtype);
    dx = args.beta_dx != 0.0 ? read_values(args.dx) : std::vector<double>(static_cast<size_t>(tokens * d.hidden));
    ref::combine(tokens, d.hidden, d.top_k, nullptr, dxe.data(), nullptr, csr.grouped_pos.data(), args.beta_dx,
            dx.data());
    round_all(dx, d.dtype);
    MatmulTask router_term;  // dx += dlogits Wr
    router_term.m = tokens;
    router_term.n = d.hidden;
    router_term.k = d.router_experts;
    router_term.a = MatrixView{dlogits.data(), d.router_experts, 1, nullptr, nullptr};
    router_term.b = MatrixView{w_router.data(), d.hidden, 1, nullptr, nullptr};
    router_term.c = dx.data();
    router_term.ldc = d.hidden;
    router_term.accumulate = true;
    matmul(router_term);
  }

  std::vector<double> dw_router, dw1, db1, dw2;
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
    dw1.resize(static_cast<size_t>(d.experts * width * d.hidden));
    dw2.resize(static_cast<size_t>(d.experts * d.hidden * d.intermediate));
    if (d.has_b1) db1.resize(static_cast<size_t>(d.experts * width));
    expert_mlp_weight_grads(mlp, offsets, dout_rows, a_scaled.data(), dh.data(), x_rows, dw1.data(),
                            d.has_b1 ? db1.data() : nullptr, dw2.data());
  }

  if (input_grad) write_values(args.dx, dx);
  if (weight_grad) {
    write_accumulated(args.dw_router, dw_router, args.beta_dw_router);
    write_accumulated(args.dw1, dw1, args.beta_dw1);
    write_accumulated(args.dw2, dw2, args.beta_dw2);
    if (d.has_b1) write_accumulated(args.db1, db1, args.beta_db1);
    if (d.has_b2) write_accumulated(args.db2, db2, args.beta_db2);
  }
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
