// A build without CUDA has no device row operations; an NCCL communicator cannot exist there either.
#include "src/ep/row_ops.h"

namespace moekit {
inline namespace v0 {
namespace ep {

std::unique_ptr<RowOps> make_cuda_row_ops() { return nullptr; }

}  // namespace ep
}  // namespace v0
}  // namespace moekit
