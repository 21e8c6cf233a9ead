// Thread helpers of the workloads that make one row on one thread and one on --threads.
#ifndef BRISK_STRESS_PARALLEL_H
#define BRISK_STRESS_PARALLEL_H

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "stress/suite.h"

namespace brisk::stress {

// The thread counts of such a workload's rows: 1, then --threads when that is more (--rows
// keeps one of them).
inline std::vector<int> row_thread_counts(const Context& ctx) {
  std::vector<int> counts;
  if (ctx.options.single_row) counts.push_back(1);
  if (ctx.options.parallel_row && (ctx.threads() > 1 || counts.empty())) counts.push_back(ctx.threads());
  return counts;
}

// Runs body(task) for task 0..threads-1, each on a thread of its own, and returns the sum of
// what the bodies return (their operation counts).
template <typename Body>
std::uint64_t run_on_threads(int threads, Body&& body) {
  std::atomic<std::uint64_t> ops{0};
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&ops, &body, t] {
      ops.fetch_add(body(static_cast<std::uint32_t>(t)), std::memory_order_relaxed);
    });
  }
  for (std::thread& th : pool) th.join();
  return ops.load(std::memory_order_relaxed);
}

// Measures one row `name` per thread count of row_thread_counts: body(threads) runs the row and
// returns its operation count; the progress bar counts `units_per_thread` units per thread.
template <typename Body>
void measure_rows(Context& ctx, const char* name, std::uint64_t units_per_thread, const std::string& note,
                  Body&& body) {
  for (int threads : row_thread_counts(ctx)) {
    ctx.progress.begin(std::string(name) + " x" + std::to_string(threads), units_per_thread * threads);
    ctx.recorder.measure(name, threads, [&] { return body(threads); }, note);
    ctx.progress.end();
  }
}

}  // namespace brisk::stress

#endif  // BRISK_STRESS_PARALLEL_H
