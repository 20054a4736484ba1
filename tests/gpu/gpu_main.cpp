// Entry point of every GPU test executable: exit 77 (CTest "skipped") unless a compute-capability 9.x GPU is
// usable, so machines without one never report these tests as passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <cstdio>

int main(int argc, char** argv) {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n", status != cudaSuccess ? cudaGetErrorString(status) : "0 devices");
    return 77;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major != 9) {
    std::printf("SKIPPED: device 0 is not a Hopper GPU (compute capability %d.%d)\n", prop.major, prop.minor);
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
