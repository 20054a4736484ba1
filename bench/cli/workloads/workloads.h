// The workload of each operation family (see workload.h); make_workload() in factory.cpp picks one by op.
#pragma once

#include <memory>

#include "workload.h"

namespace moekit_bench {

std::unique_ptr<Workload> make_router_workload(const CaseConfig& config, const Shape& shape);
std::unique_ptr<Workload> make_dispatch_workload(const CaseConfig& config, const Shape& shape);
std::unique_ptr<Workload> make_grouped_gemm_workload(const CaseConfig& config, const Shape& shape);
std::unique_ptr<Workload> make_reduction_workload(const CaseConfig& config, const Shape& shape);
std::unique_ptr<Workload> make_group_select_workload(const CaseConfig& config, const Shape& shape);
std::unique_ptr<Workload> make_moe_layer_workload(const CaseConfig& config, const Shape& shape);
std::unique_ptr<Workload> make_sparse_ffn_workload(const CaseConfig& config, const Shape& shape);

// Shared by the workloads: a tensor spec in one line, and the fixed texts of the memory-bound model.
TensorSpec spec(std::string name, moekit_dtype_t dtype, std::vector<int64_t> shape, Access access, float scale = 0.0f,
                Compare compare = Compare::none);
// A read-only input with fixed contents (routing metadata), the same in every set.
TensorSpec given(std::string name, moekit_dtype_t dtype, std::vector<int64_t> shape,
                 std::shared_ptr<const std::vector<unsigned char>> data);
WorkModel memory_bound_model();
// The sparse FFN description of a shape (group selection and the layer).
moekit_sparse_ffn_desc_t sparse_ffn_desc(const Shape& shape, moekit_dtype_t dtype);
// The sparse FFN's fixed energy subsample [F/G, spg] (moekit_subsample_rows, from the case's seed).
TensorSpec subsample_rows_spec(const Shape& shape, uint64_t seed);

}  // namespace moekit_bench
