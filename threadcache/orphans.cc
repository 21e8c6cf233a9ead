// Orphan spans and the orphan queue. See orphans.h.
#include "threadcache/orphans.h"

#include <sched.h>

#include <atomic>

#include "core/assert.h"
#include "core/central_pool.h"
#include "core/chunk.h"
#include "core/options.h"
#include "core/platform.h"
#include "core/report.h"
#include "core/span_holes.h"
#include "core/stats.h"
#include "threadcache/remote_free.h"
#include "threadcache/span_pages.h"

namespace brisk {

namespace {
// Span::kept_ms of an orphan that changed at now_ms: never 0, which marks one whose holes were
// made since.
std::uint32_t orphan_stamp(std::uint64_t now_ms) {
  const auto stamp = static_cast<std::uint32_t>(now_ms);
  return stamp != 0 ? stamp : 1;
}
}  // namespace

void orphan_span(Span* s, bool holes_made) {
  BRISK_ASSERT(s->used > 0 && !s->listed);  // an empty span is released, not orphaned
  const std::uint32_t stamp = holes_made ? 0 : orphan_stamp(platform::now_ms());
  CentralPool& pool = g_central[central_index(s)];
  LockGuard g(pool.lock);
  s->kept_ms = stamp;
  s->owner.store(&g_orphan_heap, std::memory_order_release);
  if (s->kind == SpanKind::kSmall && s->has_room()) pool.push(s);
  stats::add(&stats::Stripe::spans_orphaned, 1);
}
std::size_t punch_orphan_holes(std::uint64_t now_ms, std::uint64_t delay_ms) {
  std::size_t bytes = 0;
  const auto now = static_cast<std::uint32_t>(now_ms);
  for (unsigned c = 0; c < kNumClasses; ++c) {
    CentralPool& pool = g_central[c];
    if (!pool.nonempty.load(std::memory_order_relaxed)) continue;
    // One span a lock hold, the head each time, moved to the tail after; and after a hold that
    // another thread waited through, the lock is left to it (SpinLock::let_waiter_in). A walk of the free list and a
    // madvise per span, over a gigabyte of an exited thread's 1 KiB blocks, held another
    // thread's refill of the class for the whole trim (330 ms) under one hold, and for up to
    // 300 ms with one span a hold alone: the spin lock's waiter yields its CPU, and missed the
    // moment between two holds. (A sched_yield after every span did as well on a quiet machine,
    // but beside two busy processes each gave the CPU away for a time slice: a trim of those
    // blocks took 2.0 s instead of 0.35.) Spans taken or added meanwhile only make the walk see
    // a span twice or miss one.
    std::size_t left;
    {
      LockGuard g(pool.lock);
      left = pool.available.count;
    }
    for (; left != 0; --left) {
      LockCounts during;
      {
        LockGuard g(pool.lock);
        during = pool.lock.counts();
        Span* s = pool.available.head;
        if (s == nullptr) break;
        pool.rotate();
        if (s->used == 0 || s->kept_ms == 0) continue;  // nothing came back since its last holes
        if (delay_ms != 0 && static_cast<std::int32_t>(now - s->kept_ms) < static_cast<std::int64_t>(delay_ms)) continue;
        bytes += span_punch_holes(s) + span_drop_tail(s);
        s->kept_ms = 0;
      }
      pool.lock.let_waiter_in(during);
    }
  }
  return bytes;
}
bool kept_span_fits(const Span* s) {
  if (s->carved_blocks == 0) return false;  // never carved: nothing resident to keep
  const std::size_t bytes = round_to_os_page(s->carved_bytes());
  const auto budget = static_cast<std::size_t>(options::get(options::Id::kKeptSpanBytes));
  return CentralPool::g_kept_span_bytes.load(std::memory_order_relaxed) + bytes <= budget;
}

std::atomic<void (*)(Span* chain)> g_kept_release_test_hook{nullptr};

namespace {

// How long ago a span was kept, in ms: 0 for one kept after `now` was read (a caller reads the
// clock before work that may keep spans: the background pass before its parked-heap takes, a
// purge check before its tails), which an unsigned difference would make look ages old.
std::int64_t kept_age(std::uint32_t now, const Span* s) {
  const auto age = static_cast<std::int32_t>(now - s->kept_ms);
  return age < 0 ? 0 : age;
}

// Takes s off pool's kept list to give its pages back (no owner's any more); under the lock.
void take_kept_locked(CentralPool& pool, Span* s) {
  pool.remove_kept(s);
  stats::add(&stats::Stripe::spans_orphaned, -1);
}

// Chains of kept spans taken off their pools' lists and not yet back in their chunks. Between
// the two no list holds them: a fork meanwhile would give the child spans it can never reach, up
// to the budget's bytes lost to it for good. A chain is counted under its pool's lock, so once
// the fork handler holds every pool's lock none starts; it then waits for the count to fall to
// 0 (kept_releases_wait) before it takes the chunk locks a release takes.
//
// A signal handler may fork on a thread that is releasing a chain itself: that release cannot
// end while the handler waits for it. t_kept_releasing (raised before the count, lowered after)
// tells the handler so, and it then waits for none (other threads' chains under way may be
// lost to that child, as before the count). The child's count starts at 0 and its fork
// generation moves on, so that a chain the parent counted is not taken off the child's count
// when the interrupted release ends there.
std::atomic<unsigned> g_kept_releases{0};
std::atomic<unsigned> g_kept_fork_generation{0};
__thread unsigned t_kept_releasing __attribute__((tls_model("initial-exec")));
__thread unsigned t_kept_generation __attribute__((tls_model("initial-exec")));

// Under a pool's lock: counts a chain about to leave its lists.
void count_kept_release_locked() {
  ++t_kept_releasing;
  std::atomic_signal_fence(std::memory_order_seq_cst);  // raised before counted, for a handler
  t_kept_generation = g_kept_fork_generation.load(std::memory_order_relaxed);
  g_kept_releases.fetch_add(1, std::memory_order_relaxed);
}
// Once the chain's pages are back in their chunks.
void end_kept_release() {
  if (t_kept_generation == g_kept_fork_generation.load(std::memory_order_relaxed))
    g_kept_releases.fetch_sub(1, std::memory_order_release);
  std::atomic_signal_fence(std::memory_order_seq_cst);  // uncounted before lowered
  --t_kept_releasing;
}

// Takes pool's kept spans older than delay_ms (all: every one) off its list, oldest first,
// into a chain through next, counted in g_kept_releases if there are any; under the pool's lock.
Span* take_stale_kept_locked(CentralPool& pool, std::uint32_t now, std::uint64_t delay_ms, bool all) {
  Span* chain = nullptr;
  while (Span* s = pool.kept_tail) {
    if (!all && kept_age(now, s) < static_cast<std::int64_t>(delay_ms)) break;
    take_kept_locked(pool, s);
    s->next = chain;
    chain = s;
  }
  if (chain != nullptr) count_kept_release_locked();
  return chain;
}

// Outside every pool lock: release_span_pages may take the abandoned-chunk list's lock, and
// giving pages back is too slow to hold other threads' refills for. Ends the chain's count.
void release_kept_chain(Span* chain) {
  if (chain == nullptr) return;
  if (auto hook = g_kept_release_test_hook.load(std::memory_order_relaxed); BRISK_UNLIKELY(hook != nullptr))
    hook(chain);
  while (Span* s = chain) {
    chain = s->next;
    s->next = nullptr;
    release_span_pages(s);
  }
  end_kept_release();
}

std::atomic<std::uint64_t> g_kept_swept_ms{0};

}  // namespace

void keep_empty_span(Span* s) {
  BRISK_ASSERT(s->kind == SpanKind::kSmall && s->used == 0 && !s->listed && !s->kept && s->carved_blocks != 0);
  // Uncarved, so that its next owner cuts its blocks in address order again (popping a free
  // list left in the order of the last frees scattered mstress's blocks: 1.05x its time), over
  // pages that carving finds resident (the chunk's os_pages record and resident_pages, which
  // spare it the populate calls of fresh pages).
  const std::uint64_t written = written_os_pages(s);
  const std::size_t bytes = round_to_os_page(s->carved_bytes());
  const unsigned carved_pages = static_cast<unsigned>((s->carved_bytes() + kPageSize - 1) >> kPageShift);
  chunk_note_written(chunk_of(reinterpret_cast<std::uintptr_t>(s->start)), s->first_page, s->page_count, written);
  store_shared(s->resident_pages, static_cast<std::uint8_t>(s->resident_pages | ((1u << carved_pages) - 1)));
  s->free = nullptr;
  store_shared(s->carved_blocks, 0u);
  store_shared(s->hole_pages, std::uint64_t{0});  // uncarved: carving writes those pages again
  s->kept_bytes = static_cast<std::uint32_t>(bytes);
  const std::uint64_t now = platform::now_ms();
  s->kept_ms = static_cast<std::uint32_t>(now);
  const auto delay = static_cast<std::uint64_t>(options::get(options::Id::kPurgeDelayMs));
  CentralPool& pool = g_central[s->size_class];
  Span* stale;
  {
    LockGuard g(pool.lock);
    s->owner.store(&g_orphan_heap, std::memory_order_release);
    stale = take_stale_kept_locked(pool, static_cast<std::uint32_t>(now), delay, false);
    pool.push_kept(s);
    stats::add(&stats::Stripe::spans_orphaned, 1);
  }
  release_kept_chain(stale);
}

void release_kept_spans(std::uint64_t now_ms, std::uint64_t delay_ms, bool all) {
  if (CentralPool::g_kept_span_bytes.load(std::memory_order_relaxed) == 0) return;
  for (unsigned c = 0; c < kNumClasses; ++c) {
    CentralPool& pool = g_central[c];
    Span* stale;
    {
      LockGuard g(pool.lock);
      stale = take_stale_kept_locked(pool, static_cast<std::uint32_t>(now_ms), delay_ms, all);
    }
    release_kept_chain(stale);
  }
}

void release_kept_spans_past_budget() {
  const auto budget = static_cast<std::size_t>(options::get(options::Id::kKeptSpanBytes));
  if (CentralPool::g_kept_span_bytes.load(std::memory_order_relaxed) > budget) release_kept_spans(0, 0, true);
}

void release_stale_kept_spans_due(std::uint64_t now_ms, std::uint64_t delay_ms) {
  if (CentralPool::g_kept_span_bytes.load(std::memory_order_relaxed) == 0) return;
  std::uint64_t last = g_kept_swept_ms.load(std::memory_order_relaxed);
  if (now_ms - last < delay_ms ||
      !g_kept_swept_ms.compare_exchange_strong(last, now_ms, std::memory_order_relaxed))
    return;
  release_kept_spans(now_ms, delay_ms);
}

bool release_kept_span_for_pages(unsigned pages) {
  if (CentralPool::g_kept_span_bytes.load(std::memory_order_relaxed) == 0) return false;
  // The pool whose oldest kept span has waited longest, by the unlocked marks: a race only
  // makes the choice less than the best, and the lock decides what is taken.
  const auto now = static_cast<std::uint32_t>(platform::now_ms());
  unsigned best = kNumClasses;
  std::int32_t longest = 0;
  for (unsigned c = 0; c < kNumClasses; ++c) {
    const CentralPool& pool = g_central[c];
    if (kClasses[c].span_pages < pages || pool.kept_count.load(std::memory_order_relaxed) == 0) continue;
    const auto waited = static_cast<std::int32_t>(now - pool.kept_oldest_ms.load(std::memory_order_relaxed));
    if (best == kNumClasses || waited > longest) {
      best = c;
      longest = waited;
    }
  }
  if (best == kNumClasses) return false;
  CentralPool& pool = g_central[best];
  Span* s;
  {
    LockGuard g(pool.lock);
    s = pool.kept_tail;
    if (s == nullptr) return false;
    take_kept_locked(pool, s);  // s->next is null off the list
    count_kept_release_locked();
  }
  release_kept_chain(s);
  return true;
}

void kept_releases_wait() {
  if (t_kept_releasing != 0) return;  // a handler forking on a thread in a release (above)
  // A release gives pages back (a madvise or an munmap each): yield rather than spin.
  while (g_kept_releases.load(std::memory_order_acquire) != 0) sched_yield();
}
void kept_releases_reset_in_child() {
  g_kept_fork_generation.fetch_add(1, std::memory_order_relaxed);
  g_kept_releases.store(0, std::memory_order_relaxed);
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
    // A kept span has no live block: the free is invalid, and the orphan queue's drain reports
    // it (process_orphan_block: never handed out), the span left on its list. A span with holes
    // (core/span_holes.h) stays an orphan until a heap short of its class takes it: its frees
    // go through the drain, which knows a block in a hole from a live one.
    if (s->owner.load(std::memory_order_relaxed) != &g_orphan_heap || s->kept || s->hole_pages != 0) return false;
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
std::size_t process_orphan_block(Block* b, std::uint32_t stamp) {
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
      // Free since brisk_trim gave its page back, and never handed out again (its key went with
      // the page, so the freeing thread's key exchange could not tell).
      if (span_block_in_hole(s, a))
        fatal_pointer_error("double free of", b, "freed again after brisk_trim gave its page back");
      Block* old = s->free;
      set_link(b, old);
      s->free = b;
      s->kept_ms = stamp;
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
    // No owner and on no list: nobody else can reach it.
    if (s->kind == SpanKind::kSmall && kept_span_fits(s))
      keep_empty_span(s);
    else
      release_span_pages(s);
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
  const std::uint32_t stamp = b != nullptr ? orphan_stamp(platform::now_ms()) : 0;
  while (b != nullptr) {
    Block* next = chain_next(b);
    bytes += process_orphan_block(b, stamp);
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
