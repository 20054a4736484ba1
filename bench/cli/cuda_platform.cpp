// The CUDA backend's platform: device memory of device 0, one non-blocking stream, CUDA events around each call,
// and CUDA-graph capture for replayed timing.
#include <cuda_runtime.h>

#include <cctype>
#include <fstream>
#include <memory>
#include <sstream>

#include "platform.h"

namespace moekit_bench {
namespace {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw CaseFailure(MOEKIT_STATUS_EXECUTION_FAILED, std::string(what) + ": " + cudaGetErrorString(status));
}

std::string version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

// The kernel driver's release ("580.95.05") from /proc/driver/nvidia/version; "" when it cannot be read.
std::string driver_release() {
  std::ifstream file("/proc/driver/nvidia/version");
  std::string line;
  if (!std::getline(file, line)) return "";
  std::istringstream words(line);
  std::string word;
  while (words >> word)
    if (!word.empty() && std::isdigit(static_cast<unsigned char>(word[0])) && word.find('.') != std::string::npos)
      return word;
  return "";
}

// Events of one timing loop, destroyed however the loop ends.
struct Events {
  std::vector<cudaEvent_t> events;
  explicit Events(size_t count) : events(count, nullptr) {
    for (auto& e : events) check_cuda(cudaEventCreate(&e), "cudaEventCreate");
  }
  ~Events() {
    for (auto e : events)
      if (e != nullptr) cudaEventDestroy(e);
  }
};

// The instantiated graphs of a capture, one per set.
struct Graphs {
  std::vector<cudaGraphExec_t> execs;
  ~Graphs() {
    for (auto e : execs) cudaGraphExecDestroy(e);
  }
};

class CudaPlatform final : public Platform {
 public:
  CudaPlatform() {
    check_cuda(cudaSetDevice(0), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaGetDeviceProperties(&prop_, 0), "cudaGetDeviceProperties");
  }
  ~CudaPlatform() override { cudaStreamDestroy(stream_); }

  moekit_backend_t backend() const override { return MOEKIT_BACKEND_CUDA; }
  moekit_device_t device() const override { return moekit_device_t{MOEKIT_DEVICE_CUDA, 0}; }
  void* stream() const override { return stream_; }

  DeviceDescription describe() const override {
    DeviceDescription d;
    d.name = prop_.name;
    d.sm_count = prop_.multiProcessorCount;
    int khz = 0;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0) == cudaSuccess) d.sm_clock_mhz = khz / 1000;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, 0) == cudaSuccess) d.memory_clock_mhz = khz / 1000;
    d.l2_bytes = static_cast<size_t>(prop_.l2CacheSize);
    d.memory_bytes = prop_.totalGlobalMem;
    int version = 0;
    d.driver = driver_release();
    if (cudaDriverGetVersion(&version) == cudaSuccess)
      d.driver += (d.driver.empty() ? "" : " ") + std::string("(CUDA ") + version_text(version) + " driver API)";
    if (cudaRuntimeGetVersion(&version) == cudaSuccess) d.cuda_runtime = version_text(version);
    return d;
  }

  void* allocate(size_t bytes) override {
    void* data = nullptr;
    const cudaError_t status = cudaMalloc(&data, bytes);
    if (status != cudaSuccess) {
      cudaGetLastError();  // an out-of-memory error is not sticky: clear it for the next case
      throw CaseFailure(status == cudaErrorMemoryAllocation ? MOEKIT_STATUS_OUT_OF_MEMORY
                                                            : MOEKIT_STATUS_EXECUTION_FAILED,
                        "cudaMalloc(" + std::to_string(bytes) + " bytes): " + cudaGetErrorString(status));
    }
    return data;
  }
  void release(void* data) noexcept override { cudaFree(data); }
  void upload(void* dst, const void* src, size_t bytes) override {
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "upload");
    synchronize();
  }
  void download(void* dst, const void* src, size_t bytes) override {
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "download");
    synchronize();
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "device copy");
  }
  void zero(void* dst, size_t bytes) override { check_cuda(cudaMemsetAsync(dst, 0, bytes, stream_), "memset"); }
  void synchronize() override { check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  size_t rotation_bytes() const override { return 2 * static_cast<size_t>(prop_.l2CacheSize); }

  std::vector<double> time_calls(const Call& call, int sets, int warmup, int iterations) override {
    for (int i = 0; i < warmup; ++i) call(i % sets);
    synchronize();
    Events events(static_cast<size_t>(iterations) + 1);
    for (int i = 0; i < iterations; ++i) {
      check_cuda(cudaEventRecord(events.events[i], stream_), "cudaEventRecord");
      call(i % sets);
    }
    check_cuda(cudaEventRecord(events.events[iterations], stream_), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(events.events[iterations]), "cudaEventSynchronize");
    std::vector<double> us(static_cast<size_t>(iterations));
    for (int i = 0; i < iterations; ++i) {
      float ms = 0;
      check_cuda(cudaEventElapsedTime(&ms, events.events[i], events.events[i + 1]), "cudaEventElapsedTime");
      us[i] = 1000.0 * ms;
    }
    return us;
  }
  std::string timing_method() const override {
    return "CUDA events around each call on one stream, GPU time; warm-up untimed";
  }

  Call capture(const Call& call, int sets) override {
    auto graphs = std::make_shared<Graphs>();
    for (int set = 0; set < sets; ++set) {
      check_cuda(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      cudaGraph_t graph = nullptr;
      try {
        call(set);
      } catch (...) {
        cudaStreamEndCapture(stream_, &graph);
        if (graph != nullptr) cudaGraphDestroy(graph);
        throw;
      }
      check_cuda(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
      cudaGraphExec_t exec = nullptr;
      const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
      cudaGraphDestroy(graph);
      check_cuda(status, "cudaGraphInstantiate");
      graphs->execs.push_back(exec);
    }
    cudaStream_t stream = stream_;
    return [graphs, stream](int set) { check_cuda(cudaGraphLaunch(graphs->execs[set], stream), "cudaGraphLaunch"); };
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaDeviceProp prop_{};
};

}  // namespace

std::unique_ptr<Platform> make_cuda_platform() { return std::make_unique<CudaPlatform>(); }

}  // namespace moekit_bench
