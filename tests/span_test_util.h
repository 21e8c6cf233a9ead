// Helpers shared by the span tests (tests/span_test.cc, tests/span_tails_test.cc) and the
// background pass's (tests/background_test.cc).
#pragma once

#include <brisk/brisk.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/central_pool.h"
#include "core/chunk.h"
#include "core/config.h"
#include "core/size_class.h"
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

// On the calling thread: every chunk's free pages purged, then two free pages that held data
// (LeaveTwoResidentFreePages), the class's central spans held aside, and the first block of
// `size` from the new span that takes those pages. nullptr if the span took other pages.
inline void* FirstBlockOfASpanOverResidentPages(std::size_t size) {
  chunk_purge_all();
  void* m = LeaveTwoResidentFreePages(0x77);
  if (m == nullptr) return nullptr;
  HoldCentralSpans(size_to_class(size));
  void* b = brisk_malloc(size);
  if (b == nullptr || span_of(b)->start != m) {
    brisk_free(b);
    return nullptr;
  }
  return b;
}

// A small span's tail: its OS pages past the first, where a one-page first carve stops.
struct SpanTail {
  char* start = nullptr;
  std::size_t bytes = 0;
};
inline SpanTail TailOf(const Span* s) {
  return SpanTail{s->start + kOsPageSize, (std::size_t{s->page_count} << kPageShift) - kOsPageSize};
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
