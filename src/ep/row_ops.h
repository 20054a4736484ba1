// The expert-parallel layer's own data movement around the exchange: where each grouped row goes in the send
// buffer, where each received row goes among the local experts' rows, and row copies by index. Everything else the
// layer computes is a public moekit operation. HostRowOps runs these on host memory (reference backend),
// CudaRowOps as small kernels on the caller's stream; both read counts and offsets from the buffers, never from the
// host, so nothing here synchronises.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "cuda/layers/saved_header.h"

namespace moekit {
inline namespace v0 {
namespace ep {

// The exchange's shape: R ranks of E experts each; capacity 0 means exact counts (no slots, no drops).
struct EpShape {
  int ranks;
  int64_t experts;   // E per rank
  int64_t capacity;  // rows per (source, destination) pair; 0 in the exact mode
};

class RowOps {
 public:
  virtual ~RowOps() = default;

  virtual void fill(int32_t* p, int64_t n, int32_t value, void* stream) = 0;
  virtual void iota(int32_t* p, int64_t n, void* stream) = 0;
  // p[0] = 0, p[1] = rows: the offsets of one group of `rows` rows (a dense GEMM as a grouped one).
  virtual void single_group(int32_t* p, int64_t rows, void* stream) = 0;

  // From the dispatch of P pairs over all R*E experts (expert_offsets [R*E+1], grouped_pos [P]):
  //   slot [P]:        send-buffer row of grouped row i, -1 past the valid rows or over capacity;
  //   kept_pos [P]:    grouped_pos with -1 for the pairs over capacity;
  //   send_counts [R*E]: rows this rank sends for each expert (after capacity);
  //   dropped [1]:     pairs over capacity.
  // Exact mode: slot[i] = i. Capacity mode: rows bound for rank d start at d*capacity.
  virtual void send_layout(const EpShape& s, const int32_t* expert_offsets, const int32_t* grouped_pos, int64_t pairs,
                           int32_t* slot, int32_t* kept_pos, int32_t* send_counts, int32_t* dropped,
                           void* stream) = 0;
  // From recv_counts [R*E] (block s: the rows rank s sent for each local expert), laid out by source as the
  // exchange delivers them (capacity mode: source s at s*capacity; exact: sources back to back):
  //   perm [M]:           local-expert row of received row r (sources in rank order within an expert), -1 if none;
  //   owner_offsets [E+1]: the local experts' row offsets.
  virtual void recv_layout(const EpShape& s, const int32_t* recv_counts, int64_t max_rows, int32_t* perm,
                           int32_t* owner_offsets, void* stream) = 0;

  // dst[i] = src[index[i]] for i < n (and i < *valid when valid is not NULL) where index[i] >= 0; a NULL index
  // copies the first n rows.
  virtual void gather(void* dst, const void* src, const int32_t* index, int64_t n, const int32_t* valid,
                      size_t row_bytes, void* stream) = 0;
  // dst[index[i]] = src[i], likewise.
  virtual void scatter(void* dst, const void* src, const int32_t* index, int64_t n, const int32_t* valid,
                       size_t row_bytes, void* stream) = 0;

  // Copies n int32 from the layer's buffers to the host and waits for them (the exact mode's synchronisation).
  virtual void to_host(int32_t* host, const int32_t* src, int64_t n, void* stream) = 0;

  // Writes the saved buffer's header (on the stream, capturable).
  virtual void write_header(SavedHeader* dst, const SavedHeader& header, void* stream) = 0;
  // The header a forward wrote, where it can be read without synchronising (host memory); NULL on the GPU.
  virtual const SavedHeader* readable_header(const SavedHeader* saved) = 0;
};

std::unique_ptr<RowOps> make_host_row_ops();
// NULL when this build has no CUDA.
std::unique_ptr<RowOps> make_cuda_row_ops();

}  // namespace ep
}  // namespace v0
}  // namespace moekit
