// sparse_ffn_forward / _backward / _forward_backward: the group-sparse SwiGLU FFN layer (docs/math.md section 7) on
// random x and weights: group selection, then the selected groups' SwiGLU. Backward as t(forward + backward) -
// t(forward). Model FLOPs count the selected neurons only: forward 6*T*D*kg*G, backward twice that (the selection's
// gate GEMM not counted). The baseline is the dense SwiGLU FFN of the full width F timed in the same run (its GEMMs).
#include <cmath>
#include <optional>

#include "workloads/workloads.h"

namespace moekit_bench {
namespace {

class SparseFfnWorkload final : public Workload {
 public:
  SparseFfnWorkload(const CaseConfig& config, const Shape& shape) : Workload(config, shape) {}

  moekit_status_t create_plan(moekit_handle_t handle) override {
    const int64_t T = shape_.tokens, D = shape_.d_model, F = shape_.d_ff, kg = shape_.top_groups;
    const moekit_dtype_t dtype = config_.dtype, grad_dtype = or_dtype(config_.weight_grad_dtype, dtype);
    moekit_sparse_ffn_desc_t desc = sparse_ffn_desc(shape_, dtype);
    desc.weight_grad_dtype = config_.weight_grad_dtype;
    const moekit_status_t status = moekit_sparse_ffn_plan_create(handle, &desc, &plan_);
    if (status != MOEKIT_SUCCESS) return status;

    const float d_scale = 1.0f / std::sqrt(static_cast<float>(D));
    const float f_scale = 1.0f / std::sqrt(static_cast<float>(kg * shape_.group_size));  // neurons each token sums
    x_ = add(spec("x", dtype, {T, D}, Access::read, 1.0f));
    w_gate_ = add(spec("w_gate", dtype, {F, D}, Access::read, d_scale));
    w_up_ = add(spec("w_up", dtype, {F, D}, Access::read, d_scale));
    w_down_ = add(spec("w_down", dtype, {D, F}, Access::read, f_scale));
    if (shape_.subsample > 0) rows_ = add(subsample_rows_spec(shape_, config_.seed));
    out_ = add(spec("out", dtype, {T, D}, Access::write, 0.0f, Compare::values));
    specs_[out_].rows_keyed_on = "groups";
    groups_ = add(spec("groups", MOEKIT_DTYPE_INT32, {T, kg}, Access::write, 0.0f, Compare::selection));
    forward_bytes_ = bytes_of({x_, w_gate_, w_up_, w_down_, out_, groups_, rows_});
    saved_ = add_saved_buffer(Access::write);
    forward_bytes_ += bytes_of({saved_});
    if (config_.op == Op::sparse_ffn_forward) return MOEKIT_SUCCESS;

    dout_ = add(spec("dout", dtype, {T, D}, Access::read, 1.0f));
    dx_ = add(spec("dx", dtype, {T, D}, Access::write, 0.0f, Compare::values));
    specs_[dx_].rows_keyed_on = "groups";
    dw_gate_ = add(spec("dw_gate", grad_dtype, {F, D}, Access::write, 0.0f, Compare::values));
    dw_up_ = add(spec("dw_up", grad_dtype, {F, D}, Access::write, 0.0f, Compare::values));
    dw_down_ = add(spec("dw_down", grad_dtype, {D, F}, Access::write, 0.0f, Compare::values));
    backward_bytes_ = bytes_of({x_, w_gate_, w_up_, w_down_, dout_, dx_, dw_gate_, dw_up_, dw_down_, saved_});
    return MOEKIT_SUCCESS;
  }

  void bind_sets(const std::vector<const TensorSet*>& sets) override {
    for (const TensorSet* s : sets) {
      moekit_sparse_ffn_fwd_args_t f;
      moekit_sparse_ffn_fwd_args_init(&f);
      f.x = s->view(x_);
      f.w_gate = s->view(w_gate_);
      f.w_up = s->view(w_up_);
      f.w_down = s->view(w_down_);
      if (rows_) f.subsample_rows = s->view(*rows_);
      f.out = s->view(out_);
      f.groups = s->view(groups_);
      fwd_.push_back(f);
      saved_data_.push_back(saved_ ? s->data(*saved_) : nullptr);
      if (config_.op == Op::sparse_ffn_forward) continue;
      moekit_sparse_ffn_bwd_args_t b;
      moekit_sparse_ffn_bwd_args_init(&b);
      b.x = f.x;
      b.w_gate = f.w_gate;
      b.w_up = f.w_up;
      b.w_down = f.w_down;
      b.dout = s->view(dout_);
      b.dx = s->view(dx_);
      b.dw_gate = s->view(dw_gate_);
      b.dw_up = s->view(dw_up_);
      b.dw_down = s->view(dw_down_);
      bwd_.push_back(b);
    }
  }

  int steps() const override { return config_.op == Op::sparse_ffn_forward ? 1 : 2; }
  std::vector<int> subtracted_steps() const override {
    return config_.op == Op::sparse_ffn_backward ? std::vector<int>{0} : std::vector<int>{};
  }
  std::string step_name(int step) const override { return step == 0 ? "sparse_ffn_forward" : "sparse_ffn_backward"; }

  moekit_status_t run_step(int step, int set, void* stream) override {
    const size_t saved_bytes = saved_ ? specs_[*saved_].bytes() : 0;
    if (step == 0)
      return moekit_sparse_ffn_forward(plan_, &fwd_[set], saved_data_[set], saved_bytes, workspace_, workspace_bytes_,
                                       stream);
    return moekit_sparse_ffn_backward(plan_, &bwd_[set], saved_data_[set], saved_bytes, workspace_, workspace_bytes_,
                                      stream);
  }

  double bytes() const override {
    switch (config_.op) {
      case Op::sparse_ffn_forward: return forward_bytes_;
      case Op::sparse_ffn_backward: return backward_bytes_;
      default: return forward_bytes_ + backward_bytes_;
    }
  }

  WorkModel model() const override {
    const int64_t T = shape_.tokens, D = shape_.d_model, F = shape_.d_ff;
    const double selected = static_cast<double>(shape_.top_groups * shape_.group_size);
    // The dense SwiGLU FFN of width F: [gate | up] = x [Wg; Wu]^T, y = a Wd^T; backward dA = dout Wd,
    // dWd = dout^T a, dx = [dg | du] [Wg; Wu], d[Wg; Wu] = [dg | du]^T x.
    const std::vector<DenseGemm> forward = {{T, 2 * F, D}, {T, D, F}};
    const std::vector<DenseGemm> backward = {{T, F, D}, {D, F, T}, {T, D, 2 * F}, {2 * F, D, T}};
    WorkModel m;
    const double forward_flops = 6.0 * static_cast<double>(T) * static_cast<double>(D) * selected;
    if (config_.op != Op::sparse_ffn_backward) {
      m.dense = forward;
      m.flops += forward_flops;
    }
    if (config_.op != Op::sparse_ffn_forward) {
      m.dense.insert(m.dense.end(), backward.begin(), backward.end());
      m.flops += 2 * forward_flops;
    }
    m.flop_convention = "selected neurons only: forward 6*T*D*kg*G, backward twice that; group selection not counted";
    m.baseline_description = "dense SwiGLU FFN of width d_ff: its cuBLASLt bf16 GEMMs (elementwise SwiGLU not timed)";
    return m;
  }

 private:
  size_t x_ = 0, w_gate_ = 0, w_up_ = 0, w_down_ = 0, out_ = 0, groups_ = 0;
  size_t dout_ = 0, dx_ = 0, dw_gate_ = 0, dw_up_ = 0, dw_down_ = 0;
  std::optional<size_t> rows_, saved_;
  double forward_bytes_ = 0, backward_bytes_ = 0;
  std::vector<moekit_sparse_ffn_fwd_args_t> fwd_;
  std::vector<moekit_sparse_ffn_bwd_args_t> bwd_;
  std::vector<void*> saved_data_;
};

}  // namespace

std::unique_ptr<Workload> make_sparse_ffn_workload(const CaseConfig& config, const Shape& shape) {
  return std::make_unique<SparseFfnWorkload>(config, shape);
}

}  // namespace moekit_bench
