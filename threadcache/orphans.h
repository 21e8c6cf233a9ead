// Orphans: spans whose owning thread exited. They are owned by g_orphan_heap and held by the
// central pool of their class, under whose lock alone they are touched; blocks freed into them
// come through the orphan queue (g_orphan_heap's RemoteQueue). A thread that frees into one
// adopts it, a whole span at a time.
#pragma once

#include "threadcache/heap.h"

namespace brisk {

void orphan_span(Span* s);              // hands a span of an exiting heap to its central pool
bool adopt_orphan_span(Heap* h, Span* s);  // false if another thread took it first
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
