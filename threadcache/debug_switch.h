// Debug mode as the thread cache sees it: the mode word, the debug heaps that own every debug
// block, and the hooks by which the slow paths and the fork handlers hand over to debug/ (a
// lower layer never includes a higher one, so debug/ installs the hooks before it turns the
// mode on).
//
// Zero cost when off: the fast paths read no mode word. Turning the mode on points every
// thread heap's current spans at g_empty_span (debug_point_heaps_at_empty_span), so each
// thread's next small allocation reaches alloc_refill, which checks the mode; medium, large
// and aligned allocations check it in their out-of-line paths.
//
// Debug heaps: a thread that makes debug blocks gets a debug heap of its own (a Heap with
// is_debug set, made by debug/ and stored in the thread heap's `debug`), so debug allocation
// and the owner's frees take no shared lock. A debug heap is no thread heap: it is never in
// t_heap, so free_fast's owner test refuses every block in its spans and each free of a debug
// block reaches free_slow, which offers it to debug/ first. A debug heap is never detached:
// when its thread exits it stays paired with the thread heap in the pool, owning its spans,
// with its queue open, and the next thread to take that heap uses it. So its spans never
// become orphans that a thread heap could adopt, and a debug block of an exited thread stays
// a debug block: freeable (the free reaches the debug heap's queue) and reportable. A span of
// a debug heap that empties holds no debug block (a quarantined one still counts in its
// `used`): it goes to its class's central pool kept whole, as a thread heap's does
// (span_pages.cc's heap_keep_empty_span), for the next span of its class, whoever's.
#pragma once

#include <atomic>
#include <cstddef>

#include "core/hints.h"
#include "threadcache/heap.h"

namespace brisk {

// brisk_debug_enter's nesting depth; debug mode is on while it is above zero.
extern std::atomic<int> g_debug_depth;
// Acquire: debug::enter raises the depth only after debug::init has written the hooks and the
// debug layer's state (stack depth and depot, the quarantine's rings), so a caller that reads
// the mode on and goes on into debug/ sees those writes (a plain load on x86; no fast path asks).
// Relaxed, a thread already allocating when the mode first turned on read them unordered: races
// under ThreadSanitizer, and on a weakly ordered CPU a null hook.
inline bool debug_mode_on() { return g_debug_depth.load(std::memory_order_acquire) > 0; }

struct DebugHooks {
  void* (*alloc)(std::size_t size);  // a malloc-kind debug block of size bytes; errno on failure
  bool (*free)(void* p);             // true: p was a debug block (freed, or its misuse reported)
  // The fork handlers' part for debug/: take every debug-layer lock (before the thread cache's
  // and core's, in one fixed order), release them in the parent, reset them in the child.
  void (*fork_prepare)();
  void (*fork_parent)();
  void (*fork_child)();
  // The heap check's lock, apart: taken first of all the fork handlers' locks, before the C
  // library's stdio list lock, and released last. Its holder runs report callbacks, which may
  // take stdio's locks (fopen, fflush) or fork themselves; no holder of a stdio lock or of any
  // other lock waits for it.
  void (*fork_check_lock)();
  void (*fork_check_unlock)();
  void (*fork_check_reset)();
  // The background pass's (background.cc): the quarantined blocks of threads that stopped
  // freeing (no push to their shard between two passes at least idle_ms apart) leave, so that
  // the spans they lie in can go back.
  std::size_t (*quarantine_idle)(std::uint64_t now_ms, std::uint64_t idle_ms);
};
// Set by debug/'s constructor (priority 101: before the program's own constructors of default
// priority, which may start threads) and by its init, before the first switch to debug mode,
// whichever comes first; never cleared. Each may be null before then. Read after
// debug_mode_on() or g_debug_blocks_may_exist, whose acquires order them.
extern DebugHooks g_debug_hooks;
// True once a debug block may exist: free_slow asks debug/ about every pointer from then on.
extern std::atomic<bool> g_debug_blocks_may_exist;

// Stores g_empty_span into every current span of every thread heap (relaxed atomic stores;
// each owner keeps its span in Heap::installed). Called after the mode word changed, with a
// sequentially consistent fence between: alloc_refill installs a span, fences and re-reads the
// mode, so either it sees the new mode or this store lands after its install.
void debug_point_heaps_at_empty_span();

}  // namespace brisk
