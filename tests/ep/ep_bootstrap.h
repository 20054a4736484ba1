// One process per GPU without MPI: rank 0 writes the ncclUniqueId to a file (through a rename, so no reader sees a
// partial file), the other ranks wait for it; each process then joins the communicator on GPU rank % visible GPUs.
// Shared by the multi-GPU test (tests/ep/ep_multi_gpu.cpp) and the benchmark (bench/device/ep_bench.cpp).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace ep_bootstrap {

struct Options {
  int rank = -1, ranks = 0;
  std::string id_file;
};

// --rank R --ranks N --id-file PATH; the environment's RANK / WORLD_SIZE (torchrun's) serve when the flags are absent.
inline Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--rank")) o.rank = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--ranks")) o.ranks = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--id-file")) o.id_file = argv[++i];
  }
  if (o.rank < 0 && std::getenv("RANK")) o.rank = std::atoi(std::getenv("RANK"));
  if (o.ranks <= 0 && std::getenv("WORLD_SIZE")) o.ranks = std::atoi(std::getenv("WORLD_SIZE"));
  return o;
}

inline void fail(const std::string& what) {
  std::fprintf(stderr, "%s\n", what.c_str());
  std::exit(1);
}

inline ncclUniqueId share_id(const Options& o) {
  ncclUniqueId id;
  if (o.rank == 0) {
    if (ncclGetUniqueId(&id) != ncclSuccess) fail("ncclGetUniqueId failed");
    std::string tmp = o.id_file + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f || std::fwrite(&id, sizeof id, 1, f) != 1) fail("cannot write " + tmp);
    std::fclose(f);
    if (std::rename(tmp.c_str(), o.id_file.c_str()) != 0) fail("cannot rename " + tmp);
    return id;
  }
  for (int tries = 0; tries < 6000; ++tries) {  // up to 10 minutes
    if (FILE* f = std::fopen(o.id_file.c_str(), "rb")) {
      size_t got = std::fread(&id, sizeof id, 1, f);
      std::fclose(f);
      if (got == 1) return id;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  fail("no ncclUniqueId appeared in " + o.id_file);
  return id;
}

// Exits 77 (skipped) when there are fewer GPUs than ranks; returns the communicator of this rank.
inline ncclComm_t join(const Options& o, int* device) {
  if (o.rank < 0 || o.ranks < 1 || o.rank >= o.ranks || o.id_file.empty())
    fail("usage: --rank R --ranks N --id-file PATH (one process per GPU; see tests/ep/run_multi_gpu.sh)");
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) {
    std::fprintf(stderr, "no GPU: skipped\n");
    std::exit(77);
  }
  // With one GPU per process (CUDA_VISIBLE_DEVICES set by a launcher) every rank sees device 0.
  *device = o.rank % gpus;
  if (gpus > 1 && gpus < o.ranks) {
    std::fprintf(stderr, "%d ranks need %d GPUs, %d visible: skipped\n", o.ranks, o.ranks, gpus);
    std::exit(77);
  }
  if (cudaSetDevice(*device) != cudaSuccess) fail("cudaSetDevice failed");
  ncclUniqueId id = share_id(o);
  ncclComm_t comm;
  ncclResult_t r = ncclCommInitRank(&comm, o.ranks, id, o.rank);
  if (r != ncclSuccess) fail(std::string("ncclCommInitRank: ") + ncclGetErrorString(r));
  return comm;
}

}  // namespace ep_bootstrap
