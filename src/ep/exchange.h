// The one place the expert-parallel layer talks to other ranks: an all-to-all of per-expert counts and an
// all-to-allv of rows, in either direction (the caller swaps the send and receive layouts to go back). The layer
// is written once over this interface; LocalExchange (ranks as threads of one process, host memory) serves the
// reference backend and the CPU tests, NcclExchange (the caller's ncclComm_t, device memory) the CUDA backend.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moekit {
inline namespace v0 {
namespace ep {

class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual int rank() const = 0;
  virtual int ranks() const = 0;
  // Whether buffers are device memory (NCCL) or host memory (in-process).
  virtual bool on_device() const = 0;

  // send [ranks * n] int32: block d goes to rank d; recv [ranks * n]: block s came from rank s.
  virtual void all_to_all(const int32_t* send, int32_t* recv, int64_t n, void* stream) = 0;
  // Rows of row_bytes bytes: rows send_base[d] .. + send_rows[d] of send go to rank d and land at rows
  // recv_base[s] .. + recv_rows[s] of recv on that rank, where s is this rank. Host arrays of ranks() entries;
  // recv_rows[s] must equal what rank s sends here.
  virtual void all_to_allv(const void* send, const int64_t* send_base, const int64_t* send_rows, void* recv,
                           const int64_t* recv_base, const int64_t* recv_rows, size_t row_bytes, void* stream) = 0;
};

}  // namespace ep
}  // namespace v0
}  // namespace moekit
