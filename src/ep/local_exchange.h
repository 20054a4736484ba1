// The in-process exchange: R ranks are R threads of one process, meeting at a barrier and copying each other's
// host buffers. Used with reference-backend handles (the CPU tests run the expert-parallel layer on it).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "src/ep/exchange.h"

namespace moekit {
inline namespace v0 {
namespace ep {

// What every rank of a group shares: a reusable barrier and each rank's published send buffer.
class LocalGroup {
 public:
  explicit LocalGroup(int ranks);
  int ranks() const { return ranks_; }

  struct Published {
    const void* data = nullptr;
    const int64_t* base = nullptr;
    const int64_t* rows = nullptr;
    size_t row_bytes = 0;
  };
  void publish(int rank, const Published& p) { published_[static_cast<size_t>(rank)] = p; }
  const Published& published(int rank) const { return published_[static_cast<size_t>(rank)]; }
  void barrier();

 private:
  int ranks_;
  std::vector<Published> published_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int waiting_ = 0;
  uint64_t generation_ = 0;
};

class LocalExchange final : public Exchange {
 public:
  LocalExchange(LocalGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int ranks() const override { return group_.ranks(); }
  bool on_device() const override { return false; }
  void all_to_all(const int32_t* send, int32_t* recv, int64_t n, void* stream) override;
  void all_to_allv(const void* send, const int64_t* send_base, const int64_t* send_rows, void* recv,
                   const int64_t* recv_base, const int64_t* recv_rows, size_t row_bytes, void* stream) override;

 private:
  LocalGroup& group_;
  int rank_;
};

}  // namespace ep
}  // namespace v0
}  // namespace moekit
