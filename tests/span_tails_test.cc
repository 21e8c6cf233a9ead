// Low-memory mode's span tails (BRISK_PURGE_SPAN_TAILS): the pages past a new small span's first
// carve that held data go back to the OS, 16 spans' at a time, less what carving reached
// meanwhile (threadcache/span_pages.cc's heap_flush_span_tails).
#include <brisk/brisk.h>
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "core/central_pool.h"
#include "core/chunk.h"
#include "core/config.h"
#include "core/options.h"
#include "core/platform.h"
#include "core/size_class.h"
#include "tests/span_test_util.h"
#include "tests/test_util.h"
#include "threadcache/heap.h"
#include "threadcache/medium.h"
#include "threadcache/span_pages.h"

namespace brisk {
namespace {

// Low-memory mode gives back a new span's resident tail, but not when the span is of a class
// whose span this thread just released on the same pages: a loop that needs one span more of a
// class than the class keeps (its current span and its spare) releases and recreates that span
// every round, and giving its tail back each time faulted it in again, about 8 faults a round.
TEST(Span, LowMemoryKeepsTheTailOfASpanRecreatedOnPagesItsClassJustReleased) {
#ifdef BRISK_TEST_SANITIZED
  GTEST_SKIP() << "the sanitizers' shadow memory takes page faults of its own (ThreadSanitizer: 228 in 200 rounds)";
#endif
  LowMemoryMode low;
  std::thread([] {
    constexpr std::size_t kSize = 12 * 1024;  // a retained class: 2-page spans
    const unsigned n = 2 * kClasses[size_to_class(kSize)].capacity + 3;  // three spans a round
    std::vector<void*> blocks(n);
    auto round = [&] {
      for (void*& p : blocks) {
        p = brisk_malloc(kSize);
        static_cast<char*>(p)[0] = 1;
        static_cast<char*>(p)[kSize - 1] = 1;
      }
      for (void* p : blocks) brisk_free(p);
    };
    for (int i = 0; i < 5; ++i) round();
    struct rusage before, after;
    getrusage(RUSAGE_THREAD, &before);
    constexpr int kRounds = 200;
    for (int i = 0; i < kRounds; ++i) round();
    getrusage(RUSAGE_THREAD, &after);
    EXPECT_LT(after.ru_minflt - before.ru_minflt, kRounds / 2) << "page faults in " << kRounds << " rounds";
  }).join();
}

// A new small span claims whole 64 KiB pages, resident ones first, and carves one OS page at a
// time. In low-memory mode (BRISK_PURGE_SPAN_TAILS) the pages its first carve does not reach go
// back to the OS when they held data, instead of staying resident for a class that may never
// need them; the span still serves every block, on zeroed pages.
TEST(Span, LowMemoryGivesBackTheResidentPagesPastANewSmallSpansFirstCarve) {
  LowMemoryMode low;
  std::thread([] {
    // A fresh thread's chunk: a medium block touched whole and freed, its run given back from
    // the thread's medium cache, leaves its two pages free and resident, the only resident free
    // run once every other free page is purged (a new span takes, of the free pages resident
    // where it will write, the one with the fewest resident OS pages: chunk.h's os_pages), so
    // the next new span takes them.
    chunk_purge_all();
    void* m = LeaveTwoResidentFreePages(0x77);
    ASSERT_NE(m, nullptr);
    void* b = brisk_malloc(48);
    Span* s = span_of(b);
    ASSERT_EQ(s->kind, SpanKind::kSmall);
    ASSERT_EQ(s->start, m) << "the new span did not take the freed resident pages";
    char* tail = s->start + kOsPageSize;
    std::size_t tail_bytes = (std::size_t{s->page_count} << kPageShift) - kOsPageSize;
    // The tail waits for others to go back with (SpanTailsGoBackTogether below), or for the
    // heap's next purge check; a flush sends it now.
    {
      HeapSlowLock lock(t_heap);
      heap_flush_span_tails(t_heap);
    }
    EXPECT_EQ(brisk_test::ResidentIn({tail}, tail_bytes), 0u) << "the span's uncarved pages stayed resident";
    // Every block of the span still works, on pages that read as zeros past the first.
    std::vector<void*> blocks{b};
    while (blocks.size() < kClasses[size_to_class(48)].capacity) blocks.push_back(brisk_malloc(48));
    for (void* p : blocks) {
      ASSERT_EQ(span_of(p), s);
      std::memset(p, 0x11, 48);
    }
    for (void* p : blocks) brisk_free(p);
  }).join();
}

// The flushes of one heap's span tails (heap_flush_span_tails), recorded through the test hook
// while an object lives: a flush by the heap's own thread or by another holding its lock.
class TailFlushes {
 public:
  explicit TailFlushes(Heap* h) {
    heap_.store(h);
    flushes_.store(0);
    ranges_.store(0);
    calls_.store(0);
    g_span_tails_flushed_test_hook.store(&Record);
  }
  ~TailFlushes() { g_span_tails_flushed_test_hook.store(nullptr); }
  unsigned flushes() const { return flushes_.load(); }
  unsigned ranges() const { return ranges_.load(); }
  std::size_t calls() const { return calls_.load(); }

 private:
  static void Record(Heap* h, unsigned ranges, std::size_t calls) {
    if (h != heap_.load()) return;
    flushes_.fetch_add(1);
    ranges_.fetch_add(ranges);
    calls_.fetch_add(calls);
  }
  static inline std::atomic<Heap*> heap_{nullptr};
  static inline std::atomic<unsigned> flushes_{0}, ranges_{0};
  static inline std::atomic<std::size_t> calls_{0};
};

// The purge delay at an hour while an object lives, so that no tail is flushed for its age.
class LongPurgeDelay {
 public:
  LongPurgeDelay() { options::g_value[static_cast<unsigned>(options::Id::kPurgeDelayMs)].store(3600 * 1000 + 1); }
  ~LongPurgeDelay() { options::drop_kept_values(); }
};

// Sixteen new spans of one-page classes (16-256 B: each first carve is one OS page), each on a
// page of freed medium blocks written whole: the pages past each first carve wait in the
// heap's pending tails and go back together when the sixteenth joins them, in one
// process_madvise where the kernel takes MADV_DONTNEED for the calling process (Linux 6.15),
// instead of a madvise per span, each of which flushed the TLB of every other CPU running the
// process (low-memory mode took 3.3x balanced's time on churn).
TEST(Span, LowMemoryGivesSpanTailsBackTogether) {
#ifdef BRISK_TEST_SANITIZED
  GTEST_SKIP() << "the sanitizers' allocations of their own take chunk pages the set-up counts on";
#endif
  LowMemoryMode low;
  LongPurgeDelay long_delay;
  std::thread([] {
    // Four medium blocks of four pages (low-memory's largest medium block is 512 KiB).
    constexpr std::size_t kMedium = 4 * kPageSize - 4096;
    chunk_purge_all();
    std::vector<char*> runs;
    for (int i = 0; i < 4; ++i) {
      runs.push_back(static_cast<char*>(brisk_malloc(kMedium)));
      ASSERT_NE(runs.back(), nullptr);
      std::memset(runs.back(), 0x5a, kMedium);
    }
    for (char* r : runs) brisk_free(r);
    auto in_runs = [&](const char* p) {
      for (char* r : runs)
        if (p >= r && p < r + kMedium) return true;
      return false;
    };
    {
      HeapSlowLock lock(t_heap);
      medium_cache_flush(t_heap);
    }
    std::vector<void*> blocks, tails;
    for (std::size_t size = 16; size <= 256; size += 16) HoldCentralSpans(size_to_class(size));
    TailFlushes flushes(t_heap);
    for (std::size_t size = 16; size <= 256; size += 16) {
      void* b = brisk_malloc(size);
      Span* s = span_of(b);
      ASSERT_EQ(s->page_count, 1u);
      ASSERT_TRUE(in_runs(s->start)) << "the span of " << size << " B did not take a page of the freed medium blocks";
      blocks.push_back(b);
      tails.push_back(s->start + kOsPageSize);
      if (tails.size() < 16) EXPECT_EQ(flushes.flushes(), 0u) << "a tail went back before the sixteenth";
    }
    EXPECT_EQ(flushes.flushes(), 1u);
    EXPECT_EQ(flushes.ranges(), 16u);
    EXPECT_EQ(t_heap->pending_tail_count, 0u);
    EXPECT_EQ(brisk_test::ResidentIn(tails, kPageSize - kOsPageSize), 0u) << "a span's uncarved pages stayed resident";
    EXPECT_EQ(flushes.calls(), platform::decommit_all_batches() ? 1u : 16u);
    for (void* b : blocks) brisk_free(b);
  }).join();
}

// Runs body(block) on a new thread in low-memory mode, with the purge delay at an hour: block
// is the first 48-byte block of a new span on two free pages that held data, whose pages past its
// first OS page (its tail) wait, resident, in the thread's pending tails.
template <typename Body>
void WithAPendingTail(Body body) {
  LowMemoryMode low;
  LongPurgeDelay long_delay;
  std::thread([&] {
    TailFlushes flushes(t_heap);
    void* b = FirstBlockOfASpanOverResidentPages(48);
    ASSERT_NE(b, nullptr) << "the new span did not take the freed resident pages";
    ASSERT_EQ(flushes.flushes(), 0u) << "the tail went back at once";
    ASSERT_EQ(t_heap->pending_tail_count, 1u);
    body(b);
  }).join();
}

// Balanced mode gives a new span's tail back while its thread runs (the tail waits, pending,
// for a batch or a purge check), but a thread's exit leaves its pending tails with their spans:
// the next thread short of the class takes such a span and carves on into the tail, and giving
// it back at the exit made that thread fault the pages in again. Low-memory mode gives them back
// at the exit too. Each thread here exits keeping its block, so its span outlives it as an
// orphan, its tail resident or not; brisk_trim then gives the orphan's tail back (as the
// background pass does once the orphan has been left alone for a purge delay).
TEST(Span, BalancedLeavesAnExitingThreadsPendingTailsWithTheirSpans) {
#ifdef BRISK_TEST_SANITIZED
  GTEST_SKIP() << "the sanitizers' allocations of their own take chunk pages the set-up counts on";
#endif
  LongPurgeDelay long_delay;
  for (brisk_strategy mode : {BRISK_STRATEGY_BALANCED, BRISK_STRATEGY_LOW_MEMORY}) {
    StrategyMode in(mode);
    void* block = nullptr;
    SpanTail tail;
    std::thread([&] {
      block = FirstBlockOfASpanOverResidentPages(48);
      ASSERT_NE(block, nullptr) << "the new span did not take the freed resident pages";
      brisk_test::Fill(block, 48, 48);
      ASSERT_EQ(t_heap->pending_tail_count, 1u) << "the new span's tail is not waiting to go back";
      tail = TailOf(span_of(block));
      ASSERT_EQ(brisk_test::ResidentIn({tail.start}, tail.bytes), tail.bytes);
      // The spans HoldCentralSpans took go back with the exit; this one keeps `block`.
    }).join();
    ASSERT_NE(tail.start, nullptr);
    if (mode == BRISK_STRATEGY_BALANCED) {
      EXPECT_EQ(brisk_test::ResidentIn({tail.start}, tail.bytes), tail.bytes) << "the exit gave the tail back";
      brisk_trim();
      EXPECT_EQ(brisk_test::ResidentIn({tail.start}, tail.bytes), 0u) << "brisk_trim kept the exited thread's span tail";
    } else {
      EXPECT_EQ(brisk_test::ResidentIn({tail.start}, tail.bytes), 0u) << "the exit kept the tail";
    }
    EXPECT_TRUE(brisk_test::Verify(block, 48, 48)) << "the span's live block changed";
    brisk_free(block);
  }
}

// brisk_trim gives back the resident tail of a span of the calling thread's own (speed mode
// keeps tails: none waits to go back), and the span serves on.
TEST(Span, BriskTrimGivesBackTheCallingThreadsSpanTails) {
#ifdef BRISK_TEST_SANITIZED
  GTEST_SKIP() << "the sanitizers' allocations of their own take chunk pages the set-up counts on";
#endif
  StrategyMode speed(BRISK_STRATEGY_SPEED);
  std::thread([] {
    void* b = FirstBlockOfASpanOverResidentPages(48);
    ASSERT_NE(b, nullptr) << "the new span did not take the freed resident pages";
    brisk_test::Fill(b, 48, 48);
    Span* s = span_of(b);
    ASSERT_EQ(t_heap->pending_tail_count, 0u);
    const SpanTail tail = TailOf(s);
    ASSERT_EQ(brisk_test::ResidentIn({tail.start}, tail.bytes), tail.bytes);
    brisk_trim();
    EXPECT_EQ(brisk_test::ResidentIn({tail.start}, tail.bytes), 0u) << "brisk_trim kept the span's tail";
    EXPECT_TRUE(brisk_test::Verify(b, 48, 48)) << "the span's live block changed";
    // The span carves on over its tail: every block of it written and checked.
    std::vector<void*> blocks{b};
    while (blocks.size() < kClasses[size_to_class(48)].capacity) blocks.push_back(brisk_malloc(48));
    for (std::size_t i = 1; i < blocks.size(); ++i) {
      ASSERT_EQ(span_of(blocks[i]), s);
      brisk_test::Fill(blocks[i], 48, i);
    }
    for (std::size_t i = 1; i < blocks.size(); ++i) EXPECT_TRUE(brisk_test::Verify(blocks[i], 48, i));
    for (void* p : blocks) brisk_free(p);
  }).join();
}

// The first tail waits: a span's creation makes no system call, and its tail stays resident
// until the heap flushes, which leaves the OS pages carving reached meanwhile (they hold blocks)
// and gives back the rest.
TEST(Span, LowMemoryAPendingTailKeepsWhatCarvingReachedBeforeTheFlush) {
#ifdef BRISK_TEST_SANITIZED
  GTEST_SKIP() << "the sanitizers' allocations of their own take chunk pages the set-up counts on";
#endif
  WithAPendingTail([](void* first) {
    Span* s = span_of(first);
    char* tail = s->start + kOsPageSize;
    EXPECT_GT(brisk_test::ResidentIn({tail}, kOsPageSize), 0u) << "the pending tail was given back";
    // Carve on into the second and third OS pages, writing every block.
    std::vector<void*> blocks{first};
    while (span_of(blocks.back()) == s && static_cast<char*>(blocks.back()) < s->start + 2 * kOsPageSize + 64)
      blocks.push_back(brisk_malloc(48));
    for (std::size_t i = 0; i < blocks.size(); ++i) brisk_test::Fill(blocks[i], 48, i + 1);
    const std::size_t carved = s->carved_bytes();
    ASSERT_GT(carved, 2 * kOsPageSize);
    {
      HeapSlowLock lock(t_heap);
      heap_flush_span_tails(t_heap);
    }
    for (std::size_t i = 0; i < blocks.size(); ++i)
      EXPECT_TRUE(brisk_test::Verify(blocks[i], 48, i + 1)) << "block " << i << " lost its data";
    char* rest = s->start + ((carved + kOsPageSize - 1) & ~(kOsPageSize - 1));
    const std::size_t rest_bytes = static_cast<std::size_t>(s->start + kPageSize - rest);
    EXPECT_EQ(brisk_test::ResidentIn({rest}, rest_bytes), 0u) << "the uncarved rest stayed resident";
    for (void* b : blocks) brisk_free(b);
  });
}

// A span that leaves its heap leaves the pending tails with it: by the next flush its pages may
// be another span's, whose blocks a decommit would zero.
TEST(Span, LowMemoryASpanReleasedWithItsTailPendingDropsTheTail) {
#ifdef BRISK_TEST_SANITIZED
  GTEST_SKIP() << "the sanitizers' allocations of their own take chunk pages the set-up counts on";
#endif
  WithAPendingTail([](void* b) {
    brisk_free(b);
    HeapSlowLock lock(t_heap);
    heap_release_empty_spans(t_heap);  // the emptied current span goes back to its chunk
    EXPECT_EQ(t_heap->pending_tail_count, 0u) << "a released span's tail is still pending";
  });
}

// Pending tails are flushed by their owner (a full batch, a purge check, exit) and by other
// threads that hold its slow lock (brisk_trim here, the background pass for an idle heap),
// while the owner carves on: no flush may drop a page carving has reached, whoever makes it.
// Three threads make and free rounds of blocks of many small sizes, each written and checked,
// while a fourth trims in a loop.
TEST(Span, LowMemoryTailsFlushedByATrimWhileThreadsCarveKeepEveryBlock) {
  LowMemoryMode low;
  std::atomic<bool> done{false};
  std::atomic<unsigned> damaged{0};
  std::thread trimmer([&] {
    while (!done.load()) brisk_trim();
  });
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < 3; ++t) {
    workers.emplace_back([&, t] {
      brisk_test::Rng rng(77 + t);
      std::vector<std::pair<void*, std::size_t>> blocks;
      for (int round = 0; round < 24 / brisk_test::kScale; ++round) {
        for (int i = 0; i < 1500; ++i) {
          const std::size_t size = 16 + rng.Below(4096);
          void* p = brisk_malloc(size);
          ASSERT_NE(p, nullptr);
          brisk_test::Fill(p, size, reinterpret_cast<std::uintptr_t>(p) ^ size);
          blocks.emplace_back(p, size);
        }
        for (auto& [p, size] : blocks) {
          if (!brisk_test::Verify(p, size, reinterpret_cast<std::uintptr_t>(p) ^ size)) damaged.fetch_add(1);
          brisk_free(p);
        }
        blocks.clear();
      }
    });
  }
  for (auto& w : workers) w.join();
  done.store(true);
  trimmer.join();
  EXPECT_EQ(damaged.load(), 0u) << "blocks changed between their fill and their check";
}

}  // namespace
}  // namespace brisk
