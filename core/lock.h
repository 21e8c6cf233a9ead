// SpinLock: the lock behind brisk's slow paths (central pools, chunk lists, the large cache).
// No lock is ever taken on the per-allocation fast path.
//
// Why not pthread_mutex: a spin lock is one byte, needs no initialisation before main, and a
// fork child can simply store "unlocked" into it (see heap_lifecycle.cc's atfork handlers).
// It spins briefly with a pause, then yields, so a preempted holder on a 2-core machine does not
// burn the other core's time slice.
#pragma once

#include <sched.h>

#include <atomic>

namespace brisk {

class SpinLock {
 public:
  void lock() {
    if (!flag_.exchange(true, std::memory_order_acquire)) return;
    lock_slow();
  }
  bool try_lock() {
    return !flag_.load(std::memory_order_relaxed) && !flag_.exchange(true, std::memory_order_acquire);
  }
  void unlock() { flag_.store(false, std::memory_order_release); }
  // For assertions that a structure's lock is held (by someone: the lock has no owner field).
  bool is_locked() const { return flag_.load(std::memory_order_relaxed); }
  // Only for a fork child, which has exactly one thread: whoever held the lock is gone.
  void reset_after_fork() { flag_.store(false, std::memory_order_relaxed); }

 private:
  void lock_slow() {
    for (unsigned spins = 0;; ++spins) {
      if (!flag_.load(std::memory_order_relaxed) && !flag_.exchange(true, std::memory_order_acquire))
        return;
      if (spins < 64) {
        __builtin_ia32_pause();
      } else {
        sched_yield();
      }
    }
  }
  std::atomic<bool> flag_{false};
};

class LockGuard {
 public:
  explicit LockGuard(SpinLock& l) : l_(l) { l_.lock(); }
  ~LockGuard() { l_.unlock(); }
  LockGuard(const LockGuard&) = delete;
  LockGuard& operator=(const LockGuard&) = delete;

 private:
  SpinLock& l_;
};

}  // namespace brisk
