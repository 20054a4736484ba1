#include "src/ep/local_exchange.h"

#include <cstring>
#include <stdexcept>
#include <string>

namespace moekit {
inline namespace v0 {
namespace ep {

LocalGroup::LocalGroup(int ranks) : ranks_(ranks), published_(static_cast<size_t>(ranks)) {}

void LocalGroup::barrier() {
  std::unique_lock<std::mutex> lock(mutex_);
  uint64_t generation = generation_;
  if (++waiting_ == ranks_) {
    waiting_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != generation; });
}

void LocalExchange::all_to_all(const int32_t* send, int32_t* recv, int64_t n, void*) {
  std::vector<int64_t> base(static_cast<size_t>(ranks())), rows(static_cast<size_t>(ranks()), n);
  for (int d = 0; d < ranks(); ++d) base[static_cast<size_t>(d)] = d * n;
  all_to_allv(send, base.data(), rows.data(), recv, base.data(), rows.data(), sizeof(int32_t), nullptr);
}

void LocalExchange::all_to_allv(const void* send, const int64_t* send_base, const int64_t* send_rows, void* recv,
                                const int64_t* recv_base, const int64_t* recv_rows, size_t row_bytes, void*) {
  group_.publish(rank_, LocalGroup::Published{send, send_base, send_rows, row_bytes});
  group_.barrier();  // every rank's send buffer is published
  std::string mismatch;
  for (int s = 0; s < ranks(); ++s) {
    const LocalGroup::Published& src = group_.published(s);
    int64_t rows = src.rows[rank_];
    if (rows != recv_rows[s] || src.row_bytes != row_bytes) {
      mismatch = "exchange: rank " + std::to_string(s) + " sends " + std::to_string(rows) + " rows of " +
                 std::to_string(src.row_bytes) + " bytes to rank " + std::to_string(rank_) + ", which expects " +
                 std::to_string(recv_rows[s]) + " of " + std::to_string(row_bytes);
      continue;
    }
    if (rows == 0) continue;
    std::memcpy(static_cast<char*>(recv) + static_cast<size_t>(recv_base[s]) * row_bytes,
                static_cast<const char*>(src.data) + static_cast<size_t>(src.base[rank_]) * row_bytes,
                static_cast<size_t>(rows) * row_bytes);
  }
  group_.barrier();  // no rank reuses its send buffer before every rank has read it
  if (!mismatch.empty()) throw std::logic_error(mismatch);
}

}  // namespace ep
}  // namespace v0
}  // namespace moekit
