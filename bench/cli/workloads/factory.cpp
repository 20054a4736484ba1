#include "workloads/workloads.h"

namespace moekit_bench {

TensorSpec spec(std::string name, moekit_dtype_t dtype, std::vector<int64_t> shape, Access access, float scale,
                Compare compare) {
  TensorSpec s;
  s.name = std::move(name);
  s.dtype = dtype;
  s.shape = std::move(shape);
  s.access = access;
  s.scale = scale;
  s.compare = compare;
  return s;
}

TensorSpec given(std::string name, moekit_dtype_t dtype, std::vector<int64_t> shape,
                 std::shared_ptr<const std::vector<unsigned char>> data) {
  TensorSpec s = spec(std::move(name), dtype, std::move(shape), Access::read);
  s.data = std::move(data);
  return s;
}

WorkModel memory_bound_model() {
  WorkModel m;
  m.flop_convention = "memory-bound: no FLOPs counted";
  m.baseline_description = "device-to-device copy moving the same bytes (read + write)";
  return m;
}

moekit_sparse_ffn_desc_t sparse_ffn_desc(const Shape& shape, moekit_dtype_t dtype) {
  moekit_sparse_ffn_desc_t desc;
  moekit_sparse_ffn_desc_init(&desc);
  desc.max_tokens = shape.tokens;
  desc.d_model = shape.d_model;
  desc.d_ff = shape.d_ff;
  desc.group_size = shape.group_size;
  desc.top_groups = shape.top_groups;
  desc.subsample = shape.subsample;
  desc.dtype = dtype;
  return desc;
}

TensorSpec subsample_rows_spec(const Shape& shape, uint64_t seed) {
  const int64_t groups = shape.d_ff / shape.group_size;
  std::vector<int32_t> rows(static_cast<size_t>(groups * shape.subsample));
  check_call(moekit_subsample_rows(seed, groups, shape.group_size, shape.subsample, rows.data()),
             "moekit_subsample_rows");
  return given("subsample_rows", MOEKIT_DTYPE_INT32, {groups, shape.subsample}, host_bytes(rows));
}

std::unique_ptr<Workload> make_workload(const CaseConfig& config, const Shape& shape) {
  switch (config.op) {
    case Op::router_forward:
    case Op::router_backward: return make_router_workload(config, shape);
    case Op::dispatch: return make_dispatch_workload(config, shape);
    case Op::gemm: return make_grouped_gemm_workload(config, shape);
    case Op::combine:
    case Op::broadcast_backward:
    case Op::db1:
    case Op::db2_ds: return make_reduction_workload(config, shape);
    case Op::group_select: return make_group_select_workload(config, shape);
    case Op::moe_forward:
    case Op::moe_backward:
    case Op::moe_forward_backward: return make_moe_layer_workload(config, shape);
    case Op::sparse_ffn_forward:
    case Op::sparse_ffn_backward:
    case Op::sparse_ffn_forward_backward: return make_sparse_ffn_workload(config, shape);
  }
  return nullptr;
}

}  // namespace moekit_bench
