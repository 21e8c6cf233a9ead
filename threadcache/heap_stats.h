// Statistics derived on request from span state: what each size class holds, live and free,
// and where the free blocks are (thread heaps or central pools). Nothing here runs on an
// allocation path: the fast paths keep `used` as their only count (core/span.h says how it is
// written so that this reader may load it), and the walk reads every live chunk's span
// descriptors under the chunk registry's lock.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/size_class.h"
#include "threadcache/heap.h"

namespace brisk {

struct ClassCounts {
  std::uint64_t live_blocks = 0;  // handed out and not yet back in their span (remote frees in flight included)
  std::uint64_t free_blocks = 0;  // capacity less live, carved or not, in spans of heaps and central pools
  std::uint64_t spans = 0;
};

// A heap whose cache bytes the walk adds up (per-thread statistics).
struct HeapCounts {
  const Heap* heap = nullptr;
  std::uint64_t cache_bytes = 0;  // free blocks in the spans it owns
};

struct SpanTotals {
  std::uint64_t small_bytes_in_use = 0;   // live small blocks by block size (in-flight remote frees included)
  std::uint64_t small_live_blocks = 0;
  std::uint64_t medium_bytes_in_use = 0;  // live medium blocks by usable size
  std::uint64_t medium_live_blocks = 0;
  std::uint64_t thread_cache_bytes = 0;   // free blocks in spans a heap owns (retained empty spans too)
  std::uint64_t central_pool_bytes = 0;   // free blocks in orphan spans
  std::uint64_t live_chunks = 0;
  std::uint64_t free_page_bytes = 0;      // free pages of live chunks
  std::uint64_t free_resident_bytes = 0;  // of which used since they were last purged
  // Headers, carved pages of small spans, whole medium spans, free pages not purged: what can
  // be resident in live chunks (an upper bound: a medium block's untouched tail is counted).
  std::uint64_t resident_estimate = 0;
  std::uint64_t remote_queued_bytes = 0;  // remote frees in outgoing batches and queues
  ClassCounts classes[kNumClasses];
};

// Fills totals (and, if heaps is given, the cache bytes of those n heaps). Exact when no
// thread allocates or frees meanwhile; otherwise each span's numbers are read one by one.
void gather_span_totals(SpanTotals* totals, HeapCounts* heaps = nullptr, std::size_t n = 0);

// Blocks h freed into other heaps' spans: sent, and waiting in its outgoing batches.
std::uint64_t remote_frees_sent(const Heap* h);

// The structures whose locks brisk_get_lock_stats reports, in its order, and their names there.
enum LockedStructure : unsigned {
  kLockCentralPools,     // g_central's small-class pools, summed
  kLockMediumPool,       // g_central[kMediumPool]
  kLockChunkRegistry,
  kLockChunkCache,
  kLockAbandonedChunks,
  kLockLargeCache,
  kLockHeapPool,
  kLockHeapSlow,         // every heap's slow_lock, summed
  kLockBackgroundPass,
  kLockOrphanQueue,      // lock-free: operations and lost compare-and-swaps (orphans.h)
  kLockedStructures
};
inline constexpr const char* kLockedStructureNames[kLockedStructures] = {
    "central pools", "medium pool",     "chunk registry", "chunk cache",     "abandoned chunks",
    "large cache",   "heap pool",       "heap slow locks", "background pass", "orphan queue"};
// Reads every structure's counts (each counter on its own, without taking a lock).
void gather_lock_counts(LockCounts (&out)[kLockedStructures]);

// The heaps attached to a thread now, newest first: skips the first `skip`, writes up to max of
// the rest to out, and returns how many there are in all.
std::size_t attached_heaps(const Heap** out, std::size_t max, std::size_t skip = 0);

}  // namespace brisk
