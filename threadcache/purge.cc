// Decay purging of a heap's chunks. See purge.h.
#include "threadcache/purge.h"

#include "core/chunk.h"
#include "core/options.h"
#include "core/platform.h"
#include "threadcache/orphans.h"
#include "threadcache/span_pages.h"

namespace brisk {

// Returns to the OS the resident memory of free pages that stayed unused for at least
// BRISK_PURGE_DELAY_MS: at each check (every BRISK_PURGE_BYTES of span releases, so an idle
// thread costs nothing) it purges the pages that were free and dirty at the previous check and
// still are, if that check is old enough. A page freed and claimed again in between is spared,
// so the pages a steady workload keeps reusing stay resident. This is jemalloc's decay, with
// the clock read only at checks: no background thread. Whole empty chunks beyond one spare go
// to the chunk cache. keep == 0 (brisk_thread_collect) purges everything at once.
// Measured on the producer/consumer workload: purging every free dirty page past a byte
// threshold cost 1985 madvise calls and a third of the run in refaults; aging by bytes alone
// (no clock) still left madvise at 21% of the profile.
std::size_t heap_purge(Heap* h, std::size_t keep) {
  h->released_since_purge = 0;
  std::uint64_t now = platform::now_ms();
  auto delay = static_cast<std::uint64_t>(options::get(options::Id::kPurgeDelayMs));
  bool age = keep == 0 || now - h->aged_at_ms >= delay;
  if (!age) return 0;
  h->aged_at_ms = now;
  heap_flush_span_tails(h);  // a purge check sends the span tails waiting for company
  // Only the owner may take a current span away: heap_purge also runs in a remote freer's or
  // the background thread's heap_release_span, under the lock but beside the owner's fast paths.
  // And only under HeapSlowLock (slow_depth counts it), which first rebuilds the spans the idle
  // purge gave back in place: the owner also takes its own lock with a bare try_lock, to reclaim
  // its queue for another of its heaps (reclaim_other_queues from its debug heap's span_create),
  // and a span still marked idle_purged must not be released.
  if (keep != 0 && t_heap == h && h->slow_depth != 0) heap_release_stale_kept_spans(h);
  // The central pools' kept spans have no heap to check them: any heap's check sweeps them,
  // once per delay process-wide (the background pass does too, where it runs).
  release_stale_kept_spans_due(now, delay);
  bool lazy = options::get(options::Id::kPurgeAdvice) == 1 && keep != 0;  // collect is eager
  bool kept_spare = false;
  std::size_t bytes = 0;
  ChunkPurgeBatch batch(lazy);  // the heap's own chunks: none is unmapped while it holds pages
  for (Chunk* c = h->chunks; c != nullptr;) {
    Chunk* next = c->next;
    std::uint64_t free = c->free_pages.load(std::memory_order_acquire);
    std::uint64_t free_dirty = free & c->dirty_pages.load(std::memory_order_relaxed);
    if (lazy) free_dirty &= ~c->lazy_pages.load(std::memory_order_relaxed);
    if (free == kAllPagesFree && kept_spare) {
      // The batch's pages first: chunk_destroy may wait for the registry lock (behind a whole
      // trim or decay sweep, or fork's prepare handler, whose child would then never get them
      // back), and no other heap can use pages the batch holds meanwhile.
      batch.flush();
      chunk_list_remove(h->chunks, c);
      if (chunk_destroy(c)) {
        // Its dirty pages were decommitted or unmapped. (A loop: __builtin_popcountll would
        // call libgcc's __popcountdi2 without -mpopcnt, and libbrisk.so needs libc alone.)
        for (std::uint64_t m = free_dirty; m != 0; m &= m - 1) bytes += kPageSize;
      } else {
        chunk_list_push(h->chunks, c);  // another heap took pages in it just now
      }
    } else {
      kept_spare |= free == kAllPagesFree;
      std::uint64_t stale = keep == 0 ? free_dirty : free_dirty & c->aged.load(std::memory_order_relaxed);
      if (stale != 0) bytes += batch.add(c, stale);
      c->aged.store(free_dirty & ~stale, std::memory_order_relaxed);
    }
    c = next;
  }
  return bytes;
}

}  // namespace brisk
