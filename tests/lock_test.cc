// SharedSpinLock (core/lock.h): readers hold it together, a writer waits for the readers inside
// and turns new ones away until it is done, and the counters say what happened. Handshakes
// through atomics, never sleeps; a watchdog turns a hang into a failure.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "core/lock.h"

namespace {

using brisk::SharedSpinLock;

class Watchdog {
 public:
  Watchdog() { alarm(20); }
  ~Watchdog() { alarm(0); }
};

template <typename Pred>
void WaitFor(Pred pred) {
  while (!pred()) std::this_thread::yield();
}

TEST(SharedSpinLock, ReadersHoldItTogether) {
  Watchdog w;
  SharedSpinLock lock;
  std::atomic<bool> in{false}, leave{false};
  std::thread other([&] {
    lock.lock_shared();
    in = true;
    WaitFor([&] { return leave.load(); });
    lock.unlock_shared();
  });
  WaitFor([&] { return in.load(); });
  lock.lock_shared();  // would hang (the watchdog fires) if readers excluded each other
  EXPECT_TRUE(lock.is_locked());
  lock.unlock_shared();
  leave = true;
  other.join();
  EXPECT_FALSE(lock.is_locked());
  brisk::LockCounts c = lock.counts();
  EXPECT_EQ(c.acquisitions, 2u);
  EXPECT_EQ(c.contended, 0u);
}

TEST(SharedSpinLock, AWriterWaitsForReadersAndKeepsNewOnesOut) {
  Watchdog w;
  SharedSpinLock lock;
  std::atomic<int> step{0};  // the order of events, as the threads saw them
  int writer_saw = -1, late_reader_saw = -1;
  lock.lock_shared();
  std::thread writer([&] {
    lock.lock();
    writer_saw = step.fetch_add(1);
    lock.unlock();
  });
  // The writer has set its bit once it counts itself contended (it found a reader inside).
  WaitFor([&] { return lock.counts().contended >= 1; });
  std::thread late_reader([&] {
    lock.lock_shared();
    late_reader_saw = step.fetch_add(1);
    lock.unlock_shared();
  });
  // The late reader meets the writer's bit and counts itself contended too; it must not get in.
  WaitFor([&] { return lock.counts().contended >= 2; });
  EXPECT_EQ(step.load(), 0) << "someone entered while the first reader held the lock";
  step.fetch_add(1);  // step 0: the first reader leaves
  lock.unlock_shared();
  writer.join();
  late_reader.join();
  EXPECT_EQ(writer_saw, 1) << "the writer did not come right after the reader it waited for";
  EXPECT_EQ(late_reader_saw, 2) << "a reader arriving while a writer waited went in before it";
  EXPECT_EQ(lock.counts().acquisitions, 3u);
  EXPECT_FALSE(lock.is_locked());
}

TEST(SharedSpinLock, WritersExcludeEachOtherAndReaders) {
  Watchdog w;
  SharedSpinLock lock;
  constexpr int kThreads = 4, kRounds = 20000;
  long counter = 0;             // written by writers only, under the lock
  std::atomic<long> torn{0};    // readers that saw a writer's half-done update
  long pair[2] = {0, 0};        // a writer keeps both equal; a reader checks that it does
  std::thread threads[kThreads];
  for (int t = 0; t < kThreads; ++t) {
    threads[t] = std::thread([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        if ((i + t) % 4 == 0) {
          lock.lock();
          ++counter;
          ++pair[0];
          ++pair[1];
          lock.unlock();
        } else {
          lock.lock_shared();
          if (pair[0] != pair[1]) torn.fetch_add(1);
          lock.unlock_shared();
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(counter, kThreads * kRounds / 4);
  EXPECT_EQ(torn.load(), 0);
  EXPECT_EQ(lock.counts().acquisitions, static_cast<std::uint64_t>(kThreads) * kRounds);
}

}  // namespace
