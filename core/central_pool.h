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
  // Emptied spans of the class kept whole (Span::kept, threadcache/orphans.cc), newest at the
  // head, through prev and next as available's; taken newest first, given back oldest first.
  Span* kept_head = nullptr;
  Span* kept_tail = nullptr;
  // Readable without the lock: the kept list's length, and when its oldest span went there.
  std::atomic<std::uint32_t> kept_count{0};
  std::atomic<std::uint32_t> kept_oldest_ms{0};
  std::atomic<bool> nonempty{false};  // available or the kept list holds a span, readable without the lock

  // Under the lock. Every span held here belongs to the orphan owner (see above).
  void push(Span* s) {
    BRISK_ASSERT(lock.is_locked());
    available.push(s);
    nonempty.store(true, std::memory_order_relaxed);
  }
  void remove(Span* s) {
    BRISK_ASSERT(lock.is_locked());
    available.remove(s);
    nonempty.store(available.head != nullptr || kept_head != nullptr, std::memory_order_relaxed);
  }
  // SpanList::rotate of available, for punch_orphan_holes' walk.
  void rotate() {
    BRISK_ASSERT(lock.is_locked());
    available.rotate();
  }
  void push_kept(Span* s) {
    BRISK_ASSERT(lock.is_locked() && !s->listed && !s->kept);
    s->kept = true;
    s->prev = nullptr;
    s->next = kept_head;
    if (kept_head != nullptr) {
      kept_head->prev = s;
    } else {
      kept_tail = s;
      kept_oldest_ms.store(s->kept_ms, std::memory_order_relaxed);
    }
    kept_head = s;
    kept_count.store(kept_count.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    g_kept_span_bytes.fetch_add(s->kept_bytes, std::memory_order_relaxed);
    nonempty.store(true, std::memory_order_relaxed);
  }
  void remove_kept(Span* s) {
    BRISK_ASSERT(lock.is_locked() && s->kept);
    if (s->prev != nullptr) s->prev->next = s->next; else kept_head = s->next;
    if (s->next != nullptr) {
      s->next->prev = s->prev;
    } else {
      kept_tail = s->prev;
      if (kept_tail != nullptr) kept_oldest_ms.store(kept_tail->kept_ms, std::memory_order_relaxed);
    }
    s->prev = s->next = nullptr;
    s->kept = false;
    kept_count.store(kept_count.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
    g_kept_span_bytes.fetch_sub(s->kept_bytes, std::memory_order_relaxed);
    nonempty.store(available.head != nullptr || kept_head != nullptr, std::memory_order_relaxed);
  }

  // Bytes of the spans on every pool's kept list (Span::kept_bytes), against BRISK_KEPT_SPAN_BYTES.
  static std::atomic<std::size_t> g_kept_span_bytes;
};

inline constexpr unsigned kMediumPool = kNumClasses;
inline constexpr unsigned kCentralPools = kNumClasses + 1;
extern CentralPool g_central[kCentralPools];

inline unsigned central_index(const Span* s) {
  return s->kind == SpanKind::kMedium ? kMediumPool : s->size_class;
}

// Takes a span with room from the pool of class c and makes new_owner its owner: an orphan with
// free blocks first (its room is memory already in use; holes brisk_trim made in it are filled
// first, core/span_holes.h), else the kept empty span that went there last (uncarved: the
// taker carves it again, over pages that are still resident).
Span* central_take(unsigned c, Heap* new_owner);

void central_locks_acquire();
void central_locks_release();
void central_locks_reset_in_child();

}  // namespace brisk
