// Static-partition parallel loops for the reference backend. Each index is computed by exactly one thread with
// a fixed summation order inside it, so results do not depend on the thread count.
#pragma once

#include <cstdint>
#include <functional>

namespace moekit {
inline namespace v0 {
namespace ref {

// Threads the loops use: the handle's num_threads (0 = hardware concurrency). Set by the reference backend.
void set_thread_count(int threads);
int thread_count();

// Calls body(begin, end) on disjoint chunks covering [0, n); returns when all are done. Exceptions thrown by a
// body are rethrown on the calling thread. Small n runs inline.
void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& body, int64_t min_chunk = 1);

}  // namespace ref
}  // namespace v0
}  // namespace moekit
