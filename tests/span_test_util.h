// Helpers shared by the span tests (tests/span_test.cc, tests/span_tails_test.cc) and the
// background pass's (tests/background_test.cc).
#pragma once

#include <brisk/brisk.h>

#include <cstdint>
#include <cstring>

#include "core/central_pool.h"
#include "core/chunk.h"
#include "core/config.h"
#include "threadcache/heap.h"
#include "threadcache/medium.h"
#include "threadcache/span_pages.h"

namespace brisk {

inline Span* span_of(void* p) {
  auto a = reinterpret_cast<std::uintptr_t>(p);
  return chunk_of(a)->span_of(a);
}

// A medium block of two pages, written whole (with `fill`) and freed, its run given back from
// the calling thread's medium cache: two free pages that held data, resident. Returns where it
// was.
inline void* LeaveTwoResidentFreePages(int fill) {
  constexpr std::size_t kMedium = 2 * kPageSize - 4096;
  void* m = brisk_malloc(kMedium);
  if (m == nullptr) return nullptr;
  std::memset(m, fill, kMedium);
  brisk_free(m);
  HeapSlowLock lock(t_heap);
  medium_cache_flush(t_heap);
  return m;
}

// Every span of class c waiting in the central pool (other tests' exited threads leave some),
// taken into this thread's heap and left off its available list: the thread's next block of c
// comes from a new span. They go back to the pool when the thread exits.
inline void HoldCentralSpans(unsigned c) {
  HeapSlowLock lock(t_heap);
  while (Span* s = central_take(c, t_heap)) heap_link_span(t_heap, s);
}

// A strategy for a scope: the strategy in force before comes back after.
class StrategyMode {
 public:
  explicit StrategyMode(brisk_strategy mode) : before_(brisk_get_strategy()) { brisk_set_strategy(mode); }
  ~StrategyMode() { brisk_set_strategy(before_); }

 private:
  brisk_strategy before_;
};

class LowMemoryMode : public StrategyMode {
 public:
  LowMemoryMode() : StrategyMode(BRISK_STRATEGY_LOW_MEMORY) {}
};

}  // namespace brisk
