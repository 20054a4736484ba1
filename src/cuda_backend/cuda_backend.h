// The CUDA backend (sm_90): creating one checks that the device exists and is a Hopper GPU. A shape or dtype its
// kernels do not serve reports NOT_SUPPORTED, so a framework falls back to another path.
#pragma once

#include <string>

#include "cuda/gemm/gemm_config.h"
#include "src/backend.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

// The device facts the kernels' launches read, queried once when the handle is created.
struct DeviceFacts {
  int sm_count;
  int cc_major, cc_minor;
  int shared_bytes_optin;  // the most dynamic shared memory one block may opt in to
};

class CudaBackend final : public Backend {
 public:
  // Throws NOT_SUPPORTED when no CUDA device is usable or device `device_index` is not compute capability 9.x,
  // INVALID_VALUE when device_index is past the last device. `validate` (MOEKIT_HANDLE_VALIDATE): allocates the
  // failure record of the value checks, one word of device and one of pinned host memory.
  CudaBackend(int device_index, bool validate);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;
  moekit_device_t device() const override { return moekit_device_t{MOEKIT_DEVICE_CUDA, device_index_}; }

  void plan_sizes(moekit_plan& plan) const override;
  std::string describe(const moekit_plan& plan) const override;
  // validation_ops.cpp
  uint64_t check_values(const std::vector<ValueCheck>& checks, uint32_t first_check, void* stream) override;

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

 private:
  // plan_sizes of a MoE layer plan (moe_layer_ops.cpp): the building blocks' plans sized, then the workspace and
  // saved sections laid out.
  void moe_layer_sizes(moekit_plan& plan) const;
  void experts_layer_sizes(moekit_plan& plan) const;     // experts_layer_ops.cpp
  void sparse_ffn_layer_sizes(moekit_plan& plan) const;  // sparse_ffn_layer_ops.cpp
  void token_experts_sizes(moekit_plan& plan) const;     // token_experts_ops.cpp
  void allocate_record();                                // validation_ops.cpp

  int device_index_;
  DeviceFacts facts_;
  unsigned long long* device_record_ = nullptr;  // the value checks' first failure (validation only)
  unsigned long long* host_record_ = nullptr;    // pinned: where it is read back
};

// plan_sizes of a grouped GEMM plan (src/cuda_backend/gemm_ops.cpp): NOT_SUPPORTED for what the kernels cannot take,
// else the configuration (plan.gemm_config) and its workspace size.
void plan_grouped_gemm(moekit_plan& plan, const GemmDevice& device);

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
