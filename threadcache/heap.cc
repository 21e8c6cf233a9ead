// The heap's slow paths: refill, free_slow (remote frees, bad pointers), pointer validation
// and collect. The call map is in the README ("Call map: from malloc to the OS"). The nouns they
// use have files of their own: span_pages (spans), purge, remote_free, orphans, medium.
#include "threadcache/heap.h"

#include <errno.h>

#include <atomic>

#include "core/central_pool.h"
#include "core/large.h"
#include "core/platform.h"
#include "core/report.h"
#include "threadcache/debug_switch.h"
#include "threadcache/foreign_cache.h"
#include "threadcache/medium.h"
#include "threadcache/orphans.h"
#include "threadcache/purge.h"
#include "threadcache/remote_free.h"
#include "threadcache/span_pages.h"

namespace brisk {

constinit Span g_empty_span{.block_size = 1};
std::atomic<int> g_debug_depth{0};
DebugHooks g_debug_hooks{};
std::atomic<bool> g_debug_blocks_may_exist{false};

void free_list_damaged(const Block* b) {
  fatal_pointer_error("damaged free list: the link in freed block", b,
                      "was written after the free (a use after free, or an overflow of the block before it)");
}

namespace {
BRISK_NOINLINE void* refill(Heap* h, unsigned c, std::size_t size);
BRISK_NOINLINE void* refill_locked(Heap* h, unsigned c, std::size_t size);

// What every refill of an attached heap with its levers read does before it asks the foreign
// cache.
BRISK_ALWAYS_INLINE void refill_note(Heap* h, unsigned c) {
  heap_note_refill(h, c);
  if (h->foreign_always) h->foreign_wanted[c] = true;
}
}  // namespace

// The mode's test first, before any register is saved: in debug mode every allocation of a
// thread heap comes here. Then a block of the foreign cache, without a call or a saved register
// (only an attached heap's cache holds any; levers to read again go the long way): a thread
// that reuses other threads' blocks (a ring of threads, xmalloc) is served here at most of its
// allocations. The refill proper is out of line (one jump more for it).
BRISK_NOINLINE void* alloc_refill(Heap* h, unsigned c, std::size_t size) {
  if (BRISK_UNLIKELY(debug_mode_on()) && !h->is_debug) return g_debug_hooks.alloc(size);
  // Read as a relaxed atomic: outside out_busy, another thread taking the cache
  // (heap_take_outgoing) may be emptying it; foreign_cache_take reads it again inside.
  if (load_shared(h->foreign[c]) == nullptr || BRISK_UNLIKELY(heap_levers_stale(h))) return refill(h, c, size);
  refill_note(h, c);
  if (void* p = foreign_cache_take(h, c)) return p;
  return refill_locked(h, c, size);
}

namespace {

BRISK_NOINLINE void* refill(Heap* h, unsigned c, std::size_t size) {
  if (BRISK_UNLIKELY(!heap_is_attached(h))) {
    void* p;
    if (h == &g_exited_heap) {
      p = alloc_with_borrowed_heap([c, size](Heap* borrowed) { return alloc_refill(borrowed, c, size); });
    } else {
      h = heap_for_this_thread();
      p = h != nullptr ? alloc_small(h, c, size) : nullptr;
    }
    if (p == nullptr) errno = ENOMEM;
    return p;
  }
  heap_refresh_levers(h);
  refill_note(h, c);
  if (void* p = foreign_cache_take(h, c)) return p;
  return refill_locked(h, c, size);
}

// The rest of a refill, under h's slow lock: room in h's own spans, the central pool's, or a
// new span.
BRISK_NOINLINE void* refill_locked(Heap* h, unsigned c, std::size_t size) {
  HeapSlowLock lock(h);
  if (!h->incoming.empty()) heap_drain_incoming(h);
  drain_orphans_tried();
  if (BRISK_UNLIKELY(h->pending_tail_count != 0)) heap_age_span_tails(h);
  Span* s = h->installed[c];
  BRISK_ASSERT(s == &g_empty_span || (s->kind == SpanKind::kSmall && s->size_class == c &&
                                      s->owner.load(std::memory_order_relaxed) == h));
  if (s->free == nullptr) {
    if (s != &g_empty_span && !s->fully_carved()) {
      carve(s);
    } else {
      // The current span is full: it stays owned and unlisted until a block comes back to it.
      // The next: of the span listed last and the span listed first, the roomier. A full span
      // is listed at the free that gives it its first block back (free_local_refilled), so the
      // span listed last often has one free block, and a thread whose live blocks of the class
      // fill many spans, freed in random order, took a slow path for almost every allocation
      // when it always took that one: mimalloc-bench's alloc-test (blocks of 1 KiB and less,
      // 2^18 slots, 100M steps a thread) spent 16% of its time in refill and
      // free_local_refilled and took 1.31x mimalloc's time. The span listed first has had the
      // longest time to collect frees. Always taking it ran alloc-test in 0.79 of the time, but
      // prodcons in 1.085 [0.977, 1.119] (15 pairs): there the span listed last is the one the
      // producer's drain just wrote free blocks into (cache-hot), and often as roomy.
      s = h->available[c].pop_roomier_end();
      if (s == h->spare[c]) h->spare[c] = nullptr;
      if (s == nullptr) {
        // The thread grows in c: keep what it frees of other threads' c (foreign_cache.h).
        h->foreign_wanted[c] = true;
        s = central_take(c, h);
        if (s != nullptr) heap_link_span(h, s);
      }
      if (s == nullptr) s = span_new_small(h, c);
      if (s == nullptr) {
        errno = ENOMEM;
        return nullptr;
      }
      if (s->free == nullptr) carve(s);  // set_current below installs it
    }
  }
  // A new span, or the one a debug switch, the idle purge or a purge check took off the fast path.
  if (current_span(h, c) != s) {
    set_current(h, c, s);
    // Pairs with the fence after a switch turned the mode on (debug_switch.h): either the mode
    // reads on here, or the switch's store of g_empty_span lands after this install.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (BRISK_UNLIKELY(debug_mode_on()) && !h->is_debug) {
      std::atomic_ref<Span*>(h->current[c]).store(&g_empty_span, std::memory_order_relaxed);
      return g_debug_hooks.alloc(size);
    }
  }
  return alloc_small(h, c, size);  // the current span has a free block now
}

}  // namespace

BlockRef checked_block(const void* p, const char* what) {
  auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint8_t kind = region_kind(a);
  if (kind == kRegionChunk) {
    Span* s = chunk_of(a)->span_of(a);
    if (s->kind == SpanKind::kUnused) fatal_pointer_error(what, p, "not a block brisk handed out");
    std::uintptr_t offset = a - reinterpret_cast<std::uintptr_t>(s->start);
    if (!s->is_block_start(offset))
      fatal_pointer_error(what, p, "points inside a block, not at its start");
    return BlockRef{s, nullptr};
  }
  if (region_is_large(kind)) {
    if (LargeHeader* lh = large_header_of(p, kind)) return BlockRef{nullptr, lh};
    fatal_pointer_error(what, p, "not the start of a block brisk handed out");
  }
  fatal_pointer_error(what, p, "not a block brisk handed out");
}

namespace {

// A small or medium block b of span s, owned by `owner` (another heap), that this thread (heap h)
// has claimed: adopted with its span if that is an orphan, else sent home.
void free_claimed(Heap* h, Span* s, Block* b, Heap* owner) {
  auto a = reinterpret_cast<std::uintptr_t>(b);
  if (owner == &g_orphan_heap && adopt_orphan_span(h, s)) {
    // The span is ours now: this free, and the next ones into it, are local. Its carve state is
    // ours to read only now, so the never-handed-out test that every other path makes first
    // comes here after the adoption.
    if (!s->in_carved_part(a))
      fatal_pointer_error("invalid free of", b, "never handed out");
    free_to_own_span(h, s, b, free_code(a));
    return;
  }
  if (s->kind == SpanKind::kMedium && free_remote_medium(h, owner, s)) return;
  outgoing_add(h, owner, b, s->block_size);
}

}  // namespace

namespace {

BRISK_NOINLINE void free_release_slow(void* p);

// A free that may be of a debug block: the debug layer's, unless p is no debug block.
BRISK_NOINLINE void free_maybe_debug(void* p) {
  if (g_debug_hooks.free(p)) return;
  free_release_slow(p);
}

}  // namespace

namespace {

// free_slow's first try, before free_release_slow: the common remote free, of the start of a
// block of a small span that another live heap owns, by a thread with a heap. free_release_slow's
// checks in the same order, without a call or a saved register; then the block is kept in the
// foreign cache if the thread keeps its class (foreign_cache_keep), else claimed by the exchange
// of its free key and added to the outgoing batch for its owner (a tail call). So a thread that
// frees other threads' blocks (a ring of threads, a consumer) skips free_release_slow's frame
// and its second lookup of the block. False, with nothing changed, for anything else:
// free_release_slow then checks p again in full and reports what is wrong with it (a double
// free: its exchange finds the key that this one found), or takes a parked owner's heap.
BRISK_ALWAYS_INLINE bool free_remote_small(void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (region_kind(a) != kRegionChunk) return false;
  Span* s = chunk_of(a)->span_of(a);
  Heap* h = t_heap;
  if (s->kind != SpanKind::kSmall || !heap_is_attached(h)) return false;
  if (!s->is_block_start(a - reinterpret_cast<std::uintptr_t>(s->start))) return false;
  Heap* owner = s->owner.load(std::memory_order_acquire);
  if (owner == h || owner == nullptr || owner == &g_orphan_heap || heap_is_parked(owner)) return false;
  const unsigned c = s->size_class;
  const std::size_t size = s->block_size;
  const FreeCode code = free_code(a);
  auto* b = static_cast<Block*>(p);
  if (h->foreign_wanted[c]) return foreign_cache_keep(h, c, b, code, size);
  if (std::atomic_ref<std::uintptr_t>(b->key).exchange(code.key, std::memory_order_relaxed) == code.key) return false;
  outgoing_add(h, owner, b, size);
  return true;
}

}  // namespace

// Both tests first, before any register is saved: in debug mode every free of a debug block
// comes here. Then the common remote free, without a call (free_remote_small). The release path
// proper is out of line (one jump more for it).
BRISK_NOINLINE void free_slow(void* p) {
  if (p == nullptr) return;
  if (BRISK_UNLIKELY(g_debug_blocks_may_exist.load(std::memory_order_acquire))) return free_maybe_debug(p);
  if (free_remote_small(p)) return;
  free_release_slow(p);
}

namespace {

BRISK_NOINLINE void free_release_slow(void* p) {
  auto a = reinterpret_cast<std::uintptr_t>(p);
  BlockRef ref = checked_block(p, "invalid free of");
  if (ref.large != nullptr) {
    large_free_here(p, ref.large);
    return;
  }
  Span* s = ref.span;
  auto* b = static_cast<Block*>(p);
  FreeCode code = free_code(a);
  Heap* owner = s->owner.load(std::memory_order_acquire);
  // No owner: the span was given back (it holds no live block) after checked_block saw it in
  // use, so this is a double or invalid free racing with its release. Reported as
  // process_owned_run reports one found later; sent on, it reached outgoing_add(nullptr).
  if (BRISK_UNLIKELY(owner == nullptr)) fatal_pointer_error("invalid free of", p, "its span is not in use");
  Heap* h = t_heap;
  if (owner == h) {
    // The fast path refused it: it is free already, or lies beyond the carved blocks.
    if (b->key == code.key) fatal_pointer_error("double free of", p, nullptr);
    fatal_pointer_error("invalid free of", p, "never handed out");
  }
  // A remote free claims the block by setting its key in one atomic exchange: of two threads
  // freeing it at once, exactly one reads a value other than the key, so the block joins one
  // outgoing batch only. (The owner's free_fast checks and sets the key without an atomic; a
  // free by the owner racing with a remote free of the same block is not caught.)
  if (std::atomic_ref<std::uintptr_t>(b->key).exchange(code.key, std::memory_order_relaxed) == code.key)
    fatal_pointer_error("double free of", p, nullptr);
  if (h == &g_exited_heap) {
    h = nullptr;  // the thread must not own a heap again
  } else if (h == &g_sentinel_heap) {
    h = heap_for_this_thread();
  }
  if (h == nullptr) {
    send_chain(owner, b, b, s->block_size);  // no heap (exited thread, or out of memory for one): send it alone
    return;
  }
  // The owner waits in pthread_join: what its heap holds is taken (if small enough to take in a
  // free), and this block's span is an orphan that this thread adopts (heap_lifecycle.cc,
  // "Parked heaps").
  if (BRISK_UNLIKELY(heap_is_parked(owner)) && load_shared(owner->span_count) <= kParkedTakeInFreeMaxSpans &&
      heap_take_parked(owner, platform::now_ms()))
    owner = s->owner.load(std::memory_order_acquire);
  if (s->kind == SpanKind::kSmall && owner != &g_orphan_heap && foreign_cache_add(h, s, b)) return;
  free_claimed(h, s, b, owner);
}

}  // namespace

void heap_refresh_levers_slow(Heap* h) {
  // The epoch first (an acquire), then the strategy it follows, and the lever computed from
  // them: get() could still hold the previous strategy's value a moment after the epoch moved,
  // and the heap would keep it until the next switch.
  h->lever_epoch = options::strategy_epoch();
  h->batch_bytes = static_cast<std::size_t>(options::get_for(options::Id::kRemoteBatchBytes, options::strategy()));
  h->foreign_limit = static_cast<std::size_t>(options::get_for(options::Id::kForeignCacheBytes, options::strategy()));
  h->foreign_always = options::get_for(options::Id::kForeignCacheAlways, options::strategy()) != 0;
  h->span_keep = static_cast<std::uint32_t>(options::get_for(options::Id::kSpanKeep, options::strategy()));
}

std::atomic<void (*)(Heap* h)> g_give_back_test_hook{nullptr};

std::size_t heap_give_back_kept_tried(Heap* h) {
  if (!h->slow_lock.try_lock()) return 0;
  if (auto hook = g_give_back_test_hook.load(std::memory_order_relaxed); BRISK_UNLIKELY(hook != nullptr)) hook(h);
  std::size_t bytes = 0;
  // A heap that stopped serving gave everything back when it detached; a debug heap never stops
  // (debug_switch.h).
  if (h->serving || h->is_debug) bytes = medium_cache_flush(h) + heap_release_spares(h) + heap_flush_span_tails(h);
  h->slow_lock.unlock();
  return bytes;
}

std::size_t heap_collect(Heap* h) {
  HeapSlowLock lock(h);
  foreign_cache_flush(h);
  heap_flush_outgoing(h);
  // The orphan queue before h's own: a block freed into a span whose owner exited may belong to
  // a span h adopted since, and goes on to h's queue (process_orphan_block); drained the other
  // way round, it stayed there, counted in its span's `used`, which the collect then could not
  // give back (a chunk of a test's exited threads stayed mapped, pinned by such spans, in 1 of
  // 20-30 runs of threads_test under ASan). h's own queue may send blocks there: those of spans
  // h gave to the central pool (the span keep, remote_free.cc) after they were sent to h. So the
  // orphan queue once more after it.
  drain_orphans();
  heap_drain_incoming(h);
  drain_orphans();
  heap_release_empty_spans(h);
  medium_cache_flush(h);
  // The central pools' kept empty spans, which the drains may have added to, as the large cache
  // is flushed: process-wide caches a collect empties. Before the purge, which then takes
  // their pages in h's chunks (those in other chunks decay there, or empty them).
  release_kept_spans(0, 0, true);
  return heap_purge(h, 0);
}

}  // namespace brisk
