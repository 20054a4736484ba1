// The reference backend's platform: 256-byte aligned host memory and wall-clock timing of synchronous calls.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <thread>

#include "platform.h"

namespace moekit_bench {
namespace {

std::string cpu_model_name() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
  }
  return "unknown CPU";
}

class HostPlatform final : public Platform {
 public:
  explicit HostPlatform(int threads) : threads_(threads) {}

  moekit_backend_t backend() const override { return MOEKIT_BACKEND_REFERENCE; }
  moekit_device_t device() const override { return moekit_device_t{MOEKIT_DEVICE_CPU, 0}; }
  void* stream() const override { return nullptr; }

  DeviceDescription describe() const override {
    DeviceDescription d;
    d.name = cpu_model_name();
    d.threads = threads_ > 0 ? threads_ : static_cast<int>(std::thread::hardware_concurrency());
    return d;
  }

  void* allocate(size_t bytes) override {
    void* data = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (data == nullptr) throw CaseFailure(MOEKIT_STATUS_OUT_OF_MEMORY, "out of host memory");
    return data;
  }
  void release(void* data) noexcept override { std::free(data); }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void zero(void* dst, size_t bytes) override { std::memset(dst, 0, bytes); }
  void synchronize() override {}
  size_t rotation_bytes() const override { return 0; }

  std::vector<double> time_calls(const Call& call, int sets, int warmup, int iterations) override {
    for (int i = 0; i < warmup; ++i) call(i % sets);
    std::vector<double> us;
    us.reserve(static_cast<size_t>(iterations));
    for (int i = 0; i < iterations; ++i) {
      const auto start = std::chrono::steady_clock::now();
      call(i % sets);
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    }
    return us;
  }
  std::string timing_method() const override { return "wall clock (std::chrono::steady_clock) around each call"; }

  Call capture(const Call&, int) override { return nullptr; }

 private:
  int threads_;
};

}  // namespace

std::unique_ptr<Platform> make_host_platform(int threads) { return std::make_unique<HostPlatform>(threads); }

}  // namespace moekit_bench
