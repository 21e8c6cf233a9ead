// pthread_join and C11's thrd_join: the joining thread parks its heap while it waits
// (threadcache/heap_lifecycle.cc, "Parked heaps"), so that the threads it waits for, which often
// free the blocks it allocated before starting them, take those blocks' spans over instead of
// queueing the blocks to a heap that runs no slow path until the join returns.
// std::thread::join calls pthread_join.
//
// The C library's functions are found with dlsym(RTLD_NEXT) at the first call. Where there is
// none to find (a static executable has no dynamic linker), glibc's pthread_timedjoin_np with
// no deadline is the same blocking join (both are __pthread_clockjoin_ex, block=true), and
// thrd_join is that join with its result and error mapped as glibc maps them. The timed and try
// variants are not wrapped: a join with a deadline parks nothing.
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <threads.h>

#include <atomic>

#include "core/hints.h"
#include "threadcache/heap.h"

#ifndef BRISK_OVERRIDE
#error "threads.cc is built only into the replacing libraries"
#endif

using namespace brisk;

namespace {

using JoinFn = int (*)(pthread_t, void**);
using ThrdJoinFn = int (*)(thrd_t, int*);

int join_without_deadline(pthread_t thread, void** result) { return pthread_timedjoin_np(thread, result, nullptr); }

int thrd_join_without_deadline(thrd_t thread, int* result) {
  void* r = nullptr;
  if (join_without_deadline(thread, &r) != 0) return thrd_error;
  if (result != nullptr) *result = static_cast<int>(reinterpret_cast<intptr_t>(r));
  return thrd_success;
}

template <class Fn>
Fn next_function(std::atomic<Fn>& slot, const char* name, Fn self, Fn fallback) {
  Fn fn = slot.load(std::memory_order_acquire);
  if (BRISK_UNLIKELY(fn == nullptr)) {
    fn = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
    if (fn == nullptr || fn == self) fn = fallback;
    slot.store(fn, std::memory_order_release);
  }
  return fn;
}

std::atomic<JoinFn> g_next_join{nullptr};
std::atomic<ThrdJoinFn> g_next_thrd_join{nullptr};

}  // namespace

extern "C" {

// Cancelled while it waits (pthread_join is a cancellation point), the thread leaves without
// returning here; its key destructor unparks the heap before it detaches it.
BRISK_EXPORT int pthread_join(pthread_t thread, void** result) {
  JoinFn join = next_function<JoinFn>(g_next_join, "pthread_join", &pthread_join, join_without_deadline);
  Heap* parked = heap_park();
  int r = join(thread, result);
  heap_unpark(parked);
  return r;
}

BRISK_EXPORT int thrd_join(thrd_t thread, int* result) {
  ThrdJoinFn join = next_function<ThrdJoinFn>(g_next_thrd_join, "thrd_join", &thrd_join, thrd_join_without_deadline);
  Heap* parked = heap_park();
  int r = join(thread, result);
  heap_unpark(parked);
  return r;
}

}  // extern "C"
