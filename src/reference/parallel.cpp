#include "src/reference/parallel.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace moekit {
inline namespace v0 {
namespace ref {

namespace {
std::atomic<int> g_threads{0};
}

void set_thread_count(int threads) { g_threads.store(threads); }

int thread_count() {
  int threads = g_threads.load();
  if (threads > 0) return threads;
  return std::max(1u, std::thread::hardware_concurrency());
}

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& body, int64_t min_chunk) {
  if (n <= 0) return;
  int64_t chunks = std::min<int64_t>(thread_count(), (n + min_chunk - 1) / std::max<int64_t>(min_chunk, 1));
  if (chunks <= 1) {
    body(0, n);
    return;
  }
  std::exception_ptr failure;
  std::mutex failure_lock;
  auto run = [&](int64_t chunk) {
    int64_t begin = n * chunk / chunks;
    int64_t end = n * (chunk + 1) / chunks;
    try {
      body(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> guard(failure_lock);
      if (!failure) failure = std::current_exception();
    }
  };
  std::vector<std::thread> workers;
  workers.reserve(static_cast<size_t>(chunks - 1));
  for (int64_t chunk = 1; chunk < chunks; ++chunk) workers.emplace_back(run, chunk);
  run(0);
  for (auto& worker : workers) worker.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace ref
}  // namespace v0
}  // namespace moekit
