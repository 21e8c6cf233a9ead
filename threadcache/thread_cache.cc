// The thread cache's entry points for the layers above that are not fast paths: they find the
// calling thread's heap in whichever state the thread is (no heap yet, attached, or exited).
#include <atomic>

#include "core/chunk.h"
#include "core/large.h"
#include "core/span_holes.h"
#include "threadcache/background.h"
#include "threadcache/heap.h"
#include "threadcache/medium.h"
#include "threadcache/orphans.h"
#include "threadcache/span_pages.h"

namespace brisk {

void* alloc_medium_here(std::size_t size, bool zero, std::size_t room) {
  Heap* h = t_heap;
  if (h == &g_exited_heap)
    return alloc_with_borrowed_heap([&](Heap* borrowed) { return alloc_medium(borrowed, size, zero, room); });
  if (h == &g_sentinel_heap) h = heap_for_this_thread();
  return h != nullptr ? alloc_medium(h, size, zero, room) : nullptr;
}

// The thread's debug heap too (threadcache/debug_switch.h): its free pages are the calling
// thread's as much as its thread heap's, and only its owner purges them (no other heap's decay
// walks its chunks), so a thread done with debug mode would keep them until its next debug
// block otherwise.
std::size_t thread_collect() {
  Heap* h = t_heap;
  if (heap_is_attached(h)) {
    std::size_t bytes = heap_collect(h);
    if (h->debug != nullptr) bytes += heap_collect(h->debug);
    return bytes + large_cache_flush();
  }
  drain_orphans();
  release_kept_spans(0, 0, true);  // as heap_collect does
  return large_cache_flush();
}

namespace {

// With h's slow lock held, by h's owner (whose fast paths are the only other users of its
// spans' free lists, and who alone carves them): the OS pages of h's small spans that hold only
// free blocks go back to the OS (core/span_holes.h), and so do the resident pages past their
// carved parts (their tails: speed mode keeps them, and no mode sends back those of a span made
// on pages its class just released, nor of a kept span taken again); each span
// given holes leaves h for its class's central pool as an orphan. Returns the bytes given back.
std::size_t heap_punch_holes(Heap* h) {
  BRISK_ASSERT(t_heap == h && h->slow_depth != 0 && !h->is_debug && !h->idle_purged);
  std::size_t bytes = 0;
  for (Span* s = h->all_spans; s != nullptr;) {
    Span* next = s->all_next;
    if (s->kind == SpanKind::kSmall && s->used != 0) {
      bytes += span_drop_tail(s);
      const std::size_t punched = span_punch_holes(s);
      if (punched != 0) {
        bytes += punched;
        // Off h's fast paths for good: h's frees into it would not see a hole (span_holes.h).
        const unsigned c = s->size_class;
        if (s->listed) h->available[c].remove(s);
        if (h->spare[c] == s) h->spare[c] = nullptr;
        if (h->installed[c] == s) set_current(h, c, &g_empty_span);
        heap_unlink_span(h, s);
        orphan_span(s, true);
      }
    }
    s = next;
  }
  return bytes;
}

}  // namespace

// The calling thread's collect first, so its emptied spans are free pages before the sweep.
// Then the frees queued to every other heap whose slow lock is free: the spans they empty are
// given back as the background thread does for idle heaps (reclaim_queued_frees; sound whatever
// the owner is doing), and so are the pages of their installed spans that hold no live block
// (purge in place, background.cc). Other free blocks in their spans are left alone: their
// owners use them without a lock. Whole OS pages of free blocks in spans that keep a live block
// go back too, in the calling thread's spans and the orphans' (core/span_holes.h). The sweep
// takes every chunk's free pages (chunk_purge_all).
std::size_t process_trim() {
  heap_reap_exited();  // heaps left attached by threads that are gone, then their memory
  std::size_t bytes = thread_collect();
  // Debug heaps too: the blocks of one that other threads freed wait in its queue after their
  // quarantine, and its owner may not allocate again. (Its own thread's was collected above.)
  for (Heap* h = all_heaps(); h != nullptr; h = h->all_next) {
    if (h == t_heap) continue;
    reclaim_queued_frees(h, &bytes);  // released spans are counted by chunk_purge_all below
    heap_give_back_kept_tried(h);
    Heap* d = std::atomic_ref<Heap*>(h->debug).load(std::memory_order_acquire);
    if (d != nullptr) {
      reclaim_queued_frees(d);
      heap_give_back_kept_tried(d);
    }
  }
  // What the reclaims forwarded there: blocks that reached a heap after it gave their span to
  // the central pool (the span keep), which may empty such spans now.
  drain_orphans();
  release_kept_spans(0, 0, true);  // to their chunks: the sweep counts their pages
  // Then the free blocks that share their spans with live ones: whole OS pages of them go back
  // (core/span_holes.h), in the orphans' spans and in the calling thread's, which become
  // orphans. Other threads' spans are on their owners' lock-free fast paths.
  bytes += punch_orphan_holes(0, 0);
  if (Heap* h = t_heap; heap_is_attached(h)) {
    HeapSlowLock lock(h);
    bytes += heap_punch_holes(h);
  }
  bytes += chunk_purge_all();
  chunk_destroy_empty_abandoned();  // to the chunk cache, which goes next
  return bytes + chunk_cache_flush();
}

}  // namespace brisk
