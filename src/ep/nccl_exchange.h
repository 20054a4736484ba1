// The NCCL exchange: the caller's ncclComm_t, device buffers, grouped ncclSend/ncclRecv on the caller's stream.
// Declared in every build; without NCCL, nccl_available() is false and make_nccl_exchange is never reached.
#pragma once

#include <memory>

#include "src/ep/exchange.h"

namespace moekit {
inline namespace v0 {
namespace ep {

bool nccl_available();
std::unique_ptr<Exchange> make_nccl_exchange(void* nccl_comm);

}  // namespace ep
}  // namespace v0
}  // namespace moekit
