// Debug mode as the thread cache sees it: the mode word, the heap that owns every debug block,
// and the two hooks by which the slow paths hand allocations and frees up to debug/ (a lower
// layer never includes a higher one, so debug/ installs the hooks before it turns the mode on).
//
// Zero cost when off: the fast paths read no mode word. Turning the mode on points every
// thread heap's current spans at g_empty_span (debug_point_heaps_at_empty_span), so each
// thread's next small allocation reaches alloc_refill, which checks the mode; medium, large
// and aligned allocations check it in their out-of-line paths. Debug blocks live in spans
// owned by g_debug_heap, which no thread's heap is, so free_fast's owner test refuses them and
// every free of one reaches free_slow, which offers it to debug/ first.
#pragma once

#include <atomic>
#include <cstddef>

#include "core/hints.h"
#include "core/lock.h"
#include "threadcache/heap.h"

namespace brisk {

// brisk_debug_enter's nesting depth; debug mode is on while it is above zero.
extern std::atomic<int> g_debug_depth;
inline bool debug_mode_on() { return g_debug_depth.load(std::memory_order_relaxed) > 0; }

struct DebugHooks {
  void* (*alloc)(std::size_t size);  // a malloc-kind debug block of size bytes; errno on failure
  bool (*free)(void* p);             // true: p was a debug block (freed, or its misuse reported)
};
// Set once, before the first switch to debug mode, and never cleared.
extern DebugHooks g_debug_hooks;
// True once a debug block may exist: free_slow asks debug/ about every pointer from then on.
extern std::atomic<bool> g_debug_blocks_may_exist;

// Owns the spans of small and medium debug blocks; used only by debug/, under g_debug_lock
// (taken before the central, chunk and large locks, and by the fork handlers before them).
extern Heap g_debug_heap;
extern SpinLock g_debug_lock;

// Stores g_empty_span into every current span of every thread heap (relaxed atomic stores;
// each owner keeps its span in Heap::installed). Called after the mode word changed, with a
// sequentially consistent fence between: alloc_refill installs a span, fences and re-reads the
// mode, so either it sees the new mode or this store lands after its install.
void debug_point_heaps_at_empty_span();

}  // namespace brisk
