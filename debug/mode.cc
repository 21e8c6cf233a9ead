#include "debug/mode.h"

#include <atomic>

#include "core/options.h"
#include "debug/block.h"
#include "threadcache/debug_switch.h"

namespace brisk::debug {

void enter() {
  init();  // outside every lock: it may call malloc
  g_debug_depth.fetch_add(1, std::memory_order_seq_cst);
  // Pairs with alloc_refill's fence after it installs a span (debug_switch.h). Every enter
  // points the heaps, not only the first: a nested enter returns with the mode on for all.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  debug_point_heaps_at_empty_span();
  // And the heaps' empty spans visible to every thread before enter returns: an allocation a
  // thread makes after a fence of its own that follows this one in the single total order
  // sees them (TheSwitchReachesAThreadLoopingOnItsFastPath counts on it; without it, the
  // caller's next load could pass these stores, x86 included).
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void exit() {
  int depth = g_debug_depth.load(std::memory_order_relaxed);
  while (depth > 0 && !g_debug_depth.compare_exchange_weak(depth, depth - 1, std::memory_order_seq_cst)) {
  }
  // Nothing to undo in the heaps: each thread's next refill puts its spans back.
}

bool active() { return debug_mode_on(); }

namespace {
// BRISK_DEBUG=1: on from start-up (allocations made before this constructor are release blocks).
__attribute__((constructor)) void debug_at_start() {
  if (options::get(options::Id::kDebug) != 0) enter();
}
// Debug blocks still live when the process exits (in any mode: blocks made while the mode was
// on). A destructor of libbrisk runs after the program's own static destructors.
__attribute__((destructor)) void leaks_at_exit() {
  const std::int64_t leaks = options::get(options::Id::kDebugLeaks);
  if (leaks != 0) report_leaks(leaks == 1 ? LeakScope::kUnreachable : LeakScope::kAll);
}
}  // namespace

}  // namespace brisk::debug
