// The sparse SwiGLU FFN layer (docs/math.md section 7) on the reference backend. After group selection the layer is an
// MoE with E = F/G experts of size I = G, top-k kg and all scores 1: the tokens are grouped by selected group (the
// dispatch CSR) and each group's slice of Wg, Wu, Wd is one expert's weights, so nothing [T, F] exists; the
// grouped arrays are [T*kg, G] = [T, kg*G]. Saved between forward and backward: the selected groups.
#include <algorithm>
#include <vector>

#include "moekit/moekit.h"
#include "src/numeric.h"
#include "src/reference/activation.h"
#include "src/reference/blocks.h"
#include "src/reference/dense.h"
#include "src/reference/grouped_gemm.h"
#include "src/reference/layer_io.h"
#include "src/reference/parallel.h"
#include "src/reference/reference_backend.h"

namespace moekit {
inline namespace v0 {
namespace ref {

namespace {

struct SparseShape {
  int64_t tokens, d_model, d_ff, group_size, groups, top_groups;
};

SparseShape shape_of(const moekit_sparse_ffn_desc_t& d, int64_t tokens) {
  return SparseShape{tokens, d.d_model, d.d_ff, d.group_size, d.d_ff / d.group_size, d.top_groups};
}

// Group g's G rows of Wg or Wu [F, D] as B_g [D, G] (x W^T), and as B_g [G, D] (the input gradient).
GroupedMatrix rows_as_nk(const std::vector<double>& w, const SparseShape& s) {
  return weights_nk(w.data(), s.group_size, s.d_model);
}
GroupedMatrix rows_as_kn(const std::vector<double>& w, const SparseShape& s) {
  return weights_kn(w.data(), s.group_size, s.d_model);
}
// Group g's G columns of Wd [D, F] as B_g [G, D] (p Wd[:, g]^T), and as B_g [D, G] (dout Wd[:, g]).
GroupedMatrix columns_for_forward(const std::vector<double>& wd, const SparseShape& s) {
  return GroupedMatrix{wd.data(), s.group_size, 1, s.d_ff};
}
GroupedMatrix columns_for_backward(const std::vector<double>& wd, const SparseShape& s) {
  return GroupedMatrix{wd.data(), s.group_size, s.d_ff, 1};
}

// gate = round(x Wg_g^T), up = round(x Wu_g^T) for every grouped row, [rows, G] each.
void gate_and_up(const SparseShape& s, int32_t dtype, const Csr& csr, const std::vector<double>& x,
                 const std::vector<double>& w_gate, const std::vector<double>& w_up, std::vector<double>& gate,
                 std::vector<double>& up) {
  const int64_t* offsets = csr.expert_offsets.data();
  int64_t rows = csr.expert_offsets.back();
  GroupedRows x_rows{x.data(), s.d_model, csr.gather_idx.data()};
  gate.resize(static_cast<size_t>(rows * s.group_size));
  up.resize(static_cast<size_t>(rows * s.group_size));
  varlen_m_product(s.groups, offsets, s.group_size, s.d_model, x_rows, rows_as_nk(w_gate, s), gate.data(),
                   s.group_size);
  varlen_m_product(s.groups, offsets, s.group_size, s.d_model, x_rows, rows_as_nk(w_up, s), up.data(), s.group_size);
  round_all(gate, dtype);
  round_all(up, dtype);
}

// p = round(silu(gate) * up), elementwise.
std::vector<double> gated_product(int32_t dtype, const std::vector<double>& gate, const std::vector<double>& up) {
  std::vector<double> p(gate.size());
  for (size_t i = 0; i < p.size(); ++i) p[i] = round_to(silu(gate[i]) * up[i], dtype);
  return p;
}

struct Selection {
  std::vector<int64_t> groups;  // [T, kg]
  Csr csr;                      // grouped by selected group
};

Selection group_by_selection(const SparseShape& s, std::vector<int64_t> groups) {
  Selection selection;
  selection.csr = dispatch_fixed(s.tokens, s.top_groups, s.groups, 0, groups.data());
  selection.groups = std::move(groups);
  return selection;
}

}  // namespace

void ReferenceBackend::sparse_ffn_forward(const moekit_plan& plan, const moekit_sparse_ffn_fwd_args_t& args,
                                          void* saved, Workspace, void*) {
  const moekit_sparse_ffn_desc_t& d = plan.sparse_ffn;
  SparseShape s = shape_of(d, args.x.shape[0]);

  std::vector<double> x = read_values(args.x);
  std::vector<double> w_gate = read_values(args.w_gate);
  std::vector<double> w_up = read_values(args.w_up);
  std::vector<double> w_down = read_values(args.w_down);
  std::vector<int64_t> subsample_rows;
  if (d.subsample > 0) {
    subsample_rows = read_indices(args.subsample_rows);
    require_in_range("subsample_rows", subsample_rows, 0, s.d_ff);
  }
  std::vector<double> lb_bias;
  if (present(args.lb_bias)) lb_bias = read_values(args.lb_bias);

  GroupSelectSpec select{d.d_model, d.d_ff, d.group_size, d.top_groups, d.subsample, d.dtype};
  std::vector<int64_t> groups(static_cast<size_t>(s.tokens * s.top_groups));
  std::vector<int64_t> counts(static_cast<size_t>(s.groups));
  ref::group_select(select, s.tokens, x.data(), w_gate.data(), d.subsample > 0 ? subsample_rows.data() : nullptr,
               lb_bias.empty() ? nullptr : lb_bias.data(), groups.data(), counts.data());
  Selection selection = group_by_selection(s, std::move(groups));
  const Csr& csr = selection.csr;
  int64_t rows = csr.expert_offsets.back();

  std::vector<double> gate, up;
  gate_and_up(s, d.dtype, csr, x, w_gate, w_up, gate, up);
  std::vector<double> p = gated_product(d.dtype, gate, up);
  // y_i = p_i Wd[:, g]^T per grouped row; out_t sums its rows in selection order.
  std::vector<double> y(static_cast<size_t>(rows * s.d_model));
  GroupedRows p_rows{p.data(), s.group_size, nullptr};
  varlen_m_product(s.groups, csr.expert_offsets.data(), s.d_model, s.group_size, p_rows,
                   columns_for_forward(w_down, s), y.data(), s.d_model);
  std::vector<double> out = args.beta_out != 0.0 ? read_values(args.out)
                                                 : std::vector<double>(static_cast<size_t>(s.tokens * s.d_model));
  ref::combine(s.tokens, s.d_model, s.top_groups, nullptr, y.data(), nullptr, csr.grouped_pos.data(), args.beta_out,
          out.data());

  write_values(args.out, out);
  if (present(args.groups)) write_indices(args.groups, selection.groups);
  if (present(args.counts)) write_indices(args.counts, counts);
  if (d.inference || saved == nullptr) return;
  SparseFfnSavedLayout layout = sparse_ffn_saved_layout(d, s.tokens);
  write_saved_header(saved, plan.id, s.tokens);
  std::copy(selection.groups.begin(), selection.groups.end(), saved_section<int64_t>(saved, layout.groups));
}

void ReferenceBackend::sparse_ffn_backward(const moekit_plan& plan, const moekit_sparse_ffn_bwd_args_t& args,
                                           const void* saved, Workspace, void*) {
  const moekit_sparse_ffn_desc_t& d = plan.sparse_ffn;
  SparseShape s = shape_of(d, args.x.shape[0]);
  check_saved_header(saved, plan.id, s.tokens);
  bool input_grad = args.compute_input_grad != 0;
  bool weight_grad = args.compute_weight_grad != 0;
  if (!input_grad && !weight_grad) return;

  const int64_t* saved_groups = saved_section<int64_t>(saved, sparse_ffn_saved_layout(d, s.tokens).groups);
  Selection selection =
      group_by_selection(s, std::vector<int64_t>(saved_groups, saved_groups + s.tokens * s.top_groups));
  const Csr& csr = selection.csr;
  const int64_t* offsets = csr.expert_offsets.data();
  int64_t rows = csr.expert_offsets.back();

  std::vector<double> x = read_values(args.x);
  std::vector<double> dout = read_values(args.dout);
  std::vector<double> w_gate = read_values(args.w_gate);
  std::vector<double> w_up = read_values(args.w_up);
  std::vector<double> w_down = read_values(args.w_down);
  std::vector<double> gate, up;
  gate_and_up(s, d.dtype, csr, x, w_gate, w_up, gate, up);

  // dp = dout Wd[:, g] (never rounded); dgate = round(dp up silu'(gate)); dup = round(dp silu(gate)).
  GroupedRows dout_rows{dout.data(), s.d_model, csr.gather_idx.data()};
  std::vector<double> dgate(static_cast<size_t>(rows * s.group_size));
  varlen_m_product(s.groups, offsets, s.group_size, s.d_model, dout_rows, columns_for_backward(w_down, s),
                   dgate.data(), s.group_size);
  std::vector<double> dup(dgate.size());
  parallel_for(static_cast<int64_t>(dgate.size()), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      size_t j = static_cast<size_t>(i);
      double dp = dgate[j];
      dgate[j] = round_to(dp * up[j] * silu_grad(gate[j]), d.dtype);
      dup[j] = round_to(dp * silu(gate[j]), d.dtype);
    }
  });

  std::vector<double> dx;
  if (input_grad) {
    // dx_t = sum over its selected groups of dgate Wg_g + dup Wu_g, rounded once.
    std::vector<double> dxe(static_cast<size_t>(rows * s.d_model));
    GroupedRows dgate_rows{dgate.data(), s.group_size, nullptr};
    GroupedRows dup_rows{dup.data(), s.group_size, nullptr};
    varlen_m_product(s.groups, offsets, s.d_model, s.group_size, dgate_rows, rows_as_kn(w_gate, s), dxe.data(),
                     s.d_model);
    varlen_m_product(s.groups, offsets, s.d_model, s.group_size, dup_rows, rows_as_kn(w_up, s), dxe.data(),
                     s.d_model, true);
    dx = args.beta_dx != 0.0 ? read_values(args.dx) : std::vector<double>(static_cast<size_t>(s.tokens * s.d_model));
    ref::combine(s.tokens, s.d_model, s.top_groups, nullptr, dxe.data(), nullptr, csr.grouped_pos.data(), args.beta_dx,
            dx.data());
  }

  std::vector<double> dw_gate, dw_up, dw_down;
  if (weight_grad) {
    // Unselected groups are empty segments: their rows (columns of Wd) get 0.
    GroupedRows x_rows{x.data(), s.d_model, csr.gather_idx.data()};
    GroupedRows dgate_rows{dgate.data(), s.group_size, nullptr};
    GroupedRows dup_rows{dup.data(), s.group_size, nullptr};
    dw_gate.resize(static_cast<size_t>(s.d_ff * s.d_model));
    dw_up.resize(dw_gate.size());
    dw_down.resize(dw_gate.size());
    varlen_k_product(s.groups, offsets, s.group_size, s.d_model, dgate_rows, x_rows, dw_gate.data(),
                     s.group_size * s.d_model, s.d_model);
    varlen_k_product(s.groups, offsets, s.group_size, s.d_model, dup_rows, x_rows, dw_up.data(),
                     s.group_size * s.d_model, s.d_model);
    std::vector<double> p = gated_product(d.dtype, gate, up);
    GroupedRows p_rows{p.data(), s.group_size, nullptr};
    varlen_k_product(s.groups, offsets, s.d_model, s.group_size, dout_rows, p_rows, dw_down.data(), s.group_size,
                     s.d_ff);
  }

  if (input_grad) write_values(args.dx, dx);
  if (weight_grad) {
    write_accumulated(args.dw_gate, dw_gate, args.beta_dw_gate);
    write_accumulated(args.dw_up, dw_up, args.beta_dw_up);
    write_accumulated(args.dw_down, dw_down, args.beta_dw_down);
  }
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
