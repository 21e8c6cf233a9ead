// Orphans: spans whose owning thread exited. They are owned by g_orphan_heap and held by the
// central pool of their class, under whose lock alone they are touched; blocks freed into them
// come through the orphan queue (g_orphan_heap's RemoteQueue). A thread that frees into one
// adopts it, a whole span at a time.
#pragma once

#include "threadcache/heap.h"

namespace brisk {

void orphan_span(Span* s);              // hands a span of an exiting heap to its central pool
bool adopt_orphan_span(Heap* h, Span* s);  // false if another thread took it first
void drain_orphans();                   // puts every block in the orphan queue back

// The orphan queue is lock-free: brisk_get_lock_stats counts its operations (chains pushed,
// non-empty takes) as acquisitions and its lost compare-and-swaps as contended.
void orphan_queue_counted_push(std::uint64_t retries);
LockCounts orphan_queue_counts();

}  // namespace brisk
