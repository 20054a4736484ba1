// The token reductions of docs/math.md section 6 over real routing (routing.h): combine (out = sum of score-weighted
// grouped rows), broadcast_backward (the same without scores), db1 (per-expert row sums of dh) and db2_ds (per-expert
// sums of score-weighted dout rows, and ds += dout . b2). Memory-bound.
#include <cmath>

#include "workloads/workloads.h"

namespace moekit_bench {
namespace {

class ReductionWorkload final : public Workload {
 public:
  ReductionWorkload(const CaseConfig& config, const Shape& shape) : Workload(config, shape) {}

  moekit_status_t create_plan(moekit_handle_t handle) override {
    const int64_t T = shape_.tokens, E = shape_.experts, K = shape_.top_k, P = T * K, H = shape_.hidden;
    const moekit_dtype_t dtype = config_.dtype, out_dtype = or_dtype(config_.out_dtype, dtype);
    moekit_status_t status;
    if (config_.op == Op::combine || config_.op == Op::broadcast_backward) {
      moekit_combine_desc_t desc;
      moekit_combine_desc_init(&desc);
      desc.max_tokens = T;
      desc.top_k = K;
      desc.hidden = H;
      desc.dtype = dtype;
      status = moekit_combine_plan_create(handle, &desc, &plan_);
    } else {
      moekit_bias_grad_desc_t desc;
      moekit_bias_grad_desc_init(&desc);
      desc.experts = E;
      desc.max_rows = P;
      desc.width = config_.op == Op::db1 ? shape_.width : H;
      desc.max_tokens = T;
      desc.dtype = dtype;
      desc.out_dtype = config_.out_dtype;
      status = moekit_bias_grad_plan_create(handle, &desc, &plan_);
    }
    if (status != MOEKIT_SUCCESS) return status;

    const Routing& routing = this->routing();
    switch (config_.op) {
      case Op::combine:
      case Op::broadcast_backward:
        grouped_ = add(spec(config_.op == Op::combine ? "y" : "dxe", dtype, {P, H}, Access::read, 1.0f));
        if (config_.op == Op::combine)
          scores_ = add(given("scores", MOEKIT_DTYPE_FP32, {T, K}, host_bytes(routing.scores)));
        pos_ = add(given("grouped_pos", MOEKIT_DTYPE_INT32, {P}, host_bytes(routing.grouped_pos)));
        out_ = add(spec(config_.op == Op::combine ? "out" : "dx", dtype, {T, H}, Access::write, 0.0f, Compare::values));
        break;
      case Op::db1:
        grouped_ = add(spec("dh", dtype, {P, shape_.width}, Access::read, 1.0f));
        offsets_ = add(given("offsets", MOEKIT_DTYPE_INT32, {E + 1}, host_bytes(routing.expert_offsets)));
        out_ = add(spec("db1", out_dtype, {E, shape_.width}, Access::write, 0.0f, Compare::values));
        break;
      default:  // db2_ds
        grouped_ = add(spec("dout", dtype, {T, H}, Access::read, 1.0f));
        scores_ = add(given("scores", MOEKIT_DTYPE_FP32, {T, K}, host_bytes(routing.scores)));
        b2_ = add(spec("b2", dtype, {E, H}, Access::read, 1.0f / std::sqrt(static_cast<float>(H))));
        offsets_ = add(given("offsets", MOEKIT_DTYPE_INT32, {E + 1}, host_bytes(routing.expert_offsets)));
        gather_ = add(given("gather_idx", MOEKIT_DTYPE_INT32, {P}, host_bytes(routing.gather_idx)));
        pos_ = add(given("pair_idx", MOEKIT_DTYPE_INT32, {P}, host_bytes(routing.pair_idx)));
        if (config_.with_db2) out_ = add(spec("db2", out_dtype, {E, H}, Access::write, 0.0f, Compare::values));
        dscores_ = add(spec("dscores", MOEKIT_DTYPE_FP32, {T, K}, Access::read_write, 1.0f, Compare::values));
        break;
    }
    return MOEKIT_SUCCESS;
  }

  void bind_sets(const std::vector<const TensorSet*>& sets) override {
    for (const TensorSet* s : sets) {
      if (config_.op == Op::combine || config_.op == Op::broadcast_backward) {
        moekit_combine_args_t a;
        moekit_combine_args_init(&a);
        a.grouped = s->view(grouped_);
        if (config_.op == Op::combine) a.scores = s->view(scores_);
        a.grouped_pos = s->view(pos_);
        a.out = s->view(out_);
        combine_.push_back(a);
      } else if (config_.op == Op::db1) {
        moekit_db1_args_t a;
        moekit_db1_args_init(&a);
        a.dh = s->view(grouped_);
        a.offsets = s->view(offsets_);
        a.db1 = s->view(out_);
        db1_.push_back(a);
      } else {
        moekit_db2_ds_args_t a;
        moekit_db2_ds_args_init(&a);
        a.dout = s->view(grouped_);
        a.scores = s->view(scores_);
        a.b2 = s->view(b2_);
        a.offsets = s->view(offsets_);
        a.gather_idx = s->view(gather_);
        a.pair_idx = s->view(pos_);
        if (config_.with_db2) a.db2 = s->view(out_);
        a.dscores = s->view(dscores_);
        db2_.push_back(a);
      }
    }
  }

  std::string step_name(int) const override { return config_.op_name; }

  moekit_status_t run_step(int, int set, void* stream) override {
    switch (config_.op) {
      case Op::combine: return moekit_combine(plan_, &combine_[set], workspace_, workspace_bytes_, stream);
      case Op::broadcast_backward:
        return moekit_broadcast_backward(plan_, &combine_[set], workspace_, workspace_bytes_, stream);
      case Op::db1: return moekit_db1(plan_, &db1_[set], workspace_, workspace_bytes_, stream);
      default: return moekit_db2_ds(plan_, &db2_[set], workspace_, workspace_bytes_, stream);
    }
  }

  WorkModel model() const override { return memory_bound_model(); }

 private:
  size_t grouped_ = 0, scores_ = 0, pos_ = 0, out_ = 0, offsets_ = 0, b2_ = 0, gather_ = 0, dscores_ = 0;
  std::vector<moekit_combine_args_t> combine_;
  std::vector<moekit_db1_args_t> db1_;
  std::vector<moekit_db2_ds_args_t> db2_;
};

}  // namespace

std::unique_ptr<Workload> make_reduction_workload(const CaseConfig& config, const Shape& shape) {
  return std::make_unique<ReductionWorkload>(config, shape);
}

}  // namespace moekit_bench
