// Checks shared by the layer tests that run a layer the way frameworks do: a forward + backward captured once in a
// CUDA graph and replayed with new inputs (so new routing: per-expert or per-group counts must live on the device,
// not be baked into the graph), and two handles on two host threads and two streams at once. Every result must be
// bitwise what plain stream calls give for the same inputs.
//
// A Layer provides: `moekit_status_t enqueue(cudaStream_t)` (forward + backward, capturable, no Catch2 assertion:
// host threads call it), `std::vector<HostTensor> results() const` and `void new_input(std::mt19937_64&)`.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "gpu_util.h"

namespace moekit_test {

inline moekit_handle_t cuda_handle() {
  moekit_handle_desc_t hd;
  moekit_handle_desc_init(&hd);
  hd.backend = MOEKIT_BACKEND_CUDA;
  moekit_handle_t h = nullptr;
  MOEKIT_REQUIRE_OK(moekit_handle_create(&hd, &h));
  return h;
}

inline void require_bitwise_same(const std::vector<HostTensor>& a, const std::vector<HostTensor>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const std::vector<double> va = a[i].values(), vb = b[i].values();
    int64_t differing = 0, first = -1;
    for (size_t j = 0; j < va.size(); ++j)
      if (!(va[j] == vb[j]) && !(std::isnan(va[j]) && std::isnan(vb[j]))) {
        if (first < 0) first = static_cast<int64_t>(j);
        ++differing;
      }
    INFO("result " << i << ": " << differing << " of " << va.size() << " elements differ, the first at " << first);
    REQUIRE(a[i].bytes_equal(b[i]));
  }
}

template <class Layer>
void require_graph_replays_like_stream_calls(Layer& layer, std::mt19937_64& rng, int replays = 3) {
  cudaStream_t stream = nullptr;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Plan and algorithm choices are made on the first call; capture the second.
  MOEKIT_REQUIRE_OK(layer.enqueue(stream));
  CUDA_REQUIRE(cudaStreamSynchronize(stream));
  cudaGraph_t graph = nullptr;
  CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  MOEKIT_REQUIRE_OK(layer.enqueue(stream));
  CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));

  std::vector<HostTensor> previous = layer.results();
  for (int replay = 0; replay < replays; ++replay) {
    INFO("replay " << replay);
    layer.new_input(rng);
    CUDA_REQUIRE(cudaGraphLaunch(exec, stream));
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    const std::vector<HostTensor> replayed = layer.results();
    REQUIRE(!replayed[0].bytes_equal(previous[0]));  // the replay computed something new
    MOEKIT_REQUIRE_OK(layer.enqueue(stream));
    CUDA_REQUIRE(cudaStreamSynchronize(stream));
    require_bitwise_same(replayed, layer.results());
    previous = replayed;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// `first` and `second` were made on two different handles.
template <class Layer>
void require_two_threads_like_alone(Layer& first, Layer& second) {
  cudaStream_t streams[2] = {};
  for (cudaStream_t& s : streams) CUDA_REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Layer* layers[2] = {&first, &second};
  std::vector<HostTensor> alone[2];
  for (int i = 0; i < 2; ++i) {
    MOEKIT_REQUIRE_OK(layers[i]->enqueue(streams[i]));
    CUDA_REQUIRE(cudaStreamSynchronize(streams[i]));
    alone[i] = layers[i]->results();
  }
  // NOTE: Catch2's assertions are not thread-safe: the threads only record statuses; the main thread checks.
  moekit_status_t statuses[2][5] = {};
  auto work = [&](int i) {
    for (moekit_status_t& status : statuses[i]) status = layers[i]->enqueue(streams[i]);
    cudaStreamSynchronize(streams[i]);
  };
  std::thread t0(work, 0), t1(work, 1);
  t0.join();
  t1.join();
  for (int i = 0; i < 2; ++i) {
    for (moekit_status_t s : statuses[i]) REQUIRE(s == MOEKIT_SUCCESS);
    require_bitwise_same(alone[i], layers[i]->results());
  }
  for (cudaStream_t s : streams) cudaStreamDestroy(s);
}

}  // namespace moekit_test
