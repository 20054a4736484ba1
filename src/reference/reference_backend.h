// The reference (CPU) backend: docs/math.md computed on host memory in float64, rounded at its section 8's points.
// Its methods live in one file per operation family (router.cpp, dispatch.cpp, reduce.cpp, group_select.cpp,
// gemm.cpp, moe_layer.cpp, experts_layer.cpp, token_experts_layer.cpp, sparse_ffn_layer.cpp, plan_sizes.cpp, value_checks.cpp).
#pragma once

#include <string>

#include "src/backend.h"

namespace moekit {
inline namespace v0 {
namespace ref {

class ReferenceBackend final : public Backend {
 public:
  explicit ReferenceBackend(int num_threads);
  moekit_device_t device() const override { return moekit_device_t{MOEKIT_DEVICE_CPU, 0}; }

  void plan_sizes(moekit_plan& plan) const override;
  std::string describe(const moekit_plan& plan) const override;
  uint64_t check_values(const std::vector<ValueCheck>& checks, uint32_t first_check, void*) override;

  void router_forward(const moekit_plan&, const moekit_router_fwd_args_t&, Workspace, void*) override;
  void router_backward(const moekit_plan&, const moekit_router_bwd_args_t&, Workspace, void*) override;
  void dispatch(const moekit_plan&, const moekit_dispatch_args_t&, Workspace, void*) override;
  void gemm(const moekit_plan&, const moekit_gemm_args_t&, Workspace, void*) override;
  void combine(const moekit_plan&, const moekit_combine_args_t&, Workspace, void*) override;
  void db1(const moekit_plan&, const moekit_db1_args_t&, Workspace, void*) override;
  void db2_ds(const moekit_plan&, const moekit_db2_ds_args_t&, Workspace, void*) override;
  void group_select(const moekit_plan&, const moekit_group_select_args_t&, Workspace, void*) override;
  void load_balance_update(const moekit_load_balance_args_t&, void*) override;

  void moe_forward(const moekit_plan&, const moekit_moe_fwd_args_t&, void* saved, Workspace, void*) override;
  void moe_backward(const moekit_plan&, const moekit_moe_bwd_args_t&, const void* saved, Workspace, void*) override;
  void experts_forward(const moekit_plan&, const moekit_experts_fwd_args_t&, void* saved, Workspace, void*) override;
  void experts_backward(const moekit_plan&, const moekit_experts_bwd_args_t&, const void* saved, Workspace,
                        void*) override;
  void token_experts_forward(const moekit_plan&, const moekit_token_experts_fwd_args_t&, void* saved, Workspace,
                             void*) override;
  void token_experts_backward(const moekit_plan&, const moekit_token_experts_bwd_args_t&, const void* saved,
                              Workspace, void*) override;
  void sparse_ffn_forward(const moekit_plan&, const moekit_sparse_ffn_fwd_args_t&, void* saved, Workspace,
                          void*) override;
  void sparse_ffn_backward(const moekit_plan&, const moekit_sparse_ffn_bwd_args_t&, const void* saved, Workspace,
                           void*) override;
};

}  // namespace ref
}  // namespace v0
}  // namespace moekit
