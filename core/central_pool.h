// Central pools: one per size class (plus one for medium spans), holding the spans that no
// thread owns: spans of exited threads, with their free blocks. A thread cache refills from its
// class's pool a whole span at a time (a batch of blocks for one lock round-trip), so contention
// on a pool's lock never reaches the per-allocation path.
//
// Every span in a pool has owner == &g_orphan_heap. Only a holder of the pool's lock touches
// such a span; blocks freed into it travel through the orphan queue (threadcache/orphans.cc) and
// are put back under this lock.
#pragma once

#include <atomic>

#include "core/assert.h"
#include "core/lock.h"
#include "core/size_class.h"
#include "core/span.h"

namespace brisk {

struct CentralPool {
  SpinLock lock;
  SpanList available;               // orphan spans with free blocks or uncarved room
  std::atomic<bool> nonempty{false};  // available.head != nullptr, readable without the lock

  // Under the lock. Every span held here belongs to the orphan owner (see above).
  void push(Span* s) {
    BRISK_ASSERT(lock.is_locked());
    available.push(s);
    nonempty.store(true, std::memory_order_relaxed);
  }
  void remove(Span* s) {
    BRISK_ASSERT(lock.is_locked());
    available.remove(s);
    nonempty.store(available.head != nullptr, std::memory_order_relaxed);
  }
};

inline constexpr unsigned kMediumPool = kNumClasses;
inline constexpr unsigned kCentralPools = kNumClasses + 1;
extern CentralPool g_central[kCentralPools];

inline unsigned central_index(const Span* s) {
  return s->kind == SpanKind::kMedium ? kMediumPool : s->size_class;
}

// Takes a span with room from the pool of class c and makes new_owner its owner.
Span* central_take(unsigned c, Heap* new_owner);

void central_locks_acquire();
void central_locks_release();
void central_locks_reset_in_child();

}  // namespace brisk
