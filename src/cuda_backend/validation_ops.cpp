// MOEKIT_HANDLE_VALIDATE on a CUDA handle: the call's value checks as kernels (cuda/validation/) on its stream, each
// lowering one failure record in device memory, which is read back with one synchronisation.
#include <cuda_runtime.h>

#include <vector>

#include "cuda/common/cuda_check.h"
#include "cuda/common/status_error.h"
#include "cuda/common/value_check_code.h"
#include "cuda/validation/value_checks.h"
#include "src/cuda_backend/cuda_backend.h"

namespace moekit {
inline namespace v0 {
namespace cuda {

namespace {

validation::CheckView check_view(const moekit_tensor_t& t) {
  validation::CheckView v{};
  v.data = t.data;
  v.dtype = t.dtype;
  v.rank = t.rank;
  for (int32_t i = 0; i < MOEKIT_MAX_RANK; ++i) {
    v.shape[i] = t.shape[i];
    v.stride[i] = t.stride[i];
  }
  return v;
}

bool has_elements(const moekit_tensor_t& t) {
  for (int32_t i = 0; i < t.rank; ++i)
    if (t.shape[i] == 0) return false;
  return t.data != nullptr && t.rank > 0;
}

}  // namespace

void CudaBackend::allocate_record() {
  int current = 0;
  check_cuda(cudaGetDevice(&current), "cudaGetDevice");
  check_cuda(cudaSetDevice(device_index_), "cudaSetDevice");
  const cudaError_t device = cudaMalloc(&device_record_, sizeof(unsigned long long));
  const cudaError_t host = cudaMallocHost(&host_record_, sizeof(unsigned long long));
  cudaSetDevice(current);
  if (device != cudaSuccess || host != cudaSuccess) {
    cudaGetLastError();
    if (device_record_ != nullptr) cudaFree(device_record_);
    if (host_record_ != nullptr) cudaFreeHost(host_record_);
    throw Error(MOEKIT_STATUS_OUT_OF_MEMORY, "flags: MOEKIT_HANDLE_VALIDATE could not allocate its failure record");
  }
}

uint64_t CudaBackend::check_values(const std::vector<ValueCheck>& checks, uint32_t first_check, void* stream) {
  const cudaStream_t s = as_stream(stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(s, &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone)
    throw_not_supported(
        "stream: is being captured; a handle made with MOEKIT_HANDLE_VALIDATE synchronises every call, which a "
        "CUDA graph cannot hold (capture with a handle made without the flag)");
  check_cuda(cudaMemsetAsync(device_record_, 0xff, sizeof(unsigned long long), s), "cudaMemsetAsync");
  for (size_t i = 0; i < checks.size(); ++i) {
    const ValueCheck& c = checks[i];
    if (!has_elements(c.tensor)) continue;
    validation::DeviceCheck d{};
    d.tensor = check_view(c.tensor);
    d.id = first_check + static_cast<uint32_t>(i);
    d.rule = static_cast<int32_t>(c.rule);
    d.lo = c.lo;
    d.hi = c.hi;
    d.shift = c.shift;
    d.rows_bound = c.rows.data != nullptr ? static_cast<const int32_t*>(c.rows.data) + c.rows_entry * c.rows.stride[0]
                                          : nullptr;
    d.via = check_view(c.via);
    cudaError_t launched = cudaSuccess;
    switch (c.rule) {
      case ValueRule::finite:
      case ValueRule::finite_or_masked: launched = validation::launch_check_finite(d, device_record_, s); break;
      case ValueRule::index_range: launched = validation::launch_check_index_range(d, device_record_, s); break;
      case ValueRule::offsets: launched = validation::launch_check_offsets(d, device_record_, s); break;
    }
    check_cuda(launched, "value check kernel");
  }
  check_cuda(cudaMemcpyAsync(host_record_, device_record_, sizeof(unsigned long long), cudaMemcpyDeviceToHost, s),
             "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  return *host_record_;
}

}  // namespace cuda
}  // namespace v0
}  // namespace moekit
