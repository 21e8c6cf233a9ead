// Thread exit, orphaned spans in the central pools, and their adoption by other threads.
#include <brisk/brisk.h>
#include "tests/test_util.h"
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <functional>
#include <condition_variable>
#include <thread>
#include <vector>

#include "core/central_pool.h"
#include "core/chunk.h"
#include "core/options.h"
#include "core/size_class.h"
#include "threadcache/heap.h"
#include "threadcache/orphans.h"

namespace brisk {
namespace {

Span* span_of(void* p) { return chunk_of(reinterpret_cast<std::uintptr_t>(p))->span_of(reinterpret_cast<std::uintptr_t>(p)); }

TEST(CentralPool, ExitedThreadsSpansAreOrphanedThenReclaimedByFrees) {
  constexpr int kBlocks = 5000;  // several spans of the 48-byte class
  std::vector<void*> blocks;
  std::thread owner([&] {
    for (int i = 0; i < kBlocks; ++i) {
      void* p = brisk_malloc(40);
      std::memset(p, i & 0xFF, 40);
      blocks.push_back(p);
    }
  });
  owner.join();
  brisk_stats after_exit = brisk_test::Stats();
  EXPECT_GT(after_exit.spans_orphaned, 0u) << "the owner exited with live blocks: its spans are orphans";
  for (void* p : blocks)
    EXPECT_EQ(span_of(p)->owner.load(), &g_orphan_heap);
  // Free everything from this thread: the blocks travel through the orphan queue.
  for (int i = 0; i < kBlocks; ++i) {
    auto* c = static_cast<unsigned char*>(blocks[static_cast<std::size_t>(i)]);
    ASSERT_EQ(c[0], static_cast<unsigned char>(i & 0xFF));
    ASSERT_EQ(c[39], static_cast<unsigned char>(i & 0xFF));
    brisk_free(c);
  }
  brisk_thread_collect();  // flushes this thread's batches and drains the orphan queue
  EXPECT_EQ(brisk_test::Stats().spans_orphaned, after_exit.spans_orphaned - (after_exit.spans_orphaned))
      << "every orphan span became empty and went back to its chunk";
}

TEST(CentralPool, AnotherThreadAdoptsAnOrphanSpanWithRoom) {
  // The owner leaves a span with free room behind (it allocates a few blocks of a class no one
  // else uses here, frees some of them, and exits).
  constexpr std::size_t kSize = 3000;
  std::vector<void*> kept;
  std::thread owner([&] {
    std::vector<void*> all;
    for (int i = 0; i < 6; ++i) all.push_back(brisk_malloc(kSize));
    for (int i = 0; i < 6; ++i) (i % 2 ? kept : all).push_back(all[static_cast<std::size_t>(i)]);
    for (int i = 0; i < 6; i += 2) brisk_free(all[static_cast<std::size_t>(i)]);
  });
  owner.join();
  ASSERT_EQ(kept.size(), 3u);
  Span* orphan = span_of(kept[0]);
  ASSERT_EQ(orphan->owner.load(), &g_orphan_heap);
  // A new thread's first allocation of that class takes the orphan span from the central pool.
  void* fresh = nullptr;
  Heap* adopter = nullptr;
  std::thread taker([&] {
    fresh = brisk_malloc(kSize);
    adopter = t_heap;
    EXPECT_EQ(span_of(fresh), orphan) << "the pool's span was reused, not a new one";
    EXPECT_EQ(orphan->owner.load(), adopter);
    brisk_free(fresh);
  });
  taker.join();
  for (void* p : kept) brisk_free(p);
  brisk_thread_collect();
}

// A thread that frees all of an exited thread's blocks of a class it has no span of yet keeps
// the adopted span, now empty, as that class's span: its next block of the class is the last
// one it freed (the head of the span's free list), not the first block of a span made anew.
TEST(CentralPool, AnAdoptedSpanThatEmptiesServesTheNextBlockOfItsClass) {
  constexpr std::size_t kSize = 2500;  // a class no other test here uses
  constexpr int kBlocks = 8;
  std::vector<void*> blocks;
  std::thread owner([&] {
    for (int i = 0; i < kBlocks; ++i) blocks.push_back(brisk_malloc(kSize));
  });
  owner.join();
  Span* orphan = span_of(blocks[0]);
  ASSERT_EQ(orphan->owner.load(), &g_orphan_heap);
  for (void* p : blocks) ASSERT_EQ(span_of(p), orphan) << "the owner's blocks share one span";
  void* next = nullptr;
  Heap* heir = nullptr;
  std::thread taker([&] {
    for (void* p : blocks) brisk_free(p);  // adopts the span at the first free; empties it at the last
    heir = t_heap;
    next = brisk_malloc(kSize);
    EXPECT_EQ(orphan->owner.load(), heir);
    brisk_free(next);
  });
  taker.join();
  EXPECT_EQ(next, blocks.back()) << "the emptied span was given back, and a new one carved";
  brisk_thread_collect();
}

// The same for a 2-page span (the 8-16 KiB classes): it stays only as a retained class's emptied
// span does, so BRISK_RETAINED_SPANS=0 (central_pool_retained_off_test) sends it back at once.
TEST(CentralPool, AnAdoptedMultiPageSpanThatEmptiesStaysWithinTheRetainedLimits) {
  constexpr std::size_t kSize = 12 * 1024;
  const unsigned c = size_to_class(kSize);
  ASSERT_GT(kClasses[c].span_pages, 1u);
  std::vector<void*> blocks;
  std::thread owner([&] {
    for (unsigned i = 0; i < kClasses[c].capacity; ++i) blocks.push_back(brisk_malloc(kSize));
  });
  owner.join();
  Span* orphan = span_of(blocks[0]);
  for (void* p : blocks) ASSERT_EQ(span_of(p), orphan);
  const bool retains = options::get(options::Id::kRetainedSpans) != 0;
  std::thread taker([&] {
    for (void* p : blocks) brisk_free(p);
    Heap* h = t_heap;
    if (retains) {
      EXPECT_EQ(h->installed[c], orphan);
      EXPECT_TRUE(h->retained[c]) << "kept past the retained spans' count and bytes";
    } else {
      EXPECT_EQ(h->installed[c], &g_empty_span) << "kept with BRISK_RETAINED_SPANS=0";
      EXPECT_NE(orphan->owner.load(), h);
    }
  });
  taker.join();
  brisk_thread_collect();
}

// Runs each closure given to Run on a thread of its own, to its end before Run returns.
class Worker {
 public:
  Worker() : thread_([this] { Loop(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Run(std::function<void()> fn) {
    std::unique_lock<std::mutex> lock(m_);
    job_ = std::move(fn);
    const std::uint64_t ticket = ++posted_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return done_ == ticket; });
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || done_ != posted_; });
      if (done_ == posted_) return;  // stop_, nothing left to run
      std::function<void()> fn = std::move(job_);
      lock.unlock();
      fn();
      lock.lock();
      ++done_;
      cv_.notify_all();
    }
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::function<void()> job_;
  std::uint64_t posted_ = 0, done_ = 0;
  bool stop_ = false;
  std::thread thread_;  // last: it starts once the rest is set up
};

// BRISK_SPAN_KEEP (low-memory's 1, speed's 0: no limit): of the spans other threads' frees gave
// room to, a thread keeps at most that many per class besides its current one; its drain gives
// the rest to the central pool, where another thread's refill takes them, and a free into such
// an orphan does not adopt it past the keep. Room made by the thread's own frees stays its own.
TEST(CentralPool, PastItsSpanKeepRoomOtherThreadsFreedGoesToTheCentralPool) {
  constexpr std::size_t kSize = 1800;  // a class no other test here uses
  const unsigned c = size_to_class(kSize);
  const unsigned cap = kClasses[c].capacity;
  const std::uint64_t orphans_before = brisk_test::Stats().spans_orphaned;
  for (const bool low : {false, true}) {
    SCOPED_TRACE(low ? "low-memory" : "speed");
    brisk_set_strategy(low ? BRISK_STRATEGY_LOW_MEMORY : BRISK_STRATEGY_SPEED);
    std::vector<void*> blocks;
    Heap* h = nullptr;
    std::uint32_t keep = 0;
    Worker owner, freer;
    owner.Run([&] {
      for (unsigned i = 0; i < 4 * cap; ++i) blocks.push_back(brisk_malloc(kSize));  // four full spans
      h = t_heap;
      keep = h->span_keep;
    });
    ASSERT_EQ(keep, low ? 1u : 0u) << "the refills read the strategy's lever";
    Span* spans[4];
    for (unsigned k = 0; k < 4; ++k) {
      spans[k] = span_of(blocks[k * cap]);
      ASSERT_EQ(span_of(blocks[k * cap + cap - 1]), spans[k]);
      ASSERT_TRUE(k == 0 || spans[k] != spans[k - 1]);
    }
    freer.Run([&] {  // room in spans 0 and 1, sent to the owner
      brisk_free(blocks[0]);
      brisk_free(blocks[cap]);
      brisk_free(blocks[cap + 1]);
      brisk_thread_collect();
    });
    owner.Run([&] {
      brisk_free(blocks[2 * cap]);  // room in span 2 by the owner's own free
      brisk_thread_collect();       // drains the freer's blocks
    });
    EXPECT_EQ(spans[0]->owner.load(), low ? &g_orphan_heap : h);
    EXPECT_EQ(spans[1]->owner.load(), low ? &g_orphan_heap : h);
    EXPECT_EQ(spans[2]->owner.load(), h) << "room made by the owner's own free stays its own";
    EXPECT_EQ(spans[3]->owner.load(), h);
    owner.Run([&] { brisk_free(blocks[cap + 2]); });  // into span 1, with span 2 kept: no adoption
    EXPECT_EQ(spans[1]->owner.load(), low ? &g_orphan_heap : h);
    if (low) {
      Worker taker;
      taker.Run([&] {
        void* p = brisk_malloc(kSize);  // its first refill of the class takes a span of the pool
        Span* s = span_of(p);
        EXPECT_TRUE(s == spans[0] || s == spans[1]) << "the orphans' room was not reused";
        EXPECT_EQ(s->owner.load(), t_heap);
        brisk_free(p);
      });
    }
    owner.Run([&] {
      for (unsigned i = 0; i < 4 * cap; ++i)
        if (i != 0 && i != cap && i != cap + 1 && i != cap + 2 && i != 2 * cap) brisk_free(blocks[i]);
      brisk_thread_collect();
    });
  }
  brisk_set_strategy(BRISK_STRATEGY_BALANCED);
  brisk_thread_collect();  // the orphan queue: blocks freed into spans whose owners exited
  EXPECT_EQ(brisk_test::Stats().spans_orphaned, orphans_before) << "a span of the test's stayed an orphan";
}

// realloc's fast path holds the old block's span across the new block's allocation, whose
// refill drains the thread's queue: the span keep may give that span to the central pool there
// (low-memory's keep of 1: another span of the class with room is kept already), and the old
// block must then be freed as another thread's block, not into a span the heap no longer owns.
TEST(CentralPool, ReallocWhoseRefillGivesTheOldBlocksSpanAway) {
  constexpr std::size_t kSize = 1700;  // a class no other test here uses; 3000 is the new block's
  const unsigned c = size_to_class(kSize);
  const unsigned cap = kClasses[c].capacity;
  ASSERT_NE(size_to_class(1800), c);
  const std::uint64_t orphans_before = brisk_test::Stats().spans_orphaned;
  brisk_set_strategy(BRISK_STRATEGY_LOW_MEMORY);
  std::vector<void*> blocks;
  Worker owner, freer;
  owner.Run([&] {
    for (unsigned i = 0; i < 3 * cap; ++i) blocks.push_back(brisk_malloc(kSize));  // three full spans
    brisk_free(blocks[0]);  // span 0 has room: the class's kept span
  });
  Span* old = span_of(blocks[cap]);
  freer.Run([&] {  // every block of span 1 but blocks[cap], sent to the owner
    for (unsigned i = cap + 1; i < 2 * cap; ++i) brisk_free(blocks[i]);
    brisk_thread_collect();
  });
  owner.Run([&] {
    Heap* h = t_heap;
    void* q = brisk_realloc(blocks[cap], 3000);  // the new class's refill drains the queue
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(old->owner.load(), &g_orphan_heap) << "the drain kept span 1";
    EXPECT_EQ(h->available[c].count, 1u) << "the heap's list of the class lost its kept span";
    EXPECT_EQ(h->available[c].head, span_of(blocks[0]));
    brisk_free(q);
    for (unsigned i = 1; i < cap; ++i) brisk_free(blocks[i]);
    for (unsigned i = 2 * cap; i < 3 * cap; ++i) brisk_free(blocks[i]);
    brisk_thread_collect();
  });
  brisk_set_strategy(BRISK_STRATEGY_BALANCED);
  brisk_thread_collect();
  EXPECT_EQ(brisk_test::Stats().spans_orphaned, orphans_before) << "a span of the test's stayed an orphan";
}

// A block another thread sent to a heap before the heap gave the block's span to the central
// pool reaches the heap's queue afterwards: it must follow the span there, whether the owner
// drains it (brisk_thread_collect: the orphan queue before and after its own) or waits for good
// and brisk_trim takes its queue. The span, whose last block it was, then goes back.
TEST(CentralPool, ABlockSentBeforeItsSpanWentToTheCentralPoolFollowsIt) {
  constexpr std::size_t kSize = 1500;  // a class no other test here uses
  const unsigned c = size_to_class(kSize);
  const unsigned cap = kClasses[c].capacity;
  ASSERT_NE(size_to_class(1700), c);
  for (const bool trim : {false, true}) {
    SCOPED_TRACE(trim ? "brisk_trim" : "the owner's collect");
    const std::uint64_t orphans_before = brisk_test::Stats().spans_orphaned;
    brisk_set_strategy(BRISK_STRATEGY_LOW_MEMORY);
    std::vector<void*> blocks;
    Worker owner, late, freer;
    owner.Run([&] {
      for (unsigned i = 0; i < 3 * cap; ++i) blocks.push_back(brisk_malloc(kSize));  // three full spans
      brisk_free(blocks[0]);  // span 0 has room: the class's kept span
    });
    Span* s = span_of(blocks[cap]);
    late.Run([&] { brisk_free(blocks[cap]); });  // owned by the owner: waits in late's batch to it
    freer.Run([&] {  // the rest of span 1, sent now
      for (unsigned i = cap + 1; i < 2 * cap; ++i) brisk_free(blocks[i]);
      brisk_thread_collect();
    });
    owner.Run([&] { brisk_thread_collect(); });  // the drain gives span 1 (one block left) away
    ASSERT_EQ(s->owner.load(), &g_orphan_heap);
    late.Run([&] { brisk_thread_collect(); });  // its batch reaches the owner's queue now
    if (trim)
      brisk_trim();
    else
      owner.Run([&] { brisk_thread_collect(); });
    EXPECT_NE(s->owner.load(), &g_orphan_heap) << "span 1's last block did not reach it";
    EXPECT_EQ(brisk_test::Stats().spans_orphaned, orphans_before);
    owner.Run([&] {
      for (unsigned i = 1; i < cap; ++i) brisk_free(blocks[i]);
      for (unsigned i = 2 * cap; i < 3 * cap; ++i) brisk_free(blocks[i]);
      brisk_thread_collect();
    });
  }
  brisk_set_strategy(BRISK_STRATEGY_BALANCED);
}

// brisk_thread_collect waits for a drain of the orphan queue that another thread has under way
// (the test holds the drain lock, as such a drainer does): when it returns, the blocks queued
// before the call are back in their spans. Here they are an exited thread's blocks that a thread
// past low-memory's span keep frees through the orphan queue.
TEST(CentralPool, CollectWaitsForAnOrphanDrainUnderWay) {
  constexpr std::size_t kSize = 1300;  // a class no other test here uses
  const unsigned c = size_to_class(kSize);
  const unsigned cap = kClasses[c].capacity;
  ASSERT_NE(size_to_class(1500), c);
  const std::uint64_t orphans_before = brisk_test::Stats().spans_orphaned;
  brisk_set_strategy(BRISK_STRATEGY_LOW_MEMORY);
  std::vector<void*> theirs;
  std::thread([&] {
    for (unsigned i = 0; i < cap; ++i) theirs.push_back(brisk_malloc(kSize));
  }).join();
  Span* orphan = span_of(theirs[0]);
  ASSERT_EQ(orphan->owner.load(), &g_orphan_heap);
  std::atomic<int> step{0};
  // Held before the freer starts: taken after, a freer scheduled first would finish its collect
  // before the lock is held (the freer's slow paths only try it, so holding it here is safe).
  orphan_drain_lock_acquire();
  std::thread freer([&] {
    std::vector<void*> own;
    for (unsigned i = 0; i <= cap; ++i) own.push_back(brisk_malloc(kSize));
    brisk_free(own[0]);  // a span of the class with room: past the keep, no adoption
    for (void* p : theirs) brisk_free(p);
    EXPECT_EQ(orphan->owner.load(), &g_orphan_heap);
    step.store(1);
    brisk_thread_collect();  // sends them to the orphan queue, then drains it
    step.store(2);
    for (unsigned i = 1; i <= cap; ++i) brisk_free(own[i]);
  });
  while (step.load() == 0) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(step.load(), 1) << "the collect returned while another drain was under way";
  orphan_drain_lock_release();
  freer.join();
  EXPECT_NE(orphan->owner.load(), &g_orphan_heap) << "the exited thread's span did not empty";
  brisk_set_strategy(BRISK_STRATEGY_BALANCED);
  brisk_thread_collect();
  EXPECT_EQ(brisk_test::Stats().spans_orphaned, orphans_before);
}

TEST(CentralPool, FreesRacingWithOwnerExitAreNeitherLostNorDoubled) {
  // Consumers free blocks while their producers exit: every block must come back exactly once,
  // which the heaps' stats show as all spans empty in the end.
  for (int round = 0; round < 20; ++round) {
    std::vector<void*> blocks(2000);
    std::thread producer([&] {
      for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i] = brisk_malloc(16 + (i % 50) * 16);
    });
    producer.join();
    std::thread a([&] {
      for (std::size_t i = 0; i < blocks.size(); i += 2) brisk_free(blocks[i]);
    });
    std::thread b([&] {
      for (std::size_t i = 1; i < blocks.size(); i += 2) brisk_free(blocks[i]);
    });
    a.join();
    b.join();
  }
  brisk_thread_collect();
  EXPECT_EQ(brisk_test::Stats().spans_orphaned, 0u);
}

// A block freed towards an owner that exits before the batch is sent reaches the orphan queue;
// if the freeing thread adopted the span meanwhile, the block goes on to the freeing thread's
// own queue, and brisk_thread_collect must take it from there too: otherwise it stays counted
// in the span, which then cannot go back.
TEST(CentralPool, CollectTakesABlockTheOrphanQueueForwardsToThisThread) {
  constexpr std::size_t kSize = 1200;  // a class no other test here uses
  void* first = nullptr;
  void* second = nullptr;
  std::atomic<int> step{0};
  std::thread owner([&] {
    first = brisk_malloc(kSize);
    second = brisk_malloc(kSize);
    step.store(1);
    while (step.load() != 2) std::this_thread::yield();
  });
  while (step.load() != 1) std::this_thread::yield();
  Span* s = span_of(first);
  ASSERT_EQ(span_of(second), s);
  brisk_free(first);  // remote: into this thread's outgoing batch for the owner, not yet sent
  step.store(2);
  owner.join();       // the owner exits: its queue closes, s is an orphan
  ASSERT_EQ(s->owner.load(), &g_orphan_heap);
  brisk_free(second);  // this thread adopts s; `first` is still in its batch, counted in s
  ASSERT_EQ(s->owner.load(), t_heap);
  brisk_thread_collect();  // sends the batch (to the orphan queue, then on to this thread)
  EXPECT_TRUE(t_heap->incoming.empty()) << "a forwarded block was left in this thread's queue";
  EXPECT_NE(s->owner.load(), t_heap) << "the span, empty now, was expected back in its chunk";
}

}  // namespace
}  // namespace brisk
