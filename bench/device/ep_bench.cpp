// Throughput of the expert-parallel layer's forward + backward on R GPUs (one process each), for a DeepSeek-V3-like
// slice (H 7168, I 2048, 256 experts, K 8) and a Qwen3-235B-like one (H 4096, I 1536, 128 experts, K 8); the
// all-to-all bandwidth of NCCL's own grouped send/recv for the same bytes the layer moves in one row exchange; and
// the share of the layer's time that four such exchanges (x and y forward, dout and dx backward) would take. That
// share is an estimate from the standalone exchange, not a trace of the layer.
//
//   cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DMOEKIT_NCCL=ON
//   cmake --build build-cuda -j --target moekit_ep_bench
//   bench/device/ep_bench.sh build-cuda            # 1, 2, 4, 8 GPUs, both slices, ep_bench_R.json per count
//   tests/ep/run_multi_gpu.sh 8 build-cuda/bench/device/moekit_ep_bench --model dsv3 --tokens 4096 --json out.json
//
// Output: one table line per case on rank 0's stdout and, with --json, one JSON object per line (median/min/max ms,
// TFLOP/s from the median, all-to-all GB/s, the communication share, the command that reproduces the case).
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "moekit/moekit_ep.h"
#include "tests/ep/ep_bootstrap.h"

namespace {

using ep_bootstrap::fail;

void check(moekit_status_t s, const char* what) {
  if (s == MOEKIT_SUCCESS) return;
  char ep[1024];
  moekit_ep_get_last_error(ep, sizeof ep);
  fail(std::string(what) + ": " + moekit_status_string(s) + ": " + ep);
}
void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(std::string(what) + ": " + cudaGetErrorString(e));
}

void* device_alloc(size_t bytes, unsigned char fill) {
  void* p;
  check_cuda(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
  check_cuda(cudaMemset(p, fill, bytes), "cudaMemset");  // 0x3c3c: a bf16 near 0.01, never zero
  return p;
}

// Random bf16 values in [-1, 1): the routing then spreads over the experts as in training (constant inputs would send
// every token to the same K experts).
void fill_random(const moekit_tensor_t& t, uint64_t seed) {
  size_t n = 1;
  for (int i = 0; i < t.rank; ++i) n *= static_cast<size_t>(t.shape[i]);
  std::vector<uint16_t> h(n);
  uint64_t state = seed;
  for (uint16_t& v : h) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    float f = static_cast<float>(static_cast<int64_t>(state >> 40) - (int64_t{1} << 23)) / float(1 << 23);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    v = static_cast<uint16_t>(u >> 16);
  }
  check_cuda(cudaMemcpy(t.data, h.data(), n * 2, cudaMemcpyHostToDevice), "upload");
}

struct Model {
  const char* name;
  int64_t hidden, intermediate, experts, top_k;
};

struct Timing {
  double median, min, max;
};

template <class Body>
Timing time_ms(int iters, cudaStream_t stream, Body&& body) {
  for (int i = 0; i < 3; ++i) body();  // warm-up
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    cudaEventRecord(a, stream);
    body();
    cudaEventRecord(b, stream);
    check_cuda(cudaEventSynchronize(b), "timing");
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a), cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return Timing{ms[ms.size() / 2], ms.front(), ms.back()};
}

}  // namespace

int main(int argc, char** argv) {
  ep_bootstrap::Options o = ep_bootstrap::parse(argc, argv);
  std::string model_name = "dsv3", json;
  int64_t tokens = 4096;
  int iters = 20;
  int32_t mode = MOEKIT_EP_EXACT;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--model")) model_name = argv[++i];
    else if (!std::strcmp(argv[i], "--tokens")) tokens = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--json")) json = argv[++i];
    else if (!std::strcmp(argv[i], "--capacity")) mode = MOEKIT_EP_CAPACITY, ++i;
  }
  Model m = model_name == "qwen3" ? Model{"qwen3-235b-like", 4096, 1536, 128, 8}
                                  : Model{"deepseek-v3-like", 7168, 2048, 256, 8};
  int dev = 0;
  ncclComm_t nccl = ep_bootstrap::join(o, &dev);
  const int R = o.ranks;
  if (m.experts % R) fail("the expert count must divide by the rank count");
  const int64_t E = m.experts / R, H = m.hidden, I = m.intermediate, K = m.top_k, W = 2 * I;
  cudaStream_t stream;
  check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");

  moekit_handle_desc_t hd;
  moekit_handle_desc_init(&hd);
  hd.backend = MOEKIT_BACKEND_CUDA;
  hd.device_index = dev;
  moekit_handle_t handle;
  check(moekit_handle_create(&hd, &handle), "moekit_handle_create");
  moekit_ep_comm_t comm;
  check(moekit_ep_comm_create_nccl(nccl, &comm), "moekit_ep_comm_create_nccl");
  moekit_ep_desc_t d;
  moekit_ep_desc_init(&d);
  d.layer.max_tokens = tokens, d.layer.hidden = H, d.layer.intermediate = I, d.layer.router_experts = m.experts;
  d.layer.experts = E, d.layer.top_k = K;
  d.mode = mode;
  d.capacity = tokens * K * 2 / R;  // twice the balanced share
  moekit_ep_plan_t plan;
  check(moekit_ep_plan_create(handle, comm, &d, &plan), "moekit_ep_plan_create");
  size_t ws = 0, sv = 0;
  check(moekit_ep_plan_sizes(plan, &ws, &sv), "moekit_ep_plan_sizes");

  moekit_device_t on{MOEKIT_DEVICE_CUDA, dev};
  auto tensor = [&](std::vector<int64_t> shape, unsigned char fill) {
    size_t n = 2;
    for (int64_t s : shape) n *= static_cast<size_t>(s);
    return moekit_tensor_make(device_alloc(n, fill), MOEKIT_DTYPE_BF16, static_cast<int32_t>(shape.size()),
                              shape.data(), on);
  };
  moekit_ep_fwd_args_t f;
  moekit_ep_fwd_args_init(&f);
  f.x = tensor({tokens, H}, 0x3c);
  f.w_router = tensor({m.experts, H}, 0x3c);
  fill_random(f.x, 1000 + static_cast<uint64_t>(o.rank));  // each rank its own tokens
  fill_random(f.w_router, 7);                             // one router on every rank
  f.w1 = tensor({E, W, H}, 0x3c);
  f.w2 = tensor({E, H, I}, 0x3c);
  f.out = tensor({tokens, H}, 0);
  moekit_ep_bwd_args_t b;
  moekit_ep_bwd_args_init(&b);
  b.x = f.x, b.w_router = f.w_router, b.w1 = f.w1, b.w2 = f.w2;
  b.dout = tensor({tokens, H}, 0x3c);
  b.dx = tensor({tokens, H}, 0);
  b.dw_router = tensor({m.experts, H}, 0);
  b.dw1 = tensor({E, W, H}, 0);
  b.dw2 = tensor({E, H, I}, 0);
  void* wsp = device_alloc(ws, 0);
  void* svp = device_alloc(sv, 0);
  Timing layer = time_ms(iters, stream, [&] {
    check(moekit_ep_forward(plan, &f, svp, sv, wsp, ws, stream), "moekit_ep_forward");
    check(moekit_ep_backward(plan, &b, svp, sv, wsp, ws, stream), "moekit_ep_backward");
  });

  // NCCL's own all-to-all (grouped send/recv of equal chunks) of one row exchange's bytes: T*K rows of H bf16.
  size_t bytes = static_cast<size_t>(tokens * K * H * 2), chunk = bytes / static_cast<size_t>(R);
  char* send = static_cast<char*>(device_alloc(bytes, 1));
  char* recv = static_cast<char*>(device_alloc(bytes, 0));
  Timing a2a = time_ms(iters, stream, [&] {
    ncclGroupStart();
    for (int p = 0; p < R; ++p) {
      ncclSend(send + p * chunk, chunk, ncclUint8, p, nccl, stream);
      ncclRecv(recv + p * chunk, chunk, ncclUint8, p, nccl, stream);
    }
    ncclGroupEnd();
  });
  // FLOPs of this rank's pairs (P = T*K): experts 6PHI forward, 12PHI backward; the router 2T(RE)H and twice that.
  double flops = 18.0 * double(tokens * K) * double(H) * double(I) + 6.0 * double(tokens) * double(m.experts) * H;
  double tflops = flops / (layer.median * 1e-3) / 1e12;
  double bus_gbs = double(bytes) * double(R - 1) / double(R) / (a2a.median * 1e-3) / 1e9;
  double comm_share = std::min(1.0, 4.0 * a2a.median / layer.median);
  if (o.rank == 0) {
    std::printf("%-18s R %d T/rank %lld mode %s | fwd+bwd median %.3f ms (min %.3f max %.3f) %.1f TFLOP/s/GPU | "
                "all-to-all %.3f ms %.1f GB/s bus | est. communication share %.0f%%\n",
                m.name, R, (long long)tokens, mode ? "capacity" : "exact", layer.median, layer.min, layer.max, tflops,
                a2a.median, bus_gbs, 100 * comm_share);
    if (!json.empty()) {
      FILE* out = std::fopen(json.c_str(), "a");
      if (!out) fail("cannot open " + json);
      std::fprintf(out,
                   "{\"model\": \"%s\", \"ranks\": %d, \"tokens_per_rank\": %lld, \"mode\": \"%s\", \"median_ms\": %.6f, \"min_ms\": %.6f, \"max_ms\": %.6f, \"tflops_per_gpu\": %.3f, "
                   "\"alltoall_ms\": %.6f, \"alltoall_bus_gbs\": %.3f, \"comm_share_estimate\": %.4f, \"command\": "
                   "\"tests/ep/run_multi_gpu.sh %d %s --model %s --tokens %lld%s\"}\n",
                   m.name, R, (long long)tokens, mode ? "capacity" : "exact", layer.median, layer.min, layer.max,
                   tflops, a2a.median, bus_gbs, comm_share, R, argv[0], model_name.c_str(), (long long)tokens,
                   mode ? " --capacity 1" : "");
      std::fclose(out);
    }
  }
  moekit_ep_plan_destroy(plan);
  moekit_ep_comm_destroy(comm);
  moekit_handle_destroy(handle);
  ncclCommDestroy(nccl);
  return 0;
}
