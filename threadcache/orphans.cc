// Orphan spans and the orphan queue. See orphans.h.
#include "threadcache/orphans.h"

#include "core/assert.h"
#include "core/central_pool.h"
#include "core/report.h"
#include "core/stats.h"
#include "threadcache/remote_free.h"
#include "threadcache/span_pages.h"

namespace brisk {

void orphan_span(Span* s) {
  BRISK_ASSERT(s->used > 0 && !s->listed);  // an empty span is released, not orphaned
  CentralPool& pool = g_central[central_index(s)];
  LockGuard g(pool.lock);
  s->owner.store(&g_orphan_heap, std::memory_order_release);
  if (s->kind == SpanKind::kSmall && s->has_room()) pool.push(s);
  stats::add(&stats::Stripe::spans_orphaned, 1);
}
// A thread freeing into a span whose owner exited takes the span over (one lock round-trip)
// instead of sending each block through the orphan queue (one lock round-trip per block): the
// Larson pattern, where a thread inherits its predecessor's blocks, then frees locally.
// Not past BRISK_SPAN_KEEP: a heap that holds its limit of spans with room in the class leaves
// the span to the central pool, where it serves the next thread short of the class (h's slow
// lock, then the pool's: the order heap_detach takes them in).
bool adopt_orphan_span(Heap* h, Span* s) {
  CentralPool& pool = g_central[central_index(s)];
  HeapSlowLock lock(h);
  if (heap_keeps_enough(h, s)) return false;
  {
    LockGuard g(pool.lock);
    if (s->owner.load(std::memory_order_relaxed) != &g_orphan_heap) return false;
    if (s->listed) pool.remove(s);
    s->owner.store(h, std::memory_order_release);
    stats::add(&stats::Stripe::spans_orphaned, -1);
  }
  heap_link_span(h, s);
  if (s->kind == SpanKind::kSmall && s->has_room()) h->available[s->size_class].push(s);
  return true;
}

namespace {

// A block freed into a span whose owner exited, put back under the central pool's lock (the
// pool holds such spans). The span may have been adopted since the block was sent. Returns the
// block's size.
std::size_t process_orphan_block(Block* b) {
  auto a = reinterpret_cast<std::uintptr_t>(b);
  Span* s = chunk_of(a)->span_of(a);
  std::size_t size = s->block_size;
  Heap* owner;
  bool emptied = false;
  CentralPool& pool = g_central[central_index(s)];
  {
    LockGuard g(pool.lock);
    owner = s->owner.load(std::memory_order_acquire);
    if (owner == &g_orphan_heap) {
      if (!s->in_carved_part(a))
        fatal_pointer_error("invalid free of", b, "never handed out");  // aborts under the lock
      Block* old = s->free;
      set_link(b, old);
      s->free = b;
      BRISK_ASSERT(s->used > 0);
      if (span_used_decrement(s)) {
        if (s->listed) pool.remove(s);
        stats::add(&stats::Stripe::spans_orphaned, -1);
        emptied = true;
      } else if (old == nullptr && s->kind == SpanKind::kSmall && !s->listed) {
        pool.push(s);
      }
    }
  }
  if (owner != &g_orphan_heap) {
    if (owner == nullptr) fatal_pointer_error("invalid free of", b, "its span is not in use");
    send_chain(owner, b, b, size);
  } else if (emptied) {
    release_span_pages(s);  // no owner and on no list: nobody else can reach it
  }
  return size;
}

}  // namespace

namespace {
// Relaxed counters on a line of their own: pushes come from any thread freeing into an orphan.
struct alignas(BRISK_CACHELINE) OrphanQueueCounters {
  std::atomic<std::uint64_t> operations{0};
  std::atomic<std::uint64_t> retries{0};
};
OrphanQueueCounters g_orphan_queue_counters;
}  // namespace

void orphan_queue_counted_push(std::uint64_t retries) {
  g_orphan_queue_counters.operations.fetch_add(1, std::memory_order_relaxed);
  if (retries != 0) g_orphan_queue_counters.retries.fetch_add(retries, std::memory_order_relaxed);
}

LockCounts orphan_queue_counts() {
  return LockCounts{g_orphan_queue_counters.operations.load(std::memory_order_relaxed),
                    g_orphan_queue_counters.retries.load(std::memory_order_relaxed), 0};
}

namespace {

SpinLock g_drain_lock;

void drain_locked() {
  Block* b = g_orphan_heap.incoming.take_all();
  if (b != nullptr) g_orphan_queue_counters.operations.fetch_add(1, std::memory_order_relaxed);
  std::size_t bytes = 0;
  while (b != nullptr) {
    Block* next = chain_next(b);
    bytes += process_orphan_block(b);
    b = next;
  }
  note_chain_taken(bytes);
}

}  // namespace

void drain_orphans() {
  LockGuard g(g_drain_lock);
  drain_locked();
}

void drain_orphans_tried() {
  if (g_orphan_heap.incoming.empty() || !g_drain_lock.try_lock()) return;
  drain_locked();
  g_drain_lock.unlock();
}

void orphan_drain_lock_acquire() { g_drain_lock.lock(); }
void orphan_drain_lock_release() { g_drain_lock.unlock(); }
void orphan_drain_lock_reset_in_child() { g_drain_lock.reset_after_fork(); }

}  // namespace brisk
