// SpinLock: the lock behind brisk's slow paths (central pools, chunk lists, the large cache).
// No lock is ever taken on the per-allocation fast path.
//
// Why not pthread_mutex: a spin lock needs no initialisation before main, and a fork child can
// simply store "unlocked" into it (see heap_lifecycle.cc's atfork handlers).
// It spins briefly with a pause, then yields, so a preempted holder on a 2-core machine does not
// burn the other core's time slice.
//
// Each lock counts its acquisitions, the acquisitions that found it held (contended) and the
// sched_yield calls made waiting (brisk_get_lock_stats). The counters share the flag's cache
// line (alignas: 32 bytes never straddle a line), which the acquiring thread owns exclusively
// after its exchange, and only the holder writes `acquisitions`: a plain load and store, no
// locked instruction. Waiters write `contended` (on arrival, so a test can see a waiter before
// it gets the lock) and `yields` with fetch_add, on the slow path only.
#pragma once

#include <sched.h>

#include <atomic>
#include <cstdint>

namespace brisk {

struct LockCounts {
  std::uint64_t acquisitions = 0;
  std::uint64_t contended = 0;  // acquisitions that found the lock held and waited
  std::uint64_t yields = 0;     // sched_yield calls while waiting
  void add(const LockCounts& o) {
    acquisitions += o.acquisitions;
    contended += o.contended;
    yields += o.yields;
  }
};

class alignas(32) SpinLock {
 public:
  void lock() {
    if (flag_.exchange(true, std::memory_order_acquire)) lock_slow();
    bump(acquisitions_, 1);
  }
  bool try_lock() {
    if (flag_.load(std::memory_order_relaxed) || flag_.exchange(true, std::memory_order_acquire)) return false;
    bump(acquisitions_, 1);
    return true;
  }
  void unlock() { flag_.store(false, std::memory_order_release); }
  // For assertions that a structure's lock is held (by someone: the lock has no owner field).
  bool is_locked() const { return flag_.load(std::memory_order_relaxed); }
  // Only for a fork child, which has exactly one thread: whoever held the lock is gone.
  void reset_after_fork() { flag_.store(false, std::memory_order_relaxed); }
  // Each counter read on its own, from any thread.
  LockCounts counts() const {
    return LockCounts{acquisitions_.load(std::memory_order_relaxed), contended_.load(std::memory_order_relaxed),
                      yields_.load(std::memory_order_relaxed)};
  }

 private:
  // Only the holder writes the counter: the lock orders the writers.
  static void bump(std::atomic<std::uint64_t>& c, std::uint64_t d) {
    c.store(c.load(std::memory_order_relaxed) + d, std::memory_order_relaxed);
  }
  // Inline, with no local state beyond the original spin count: a register more, or an
  // out-of-line call, made the functions that take a lock save more registers on entry, their
  // lock-free paths too (free_local_adjust on the empty-span path of a malloc/free pair loop
  // gained 1 to 4 instructions per call). Waiters write their counters with fetch_add.
  void lock_slow() {
    contended_.fetch_add(1, std::memory_order_relaxed);
    for (unsigned spins = 0;; ++spins) {
      if (!flag_.load(std::memory_order_relaxed) && !flag_.exchange(true, std::memory_order_acquire)) return;
      if (spins < 64) {
        __builtin_ia32_pause();
      } else {
        sched_yield();
        yields_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  std::atomic<bool> flag_{false};
  std::atomic<std::uint64_t> acquisitions_{0};
  std::atomic<std::uint64_t> contended_{0};
  std::atomic<std::uint64_t> yields_{0};
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
