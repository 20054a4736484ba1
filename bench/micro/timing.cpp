#include "timing.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>

#include "src/numeric.h"

namespace moekit_bench {

void check(moekit_status_t status, const char* what) {
  if (status == MOEKIT_SUCCESS) return;
  char message[512];
  moekit_get_last_error(message, sizeof message);
  std::fprintf(stderr, "%s failed: %s: %s\n", what, moekit_status_string(status), message);
  std::exit(1);
}

void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
  std::exit(1);
}

moekit_handle_t cuda_handle() {
  moekit_handle_desc_t desc;
  moekit_handle_desc_init(&desc);
  desc.backend = MOEKIT_BACKEND_CUDA;
  moekit_handle_t handle = nullptr;
  check(moekit_handle_create(&desc, &handle), "moekit_handle_create");
  return handle;
}

moekit_tensor_t device_tensor(void* data, moekit_dtype_t dtype, std::vector<int64_t> shape) {
  return moekit_tensor_make(data, dtype, static_cast<int32_t>(shape.size()), shape.data(),
                            moekit_device_t{MOEKIT_DEVICE_CUDA, 0});
}

Timing time_calls(const std::function<void(int)>& run, int sets, void* stream_ptr, int warmup, int runs) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  for (int i = 0; i < warmup; ++i) run(i % sets);
  check(cudaStreamSynchronize(stream), "warm-up");
  std::vector<cudaEvent_t> events(static_cast<size_t>(runs) + 1);
  for (auto& e : events) check(cudaEventCreate(&e), "cudaEventCreate");
  for (int i = 0; i < runs; ++i) {
    check(cudaEventRecord(events[static_cast<size_t>(i)], stream), "cudaEventRecord");
    run(i % sets);
  }
  check(cudaEventRecord(events[static_cast<size_t>(runs)], stream), "cudaEventRecord");
  check(cudaEventSynchronize(events[static_cast<size_t>(runs)]), "cudaEventSynchronize");
  std::vector<double> us(static_cast<size_t>(runs));
  for (int i = 0; i < runs; ++i) {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, events[static_cast<size_t>(i)], events[static_cast<size_t>(i) + 1]), "elapsed");
    us[static_cast<size_t>(i)] = 1000.0 * ms;
  }
  for (auto& e : events) cudaEventDestroy(e);
  std::sort(us.begin(), us.end());
  return Timing{us[us.size() / 2], us.front(), us.back(), runs};
}

int rotation_sets(size_t bytes) {
  int l2 = 0;
  cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0);
  size_t needed = 2 * static_cast<size_t>(l2) / std::max<size_t>(bytes, 1) + 1;
  return static_cast<int>(std::min<size_t>(std::max<size_t>(needed, 2), 64));
}

double measured_copy_tbps(size_t bytes, void* stream) {
  void* src = nullptr;
  void* dst = nullptr;
  check(cudaMalloc(&src, bytes), "cudaMalloc");
  check(cudaMalloc(&dst, bytes), "cudaMalloc");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  Timing t = time_calls([&](int) { check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s), "copy"); }, 1,
                        stream, 5, 50);
  cudaFree(src);
  cudaFree(dst);
  return 2.0 * static_cast<double>(bytes) / (t.median_us * 1e-6) / 1e12;
}

std::string format_row(const std::string& name, const Timing& t, const std::string& rate) {
  char line[512];
  std::snprintf(line, sizeof line, "%-48s %10.2f %10.2f %10.2f  %s", name.c_str(), t.median_us, t.min_us, t.max_us,
                rate.c_str());
  return line;
}

void fill_random_bf16(void* device, size_t count, float scale, unsigned long long seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<uint16_t> host(count);
  for (auto& v : host) v = moekit::float_to_bf16(dist(rng));
  check(cudaMemcpy(device, host.data(), count * 2, cudaMemcpyHostToDevice), "upload");
}

void fill_random_bf16_repeated(void* device, size_t count, float scale, unsigned long long seed) {
  const size_t tile = std::min<size_t>(count, size_t{4} << 20);
  fill_random_bf16(device, tile, scale, seed);
  for (size_t done = tile; done < count; done += tile)
    check(cudaMemcpy(static_cast<uint16_t*>(device) + done, device, std::min(tile, count - done) * 2,
                     cudaMemcpyDeviceToDevice),
          "replicate");
}

Routing random_routing(int64_t tokens, int64_t experts, int64_t top_k, unsigned long long seed) {
  std::mt19937_64 rng(seed);
  const int64_t pairs = tokens * top_k;
  std::vector<int32_t> expert(static_cast<size_t>(pairs));
  std::vector<int32_t> ids(static_cast<size_t>(experts));
  std::iota(ids.begin(), ids.end(), 0);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t k = 0; k < top_k; ++k) {
      std::uniform_int_distribution<int64_t> pick(k, experts - 1);
      std::swap(ids[static_cast<size_t>(k)], ids[static_cast<size_t>(pick(rng))]);
      expert[static_cast<size_t>(t * top_k + k)] = ids[static_cast<size_t>(k)];
    }
  }
  Routing r;
  r.offsets.assign(static_cast<size_t>(experts + 1), 0);
  for (int32_t e : expert) ++r.offsets[static_cast<size_t>(e + 1)];
  for (int64_t e = 0; e < experts; ++e) r.offsets[static_cast<size_t>(e + 1)] += r.offsets[static_cast<size_t>(e)];
  std::vector<int32_t> next(r.offsets.begin(), r.offsets.end() - 1);
  r.gather_idx.resize(static_cast<size_t>(pairs));
  r.pair_idx.resize(static_cast<size_t>(pairs));
  r.grouped_pos.resize(static_cast<size_t>(pairs));
  for (int64_t p = 0; p < pairs; ++p) {
    const int32_t i = next[static_cast<size_t>(expert[static_cast<size_t>(p)])]++;
    r.gather_idx[static_cast<size_t>(i)] = static_cast<int32_t>(p / top_k);
    r.pair_idx[static_cast<size_t>(i)] = static_cast<int32_t>(p);
    r.grouped_pos[static_cast<size_t>(p)] = i;
  }
  return r;
}

}  // namespace moekit_bench
