// group_select: the sparse FFN's grouped neuron selection (docs/math.md section 7) on random x [T, D] and W_gate
// [F, D]: the gate GEMM over the subsampled rows, the group energies and the top-kg groups with their counts.
// GEMM-shaped: model FLOPs 2*T*D*R with R = F/G * spg gate rows (all F without a subsample); the baseline is the dense
// cuBLASLt GEMM [T, R, D].
#include <cmath>
#include <optional>

#include "workloads/workloads.h"

namespace moekit_bench {
namespace {

class GroupSelectWorkload final : public Workload {
 public:
  GroupSelectWorkload(const CaseConfig& config, const Shape& shape) : Workload(config, shape) {}

  moekit_status_t create_plan(moekit_handle_t handle) override {
    const int64_t T = shape_.tokens, D = shape_.d_model, F = shape_.d_ff, NG = F / shape_.group_size;
    const moekit_sparse_ffn_desc_t desc = sparse_ffn_desc(shape_, config_.dtype);
    const moekit_status_t status = moekit_group_select_plan_create(handle, &desc, &plan_);
    if (status != MOEKIT_SUCCESS) return status;
    x_ = add(spec("x", config_.dtype, {T, D}, Access::read, 1.0f));
    w_gate_ = add(spec("w_gate", config_.dtype, {F, D}, Access::read, 1.0f / std::sqrt(static_cast<float>(D))));
    if (shape_.subsample > 0) rows_ = add(subsample_rows_spec(shape_, config_.seed));
    groups_ = add(spec("groups", MOEKIT_DTYPE_INT32, {T, shape_.top_groups}, Access::write, 0.0f, Compare::selection));
    counts_ = add(spec("counts", MOEKIT_DTYPE_INT32, {NG}, Access::write, 0.0f, Compare::selection));
    return MOEKIT_SUCCESS;
  }

  void bind_sets(const std::vector<const TensorSet*>& sets) override {
    for (const TensorSet* s : sets) {
      moekit_group_select_args_t a;
      moekit_group_select_args_init(&a);
      a.x = s->view(x_);
      a.w_gate = s->view(w_gate_);
      if (rows_) a.subsample_rows = s->view(*rows_);
      a.groups = s->view(groups_);
      a.counts = s->view(counts_);
      args_.push_back(a);
    }
  }

  std::string step_name(int) const override { return "group_select"; }
  moekit_status_t run_step(int, int set, void* stream) override {
    return moekit_group_select(plan_, &args_[set], workspace_, workspace_bytes_, stream);
  }

  WorkModel model() const override {
    const int64_t rows = shape_.subsample > 0 ? shape_.d_ff / shape_.group_size * shape_.subsample : shape_.d_ff;
    WorkModel m;
    m.dense = {DenseGemm{shape_.tokens, rows, shape_.d_model}};
    m.flops = m.dense[0].flops();
    m.flop_convention = "2 * T * D * R, R = gate rows read (F/G * subsample, or F); energies and top-k not counted";
    m.baseline_description = "cuBLASLt dense bf16 GEMM [T, R, D] (the gate GEMM alone)";
    return m;
  }

 private:
  size_t x_ = 0, w_gate_ = 0, groups_ = 0, counts_ = 0;
  std::optional<size_t> rows_;
  std::vector<moekit_group_select_args_t> args_;
};

}  // namespace

std::unique_ptr<Workload> make_group_select_workload(const CaseConfig& config, const Shape& shape) {
  return std::make_unique<GroupSelectWorkload>(config, shape);
}

}  // namespace moekit_bench
