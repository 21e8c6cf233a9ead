// The foreign cache (threadcache/foreign_cache.h): other threads' small blocks that a thread
// frees, kept for its own next allocations of their class. Runs with BRISK_BACKGROUND=0,
// BRISK_IDLE_MS=10 and BRISK_FOREIGN_CACHE_BYTES=64k (tests/CMakeLists.txt): no thread of brisk's
// own, so only the passes this test makes (with a fake clock) take an idle thread's cache, and a
// small limit to overflow.
#include <brisk/brisk.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/chunk.h"
#include "core/options.h"
#include "core/platform.h"
#include "core/size_class.h"
#include "tests/test_util.h"
#include "threadcache/background.h"
#include "threadcache/heap.h"

using namespace brisk_test;

namespace {

constexpr std::size_t kSize = 48;  // a class no other thread of these tests allocates first
constexpr std::size_t kLimit = 64 * 1024;

std::atomic<std::uint64_t> g_fake_now{1'000'000};
std::uint64_t FakeClock() { return g_fake_now.load(); }

brisk::Span* SpanOf(void* p) {
  auto a = reinterpret_cast<std::uintptr_t>(p);
  return brisk::chunk_of(a)->span_of(a);
}

std::uint32_t Batched(const brisk::Heap* h) {
  std::uint32_t n = 0;
  for (const auto& o : h->outgoing) n += brisk::load_shared(o.count);
  return n;
}

// A thread that runs `first`, then waits until released, then runs `then` and exits; as a pool
// thread that frees its work and blocks on its queue.
class Parked {
 public:
  Parked(std::function<void()> first, std::function<void()> then = [] {}) {
    thread_ = std::thread([this, first = std::move(first), then = std::move(then)] {
      first();
      heap_ = brisk::t_heap;
      std::unique_lock<std::mutex> lock(m_);
      parked_ = true;
      cv_.notify_all();
      cv_.wait(lock, [this] { return released_; });
      lock.unlock();
      then();
    });
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait(lock, [this] { return parked_; });
  }
  ~Parked() { Release(); }
  brisk::Heap* heap() const { return heap_; }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(m_);
      released_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool parked_ = false;
  bool released_ = false;
  brisk::Heap* heap_ = nullptr;
  std::thread thread_;
};

class ForeignCache : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_STREQ(getenv("BRISK_BACKGROUND"), "0") << "run through ctest (foreign_cache_test)";
    ASSERT_EQ(brisk::options::get(brisk::options::Id::kForeignCacheBytes), static_cast<std::int64_t>(kLimit));
    brisk::platform::set_clock_for_test(FakeClock);
  }
  void TearDown() override { brisk::platform::set_clock_for_test(nullptr); }
  static void Passes(int n) {
    for (int i = 0; i < n; ++i) {
      g_fake_now += 1000;
      brisk::background_pass(g_fake_now.load());
    }
  }
  // n blocks of kSize, allocated by a thread that then waits (its blocks' owner).
  std::vector<void*> OwnersBlocks(int n) {
    std::vector<void*> blocks;
    owner_ = std::make_unique<Parked>([&] {
      for (int i = 0; i < n; ++i) {
        void* p = brisk_malloc(kSize);
        Fill(p, kSize, 100 + i);
        blocks.push_back(p);
      }
    });
    return blocks;
  }
  std::unique_ptr<Parked> owner_;
};

// The freer grows in the class (it takes a new span of it), frees the owner's blocks, and
// allocates again: it gets the owner's blocks back, none of which went to the owner, whose span
// still counts them.
TEST_F(ForeignCache, AThreadGrowingInAClassGetsTheBlocksItFreedBack) {
  constexpr int kBlocks = 100;
  std::vector<void*> blocks = OwnersBlocks(kBlocks);
  const std::uint32_t used_before = brisk::load_shared(SpanOf(blocks[0])->used);
  std::vector<void*> again;
  Parked freer([&] {
    brisk_free(brisk_malloc(kSize));  // a heap of its own, which allocates the class
    const brisk_stats base = Stats();
    for (int i = 0; i < kBlocks; ++i) {
      EXPECT_TRUE(Verify(blocks[i], kSize, 100 + i));
      brisk_free(blocks[i]);
    }
    brisk::Heap* h = brisk::t_heap;
    EXPECT_EQ(brisk::load_shared(h->foreign_bytes), kBlocks * kSize);
    EXPECT_EQ(Batched(h), 0u) << "sent instead of kept";
    EXPECT_EQ(brisk::load_shared(SpanOf(blocks[0])->used), used_before) << "the owner's span lost its count";
    const brisk_stats s = Stats();
    EXPECT_EQ(s.remote_queued_bytes - base.remote_queued_bytes, kBlocks * kSize) << "the cache is not counted";
    EXPECT_EQ(base.bytes_in_use - s.bytes_in_use, kBlocks * kSize);
    // Its own span first (the fast path), then, when that is empty, its cache.
    const std::uint32_t capacity = brisk::kClasses[brisk::size_to_class(kSize)].capacity;
    while (brisk::load_shared(h->foreign_bytes) != 0 && again.size() < kBlocks + capacity) {
      void* p = brisk_malloc(kSize);
      Fill(p, kSize, 7);
      again.push_back(p);
    }
    EXPECT_EQ(brisk::load_shared(h->foreign_bytes), 0u);
    EXPECT_EQ(Stats().remote_queued_bytes, base.remote_queued_bytes);
  });
  std::sort(again.begin(), again.end());
  for (void* p : blocks)
    EXPECT_TRUE(std::binary_search(again.begin(), again.end(), p)) << p << " was not handed out again";
  for (void* p : again) EXPECT_TRUE(Verify(p, kSize, 7));
  freer.Release();
  owner_->Release();
  for (void* p : again) brisk_free(p);  // live blocks: their free key went when they were taken
}

// A thread that frees other threads' blocks of a class it does not allocate (a consumer)
// keeps none of them: they go to their owner in the outgoing batch.
TEST_F(ForeignCache, AThreadThatOnlyFreesKeepsNothing) {
  std::vector<void*> blocks = OwnersBlocks(20);
  Parked freer([&] {
    brisk_free(brisk_malloc(16));  // a heap of its own, of another class
    for (void* p : blocks) brisk_free(p);
    EXPECT_EQ(brisk::load_shared(brisk::t_heap->foreign_bytes), 0u);
    EXPECT_EQ(Batched(brisk::t_heap), 20u);
  });
}

// Past BRISK_FOREIGN_CACHE_BYTES the cache goes home at once, and the thread keeps no more until
// it needs a new span of the class again; nor once its own blocks of the class come back to it.
// Nothing is lost: once the owner has exited, every byte the test
// allocated is free again and nothing waits in a queue.
TEST_F(ForeignCache, AFullCacheGoesHomeAndTheClassIsKeptOnlyWhileTheThreadGrowsInIt) {
  const int n = static_cast<int>(kLimit / kSize) + 200;
  const brisk_stats base = Stats();
  std::vector<void*> blocks = OwnersBlocks(n);
  Parked freer([&] {
    brisk_free(brisk_malloc(kSize));
    brisk::Heap* h = brisk::t_heap;
    std::size_t most = 0;
    for (int i = 0; i < n; ++i) {
      brisk_free(blocks[i]);
      most = std::max(most, brisk::load_shared(h->foreign_bytes));
    }
    EXPECT_LE(most, kLimit);
    EXPECT_GT(most + kSize, kLimit) << "the cache was never full";
    EXPECT_EQ(brisk::load_shared(h->foreign_bytes), 0u) << "blocks freed after the overflow were kept";
    // A new span of the class again (more blocks than a span holds, kept live): kept again...
    std::vector<void*> own;
    for (std::uint32_t i = 0; i <= brisk::kClasses[brisk::size_to_class(kSize)].capacity; ++i)
      own.push_back(brisk_malloc(kSize));
    void* more[2] = {};
    Parked other([&] { for (void*& p : more) p = brisk_malloc(kSize); });  // alive: not an orphan
    brisk_free(more[0]);
    EXPECT_EQ(brisk::load_shared(h->foreign_bytes), kSize);
    // ... until its own blocks come back to a full span of the class: then it no longer grows
    // there, and others' blocks go home.
    for (void* p : own) brisk_free(p);
    brisk_free(more[1]);
    EXPECT_EQ(brisk::load_shared(h->foreign_bytes), kSize) << "kept while its own blocks came back";
    brisk_thread_collect();  // the cache and the partial batch go home
    EXPECT_EQ(brisk::load_shared(h->foreign_bytes), 0u);
  });
  freer.Release();
  owner_->Release();
  const brisk_stats after = Stats();
  EXPECT_EQ(after.remote_queued_bytes, base.remote_queued_bytes);
  EXPECT_EQ(after.bytes_in_use, base.bytes_in_use);
}

// Low-memory mode keeps a class from its first refill on (BRISK_FOREIGN_CACHE_ALWAYS): a thread
// whose own blocks come back still keeps others' blocks of the class.
TEST_F(ForeignCache, LowMemoryKeepsAClassAlsoWhenTheThreadsOwnBlocksComeBack) {
  void* theirs = nullptr;
  Parked other([&] { theirs = brisk_malloc(kSize); });  // alive: not an orphan
  Parked freer([&] {
    brisk_set_strategy(BRISK_STRATEGY_LOW_MEMORY);
    std::vector<void*> own;  // more blocks than a span holds: a refill, whose levers are low-memory's
    for (std::uint32_t i = 0; i <= brisk::kClasses[brisk::size_to_class(kSize)].capacity; ++i)
      own.push_back(brisk_malloc(kSize));
    EXPECT_TRUE(brisk::t_heap->foreign_always);
    for (void* p : own) brisk_free(p);  // back to a full span of the class
    brisk_free(theirs);
    EXPECT_EQ(brisk::load_shared(brisk::t_heap->foreign_bytes), kSize) << "not kept in low-memory mode";
    brisk_set_strategy(BRISK_STRATEGY_BALANCED);
    brisk_thread_collect();
  });
}

// A thread that keeps blocks in its cache and then blocks for good (a pool thread waiting for
// work) must not pin them: the background pass takes an idle heap's cache and sends it home,
// unless the owner is changing it just then (out_busy), and then a later pass does.
TEST_F(ForeignCache, AnIdleThreadsCacheIsSentHome) {
  Passes(3);
  std::vector<void*> blocks = OwnersBlocks(30);
  Parked freer([&] {
    brisk_free(brisk_malloc(kSize));
    for (void* p : blocks) brisk_free(p);
  });
  brisk::Heap* h = freer.heap();
  ASSERT_EQ(brisk::load_shared(h->foreign_bytes), 30 * kSize);
  h->out_busy = 1;  // as if a free were adding to it just now
  Passes(3);
  EXPECT_EQ(brisk::load_shared(h->foreign_bytes), 30 * kSize) << "taken while the owner was changing it";
  h->out_busy = 0;
  Passes(3);
  EXPECT_EQ(brisk::load_shared(h->foreign_bytes), 0u);
  EXPECT_EQ(h->foreign[brisk::size_to_class(kSize)], nullptr);
  // The owner is idle too: the pass took its queue, and its span, empty, went back.
  brisk::Span* span = SpanOf(blocks[0]);
  EXPECT_TRUE(span->idle_purged || span->owner.load() != owner_->heap() || span->used == 0)
      << "the owner's span kept the blocks";
  // The freer's next free of the class is kept again, the mark gone.
  freer.Release();
}

// brisk_trim takes the cache of a thread that is not idle yet.
TEST_F(ForeignCache, TrimTakesOtherThreadsCaches) {
  std::vector<void*> blocks = OwnersBlocks(30);
  Parked freer([&] {
    brisk_free(brisk_malloc(kSize));
    for (void* p : blocks) brisk_free(p);
  });
  ASSERT_EQ(brisk::load_shared(freer.heap()->foreign_bytes), 30 * kSize);
  brisk_trim();
  EXPECT_EQ(brisk::load_shared(freer.heap()->foreign_bytes), 0u);
}

// At thread exit the cache goes home with the thread's batches.
TEST_F(ForeignCache, AnExitingThreadSendsItsCacheHome) {
  std::vector<void*> blocks = OwnersBlocks(30);
  brisk::Heap* freer_heap = nullptr;
  std::thread([&] {
    brisk_free(brisk_malloc(kSize));
    for (void* p : blocks) brisk_free(p);
    freer_heap = brisk::t_heap;
    ASSERT_EQ(brisk::load_shared(freer_heap->foreign_bytes), 30 * kSize);
  }).join();
  EXPECT_EQ(brisk::load_shared(freer_heap->foreign_bytes), 0u);
  for (auto* f : freer_heap->foreign) EXPECT_EQ(f, nullptr);
}

// A ring of threads, each freeing the blocks its predecessor allocated (into its cache) and
// allocating again (from it), while brisk_trim takes their caches and batches from the main
// thread again and again: every block keeps its contents, and once the threads have exited
// nothing is left in use or in a queue.
TEST_F(ForeignCache, ARingOfThreadsLosesNothingWhileTrimsTakeTheirCaches) {
  constexpr int kThreads = 4;
  const int rounds = 1000 / kScale;
  constexpr int kBatch = 200;
  const brisk_stats base = Stats();
  struct Link {
    std::mutex m;
    std::condition_variable cv;
    std::vector<std::vector<void*>> batches;
  };
  std::vector<Link> links(kThreads);
  std::atomic<int> bad{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < rounds; ++r) {
        std::vector<void*> batch;
        for (int i = 0; i < kBatch; ++i) {
          void* p = brisk_malloc(kSize);
          Fill(p, kSize, (std::uint64_t{static_cast<unsigned>(t)} << 32) + r * kBatch + i);
          batch.push_back(p);
        }
        Link& next = links[(t + 1) % kThreads];
        {
          std::lock_guard<std::mutex> lock(next.m);
          next.batches.push_back(std::move(batch));
        }
        next.cv.notify_one();
        Link& mine = links[t];
        std::vector<void*> got;
        {
          std::unique_lock<std::mutex> lock(mine.m);
          mine.cv.wait(lock, [&] { return !mine.batches.empty(); });
          got = std::move(mine.batches.front());
          mine.batches.erase(mine.batches.begin());
        }
        const int from = (t + kThreads - 1) % kThreads;
        for (int i = 0; i < kBatch; ++i) {
          if (!Verify(got[i], kSize, (std::uint64_t{static_cast<unsigned>(from)} << 32) + r * kBatch + i)) ++bad;
          brisk_free(got[i]);
        }
      }
    });
  }
  std::thread trimmer([&] {
    while (!done.load()) brisk_trim();
  });
  for (auto& t : threads) t.join();
  done = true;
  trimmer.join();
  EXPECT_EQ(bad.load(), 0);
  const brisk_stats after = Stats();
  EXPECT_EQ(after.remote_queued_bytes, base.remote_queued_bytes);
  EXPECT_EQ(after.bytes_in_use, base.bytes_in_use);
}

// A block in the cache carries the free key: a second free of it, by any thread, is a double free.
TEST(ForeignCacheDeathTest, ASecondFreeOfACachedBlockIsADoubleFree) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto twice = [](bool same_thread) {
    void* p = brisk_malloc(kSize);
    std::thread([p, same_thread] {
      brisk_free(brisk_malloc(kSize));
      brisk_free(p);
      if (brisk::load_shared(brisk::t_heap->foreign_bytes) != kSize) std::abort();  // not kept
      if (same_thread) brisk_free(p);
    }).join();
    brisk_free(p);
  };
  EXPECT_DEATH(twice(true), "double free of 0x");
  EXPECT_DEATH(twice(false), "double free of 0x");
}

}  // namespace
