#include "src/reference/reference_backend.h"

#include "src/reference/parallel.h"

namespace moekit {
inline namespace v0 {
namespace ref {

ReferenceBackend::ReferenceBackend(int num_threads) { set_thread_count(num_threads); }

}  // namespace ref
}  // namespace v0
}  // namespace moekit
