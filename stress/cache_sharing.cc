// Allocator-induced false sharing, after Hoard's cache-thrash and cache-scratch benchmarks
// (Berger et al., ASPLOS 2000), written afresh. Each thread repeatedly allocates a small
// object, writes it many times and frees it. If the allocator hands objects of different
// threads out of one cache line, those writes bounce the line between cores and the row
// slows down by an order of magnitude; an allocator that keeps each thread's objects apart
// costs nothing here.
//   cache-thrash  (active): every thread allocates its own objects from the start.
//   cache-scratch (passive): the main thread allocates one object per thread, side by side,
//                 and each thread first frees the one it was given: an allocator that hands
//                 that freed memory back to the freeing thread shares the line with the
//                 other threads' objects.
// Every object's contents are checked before it is freed.
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

#include "stress/pattern.h"
#include "stress/suite.h"

namespace brisk::stress {
namespace {

constexpr std::size_t kObjectSize = 8;
constexpr std::uint64_t kWritesPerObject = 2000;

// Allocates, writes kWritesPerObject times, checks and frees `objects` objects in turn.
void churn_objects(const char* name, std::uint32_t task, std::uint64_t objects) {
  for (std::uint64_t i = 0; i < objects; ++i) {
    auto* p = static_cast<volatile std::uint64_t*>(std::malloc(kObjectSize));
    if (p == nullptr) fail_verify(name, BlockId{task, i, 0}, 0, "malloc returned NULL");
    const std::uint64_t start = (std::uint64_t{task} << 40) ^ (i << 8);
    *p = start;
    for (std::uint64_t w = 0; w < kWritesPerObject; ++w) *p = *p + 1;
    if (*p != start + kWritesPerObject)
      fail_verify(name, BlockId{task, i, 0}, 0, "object changed under its owner's writes");
    std::free(const_cast<std::uint64_t*>(p));
  }
}

void run_sharing(Context& ctx, const char* name, bool passive) {
  const int threads = ctx.threads();
  const std::uint64_t objects = ctx.scaled(50000, 100);
  ctx.progress.begin(std::string(name) + " x" + std::to_string(threads), threads);
  ctx.recorder.measure(name, threads, [&] {
    std::vector<void*> given(static_cast<std::size_t>(threads), nullptr);
    if (passive) {
      for (int t = 0; t < threads; ++t) {
        given[t] = std::malloc(kObjectSize);
        if (given[t] == nullptr) fail_verify(name, BlockId{0, 0, 0}, 0, "malloc returned NULL");
        *static_cast<std::uint64_t*>(given[t]) = static_cast<std::uint64_t>(t);
      }
    }
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const auto task = static_cast<std::uint32_t>(t + 1);
        if (passive) {
          if (*static_cast<std::uint64_t*>(given[t]) != static_cast<std::uint64_t>(t))
            fail_verify(name, BlockId{task, 0, 0}, 0, "handed-over object changed");
          std::free(given[t]);
        }
        churn_objects(name, task, objects);
        ctx.progress.advance(1);
      });
    }
    for (std::thread& t : pool) t.join();
    return static_cast<std::uint64_t>(threads) * (2 * objects + (passive ? 2 : 0));
  });
  ctx.progress.end();
}

}  // namespace

void run_cache_thrash(Context& ctx) { run_sharing(ctx, "cache-thrash", false); }
void run_cache_scratch(Context& ctx) { run_sharing(ctx, "cache-scratch", true); }

}  // namespace brisk::stress
