// RowOps as CUDA kernels on the caller's stream (the NCCL exchange's buffers are device memory). The layouts are
// tiny (R*E counts), so one block computes them; the row copies spread over the grid. Counts and offsets are read on
// the device, so no launch here waits for the host, and all of them can be captured in a CUDA graph.
#include <cuda_runtime.h>

#include <string>

#include "src/ep/ep_plan.h"
#include "src/ep/row_ops.h"

namespace moekit {
inline namespace v0 {
namespace ep {
namespace {

constexpr int kThreads = 256;

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw EpError(MOEKIT_STATUS_EXECUTION_FAILED, std::string(what) + ": " + cudaGetErrorString(e));
}

unsigned blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

__global__ void header_kernel(SavedHeader* dst, SavedHeader header) { *dst = header; }

__global__ void fill_kernel(int32_t* p, int64_t n, int32_t value, int iota) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    p[i] = iota ? static_cast<int32_t>(i) : value;
}

__global__ void single_group_kernel(int32_t* p, int32_t rows) {
  p[0] = 0;
  p[1] = rows;
}

// The rank d a grouped row i is bound for: the last d with expert_offsets[d*E] <= i.
__device__ int destination(const int32_t* expert_offsets, int ranks, int64_t experts, int64_t i) {
  int lo = 0, hi = ranks - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (expert_offsets[mid * experts] <= i) lo = mid; else hi = mid - 1;
  }
  return lo;
}

__global__ void send_slots_kernel(EpShape s, const int32_t* expert_offsets, int64_t pairs, int32_t* slot) {
  int64_t valid = expert_offsets[s.ranks * s.experts];
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < pairs; i += int64_t{gridDim.x} * blockDim.x) {
    if (i >= valid) {
      slot[i] = -1;
      continue;
    }
    if (s.capacity == 0) {
      slot[i] = static_cast<int32_t>(i);
      continue;
    }
    int d = destination(expert_offsets, s.ranks, s.experts, i);
    int64_t j = i - expert_offsets[d * s.experts];
    slot[i] = j < s.capacity ? static_cast<int32_t>(d * s.capacity + j) : -1;
  }
}

__global__ void kept_pos_kernel(const int32_t* grouped_pos, const int32_t* slot, int64_t pairs, int32_t* kept_pos) {
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < pairs; p += int64_t{gridDim.x} * blockDim.x) {
    int32_t g = grouped_pos[p];
    kept_pos[p] = g >= 0 && slot[g] >= 0 ? g : -1;
  }
}

// One thread per (destination, expert); thread 0 also writes the drops.
__global__ void send_counts_kernel(EpShape s, const int32_t* expert_offsets, int32_t* send_counts, int32_t* dropped) {
  int64_t n = s.ranks * s.experts;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
    int64_t d = k / s.experts, begin = expert_offsets[d * s.experts];
    int64_t lo = expert_offsets[k] - begin, hi = expert_offsets[k + 1] - begin;
    if (s.capacity > 0) {
      lo = lo < s.capacity ? lo : s.capacity;
      hi = hi < s.capacity ? hi : s.capacity;
    }
    send_counts[k] = static_cast<int32_t>(hi - lo);
  }
  if (threadIdx.x == 0) {
    int64_t drops = 0;
    for (int d = 0; d < s.ranks && s.capacity > 0; ++d) {
      int64_t rows = expert_offsets[(d + 1) * s.experts] - expert_offsets[d * s.experts];
      drops += rows > s.capacity ? rows - s.capacity : 0;
    }
    *dropped = static_cast<int32_t>(drops);
  }
}

__global__ void owner_offsets_kernel(EpShape s, const int32_t* recv_counts, int32_t* owner_offsets) {
  if (threadIdx.x != 0) return;
  int64_t at = 0;
  owner_offsets[0] = 0;
  for (int64_t e = 0; e < s.experts; ++e) {
    for (int r = 0; r < s.ranks; ++r) at += recv_counts[r * s.experts + e];
    owner_offsets[e + 1] = static_cast<int32_t>(at);
  }
}

// perm[row] for every received row: find its source and expert by walking the counts (R*E is small).
__global__ void perm_kernel(EpShape s, const int32_t* recv_counts, const int32_t* owner_offsets, int64_t max_rows,
                            int32_t* perm) {
  for (int64_t row = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; row < max_rows;
       row += int64_t{gridDim.x} * blockDim.x) {
    int32_t target = -1;
    int64_t base = 0;
    for (int r = 0; r < s.ranks && target < 0; ++r) {
      int64_t at = s.capacity > 0 ? r * s.capacity : base;
      for (int64_t e = 0; e < s.experts; ++e) {
        int64_t n = recv_counts[r * s.experts + e];
        if (row >= at && row < at + n) {
          int64_t before = 0;
          for (int q = 0; q < r; ++q) before += recv_counts[q * s.experts + e];
          target = static_cast<int32_t>(owner_offsets[e] + before + (row - at));
          break;
        }
        at += n;
      }
      base = at;
    }
    perm[row] = target;
  }
}

// Rows move in 4-byte words when the row size allows (every dtype's rows here do), else bytes.
template <class Word>
__global__ void move_rows_kernel(Word* dst, const Word* src, const int32_t* index, int64_t n, const int32_t* valid,
                                 int64_t words, int scatter) {
  int64_t rows = valid && *valid < n ? *valid : n;
  for (int64_t i = blockIdx.y; i < rows; i += gridDim.y) {
    int64_t j = index ? index[i] : i;
    if (j < 0) continue;
    Word* d = dst + (scatter ? j : i) * words;
    const Word* s = src + (scatter ? i : j) * words;
    for (int64_t w = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; w < words; w += int64_t{gridDim.x} * blockDim.x)
      d[w] = s[w];
  }
}

class CudaRowOps final : public RowOps {
 public:
  void fill(int32_t* p, int64_t n, int32_t value, void* stream) override {
    if (n <= 0) return;
    fill_kernel<<<blocks_for(n), kThreads, 0, cuda_stream(stream)>>>(p, n, value, 0);
    check_cuda(cudaGetLastError(), "fill");
  }
  void iota(int32_t* p, int64_t n, void* stream) override {
    if (n <= 0) return;
    fill_kernel<<<blocks_for(n), kThreads, 0, cuda_stream(stream)>>>(p, n, 0, 1);
    check_cuda(cudaGetLastError(), "iota");
  }
  void single_group(int32_t* p, int64_t rows, void* stream) override {
    single_group_kernel<<<1, 1, 0, cuda_stream(stream)>>>(p, static_cast<int32_t>(rows));
    check_cuda(cudaGetLastError(), "single_group");
  }
  void send_layout(const EpShape& s, const int32_t* expert_offsets, const int32_t* grouped_pos, int64_t pairs,
                   int32_t* slot, int32_t* kept_pos, int32_t* send_counts, int32_t* dropped, void* stream) override {
    cudaStream_t st = cuda_stream(stream);
    send_counts_kernel<<<1, kThreads, 0, st>>>(s, expert_offsets, send_counts, dropped);
    if (pairs > 0) {
      send_slots_kernel<<<blocks_for(pairs), kThreads, 0, st>>>(s, expert_offsets, pairs, slot);
      kept_pos_kernel<<<blocks_for(pairs), kThreads, 0, st>>>(grouped_pos, slot, pairs, kept_pos);
    }
    check_cuda(cudaGetLastError(), "send_layout");
  }
  void recv_layout(const EpShape& s, const int32_t* recv_counts, int64_t max_rows, int32_t* perm,
                   int32_t* owner_offsets, void* stream) override {
    cudaStream_t st = cuda_stream(stream);
    owner_offsets_kernel<<<1, 32, 0, st>>>(s, recv_counts, owner_offsets);
    if (max_rows > 0) perm_kernel<<<blocks_for(max_rows), kThreads, 0, st>>>(s, recv_counts, owner_offsets,
                                                                             max_rows, perm);
    check_cuda(cudaGetLastError(), "recv_layout");
  }
  void gather(void* dst, const void* src, const int32_t* index, int64_t n, const int32_t* valid, size_t row_bytes,
              void* stream) override {
    move(dst, src, index, n, valid, row_bytes, 0, stream);
  }
  void scatter(void* dst, const void* src, const int32_t* index, int64_t n, const int32_t* valid, size_t row_bytes,
               void* stream) override {
    move(dst, src, index, n, valid, row_bytes, 1, stream);
  }
  void to_host(int32_t* host, const int32_t* src, int64_t n, void* stream) override {
    cudaStream_t st = cuda_stream(stream);
    check_cuda(cudaMemcpyAsync(host, src, static_cast<size_t>(n) * sizeof(int32_t), cudaMemcpyDeviceToHost, st),
               "cudaMemcpyAsync (counts to the host)");
    check_cuda(cudaStreamSynchronize(st), "cudaStreamSynchronize (exact counts)");
  }

  void write_header(SavedHeader* dst, const SavedHeader& header, void* stream) override {
    header_kernel<<<1, 1, 0, cuda_stream(stream)>>>(dst, header);
    check_cuda(cudaGetLastError(), "saved header kernel");
  }
  // NOTE: reading device memory would synchronise the stream (and break graph capture), so on the GPU the backward
  // trusts the saved buffer, as the single-GPU layers do.
  const SavedHeader* readable_header(const SavedHeader*) override { return nullptr; }

 private:
  static cudaStream_t cuda_stream(void* s) { return static_cast<cudaStream_t>(s); }

  void move(void* dst, const void* src, const int32_t* index, int64_t n, const int32_t* valid, size_t row_bytes,
            int scatter, void* stream) {
    if (n <= 0) return;
    unsigned rows = static_cast<unsigned>(n < 65535 ? n : 65535);
    cudaStream_t st = cuda_stream(stream);
    if (row_bytes % 4 == 0) {
      int64_t words = static_cast<int64_t>(row_bytes / 4);
      dim3 grid(blocks_for(words), rows);
      move_rows_kernel<uint32_t><<<grid, kThreads, 0, st>>>(static_cast<uint32_t*>(dst),
                                                            static_cast<const uint32_t*>(src), index, n, valid,
                                                            words, scatter);
    } else {
      int64_t words = static_cast<int64_t>(row_bytes);
      dim3 grid(blocks_for(words), rows);
      move_rows_kernel<uint8_t><<<grid, kThreads, 0, st>>>(static_cast<uint8_t*>(dst),
                                                           static_cast<const uint8_t*>(src), index, n, valid, words,
                                                           scatter);
    }
    check_cuda(cudaGetLastError(), scatter ? "scatter rows" : "gather rows");
  }
};

}  // namespace

std::unique_ptr<RowOps> make_cuda_row_ops() { return std::make_unique<CudaRowOps>(); }

}  // namespace ep
}  // namespace v0
}  // namespace moekit
