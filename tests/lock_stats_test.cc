// brisk_get_lock_stats: a known sequence of slow-path operations moves the counters of the
// structures it locks by known amounts, and a thread that finds a lock held counts as contended.
#include <brisk/brisk.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "core/config.h"
#include "core/large.h"
#include "core/lock.h"
#include "core/size_class.h"

namespace {

// No background thread and no large-cache decay: only the test's own calls take the locks.
[[maybe_unused]] const int g_no_background = setenv("BRISK_BACKGROUND", "0", 1);
[[maybe_unused]] const int g_no_decay = setenv("BRISK_LARGE_DECAY_MS", "3600000", 1);

constexpr std::size_t kLarge = 2 * brisk::kMediumMax;  // a large block

brisk_lock_stats Lock(const char* name) {
  brisk_lock_stats all[BRISK_LOCK_STRUCTURES];
  EXPECT_EQ(brisk_get_lock_stats(all, BRISK_LOCK_STRUCTURES), size_t{BRISK_LOCK_STRUCTURES});
  for (const brisk_lock_stats& l : all)
    if (std::strcmp(l.name, name) == 0) return l;
  ADD_FAILURE() << "no structure named " << name;
  return brisk_lock_stats{};
}

// Fails the test (SIGALRM ends the process) if a wait below never ends.
class Watchdog {
 public:
  Watchdog() { alarm(60); }
  ~Watchdog() { alarm(0); }
};

TEST(LockStats, ASpinLockCountsEachAcquisitionAndNoContentionWhenAlone) {
  brisk::SpinLock lock;
  for (int i = 0; i < 5; ++i) {
    lock.lock();
    lock.unlock();
  }
  EXPECT_TRUE(lock.try_lock());
  EXPECT_FALSE(lock.try_lock());  // held: not acquired, not counted
  lock.unlock();
  brisk::LockCounts c = lock.counts();
  EXPECT_EQ(c.acquisitions, 6u);
  EXPECT_EQ(c.contended, 0u);
  EXPECT_EQ(c.yields, 0u);
}

TEST(LockStats, NamesEveryStructureAndFillsNoMoreThanAskedFor) {
  EXPECT_EQ(brisk_get_lock_stats(nullptr, 0), size_t{BRISK_LOCK_STRUCTURES});
  brisk_lock_stats two[3];
  std::memset(two, 0xab, sizeof two);
  EXPECT_EQ(brisk_get_lock_stats(two, 2), size_t{BRISK_LOCK_STRUCTURES});
  EXPECT_STREQ(two[0].name, "central pools");
  EXPECT_STREQ(two[1].name, "medium pool");
  EXPECT_EQ(two[2].acquisitions, 0xababababababababull);  // untouched
}

// After a warm-up (the first block maps fresh memory and caches the rest of it), each large
// malloc is served from the cache under its lock, and each free puts the block back under it.
TEST(LockStats, EachLargeAllocationAndFreeTakesTheLargeCacheLockOnce) {
  brisk_free(brisk_malloc(kLarge));
  constexpr int kPairs = 100;
  brisk_lock_stats before = Lock("large cache");
  brisk_lock_stats chunks_before = Lock("chunk registry");
  for (int i = 0; i < kPairs; ++i) {
    void* p = brisk_malloc(kLarge);
    ASSERT_NE(p, nullptr);
    brisk_free(p);
  }
  brisk_lock_stats after = Lock("large cache");
  EXPECT_EQ(after.acquisitions - before.acquisitions, 2u * kPairs);
  EXPECT_EQ(after.contended - before.contended, 0u);
  EXPECT_EQ(Lock("chunk registry").acquisitions, chunks_before.acquisitions);
}

// A thread fills kSpans spans of one class, frees every other block and exits: each span goes
// to the class's central pool under its lock (kSpans). This thread then allocates exactly the
// freed blocks: each refill takes one span from the pool under the lock (kSpans more), and the
// pool, empty then, is not locked again.
TEST(LockStats, SpansOrphanedAndRefilledFromTheCentralPoolTakeItsLockOncePerSpan) {
  constexpr std::size_t kSize = 3000;
  constexpr unsigned kSpans = 6;
  const unsigned capacity = brisk::kClasses[brisk::size_to_class(kSize)].capacity;
  ASSERT_GE(capacity, 2u);
  const std::size_t freed = kSpans * (capacity / 2);
  std::vector<void*> kept;
  brisk_lock_stats before = Lock("central pools");
  std::thread([&] {
    std::vector<void*> blocks;
    for (unsigned i = 0; i < kSpans * capacity; ++i) blocks.push_back(brisk_malloc(kSize));
    // Freed blocks are the odd ones of each span's run of `capacity` allocations: each span
    // keeps a live block, so it is orphaned rather than released.
    for (unsigned i = 0; i < blocks.size(); ++i) {
      if ((i % capacity) % 2 == 1) {
        brisk_free(blocks[i]);
      } else {
        kept.push_back(blocks[i]);
      }
    }
  }).join();
  brisk_lock_stats orphaned = Lock("central pools");
  EXPECT_EQ(orphaned.acquisitions - before.acquisitions, kSpans);
  std::vector<void*> refilled;
  for (std::size_t i = 0; i < freed; ++i) refilled.push_back(brisk_malloc(kSize));
  brisk_lock_stats after = Lock("central pools");
  EXPECT_EQ(after.acquisitions - orphaned.acquisitions, kSpans);
  EXPECT_EQ(after.contended - before.contended, 0u);
  for (void* p : refilled) brisk_free(p);
  for (void* p : kept) brisk_free(p);
}

// The large cache's lock is held here (as a fork would hold it) while another thread allocates
// a large block: that thread finds it held, which counts as contended before it waits. Once
// the count moves the lock is let go; no sleep, no timing.
TEST(LockStats, AThreadThatFindsTheLargeCacheLockHeldCountsAsContended) {
  Watchdog watchdog;
  brisk_free(brisk_malloc(kLarge));  // the cache holds an entry: the next malloc locks it
  brisk_lock_stats before = Lock("large cache");
  brisk::large_locks_acquire();
  std::atomic<void*> block{nullptr};
  std::thread waiter([&] { block.store(brisk_malloc(kLarge)); });
  while (Lock("large cache").contended == before.contended) std::this_thread::yield();
  EXPECT_EQ(block.load(), nullptr);  // still waiting for the lock
  brisk::large_locks_release();
  waiter.join();
  ASSERT_NE(block.load(), nullptr);
  brisk_free(block.load());
  brisk_lock_stats after = Lock("large cache");
  EXPECT_EQ(after.contended - before.contended, 1u);
  EXPECT_EQ(after.acquisitions - before.acquisitions, 3u);  // here, the waiter's malloc, the free
}

}  // namespace
