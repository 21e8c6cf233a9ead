// A thread's own purge check (threadcache/purge.cc, run every BRISK_PURGE_BYTES of releases):
// which free pages and kept empty spans it gives back, and when. Same process settings as
// background_test (tests/background_fixture.h; tests/CMakeLists.txt).
#include <brisk/brisk.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "core/chunk.h"
#include "core/options.h"
#include "core/size_class.h"
#include "tests/background_fixture.h"
#include "tests/test_util.h"
#include "threadcache/heap.h"
#include "threadcache/purge.h"

using namespace brisk_test;

namespace {

// The thread's own purge check (threadcache/purge.cc, run every BRISK_PURGE_BYTES of releases)
// gives back pages free at two checks a delay apart, but not pages claimed in between, even
// when they are free again at the second check: a steady workload reuses them every round.
std::size_t OwnPurge() {
  g_fake_now += 1000;
  brisk::Heap* h = brisk::t_heap;
  brisk::HeapSlowLock lock(h);
  return brisk::heap_purge(h, 1);
}

// A medium block freed, a check, the same pages claimed, written and freed again: returns what
// the check after that purges.
constexpr std::size_t kReusedSize = 256 * 1024;  // a medium block in every mode: its own pages

std::size_t PurgedAfterReuseBetweenChecks() {
  constexpr std::size_t kSize = kReusedSize;
  brisk_free(brisk_malloc(16));  // this thread has a heap
  // Whatever earlier tests left free is purged now and nothing is aged: a span kept empty for
  // its class goes back at the second check after it emptied, and its pages at the third.
  for (int i = 0; i < 3; ++i) OwnPurge();
  void* p = brisk_malloc(kSize);
  std::memset(p, 1, kSize);
  brisk_free(p);
  EXPECT_EQ(OwnPurge(), 0u);  // seen free and dirty once
  void* q = brisk_malloc(kSize);
  EXPECT_EQ(q, p) << "the resident pages were expected to be claimed again";
  std::memset(q, 2, kSize);
  brisk_free(q);
  return OwnPurge();
}

TEST_F(Background, OwnPurgeSparesPagesClaimedAndFreedAgainSinceItsLastCheck) {
  EXPECT_EQ(PurgedAfterReuseBetweenChecks(), 0u) << "pages used since the last check were purged";
  EXPECT_GE(OwnPurge(), kReusedSize) << "pages free at two checks were kept";
}

// Low-memory mode (BRISK_PURGE_REUSED=1) gives back pages free at both checks even when they
// were used in between: a steady workload refaults them, and resident memory stays lower.
TEST_F(Background, LowMemoryPurgesPagesFreeAtTwoChecksEvenIfUsedInBetween) {
  brisk_strategy before = brisk_get_strategy();
  brisk_set_strategy(BRISK_STRATEGY_LOW_MEMORY);
  EXPECT_GE(PurgedAfterReuseBetweenChecks(), kReusedSize) << "pages reused in between were spared";
  brisk_set_strategy(before);
}

// A span kept empty for its class, as a one-page class's current span or a retained class's,
// goes back at the second purge check after it emptied (its pages at the third): a thread that
// moved on from a class does not keep that class's pages for ever. One emptied again between
// checks (alloc/free ping-pong) stays.
brisk::Span* InstalledSpanOf(std::size_t size) {
  return brisk::t_heap->installed[brisk::size_to_class_compute(size)];
}

TEST_F(Background, ASpanKeptEmptyForItsClassGoesBackAfterTwoChecks) {
  for (std::size_t size : {std::size_t{3000}, std::size_t{12000}}) {  // one page; retained, 2 pages
    SCOPED_TRACE(size);
    brisk_free(brisk_malloc(size));
    brisk::Span* s = InstalledSpanOf(size);
    ASSERT_NE(s, &brisk::g_empty_span);
    ASSERT_EQ(s->used, 0u);
    OwnPurge();  // emptied since the check before: kept
    EXPECT_EQ(InstalledSpanOf(size), s);
    OwnPurge();  // empty since before the previous check: given back
    EXPECT_EQ(InstalledSpanOf(size), &brisk::g_empty_span) << "an idle empty span was kept";
    EXPECT_FALSE(brisk::t_heap->retained[brisk::size_to_class_compute(size)]);
  }
}

// Class c's spare, which a span that emptied behind the class's current span has just become,
// stays at the next check of its thread's and goes back at the one after.
void ExpectTheSpareGoesAtTheSecondCheck(unsigned c) {
  brisk::Span* spare = brisk::t_heap->spare[c];
  ASSERT_NE(spare, nullptr) << "a span of the class that emptied behind the current one is its spare";
  OwnPurge();
  EXPECT_EQ(brisk::t_heap->spare[c], spare);
  OwnPurge();
  EXPECT_EQ(brisk::t_heap->spare[c], nullptr) << "an idle spare was kept";
}

TEST_F(Background, ARetainedClassSpareGoesBackAfterTwoChecks) {
  constexpr std::size_t kSize = 12000;  // 2-page spans of 10 blocks
  const unsigned c = brisk::size_to_class_compute(kSize);
  brisk_free(brisk_malloc(kSize));  // the class is retained
  ASSERT_TRUE(brisk::t_heap->retained[c]);
  std::vector<void*> blocks;
  for (unsigned i = 0; i < 2 * brisk::kClasses[c].capacity; ++i) blocks.push_back(brisk_malloc(kSize));  // two spans at least
  for (void* p : blocks) brisk_free(p);
  ExpectTheSpareGoesAtTheSecondCheck(c);
  EXPECT_EQ(InstalledSpanOf(kSize), &brisk::g_empty_span);
}

// The same for a one-page class's spare (span_pages.cc's keep_spare), which its thread keeps
// unless it emptied while the class was the one refilled last.
TEST_F(Background, AOnePageClassSpareGoesBackAfterTwoChecks) {
  if (brisk::options::get(brisk::options::Id::kKeptSpanBytes) == 0) GTEST_SKIP() << "no one-page spares";
  constexpr std::size_t kSize = 40 * 1024;  // one block a one-page span
  const unsigned c = brisk::size_to_class_compute(kSize);
  ASSERT_EQ(brisk::kClasses[c].span_pages, 1u);
  void* first = brisk_malloc(kSize);
  void* second = brisk_malloc(kSize);  // the class's current span
  // A refill of another class since: of two blocks of a class of one block a span, the second
  // needs one whatever spans the thread kept.
  void* other[2] = {brisk_malloc(36 * 1024), brisk_malloc(36 * 1024)};
  brisk_free(first);
  ExpectTheSpareGoesAtTheSecondCheck(c);
  brisk_free(second);
  for (void* p : other) brisk_free(p);
}

TEST_F(Background, ASpanEmptiedAgainBetweenChecksStays) {
  for (std::size_t size : {std::size_t{3000}, std::size_t{12000}}) {
    SCOPED_TRACE(size);
    brisk_free(brisk_malloc(size));
    brisk::Span* s = InstalledSpanOf(size);
    for (int i = 0; i < 5; ++i) {
      OwnPurge();
      void* p = brisk_malloc(size);  // the class is in use between checks
      std::memset(p, 3, size);
      brisk_free(p);
      EXPECT_EQ(InstalledSpanOf(size), s) << "check " << i;
    }
  }
}

// The owner also takes its own slow lock with a bare try_lock, without HeapSlowLock's rebuild of
// the spans the idle purge gave back in place: reclaim_other_queues does, for the thread's debug
// heap. A purge check there must leave such a span alone (before, it released it still marked
// idle_purged; the descriptor's stale idle state later put a live block back on a free list).
TEST_F(Background, APurgeCheckUnderABareLockLeavesASpanPurgedInPlace) {
  using namespace brisk;
  constexpr std::size_t kSize = 3000;
  const unsigned c = size_to_class_compute(kSize);
  std::mutex m;
  std::condition_variable cv;
  int stage = 0;
  auto wait_for = [&](int want) {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return stage == want; });
  };
  auto go = [&](int next) {
    std::lock_guard<std::mutex> lock(m);
    stage = next;
    cv.notify_all();
  };
  Span* s = nullptr;
  std::thread worker([&] {
    brisk_free(brisk_malloc(kSize));  // the class's span, kept empty as its current span
    s = t_heap->installed[c];
    go(1);
    wait_for(2);  // idle meanwhile: the passes purge s in place
    Heap* h = t_heap;
    EXPECT_TRUE(s->idle_purged);
    g_fake_now += 1000;
    h->slow_lock.lock();  // as reclaim_locked's try_lock on the owner's own heap
    heap_purge(h, 1);
    h->slow_lock.unlock();
    EXPECT_EQ(h->installed[c], s) << "a span purged in place was released before its rebuild";
    EXPECT_TRUE(s->idle_purged);
    void* p = brisk_malloc(kSize);  // HeapSlowLock rebuilds it; the block is sound
    std::memset(p, 5, kSize);
    EXPECT_EQ(t_heap->installed[c], s);
    brisk_free(p);
  });
  wait_for(1);
  Passes(3, 1000);
  go(2);
  worker.join();
}

// A thread's purge gives back the pages its batch holds before it destroys a spare empty chunk:
// chunk_destroy waits for the registry lock (behind a trim or decay sweep, or fork's prepare
// handler), and until the batch is sent its pages are out of every other heap's reach (and, in
// the child of a fork made meanwhile, lost). A thread holds the registry lock shared here, as a
// sweep would; before, the pages stayed claimed until it let go.
TEST_F(Background, APurgeGivesBackItsPagesBeforeItWaitsToDestroyAChunk) {
  using brisk::Chunk;
  brisk_free(brisk_malloc(16));  // this thread has a heap
  brisk::Heap* h = brisk::t_heap;
  brisk::HeapSlowLock lock(h);
  Chunk* spare[2] = {brisk::chunk_create(h), brisk::chunk_create(h)};
  Chunk* used = brisk::chunk_create(h);
  ASSERT_TRUE(spare[0] != nullptr && spare[1] != nullptr && used != nullptr);
  // The heap walks its chunks from the head: the used one, then the spare kept, then the one
  // destroyed.
  brisk::chunk_list_push(h->chunks, spare[1]);
  brisk::chunk_list_push(h->chunks, spare[0]);
  brisk::chunk_list_push(h->chunks, used);
  std::vector<unsigned> pages;
  for (int i = 0; i < 8; ++i) {
    const unsigned p = brisk::chunk_claim_pages(used, 1);
    ASSERT_NE(p, 0u);
    std::memset(used->page_address(p), 0x5C, brisk::kPageSize);
    pages.push_back(p);
  }
  std::uint64_t freed = 0;
  for (std::size_t k = 1; k < pages.size(); k += 2) {
    brisk::chunk_release_pages(used, pages[k], 1);
    freed |= std::uint64_t{1} << pages[k];
  }
  ASSERT_EQ(used->dirty_pages.load() & freed, freed);
  std::atomic<int> stage{0};  // 1: the registry lock is held; 2: let it go
  std::thread sweep([&stage] {
    brisk::chunk_for_each_live(
        [](Chunk*, void* arg) {
          auto* st = static_cast<std::atomic<int>*>(arg);
          int expected = 0;
          if (st->compare_exchange_strong(expected, 1))
            while (st->load() != 2) std::this_thread::yield();
        },
        &stage);
  });
  while (stage.load() != 1) std::this_thread::yield();
  bool given_back_while_waiting = false;
  std::thread watcher([&] {
    // Free and clean while the lock is still held: sent before chunk_destroy, which cannot
    // finish meanwhile.
    for (int i = 0; i < 2000 && !given_back_while_waiting; ++i) {
      given_back_while_waiting =
          (used->free_pages.load() & freed) == freed && (used->dirty_pages.load() & freed) == 0;
      if (!given_back_while_waiting) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    stage.store(2);
  });
  brisk::heap_purge(h, 0);
  watcher.join();
  sweep.join();
  EXPECT_TRUE(given_back_while_waiting) << "the batch's pages stayed claimed while the purge waited for the registry lock";
  EXPECT_EQ(used->free_pages.load() & freed, freed);
  EXPECT_EQ(static_cast<unsigned char>(used->page_address(pages[0])[100]), 0x5Cu) << "a live page lost its data";
  for (std::size_t k = 0; k < pages.size(); k += 2) brisk::chunk_release_pages(used, pages[k], 1);
}

}  // namespace
