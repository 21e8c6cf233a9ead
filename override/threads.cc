// pthread_join: the joining thread parks its heap while it waits (threadcache/heap_lifecycle.cc,
// "Parked heaps"), so that the threads it waits for, which often free the blocks it allocated
// before starting them, take those blocks' spans over instead of queueing the blocks to a heap
// that runs no slow path until the join returns. std::thread::join calls it too.
//
// The C library's pthread_join is found with dlsym(RTLD_NEXT) at the first call. Where there
// is none to find (a static executable has no dynamic linker), glibc's pthread_timedjoin_np
// with no deadline is the same blocking join (both are __pthread_clockjoin_ex, block=true).
// The timed and try variants are not wrapped: a join with a deadline parks nothing.
#include <dlfcn.h>
#include <pthread.h>

#include <atomic>

#include "core/hints.h"
#include "threadcache/heap.h"

#ifndef BRISK_OVERRIDE
#error "threads.cc is built only into the replacing libraries"
#endif

using namespace brisk;

namespace {

using JoinFn = int (*)(pthread_t, void**);

int join_without_deadline(pthread_t thread, void** result) { return pthread_timedjoin_np(thread, result, nullptr); }

JoinFn next_join() {
  static std::atomic<JoinFn> next{nullptr};
  JoinFn fn = next.load(std::memory_order_acquire);
  if (BRISK_UNLIKELY(fn == nullptr)) {
    fn = reinterpret_cast<JoinFn>(dlsym(RTLD_NEXT, "pthread_join"));
    if (fn == nullptr || fn == &pthread_join) fn = join_without_deadline;
    next.store(fn, std::memory_order_release);
  }
  return fn;
}

}  // namespace

extern "C" {

// Cancelled while it waits (pthread_join is a cancellation point), the thread leaves without
// returning here; its key destructor unparks the heap before it detaches it.
BRISK_EXPORT int pthread_join(pthread_t thread, void** result) {
  JoinFn join = next_join();
  Heap* parked = heap_park();
  int r = join(thread, result);
  heap_unpark(parked);
  return r;
}

}  // extern "C"
