#include "src/cuda_backend/cuda_backend.h"

#include <cuda_runtime.h>

#include <string>

#include "cuda/common/cuda_check.h"
#include "cuda/dispatch/dispatch_layout.h"
#include "cuda/reduce/bias_sums.h"
#include "cuda/sparse_ffn/group_select_workspace.h"
#include "cuda/routing/aux_losses.h"
#include "cuda/routing/router.h"
#include "cuda/common/status_error.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

CudaBackend::CudaBackend(int device_index, bool validate) : device_index_(device_index) {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    // NOTE: clears the error, so a later CUDA call of the caller does not see it.
    cudaGetLastError();
    throw_not_supported(std::string("device_index: no CUDA device available (") + cudaGetErrorString(status) + ")");
  }
  if (count == 0) throw_not_supported("device_index: no CUDA device available (the driver reports 0 devices)");
  if (device_index >= count)
    throw_invalid("device_index: " + std::to_string(device_index) + " is past the last CUDA device (" +
                  std::to_string(count) + " present)");
  cudaDeviceProp prop{};
  status = cudaGetDeviceProperties(&prop, device_index);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw_not_supported("device_index: cannot query CUDA device " + std::to_string(device_index) + " (" +
                        cudaGetErrorString(status) + ")");
  }
  if (prop.major != 9)
    throw_not_supported("device_index: CUDA device " + std::to_string(device_index) + " (" + prop.name +
                        ") has compute capability " + std::to_string(prop.major) + "." + std::to_string(prop.minor) +
                        "; the CUDA backend needs 9.x (Hopper, sm_90)");
  facts_ = DeviceFacts{prop.multiProcessorCount, prop.major, prop.minor, static_cast<int>(prop.sharedMemPerBlockOptin)};
  if (validate) allocate_record();
}

CudaBackend::~CudaBackend() {
  // NOTE: a destructor cannot report; a failed free leaves the words to the process's teardown.
  if (device_record_ != nullptr) cudaFree(device_record_);
  if (host_record_ != nullptr) cudaFreeHost(host_record_);
}

void CudaBackend::plan_sizes(moekit_plan& plan) const {
  plan.workspace_bytes = plan.forward_workspace_bytes = plan.backward_workspace_bytes = 0;
  plan.saved_bytes = 0;
  if (plan.kind == OpKind::router) {
    if (plan.router.experts > routing::max_router_experts)
      throw_not_supported("experts: the CUDA router holds at most " + std::to_string(routing::max_router_experts) +
                          " experts per row, got " + std::to_string(plan.router.experts));
    plan.workspace_bytes =
        routing::router_workspace_bytes(plan.router.max_tokens, plan.router.experts, facts_.sm_count);
    if (plan.router.load_balance_coeff != 0 || plan.router.z_loss_coeff != 0)
      plan.workspace_bytes =
          routing::aux_loss_layout(plan.workspace_bytes, plan.router.max_tokens, plan.router.experts).end;
  }
  if (plan.kind == OpKind::gemm)
    plan_grouped_gemm(plan, GemmDevice{facts_.sm_count, facts_.cc_major, facts_.cc_minor});
  if (plan.kind == OpKind::dispatch)
    plan.workspace_bytes = dispatch_layout(plan.dispatch.experts, plan.dispatch.max_pairs).workspace_bytes;
  if (plan.kind == OpKind::group_select)
    plan.workspace_bytes = sparse_ffn::group_select_layout(plan.sparse_ffn).total_bytes;
  if (plan.kind == OpKind::moe_layer) moe_layer_sizes(plan);
  if (plan.kind == OpKind::experts) experts_layer_sizes(plan);
  if (plan.kind == OpKind::token_experts) token_experts_sizes(plan);
  if (plan.kind == OpKind::sparse_ffn_layer) sparse_ffn_layer_sizes(plan);
  if (plan.kind == OpKind::bias_grad)
    plan.workspace_bytes =
        reduce::bias_sums_layout(plan.bias_grad.experts, plan.bias_grad.max_rows, plan.bias_grad.width).bytes;
  if (!is_layer(plan.kind)) plan.forward_workspace_bytes = plan.backward_workspace_bytes = plan.workspace_bytes;
}

std::string CudaBackend::describe(const moekit_plan& plan) const {
  std::string text = plan_summary(plan) + ": CUDA device " + std::to_string(device_index_) + " (" +
                     std::to_string(facts_.sm_count) + " SMs)";
  if (plan.kind == OpKind::gemm) text += ", " + describe_gemm_config(plan.gemm, plan.gemm_config);
  if (plan.sub_plans)
    for (const auto& [name, sub] : plan.sub_plans->list()) {
      text += std::string("\n  ") + name + ": " + plan_summary(*sub);
      if (sub->kind == OpKind::gemm) text += ", " + describe_gemm_config(sub->gemm, sub->gemm_config);
    }
  return text;
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
