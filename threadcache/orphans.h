// Orphans: spans whose owning thread exited. They are owned by g_orphan_heap and held by the
// central pool of their class, under whose lock alone they are touched; blocks freed into them
// come through the orphan queue (g_orphan_heap's RemoteQueue). A thread that frees into one
// adopts it, a whole span at a time.
#pragma once

#include "threadcache/heap.h"

namespace brisk {

// Hands a span of an exiting heap (or one its heap sheds) to its central pool. holes_made: its
// holes were just made (core/span_holes.h), so the background pass need not walk it again until
// a block comes back to it (Span::kept_ms).
void orphan_span(Span* s, bool holes_made = false);
bool adopt_orphan_span(Heap* h, Span* s);  // false if another thread took it first
// The OS pages of orphan spans that hold only free blocks, and the uncarved pages past their
// carved parts that held data (their tails, which the exiting thread left them), go back to the
// OS (core/span_holes.h), each pool's spans under its lock: of every orphan that changed since its holes
// were last made (Span::kept_ms), and, with a delay (the background pass), only of those
// unchanged for that long, so that a span other threads are freeing into is not walked at each
// pass. brisk_trim passes 0. Returns the bytes.
std::size_t punch_orphan_holes(std::uint64_t now_ms, std::uint64_t delay_ms);
// Kept empty spans. A small span whose last block comes back, and that its heap does not keep
// (as its class's current span or spare), goes whole to its class's central pool rather than
// giving its pages back to the chunk; so do the empty spans of a heap detaching at thread exit,
// and an orphan span the orphan queue's drain empties. The next thread short of the class takes
// it (central_take, after the orphans with live blocks) and carves it again from its first
// block, over pages that are still resident where the class's blocks were written: a program
// that writes only part of its blocks (a header, a tail) finds the same offsets present again,
// where a span of another class cut over those pages puts its blocks' ends on pages that fault.
// Bounded by BRISK_KEPT_SPAN_BYTES (the bytes the spans' blocks may have written) and by age: a
// span kept BRISK_PURGE_DELAY_MS goes back to its chunk, whose decay then purges its pages.
// mimalloc keeps a page that empties in its heap's queue for a few cycles ("retire") for the
// same reuse; tcmalloc keeps the blocks themselves in size-class caches shared by all threads.
//
// Whether s is worth keeping: carved (a span never carved holds nothing resident), and its
// written bytes fit the budget now (read without a lock: a bound kept within a span or so per
// thread keeping one at the same moment).
bool kept_span_fits(const Span* s);
// s: an empty small span held by no heap and on no list, with carved blocks. Made uncarved
// (its written OS pages noted as resident), stamped and put on its class's kept list; kept
// spans of that class older than the purge delay go back to their chunks meanwhile.
void keep_empty_span(Span* s);
// Kept spans that went to their pools at least delay_ms before now_ms (every one: all), back to
// their chunks (whose sweeps count the pages they give back). brisk_trim, brisk_thread_collect
// (all), the background pass and the heaps' purge checks (release_stale_kept_spans_due: at
// most once per delay process-wide).
void release_kept_spans(std::uint64_t now_ms, std::uint64_t delay_ms, bool all = false);
void release_stale_kept_spans_due(std::uint64_t now_ms, std::uint64_t delay_ms);
// Every kept span, when the pools hold more than BRISK_KEPT_SPAN_BYTES allows now: called after a
// strategy switch, since a process whose threads have all stopped runs no purge check, and
// without a second thread no background pass, that would give them back.
void release_kept_spans_past_budget();
// For a new small span of `pages` pages that found no resident free pages: the kept span that
// has waited longest among the classes whose spans have at least that many pages goes back to
// its chunk, whose resident pages the new span then claims, rather than a fresh page that would
// fault. A program that moves on through the classes (a string growing by realloc) leaves
// spans kept for classes it will not use again. False: no such span.
bool release_kept_span_for_pages(unsigned pages);
// Fork support. Kept spans on their way back to their chunks are on no list for a moment; the
// fork handler, holding every central pool's lock (so that no such release starts), waits for
// those under way before it takes the chunk locks they take, so that the child loses none.
void kept_releases_wait();
void kept_releases_reset_in_child();
// Test hook, null in production: called with each chain of kept spans taken off their lists,
// before their pages go back (tests/kept_span_test.cc forks there).
extern std::atomic<void (*)(Span* chain)> g_kept_release_test_hook;

// Puts every block in the orphan queue back. Drains run one at a time (a drain lock, taken
// after a heap's slow lock and before the central pools' locks): drain_orphans waits for one
// under way, so that once it returns every block queued before it was called is back (a
// collect or a trim, whose caller reads the statistics next); drain_orphans_tried leaves the
// queue to the drain under way (a refill, the background pass).
void drain_orphans();
void drain_orphans_tried();
// The drain lock, for the fork handlers.
void orphan_drain_lock_acquire();
void orphan_drain_lock_release();
void orphan_drain_lock_reset_in_child();

// The orphan queue is lock-free: brisk_get_lock_stats counts its operations (chains pushed,
// non-empty takes) as acquisitions and its lost compare-and-swaps as contended.
void orphan_queue_counted_push(std::uint64_t retries);
LockCounts orphan_queue_counts();

}  // namespace brisk
