// Where a benchmark runs: host memory and the wall clock for the reference backend, device memory, a stream and
// CUDA events for the CUDA backend. Everything the measurement does with memory and time goes through this.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "moekit/moekit.h"

namespace moekit_bench {

// A failure that ends one case (out of memory, a CUDA error, a library call that failed); the run goes on with
// the next case. `status` is the library's status when a moekit call failed, else MOEKIT_STATUS_EXECUTION_FAILED.
class CaseFailure : public std::runtime_error {
 public:
  CaseFailure(moekit_status_t status, const std::string& message) : std::runtime_error(message), status(status) {}
  moekit_status_t status;
};

// Throws CaseFailure with the library's last error unless `status` is MOEKIT_SUCCESS.
void check_call(moekit_status_t status, const char* what);

// One call of a case on input set `set` (the sets rotate so no call finds the previous call's data in cache).
using Call = std::function<void(int set)>;

// What the device is, for the results' meta block.
struct DeviceDescription {
  std::string name;
  int sm_count = 0;          // CUDA; 0 on the host
  int threads = 0;           // reference backend worker threads (0 on CUDA)
  int sm_clock_mhz = 0;      // peak clocks as the driver reports them
  int memory_clock_mhz = 0;
  size_t l2_bytes = 0;
  size_t memory_bytes = 0;
  std::string driver;        // CUDA driver version ("" on the host)
  std::string cuda_runtime;  // CUDA runtime version ("" on the host)
};

class Platform {
 public:
  virtual ~Platform() = default;

  virtual moekit_backend_t backend() const = 0;
  virtual moekit_device_t device() const = 0;
  virtual void* stream() const = 0;  // the cudaStream_t every call goes on (NULL on the host)
  virtual DeviceDescription describe() const = 0;

  // Memory that moekit calls on this platform read and write, aligned to 256 bytes. allocate throws CaseFailure.
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* data) noexcept = 0;
  virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void download(void* host_dst, const void* src, size_t bytes) = 0;  // waits for the stream first
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;           // within the platform's memory
  virtual void zero(void* dst, size_t bytes) = 0;
  virtual void synchronize() = 0;

  // How many bytes a working set must exceed so that rotating through copies defeats the cache (2x the L2 size
  // on a GPU); 0 where inputs are not rotated (the reference backend).
  virtual size_t rotation_bytes() const = 0;

  // Runs call(i % sets) `warmup` times untimed, then `iterations` times, each timed on its own; returns the
  // per-call times in microseconds, in call order.
  virtual std::vector<double> time_calls(const Call& call, int sets, int warmup, int iterations) = 0;
  virtual std::string timing_method() const = 0;

  // CUDA graphs: captures call(set) for every set once and returns a call that replays the captured graph of a set.
  // Platforms without graphs return nullptr.
  virtual Call capture(const Call& call, int sets) = 0;
};

// The reference backend's platform: host memory, std::chrono::steady_clock.
std::unique_ptr<Platform> make_host_platform(int threads);
#ifdef MOEKIT_BENCH_WITH_CUDA
// The CUDA backend's platform on device 0 (cuda_platform.cpp); throws CaseFailure when no device is usable.
std::unique_ptr<Platform> make_cuda_platform();
#endif

// Owns `bytes` of a platform's memory.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Platform& platform, size_t bytes) : platform_(&platform), bytes_(bytes) {
    data_ = bytes > 0 ? platform.allocate(bytes) : nullptr;
  }
  ~Buffer() {
    if (data_ != nullptr) platform_->release(data_);
  }
  Buffer(Buffer&& other) noexcept { swap(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    swap(other);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void swap(Buffer& other) noexcept {
    std::swap(platform_, other.platform_);
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
  }
  Platform* platform_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace moekit_bench
