#include "src/ep/nccl_exchange.h"

#include <string>

#include "src/ep/ep_plan.h"

#if MOEKIT_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace moekit {
inline namespace v0 {
namespace ep {

#if MOEKIT_WITH_NCCL
namespace {

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess)
    throw EpError(MOEKIT_STATUS_EXECUTION_FAILED, std::string("exchange: ") + what + " failed: " +
                                                      ncclGetErrorString(r));
}

class NcclExchange final : public Exchange {
 public:
  explicit NcclExchange(ncclComm_t comm) : comm_(comm) {
    check_nccl(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    check_nccl(ncclCommCount(comm_, &ranks_), "ncclCommCount");
  }
  int rank() const override { return rank_; }
  int ranks() const override { return ranks_; }
  bool on_device() const override { return true; }

  void all_to_all(const int32_t* send, int32_t* recv, int64_t n, void* stream) override {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int peer = 0; peer < ranks_; ++peer) {
      check_nccl(ncclSend(send + peer * n, static_cast<size_t>(n), ncclInt32, peer, comm_, s), "ncclSend");
      check_nccl(ncclRecv(recv + peer * n, static_cast<size_t>(n), ncclInt32, peer, comm_, s), "ncclRecv");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  }

  // Rows move as bytes: the exchange does no arithmetic, so the dtype does not matter.
  void all_to_allv(const void* send, const int64_t* send_base, const int64_t* send_rows, void* recv,
                   const int64_t* recv_base, const int64_t* recv_rows, size_t row_bytes, void* stream) override {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int peer = 0; peer < ranks_; ++peer) {
      if (send_rows[peer] > 0)
        check_nccl(ncclSend(static_cast<const char*>(send) + static_cast<size_t>(send_base[peer]) * row_bytes,
                            static_cast<size_t>(send_rows[peer]) * row_bytes, ncclUint8, peer, comm_, s),
                   "ncclSend");
      if (recv_rows[peer] > 0)
        check_nccl(ncclRecv(static_cast<char*>(recv) + static_cast<size_t>(recv_base[peer]) * row_bytes,
                            static_cast<size_t>(recv_rows[peer]) * row_bytes, ncclUint8, peer, comm_, s),
                   "ncclRecv");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  }

 private:
  ncclComm_t comm_;
  int rank_ = 0, ranks_ = 1;
};

}  // namespace

bool nccl_available() { return true; }
std::unique_ptr<Exchange> make_nccl_exchange(void* nccl_comm) {
  return std::make_unique<NcclExchange>(static_cast<ncclComm_t>(nccl_comm));
}
#else
bool nccl_available() { return false; }
std::unique_ptr<Exchange> make_nccl_exchange(void*) { return nullptr; }
#endif

}  // namespace ep
}  // namespace v0
}  // namespace moekit
