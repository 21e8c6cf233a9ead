// A heap's spans: where a new span's pages come from, lazy carving, the heap's list of every
// span it holds, and what happens to a span that empties (kept as its class's current span,
// retained, or released to its chunk). Only the owning heap calls these for its spans, except
// release_span_pages, which the holder of a central pool's lock also calls for an orphan span
// that emptied (orphans.cc).
#pragma once

#include <cstddef>

#include "threadcache/heap.h"

namespace brisk {

// A span of `pages` pages with its descriptor set up (pages and start), not yet given a kind or
// an owner. dirty (optional): set to the pages that may hold old data, bit i for the span's page
// i (0: every page reads as zeros). nullptr: no memory.
// small: for a small class (may take the pages of a span kept empty for another class). need
// (one-page spans): the OS pages its first carves touch (chunk_claim_pages).
Span* span_create(Heap* h, unsigned pages, std::uint64_t* dirty = nullptr, bool small = false, unsigned need = 0);
// By h's owner, at each alloc_refill of class c: counts the refill (Heap::refills, refilled_at)
// and adapts how stale a kept span must be before a new span of another class takes its page
// (span_pages.cc's take_stale_kept_page): a class whose kept span was taken and that refills
// again within four times that many refills doubles it; every 1,024 refills halve it.
inline void heap_note_refill(Heap* h, unsigned c) {
  const std::uint32_t now = ++h->refills;
  h->refilled_at[c] = now;
  if (BRISK_UNLIKELY(h->kept_taken_at[c] != 0)) {
    if (now - h->kept_taken_at[c] < 4 * h->take_kept_after && h->take_kept_after < Heap::kTakeKeptAfterMax)
      h->take_kept_after *= 2;
    h->kept_taken_at[c] = 0;
  }
  if ((now & 1023) == 0 && h->take_kept_after > Heap::kTakeKeptAfterMin) h->take_kept_after /= 2;
}
// A fresh span of small class c owned by h, with nothing carved yet.
Span* span_new_small(Heap* h, unsigned c);
// Under h's slow lock: h's pending span tails (BRISK_PURGE_SPAN_TAILS) go back to the OS, all in
// one system call where the kernel allows it, less the OS pages carving has reached since.
// Returns their bytes.
std::size_t heap_flush_span_tails(Heap* h);
// Under h's slow lock: the same once the first of them has waited BRISK_PURGE_DELAY_MS (each
// refill asks, while any wait).
void heap_age_span_tails(Heap* h);
// Tests: called at each flush with the ranges given back and the system calls that took.
extern std::atomic<void (*)(Heap* h, unsigned ranges, std::size_t calls)> g_span_tails_flushed_test_hook;
void carve(Span* s);                       // cuts the next OS page of s into free blocks
void heap_link_span(Heap* h, Span* s);     // onto h's list of all its spans
void heap_unlink_span(Heap* h, Span* s);   // off that list
void release_span_pages(Span* s);          // resets s and gives its pages back to the chunk
// The OS pages of s that may have held data since its pages were claimed, bit i for its i-th
// (chunk.h's os_pages record): a small span's carved part, a medium span's pages all.
std::uint64_t written_os_pages(const Span* s);
// Unlinks s from h, releases it, purges when due. Called with h's slow lock held, by h's owner
// (HeapSlowLock) or by another thread that took the lock itself (free_remote_medium, the
// background reclaim, heap_give_back_kept_tried): nothing it calls may take HeapSlowLock, whose
// nesting count is the owner's alone.
void heap_release_span(Heap* h, Span* s);
// With h's slow lock held, as heap_release_span: an emptied small span of h goes to its class's
// central pool, kept whole (orphans.h, keep_empty_span), unless h is a debug heap, the span was
// never carved or the pools' budget is spent. False: not kept (the caller releases it).
bool heap_keep_empty_span(Heap* h, Span* s);
// With h's slow lock held: gives back every class's spare (span_pages.cc); returns their bytes.
std::size_t heap_release_spares(Heap* h);
// With h's slow lock held, by the thread whose fast paths use h's current spans (they do so
// without the lock, so no other thread may release them): gives back every class's current
// span that is empty, and every spare.
void heap_release_empty_spans(Heap* h);
// In heap_purge's aging check, by h's owner thread under HeapSlowLock: gives
// back every span kept empty for its class (a current span, a retained class's spare) from
// which nothing was allocated since the previous check: jemalloc's decay, for whole spans. A
// class in use keeps its span (at the cost of one slow path a check, which puts it back on the
// fast path); a class the thread left goes back within two purge delays, and its pages a
// check later, as any free page's.
void heap_release_stale_kept_spans(Heap* h);

}  // namespace brisk
