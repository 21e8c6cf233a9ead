// SpinLock: the lock behind brisk's slow paths (central pools, chunk lists, the large cache).
// TicketLock (below): a fair one, for a lock held long.
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

#include "core/platform.h"

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
  // lock(), giving up (false) if the lock is still held `ms` milliseconds on: for code that must
  // not wait for ever, as the leak report at exit (debug/leaks.cc), which exit() called from a
  // signal handler runs on a thread that may hold the lock itself.
  bool lock_within(std::uint64_t ms) {
    const std::uint64_t deadline = platform::now_ns() + ms * 1'000'000;
    while (!try_lock()) {
      if (platform::now_ns() > deadline) return false;
      sched_yield();
    }
    return true;
  }
  // After unlock(), by a thread about to take the lock again at once (a loop of short holds):
  // if another thread came to wait since `mark` (counts() read while holding), a short spin for
  // it to take the lock, then, if it has not (it is in its own sched_yield, and would miss the
  // moment between two holds), one yield of this thread's CPU. No yield when nobody waited: on a
  // loaded machine each would give the CPU away for a time slice.
  void let_waiter_in(const LockCounts& mark) const {
    const LockCounts now = counts();
    if (now.contended == mark.contended && now.yields == mark.yields) return;
    for (unsigned spins = 0; spins < 256; ++spins) {
      if (is_locked()) return;
      __builtin_ia32_pause();
    }
    sched_yield();
  }
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

// SharedSpinLock: a SpinLock for writers, plus a count of readers that exclude writers but not
// each other, for a structure read on repeated paths and changed rarely (the chunk registry:
// every heap scans it for free pages, chunks join and leave it only when mapped or destroyed).
// One word holds the reader count and the writer bit. A reader adds itself and leaves again if
// the writer bit was set; a writer takes the SpinLock (one writer at a time), sets the bit, and
// waits for the readers already in to leave. Both are read-modify-writes of the same word, so
// of a reader and a writer arriving together one sees the other. A steady stream of readers
// cannot starve a writer: the bit turns new readers away while it waits.
// Counts: acquisitions of both kinds; contended: a reader that met a writer, a writer that met
// readers or another writer. Readers write their counter with fetch_add on the word's line,
// which their arrival already took.
class alignas(64) SharedSpinLock {
 public:
  void lock() {
    writers_.lock();
    if (state_.fetch_or(kWriter, std::memory_order_acq_rel) != 0) {
      contended_.fetch_add(1, std::memory_order_relaxed);
      wait([this] { return state_.load(std::memory_order_acquire) != kWriter; });
    }
  }
  void unlock() {
    state_.fetch_and(~kWriter, std::memory_order_release);
    writers_.unlock();
  }
  void lock_shared() {
    shared_acquisitions_.fetch_add(1, std::memory_order_relaxed);
    while ((state_.fetch_add(kReader, std::memory_order_acquire) & kWriter) != 0) {
      state_.fetch_sub(kReader, std::memory_order_relaxed);
      contended_.fetch_add(1, std::memory_order_relaxed);
      wait([this] { return (state_.load(std::memory_order_relaxed) & kWriter) != 0; });
    }
  }
  void unlock_shared() { state_.fetch_sub(kReader, std::memory_order_release); }
  bool is_locked() const { return state_.load(std::memory_order_relaxed) != 0; }
  // Only for a fork child, which has exactly one thread: whoever held the lock is gone.
  void reset_after_fork() {
    state_.store(0, std::memory_order_relaxed);
    writers_.reset_after_fork();
  }
  LockCounts counts() const {
    LockCounts c = writers_.counts();
    c.acquisitions += shared_acquisitions_.load(std::memory_order_relaxed);
    c.contended += contended_.load(std::memory_order_relaxed);
    c.yields += yields_.load(std::memory_order_relaxed);
    return c;
  }

 private:
  static constexpr std::uint64_t kWriter = 1;
  static constexpr std::uint64_t kReader = 2;
  template <typename Busy>
  void wait(Busy busy) {
    for (unsigned spins = 0; busy(); ++spins) {
      if (spins < 64) {
        __builtin_ia32_pause();
      } else {
        sched_yield();
        yields_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  std::atomic<std::uint64_t> state_{0};
  std::atomic<std::uint64_t> shared_acquisitions_{0};
  std::atomic<std::uint64_t> contended_{0};
  std::atomic<std::uint64_t> yields_{0};
  SpinLock writers_;
};

class SharedLockGuard {
 public:
  explicit SharedLockGuard(SharedSpinLock& l) : l_(l) { l_.lock_shared(); }
  ~SharedLockGuard() { l_.unlock_shared(); }
  SharedLockGuard(const SharedLockGuard&) = delete;
  SharedLockGuard& operator=(const SharedLockGuard&) = delete;

 private:
  SharedSpinLock& l_;
};

// TicketLock: first come, first served (a ticket, and the ticket being served). For a lock
// whose holder works long and comes straight back for it: brisk_check_heap in a loop re-took a
// SpinLock before a waiter that had yielded could see it free, and fork's prepare handler waited
// up to 1.3 s behind such a loop (20 forks: 8.4 s). A waiter spins briefly, then yields. No
// counters: not one of the slow paths' locks.
class TicketLock {
 public:
  void lock() {
    const std::uint32_t mine = next_.fetch_add(1, std::memory_order_relaxed);
    for (unsigned spins = 0; serving_.load(std::memory_order_acquire) != mine; ++spins) {
      if (spins < 64) {
        __builtin_ia32_pause();
      } else {
        sched_yield();
      }
    }
  }
  // Only the holder writes serving_.
  void unlock() { serving_.store(serving_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }
  // Only for a fork child, which has exactly one thread: whoever held or awaited the lock is gone.
  void reset_after_fork() {
    next_.store(0, std::memory_order_relaxed);
    serving_.store(0, std::memory_order_relaxed);
  }

 private:
  std::atomic<std::uint32_t> next_{0};
  std::atomic<std::uint32_t> serving_{0};
};

template <typename Lock = SpinLock>
class LockGuard {
 public:
  explicit LockGuard(Lock& l) : l_(l) { l_.lock(); }
  ~LockGuard() { l_.unlock(); }
  LockGuard(const LockGuard&) = delete;
  LockGuard& operator=(const LockGuard&) = delete;

 private:
  Lock& l_;
};
template <typename Lock>
LockGuard(Lock&) -> LockGuard<Lock>;

}  // namespace brisk
