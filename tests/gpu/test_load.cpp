// The CUDA MoE layer under sustained load (label [load], left out of the sanitizer runs): 8 host threads, each with
// its own handle, stream and layer shape, running forward + backward for MOEKIT_LOAD_SECONDS (default 60); 1,000
// replays of a captured graph with new routing each time; one handle shared by 4 threads, one call at a time as
// the header allows. Every result is bitwise what the same call gives run alone.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "moe_device_layer.h"
#include "replay_checks.h"

using moekit_test::cuda_handle;
using moekit_test::DeviceLayer;
using moekit_test::HostTensor;
using moekit_test::LayerShape;

namespace {

double load_seconds() {
  const char* text = std::getenv("MOEKIT_LOAD_SECONDS");
  return text ? std::atof(text) : 60.0;
}

// Eight shapes: tile multiples and not, few and many experts, K from 1 to 8, T from 1 up.
const std::vector<LayerShape> kShapes = {
    {200, 128, 72, 16, 4}, {1, 64, 40, 8, 2},    {513, 256, 136, 32, 8}, {64, 128, 128, 4, 1},
    {1000, 192, 96, 64, 6}, {37, 320, 200, 8, 3}, {300, 256, 256, 16, 2}, {129, 136, 64, 128, 8}};

// A thread's inputs, drawn in turn: each comes with the results it gave when run alone.
struct Workload {
  std::unique_ptr<DeviceLayer> layer;
  std::vector<HostTensor> inputs;
  std::vector<std::vector<HostTensor>> alone;
};

constexpr int kInputs = 3;

// Draws the inputs and runs each alone (on `stream`, nothing else running) for its expected results.
void prepare(Workload& w, moekit_handle_t handle, const LayerShape& shape, uint64_t seed, cudaStream_t stream) {
  std::mt19937_64 rng(seed);
  w.layer = std::make_unique<DeviceLayer>(handle, rng, shape);
  for (int i = 0; i < kInputs; ++i) {
    HostTensor x(MOEKIT_DTYPE_BF16, {shape.tokens, shape.hidden});
    x.fill_uniform(rng, 1.0);
    w.inputs.push_back(x);
    w.layer->x.upload(x);
    MOEKIT_REQUIRE_OK(w.layer->enqueue(stream));
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    w.alone.push_back(w.layer->results());
  }
}

// What a thread saw; checked on the main thread (Catch2's assertions are not thread-safe).
struct Tally {
  int64_t runs = 0, mismatches = 0;
  moekit_status_t first_failure = MOEKIT_SUCCESS;
};

bool same_bits(const std::vector<HostTensor>& a, const std::vector<HostTensor>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (!a[i].bytes_equal(b[i])) return false;
  return true;
}

// Runs the workload's inputs in turn until `deadline`; `lock`, if set, is held around each call into the library.
void run_until(Workload& w, cudaStream_t stream, std::chrono::steady_clock::time_point deadline, std::mutex* lock,
               Tally& tally) {
  for (int64_t run = 0; std::chrono::steady_clock::now() < deadline; ++run) {
    const int i = static_cast<int>(run % kInputs);
    w.layer->x.upload(w.inputs[static_cast<size_t>(i)]);
    moekit_status_t status;
    {
      std::unique_lock<std::mutex> held;
      if (lock) held = std::unique_lock<std::mutex>(*lock);
      status = w.layer->enqueue(stream);
    }
    if (status != MOEKIT_SUCCESS) {
      if (tally.first_failure == MOEKIT_SUCCESS) tally.first_failure = status;
      return;
    }
    cudaStreamSynchronize(stream);
    if (!same_bits(w.layer->results(), w.alone[static_cast<size_t>(i)])) ++tally.mismatches;
    ++tally.runs;
  }
}

// `threads` workloads on their own streams, handle i % handles.size(), the calls of a shared handle serialised.
void require_load_like_alone(std::vector<moekit_handle_t> handles, size_t threads, double seconds) {
  std::vector<cudaStream_t> streams(threads);
  for (cudaStream_t& s : streams) CUDA_REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<Workload> work(threads);
  for (size_t i = 0; i < threads; ++i)
    prepare(work[i], handles[i % handles.size()], kShapes[i % kShapes.size()], 500 + i, streams[i]);
  std::vector<std::mutex> locks(handles.size());
  const bool shared = handles.size() < threads;
  std::vector<Tally> tallies(threads);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                              std::chrono::duration<double>(seconds));
  std::vector<std::thread> pool;
  for (size_t i = 0; i < threads; ++i)
    pool.emplace_back(run_until, std::ref(work[i]), streams[i], deadline, shared ? &locks[i % handles.size()] : nullptr,
                      std::ref(tallies[i]));
  for (std::thread& t : pool) t.join();
  int64_t total = 0;
  for (size_t i = 0; i < threads; ++i) {
    const LayerShape& s = kShapes[i % kShapes.size()];
    INFO("thread " << i << ": T " << s.tokens << " H " << s.hidden << " I " << s.inter << " E " << s.experts << " K "
                   << s.top_k << ", " << tallies[i].runs << " runs");
    REQUIRE(tallies[i].first_failure == MOEKIT_SUCCESS);
    REQUIRE(tallies[i].mismatches == 0);
    REQUIRE(tallies[i].runs > 0);
    total += tallies[i].runs;
  }
  WARN(threads << " threads, " << handles.size() << " handle(s): " << total << " forward + backward runs in "
               << seconds << " s, every one bitwise as alone");
  work.clear();
  for (cudaStream_t s : streams) cudaStreamDestroy(s);
}

}  // namespace

TEST_CASE("load: 8 threads with own handles and streams, 8 shapes, MOEKIT_LOAD_SECONDS long, bitwise as alone",
          "[gpu][layer][load]") {
  std::vector<moekit_handle_t> handles;
  for (int i = 0; i < 8; ++i) handles.push_back(cuda_handle());
  require_load_like_alone(handles, 8, load_seconds());
  for (moekit_handle_t h : handles) moekit_handle_destroy(h);
}

TEST_CASE("one handle shared by 4 threads, one call at a time: bitwise as alone", "[gpu][layer][load]") {
  moekit_handle_t handle = cuda_handle();
  require_load_like_alone({handle}, 4, load_seconds() / 4);
  moekit_handle_destroy(handle);
}

TEST_CASE("1,000 replays of a captured forward + backward, new routing each time, bitwise as stream calls",
          "[gpu][layer][load][graph]") {
  moekit_handle_t handle = cuda_handle();
  std::mt19937_64 rng(22);
  {
    DeviceLayer layer(handle, rng);
    moekit_test::require_graph_replays_like_stream_calls(layer, rng, 1000);
  }
  moekit_handle_destroy(handle);
}
