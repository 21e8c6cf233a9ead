// Statistics derived from span state. See heap_stats.h.
#include "threadcache/heap_stats.h"

#include "core/central_pool.h"
#include "core/chunk.h"
#include "core/large.h"
#include "core/stats.h"
#include "threadcache/background.h"
#include "threadcache/orphans.h"

namespace brisk {
namespace {

struct Walk {
  SpanTotals* totals;
  HeapCounts* heaps;
  std::size_t heap_count;
  std::size_t last_hit;  // a heap's spans cluster in its chunks: the last match is tried first
};

HeapCounts* find_heap(Walk& w, const Heap* h) {
  if (w.heap_count == 0) return nullptr;
  if (w.heaps[w.last_hit].heap == h) return &w.heaps[w.last_hit];
  for (std::size_t i = 0; i < w.heap_count; ++i) {
    if (w.heaps[i].heap == h) {
      w.last_hit = i;
      return &w.heaps[i];
    }
  }
  return nullptr;
}


void visit_chunk(Chunk* c, void* context) {
  Walk& w = *static_cast<Walk*>(context);
  SpanTotals& t = *w.totals;
  ++t.live_chunks;
  std::uint64_t free = c->free_pages.load(std::memory_order_relaxed) & kAllPagesFree;
  std::uint64_t free_dirty = free & c->dirty_pages.load(std::memory_order_relaxed);
  // Not __builtin_popcountll: without -mpopcnt it calls libgcc, and libbrisk.so needs libc alone.
  for (std::uint64_t m = free; m != 0; m &= m - 1) t.free_page_bytes += kPageSize;
  for (std::uint64_t m = free_dirty; m != 0; m &= m - 1) t.free_resident_bytes += kPageSize;
  t.resident_estimate += round_to_os_page(sizeof(Chunk));  // the header page's used part
  // A live span's descriptor is the one at its first page, and its kind is not kUnused; every
  // other descriptor is kUnused (release_span_pages resets it, and a span never starts at a
  // page inside another).
  for (unsigned i = 1; i < kPagesPerChunk; ++i) {
    const Span& s = c->spans[i];
    SpanKind kind = load_shared(s.kind);
    if (kind == SpanKind::kUnused) continue;
    std::uint64_t used = load_shared(s.used);
    Heap* owner = s.owner.load(std::memory_order_relaxed);
    if (kind == SpanKind::kMedium) {
      // Resident: its pages. Live (used 1): its usable size is in use (medium.cc); freed and kept
      // in its heap's medium cache (used 0): its pages are the thread cache's.
      const std::uint64_t pages = std::uint64_t{load_shared(s.page_count)} << kPageShift;
      t.resident_estimate += pages;
      if (used != 0) {
        t.medium_bytes_in_use += load_shared(s.block_size);
        ++t.medium_live_blocks;
      } else {
        t.thread_cache_bytes += pages;
        if (HeapCounts* hc = find_heap(w, owner)) hc->cache_bytes += pages;
      }
      continue;
    }
    unsigned cls = load_shared(s.size_class);
    if (cls >= kNumClasses) continue;  // a descriptor being set up by its owner just now
    const SizeClassInfo& info = kClasses[cls];
    // A span purged in place (background.cc): the queued blocks dropped with its pages are
    // free, though its owner has not taken them off used yet, and at most the pages of one
    // block stay resident.
    bool purged = load_shared(s.idle_purged);
    if (purged) {
      std::uint64_t absorbed = load_shared(s.idle_absorbed);
      used = used > absorbed ? used - absorbed : 0;
    }
    if (used > info.capacity) used = info.capacity;  // read while it changed
    std::uint64_t free_blocks = info.capacity - used;
    ClassCounts& k = t.classes[cls];
    k.live_blocks += used;
    k.free_blocks += free_blocks;
    ++k.spans;
    t.small_live_blocks += used;
    t.small_bytes_in_use += used * info.size;
    std::uint64_t free_bytes = free_blocks * info.size;
    if (owner == &g_orphan_heap) {
      t.central_pool_bytes += free_bytes;
    } else {
      t.thread_cache_bytes += free_bytes;
      if (HeapCounts* hc = find_heap(w, owner)) hc->cache_bytes += free_bytes;
    }
    // Carved pages, and the resident ones past them: pages the span claimed after they held
    // data (span_new_small), which stay resident until carving reaches them.
    // The class's size, not the span's block_size: a descriptor released and reused between two
    // loads could pair a small span's count with a medium block's size.
    if (purged) {
      t.resident_estimate += round_to_os_page(info.size) + kOsPageSize;
      continue;
    }
    std::uint64_t carved = load_shared(s.carved_blocks);
    if (carved > info.capacity) carved = info.capacity;  // read while it changed
    const std::uint64_t carved_end = round_to_os_page(carved * info.size);
    // Less the pages brisk_trim gave back inside it (core/span_holes.h), all in the carved part.
    const std::uint64_t holes = std::uint64_t{count_bits(load_shared(s.hole_pages))} * kOsPageSize;
    t.resident_estimate += carved_end > holes ? carved_end - holes : 0;
    for (std::uint64_t m = load_shared(s.resident_pages); m != 0; m &= m - 1) {
      const std::uint64_t page = static_cast<std::uint64_t>(__builtin_ctzll(m)) << kPageShift;
      const std::uint64_t page_end = page + kPageSize;
      if (page_end > carved_end) t.resident_estimate += page_end - (page > carved_end ? page : carved_end);
    }
  }
}

}  // namespace

void gather_span_totals(SpanTotals* totals, HeapCounts* heaps, std::size_t n) {
  *totals = SpanTotals{};
  for (std::size_t i = 0; i < n; ++i) heaps[i].cache_bytes = 0;
  Walk w{totals, heaps, n, 0};
  chunk_for_each_live(visit_chunk, &w);
  totals->resident_estimate += totals->free_resident_bytes;
  // Cached chunks keep only their header's used part (chunk_destroy decommits the rest).
  totals->resident_estimate +=
      stats::g.chunks_cached.load(std::memory_order_relaxed) * round_to_os_page(sizeof(Chunk));
  std::uint64_t queued = stats::sum(&stats::Stripe::remote_queued_bytes);
  for (Heap* h = all_heaps(); h != nullptr; h = h->all_next) {
    for (const OutgoingBatch& o : h->outgoing) queued += load_shared(o.bytes);
    queued += load_shared(h->foreign_bytes);
  }
  totals->remote_queued_bytes = queued;
}

void gather_lock_counts(LockCounts (&out)[kLockedStructures]) {
  for (LockCounts& c : out) c = LockCounts{};
  for (unsigned c = 0; c < kNumClasses; ++c) out[kLockCentralPools].add(g_central[c].lock.counts());
  out[kLockMediumPool] = g_central[kMediumPool].lock.counts();
  out[kLockChunkRegistry] = chunk_registry_lock_counts();
  out[kLockChunkCache] = chunk_cache_lock_counts();
  out[kLockAbandonedChunks] = chunk_abandoned_lock_counts();
  out[kLockLargeCache] = large_lock_counts();
  out[kLockHeapPool] = heap_pool_lock_counts();
  for (Heap* h = all_heaps(); h != nullptr; h = h->all_next) out[kLockHeapSlow].add(h->slow_lock.counts());
  out[kLockBackgroundPass] = background_lock_counts();
  out[kLockOrphanQueue] = orphan_queue_counts();
}

std::uint64_t remote_frees_sent(const Heap* h) {
  std::uint64_t sent = h->remote_frees_sent.load(std::memory_order_relaxed);
  for (const OutgoingBatch& o : h->outgoing) sent += load_shared(o.count);
  return sent;
}

std::size_t attached_heaps(const Heap** out, std::size_t max, std::size_t skip) {
  std::size_t n = 0;
  for (Heap* h = all_heaps(); h != nullptr; h = h->all_next) {
    if (h->thread_id.load(std::memory_order_relaxed) == 0) continue;
    if (n >= skip && n - skip < max) out[n - skip] = h;
    ++n;
  }
  return n;
}

}  // namespace brisk
