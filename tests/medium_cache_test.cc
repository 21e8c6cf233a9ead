// The medium cache (threadcache/medium.cc): a freed medium block's page run stays with its
// thread for the thread's next medium block, bounded by BRISK_MEDIUM_CACHE_BYTES, and comes back
// to the chunks when the thread collects, when brisk_trim runs, when the thread stays idle or
// exits, and when the strategy's budget shrinks. Run with BRISK_BACKGROUND=0 and
// BRISK_IDLE_MS=10 (tests/CMakeLists.txt), so only the passes the test makes reclaim.
#include <brisk/brisk.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "core/platform.h"
#include "core/stats.h"
#include "tests/test_util.h"
#include "core/options.h"
#include "threadcache/background.h"
#include "threadcache/heap.h"

using namespace brisk_test;

namespace {

constexpr std::size_t kPage = 64 * 1024;
constexpr std::size_t kBlock = 100 * 1024;  // a medium block of two pages

bool CacheOn() { return brisk::options::get(brisk::options::Id::kMediumCacheBytes) != 0; }

// The offset of the first byte of p[0, n) that is not zero, or n.
std::size_t FirstNonZero(const unsigned char* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] != 0) return i;
  return n;
}

std::uint64_t CacheBytesOfThisThread() {
  brisk::Heap* h = brisk::t_heap;
  brisk::HeapSlowLock lock(h);
  return h->medium_cache_bytes;
}

// Its debug heap's, which the thread must have.
std::uint64_t CacheBytesOfThisThreadsDebugHeap() {
  brisk::Heap* d = brisk::t_heap->debug;
  if (d == nullptr) return 0;
  brisk::HeapSlowLock lock(d);
  return d->medium_cache_bytes;
}

// Debug blocks of kBlock bytes that, freed one after another by one thread, overflow the whole
// quarantine (the thread's shard holds a part of it): the first ones leave it.
std::size_t DebugBlocksPastTheQuarantine() {
  return static_cast<std::size_t>(brisk::options::get(brisk::options::Id::kDebugQuarantine)) / kBlock + 4;
}

// The next medium block of the same pages takes the freed one's run: the same address, the old
// contents gone only where calloc says so, and the statistics count the run as the thread's cache.
TEST(MediumCache, AFreedMediumRunServesTheThreadsNextMediumBlock) {
  if (!CacheOn()) GTEST_SKIP() << "BRISK_MEDIUM_CACHE_BYTES=0: no medium cache";
  std::thread([] {
    void* p = brisk_malloc(kBlock);
    ASSERT_NE(p, nullptr);
    Fill(p, kBlock, 1);
    const brisk_stats live = Stats();
    brisk_free(p);
    const brisk_stats freed = Stats();
    EXPECT_EQ(live.medium_live_blocks - freed.medium_live_blocks, 1u);
    EXPECT_EQ(freed.thread_cache_bytes - live.thread_cache_bytes, 2 * kPage);
    EXPECT_EQ(CacheBytesOfThisThread(), 2 * kPage);
    void* q = brisk_malloc(kBlock - 1000);
    EXPECT_EQ(q, p) << "the cached run was expected to serve the next block of its pages";
    EXPECT_EQ(brisk_usable_size(q), (kBlock - 1000 + 15) & ~std::size_t{15});
    EXPECT_EQ(CacheBytesOfThisThread(), 0u);
    brisk_free(q);
    void* z = brisk_calloc(1, kBlock);
    ASSERT_EQ(z, p);
    ASSERT_EQ(FirstNonZero(static_cast<unsigned char*>(z), kBlock), kBlock) << "a byte not zeroed";
    brisk_free(z);
  }).join();
}

// OS pages of [p, p + n) resident now, by mincore.
std::size_t ResidentOsPages(const void* p, std::size_t n) {
  const std::size_t os_page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  auto a = reinterpret_cast<std::uintptr_t>(p) & ~(os_page - 1);
  const std::size_t pages = (reinterpret_cast<std::uintptr_t>(p) + n - a + os_page - 1) / os_page;
  std::vector<unsigned char> vec(pages);
  if (mincore(reinterpret_cast<void*>(a), pages * os_page, vec.data()) != 0) return pages;
  std::size_t resident = 0;
  for (unsigned char v : vec) resident += v & 1;
  return resident;
}

// calloc of a run whose last block wrote a few OS pages zeroes those and touches no other but
// the block's last (calloc_big writes its first and last byte): the pages the block before never
// wrote read as zeros already. A memset of the whole block made every one of them resident
// (prodcons: half of its page faults).
TEST(MediumCache, CallocOfAReusedRunTouchesOnlyThePagesTheBlockBeforeWrote) {
  if (!CacheOn()) GTEST_SKIP() << "BRISK_MEDIUM_CACHE_BYTES=0: no medium cache";
  std::thread([] {
    constexpr std::size_t kSize = 4 * kPage - 4096;
    auto* p = static_cast<unsigned char*>(brisk_malloc(kSize));
    ASSERT_NE(p, nullptr);
    // A fresh run: malloc wrote only the block's first word.
    ASSERT_EQ(ResidentOsPages(p, kSize), 1u) << "a fresh run was expected";
    p[100] = 1;                  // the block's first OS page (the free writes there too)
    p[2 * kPage + 100] = 2;      // one OS page in its third 64 KiB page
    brisk_free(p);
    auto* z = static_cast<unsigned char*>(brisk_calloc(1, kSize));
    ASSERT_EQ(z, p) << "the cached run was expected to serve the calloc";
    // The two written pages, and the block's last, which calloc writes (calloc_big).
    EXPECT_EQ(ResidentOsPages(z, kSize), 3u) << "calloc wrote pages the block before never wrote";
    ASSERT_EQ(FirstNonZero(z, kSize), kSize) << "a byte not zeroed";
    brisk_free(z);
    brisk_thread_collect();
  }).join();
}

// Callocs `size` bytes, which the cached run at `run` is expected to serve, zeroed; the block
// is left live at `run`. Returns the residency questions (mincore, pagemap) the calloc asked.
std::uint64_t AsksOfCallocFrom(unsigned char* run, std::size_t size) {
  const std::uint64_t before = brisk::stats::g.os_resident_calls.load();
  auto* z = static_cast<unsigned char*>(brisk_calloc(1, size));
  const std::uint64_t asked = brisk::stats::g.os_resident_calls.load() - before;
  EXPECT_EQ(z, run) << "the cached run was expected to serve the calloc";
  EXPECT_EQ(FirstNonZero(z, size), size) << "a byte not zeroed";
  return asked;
}

// A run whose block the last calloc found (or made) present in every OS page is present
// still: the next calloc from it zeroes it without asking the kernel again (it asked once per
// calloc before: a mincore each in a loop of fixed-size callocs). A sparse run, whose untouched
// pages the question finds absent, learns nothing (the test above).
TEST(MediumCache, ACallocOfARunFoundWhollyPresentAsksNoMore) {
  if (!CacheOn()) GTEST_SKIP() << "BRISK_MEDIUM_CACHE_BYTES=0: no medium cache";
  std::thread([] {
    constexpr std::size_t kSize = 4 * kPage - 4096;  // dirty pages past 128 KiB: calloc asks
    auto* p = static_cast<unsigned char*>(brisk_malloc(kSize));
    ASSERT_NE(p, nullptr);
    std::memset(p, 0x5a, kSize);  // present whole
    brisk_free(p);
    EXPECT_GE(AsksOfCallocFrom(p, kSize), 1u) << "the first calloc of the run did not ask";
    std::memset(p, 0x5b, kSize);
    brisk_free(p);
    EXPECT_EQ(AsksOfCallocFrom(p, kSize), 0u) << "the second calloc asked again";
    // Shrunk in place, the run gives back its last pages, which the chunk may purge: grown
    // into them again, its next calloc asks.
    ASSERT_EQ(brisk_realloc(p, kPage + 4096), p);
    ASSERT_EQ(brisk_realloc(p, kSize), p) << "the pages given back were expected free to grow into";
    brisk_free(p);
    EXPECT_GE(AsksOfCallocFrom(p, kSize), 1u) << "pages given back were taken as present";
    brisk_free(p);
    brisk_thread_collect();
  }).join();
}

// A run with up to half again the pages a block needs serves it, the one with the most pages
// first: a block that then grows by realloc into those pages stays where it is.
TEST(MediumCache, ABlockFromALargerRunGrowsInPlace) {
  if (!CacheOn()) GTEST_SKIP() << "BRISK_MEDIUM_CACHE_BYTES=0: no medium cache";
  std::thread([] {
    void* two = brisk_malloc(2 * kPage);
    void* three = brisk_malloc(3 * kPage);
    void* four = brisk_malloc(4 * kPage);
    brisk_free(two);
    brisk_free(three);
    brisk_free(four);  // 4 pages: too many for a block of 2
    void* p = brisk_malloc(kBlock);
    EXPECT_EQ(p, three);
    Fill(p, kBlock, 2);
    void* q = brisk_realloc(p, 3 * kPage - 100);
    EXPECT_EQ(q, p) << "the run's third page was expected to take the growth";
    EXPECT_TRUE(Verify(q, kBlock, 2));
    brisk_free(q);
    brisk_thread_collect();
  }).join();
}

// A realloc that grows a block inside the spare pages of its run keeps them all, even when the
// new size needs fewer pages than the run has; a realloc that shrinks gives back the pages
// past its new size.
TEST(MediumCache, AGrowingReallocKeepsTheRunsSparePagesAndAShrinkingOneGivesThemBack) {
  if (!CacheOn()) GTEST_SKIP() << "BRISK_MEDIUM_CACHE_BYTES=0: no medium cache";
  std::thread([] {
    brisk_free(brisk_malloc(3 * kPage));
    void* p = brisk_malloc(kBlock);
    auto a = reinterpret_cast<std::uintptr_t>(p);
    brisk::Span* s = brisk::chunk_of(a)->span_of(a);
    ASSERT_EQ(s->page_count, 3u) << "the 3-page run was expected to serve a 2-page block";
    void* q = brisk_realloc(p, kBlock + 1000);  // grows, still within 2 pages
    ASSERT_EQ(q, p);
    EXPECT_EQ(s->page_count, 3u) << "a growing realloc gave back the run's spare page";
    q = brisk_realloc(q, kBlock);  // shrinks
    ASSERT_EQ(q, p);
    EXPECT_EQ(s->page_count, 2u) << "a shrinking realloc kept the page past its new size";
    brisk_free(q);
    brisk_thread_collect();
  }).join();
}

// A run of more than half the budget is given back at once: a few big runs would fill it.
TEST(MediumCache, ARunOfMoreThanHalfTheBudgetIsNotKept) {
  if (!CacheOn()) GTEST_SKIP() << "BRISK_MEDIUM_CACHE_BYTES=0: no medium cache";
  const auto budget = static_cast<std::size_t>(brisk::options::get(brisk::options::Id::kMediumCacheBytes));
  // Speed mode's budget (8 MiB) is more than twice the largest medium block: the test command
  // runs this test again with BRISK_MEDIUM_CACHE_BYTES=256k (medium_cache_small_budget_test).
  const auto medium_max = static_cast<std::size_t>(brisk::options::get(brisk::options::Id::kMediumMax));
  if (budget / 2 + kPage > medium_max) GTEST_SKIP() << "no medium block is bigger than half this budget";
  std::thread([budget] {
    brisk_free(brisk_malloc(budget / 2));
    EXPECT_EQ(CacheBytesOfThisThread(), budget / 2);
    brisk_thread_collect();
    brisk_free(brisk_malloc(budget / 2 + 1));
    EXPECT_EQ(CacheBytesOfThisThread(), 0u);
  }).join();
}

// A miss gives back the oldest cached run and every run smaller than its request, which a thread
// whose blocks grow would never take again; a run too big for the request stays.
TEST(MediumCache, AMissGivesBackEveryCachedRunSmallerThanItsRequest) {
  if (!CacheOn()) GTEST_SKIP() << "BRISK_MEDIUM_CACHE_BYTES=0: no medium cache";
  const auto budget = static_cast<std::size_t>(brisk::options::get(brisk::options::Id::kMediumCacheBytes));
  if (budget < 16 * kPage) GTEST_SKIP() << "the budget keeps fewer than the test's runs";
  std::thread([] {
    // Runs of 2, 3 and 7 pages, cached oldest first. A request of 4 pages takes a run of 4 to
    // 6 pages: none fits.
    void* two = brisk_malloc(2 * kPage - 1000);
    void* three = brisk_malloc(3 * kPage - 1000);
    void* seven = brisk_malloc(7 * kPage - 1000);
    ASSERT_TRUE(two != nullptr && three != nullptr && seven != nullptr);
    brisk_free(two);
    brisk_free(three);
    brisk_free(seven);
    ASSERT_EQ(CacheBytesOfThisThread(), 12 * kPage);
    void* four = brisk_malloc(4 * kPage - 1000);
    ASSERT_NE(four, nullptr);
    EXPECT_EQ(CacheBytesOfThisThread(), 7 * kPage) << "the runs of 2 and 3 pages were expected back, the 7 kept";
    brisk_free(four);
    brisk_thread_collect();
  }).join();
}

// A debug block's run comes back to its thread's debug heap when the block leaves the
// quarantine, and stays there for the thread's next medium debug block.
TEST(MediumCache, ADebugHeapKeepsTheRunsOfBlocksLeavingTheQuarantine) {
  if (!CacheOn()) GTEST_SKIP() << "BRISK_MEDIUM_CACHE_BYTES=0: no medium cache";
  if (DebugBlocksPastTheQuarantine() > 200) GTEST_SKIP() << "the quarantine holds too many blocks for the test";
  std::thread([] {
    brisk_debug_enter();
    std::vector<void*> blocks(DebugBlocksPastTheQuarantine());
    for (void*& p : blocks) p = brisk_malloc(kBlock);
    for (void* p : blocks) brisk_free(p);
    const std::uint64_t cached = CacheBytesOfThisThreadsDebugHeap();
    EXPECT_GT(cached, 0u) << "no run of a block that left the quarantine was kept";
    void* next = brisk_malloc(kBlock);
    EXPECT_LT(CacheBytesOfThisThreadsDebugHeap(), cached) << "the next debug block did not take a cached run";
    brisk_free(next);
    brisk_debug_exit();
    brisk_thread_collect();
  }).join();
}

// A second free of a block whose run waits in the cache is named as a double free.
TEST(MediumCacheDeathTest, ASecondFreeOfACachedBlockIsADoubleFree) {
  if (!CacheOn()) GTEST_SKIP() << "BRISK_MEDIUM_CACHE_BYTES=0: no medium cache";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        void* p = brisk_malloc(kBlock);
        brisk_free(p);
        brisk_free(p);
      },
      "double free of 0x");
  EXPECT_DEATH(
      {
        void* p = brisk_malloc(kBlock);
        brisk_free(p);
        std::thread([p] { brisk_free(p); }).join();  // a remote free of it
      },
      "double free of 0x");
}

// A worker that frees medium blocks and then blocks, as a pool thread waiting for work does. In
// debug mode (debug) its blocks are debug blocks, more of them than the quarantine holds, so that
// the runs of those that left it wait in its debug heap's cache.
class IdleWorkerWithCachedRuns {
 public:
  static constexpr int kBlocks = 4;
  explicit IdleWorkerWithCachedRuns(bool debug = false) {
    worker_ = std::thread([this, debug] {
      if (debug) brisk_debug_enter();
      std::vector<void*> p(debug ? DebugBlocksPastTheQuarantine() : kBlocks);
      for (void*& b : p) {
        b = brisk_malloc(kBlock);
        Fill(b, kBlock, 3);
      }
      for (void* b : p) brisk_free(b);
      std::unique_lock<std::mutex> lock(m_);
      cached_ = debug ? CacheBytesOfThisThreadsDebugHeap() : CacheBytesOfThisThread();
      ready_ = true;
      cv_.notify_all();
      cv_.wait(lock, [this] { return done_; });
      left_ = debug ? CacheBytesOfThisThreadsDebugHeap() : CacheBytesOfThisThread();
      if (debug) brisk_debug_exit();
    });
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait(lock, [this] { return ready_; });
  }
  ~IdleWorkerWithCachedRuns() {
    if (worker_.joinable()) Finish();
  }
  std::uint64_t cached() const { return cached_; }
  // Wakes the worker and returns the bytes its cache held then.
  std::uint64_t Finish() {
    {
      std::lock_guard<std::mutex> lock(m_);
      done_ = true;
    }
    cv_.notify_all();
    worker_.join();
    return left_;
  }

 private:
  std::thread worker_;
  std::mutex m_;
  std::condition_variable cv_;
  bool ready_ = false, done_ = false;
  std::uint64_t cached_ = 0, left_ = ~std::uint64_t{0};
};

// Runs reclaim() beside a worker that cached runs and blocked: the worker's cache must be empty
// after it, and the process's thread cache bytes lower by at least what the worker cached.
template <class Reclaim>
void ExpectTheIdleWorkersRunsTaken(Reclaim reclaim, bool debug = false) {
  IdleWorkerWithCachedRuns idle(debug);
  if (debug) ASSERT_GT(idle.cached(), 0u);
  else ASSERT_EQ(idle.cached(), IdleWorkerWithCachedRuns::kBlocks * 2 * kPage);
  const brisk_stats before = Stats();
  reclaim();
  const brisk_stats after = Stats();
  EXPECT_LE(after.thread_cache_bytes + idle.cached(), before.thread_cache_bytes)
      << "before " << before.thread_cache_bytes << ", after " << after.thread_cache_bytes;
  EXPECT_EQ(idle.Finish(), 0u);
}

TEST(MediumCache, BriskTrimTakesTheRunsOtherThreadsCached) {
  if (!CacheOn()) GTEST_SKIP() << "BRISK_MEDIUM_CACHE_BYTES=0: no medium cache";
  ExpectTheIdleWorkersRunsTaken([] { brisk_trim(); });
}

void TwoBackgroundPasses() {
  // The first pass sees the worker's heap; 1 s later (BRISK_IDLE_MS=10) it is idle.
  std::uint64_t now = brisk::platform::now_ms();
  brisk::background_pass(now);
  brisk::background_pass(now + 1000);
}

TEST(MediumCache, TheBackgroundPassTakesTheRunsOfAnIdleThread) {
  if (!CacheOn()) GTEST_SKIP() << "BRISK_MEDIUM_CACHE_BYTES=0: no medium cache";
  ASSERT_STREQ(getenv("BRISK_BACKGROUND"), "0") << "run through ctest (medium_cache_test)";
  ExpectTheIdleWorkersRunsTaken(TwoBackgroundPasses);
}

// The same for the runs in an idle thread's debug heap: its thread heap's slow paths say nothing
// about it (debug mode makes blocks from the debug heap only).
TEST(MediumCache, TheBackgroundPassTakesTheRunsOfAnIdleThreadsDebugHeap) {
  if (!CacheOn()) GTEST_SKIP() << "BRISK_MEDIUM_CACHE_BYTES=0: no medium cache";
  ASSERT_STREQ(getenv("BRISK_BACKGROUND"), "0") << "run through ctest (medium_cache_test)";
  if (DebugBlocksPastTheQuarantine() > 200) GTEST_SKIP() << "the quarantine holds too many blocks for the test";
  ExpectTheIdleWorkersRunsTaken(TwoBackgroundPasses, true);
}

// brisk_thread_collect gives the thread's cached runs back, and a switch to a strategy with a
// smaller budget (speed's 8 MiB to balanced's 2 MiB) shrinks the cache at the thread's next
// medium block.
TEST(MediumCache, CollectAndASwitchToASmallerBudgetShrinkTheCache) {
  if (!CacheOn()) GTEST_SKIP() << "BRISK_MEDIUM_CACHE_BYTES=0: no medium cache";
  if (getenv("BRISK_MEDIUM_CACHE_BYTES") != nullptr) GTEST_SKIP() << "the budget is the environment's in every mode";
  std::thread([] {
    brisk_free(brisk_malloc(kBlock));
    EXPECT_EQ(CacheBytesOfThisThread(), 2 * kPage);
    brisk_thread_collect();
    EXPECT_EQ(CacheBytesOfThisThread(), 0u);
    const brisk_strategy was = brisk_get_strategy();
    brisk_set_strategy(BRISK_STRATEGY_SPEED);
    constexpr std::size_t kBig = 15 * kPage + 1;  // a run of 16 pages: 1 MiB
    void* big[3];
    for (void*& p : big) p = brisk_malloc(kBig);
    for (void* p : big) brisk_free(p);
    EXPECT_EQ(CacheBytesOfThisThread(), 3 * 16 * kPage) << "speed mode keeps 8 MiB of runs";
    brisk_set_strategy(BRISK_STRATEGY_BALANCED);
    void* c = brisk_malloc(kBlock);  // fits no cached run: the oldest goes, then the cache shrinks to 2 MiB
    EXPECT_EQ(CacheBytesOfThisThread(), 2 * 16 * kPage);
    brisk_free(c);
    EXPECT_LE(CacheBytesOfThisThread(), std::uint64_t{2} << 20);
    brisk_set_strategy(was);
    brisk_thread_collect();
  }).join();
}

// Low-memory mode keeps a medium cache too (BRISK_MEDIUM_CACHE_BYTES 2m; options.cc has why:
// a block that takes a cached run of up to half again its pages can grow into them in place).
TEST(MediumCache, LowMemoryKeepsRuns) {
  if (getenv("BRISK_MEDIUM_CACHE_BYTES") != nullptr) GTEST_SKIP() << "the budget is the environment's in every mode";
  const brisk_strategy was = brisk_get_strategy();
  brisk_set_strategy(BRISK_STRATEGY_LOW_MEMORY);
  std::thread([] {
    void* grown = brisk_malloc(3 * kPage);  // a run of 3 pages (pages_for rounds the block up)
    brisk_free(grown);
    EXPECT_EQ(CacheBytesOfThisThread(), 3 * kPage) << "low-memory kept no run";
    void* p = brisk_malloc(kBlock);  // 2 pages: takes the 3-page run
    EXPECT_EQ(p, grown);
    EXPECT_EQ(CacheBytesOfThisThread(), 0u);
    void* q = brisk_realloc(p, kBlock + kPage);  // 3 pages: the run's last one
    EXPECT_EQ(q, p) << "the block did not grow within its run";
    brisk_free(q);
    brisk_thread_collect();
  }).join();
  brisk_set_strategy(was);
}

// A block whose run came from the cache, freed by another thread into the queue of its owner,
// which then blocks: brisk_trim's reclaim of that queue gives the span back, as it does for a
// block in a fresh run (the cache hit must leave no trace of the free that cached the run).
bool QueuedFreeReclaimed(bool from_cache) {
  std::mutex m;
  std::condition_variable cv;
  bool ready = false, done = false;
  brisk::Heap* owner = nullptr;
  void* p = nullptr;
  std::thread worker([&] {
    if (from_cache) brisk_free(brisk_malloc(kBlock));
    void* b = brisk_malloc(kBlock);
    std::unique_lock<std::mutex> lock(m);
    owner = brisk::t_heap;
    p = b;
    ready = true;
    cv.notify_all();
    cv.wait(lock, [&] { return done; });
  });
  {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return ready; });
  }
  owner->slow_lock.lock();  // free_remote_medium's try fails: the block goes to the owner's queue
  brisk_free(p);
  owner->slow_lock.unlock();
  brisk_thread_collect();  // sends this thread's outgoing batch
  brisk_trim();            // reclaims the owner's queue
  const bool reclaimed = owner->incoming.empty();
  {
    std::lock_guard<std::mutex> lock(m);
    done = true;
  }
  cv.notify_all();
  worker.join();
  return reclaimed;
}

TEST(MediumCache, AQueuedFreeOfABlockInAFreshRunIsReclaimed) { EXPECT_TRUE(QueuedFreeReclaimed(false)); }

TEST(MediumCache, AQueuedFreeOfABlockInACachedRunIsReclaimed) {
  if (!CacheOn()) GTEST_SKIP() << "BRISK_MEDIUM_CACHE_BYTES=0: no medium cache";
  EXPECT_TRUE(QueuedFreeReclaimed(true));
}

}  // namespace
