// The CUDA MoE layer under the ways frameworks run it (tests/gpu/replay_checks.h): a forward + backward captured
// once in a CUDA graph and replayed with different inputs, so different routing each time, and two handles on two
// host threads and two streams at once; every result bitwise what plain stream calls give.
#include <catch2/catch.hpp>

#include <random>

#include "moe_device_layer.h"
#include "replay_checks.h"

using moekit_test::cuda_handle;
using moekit_test::DeviceLayer;

TEST_CASE("a captured forward + backward replays with new routing each time, bitwise as stream calls",
          "[gpu][layer][graph][sanitize]") {
  moekit_handle_t handle = cuda_handle();
  std::mt19937_64 rng(21);
  {
    DeviceLayer layer(handle, rng);
    moekit_test::require_graph_replays_like_stream_calls(layer, rng);
  }
  moekit_handle_destroy(handle);
}

TEST_CASE("two handles on two host threads and two streams give what each gives alone",
          "[gpu][layer][threads][sanitize]") {
  std::mt19937_64 rng(33);
  moekit_handle_t handles[2] = {cuda_handle(), cuda_handle()};
  {
    DeviceLayer first(handles[0], rng), second(handles[1], rng);
    moekit_test::require_two_threads_like_alone(first, second);
  }
  for (moekit_handle_t h : handles) moekit_handle_destroy(h);
}
