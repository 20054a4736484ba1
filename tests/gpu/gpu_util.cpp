#include "gpu/gpu_util.h"

#include <cstring>
#include <stdexcept>
#include <utility>

namespace moekit_test {

namespace {
void throw_on_error(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}
}  // namespace

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) throw_on_error(cudaMalloc(&data_, bytes), "cudaMalloc");
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceTensor::DeviceTensor(const HostTensor& host)
    : dtype_(host.dtype()),
      shape_(host.shape()),
      buffer_(static_cast<size_t>(host.numel()) * dtype_size(host.dtype())) {
  upload(host);
}

moekit_tensor_t DeviceTensor::view() {
  moekit_device_t device{MOEKIT_DEVICE_CUDA, 0};
  return moekit_tensor_make(buffer_.data(), dtype_, static_cast<int32_t>(shape_.size()), shape_.data(), device);
}

void DeviceTensor::upload(const HostTensor& host) {
  throw_on_error(cudaMemcpy(buffer_.data(), host.data(), buffer_.bytes(), cudaMemcpyHostToDevice), "upload");
  // NOTE: a pageable cudaMemcpy may return before its DMA lands, and the library runs on streams that do not wait
  // for the legacy one: the copy is finished here, so a tensor is ready for any stream once constructed.
  throw_on_error(cudaStreamSynchronize(nullptr), "upload");
}

HostTensor DeviceTensor::download() const {
  HostTensor host(dtype_, shape_);
  throw_on_error(cudaMemcpy(host.data(), buffer_.data(), buffer_.bytes(), cudaMemcpyDeviceToHost), "download");
  return host;
}

Handles::Handles() {
  moekit_handle_desc_t desc;
  moekit_handle_desc_init(&desc);
  desc.backend = MOEKIT_BACKEND_REFERENCE;
  if (moekit_handle_create(&desc, &reference) != MOEKIT_SUCCESS)
    throw std::runtime_error("reference handle: " + last_error());
  desc.backend = MOEKIT_BACKEND_CUDA;
  if (moekit_handle_create(&desc, &cuda) != MOEKIT_SUCCESS) throw std::runtime_error("CUDA handle: " + last_error());
}

Handles::~Handles() {
  moekit_handle_destroy(cuda);
  moekit_handle_destroy(reference);
}

size_t l2_cache_bytes() {
  int bytes = 0;
  cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, 0);
  return static_cast<size_t>(bytes);
}

}  // namespace moekit_test
