// The thread cache's entry points for the layers above that are not fast paths: they find the
// calling thread's heap in whichever state the thread is (no heap yet, attached, or exited).
#include "core/large.h"
#include "threadcache/heap.h"
#include "threadcache/medium.h"
#include "threadcache/orphans.h"

namespace brisk {

void* alloc_medium_here(std::size_t size, bool zero) {
  Heap* h = t_heap;
  if (h == &g_exited_heap)
    return alloc_with_borrowed_heap([&](Heap* borrowed) { return alloc_medium(borrowed, size, zero); });
  if (h == &g_sentinel_heap) h = heap_for_this_thread();
  return h != nullptr ? alloc_medium(h, size, zero) : nullptr;
}

void thread_collect() {
  Heap* h = t_heap;
  if (heap_is_attached(h)) {
    heap_collect(h);
  } else {
    drain_orphans();
    large_cache_flush();
  }
}

}  // namespace brisk
