// The background thread's work, one pass at a time, with a fake clock: the decay purge of every
// chunk (abandoned ones too), and the reclaim of frees queued to a thread that stays idle. The
// test process runs with BRISK_BACKGROUND=0 (no thread of brisk's own), BRISK_PURGE_BYTES=1g
// (no purge by the threads themselves), BRISK_PURGE_DELAY_MS=100 and BRISK_IDLE_MS=10 (a heap
// is idle after 10 ms without a slow path; tests/CMakeLists.txt), so only the passes the test
// makes return memory; and BRISK_MEDIUM_CACHE_BYTES=0, so a freed medium block's pages are free
// pages of its chunk at once (medium_cache_test tests the cache).
#include <brisk/brisk.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <latch>
#include <utility>
#include <iterator>
#include <mutex>
#include <thread>
#include <vector>

#include "core/platform.h"
#include "tests/background_fixture.h"
#include "tests/span_test_util.h"
#include "tests/test_util.h"
#include "threadcache/background.h"
#include "threadcache/heap.h"
#include "threadcache/purge.h"
#include "core/chunk.h"
#include "core/free_key.h"
#include "core/size_class.h"

using namespace brisk_test;

namespace {

// Blocks of 32 KiB (two a one-page span), every one but one per chunk freed: no chunk empties,
// so only purging free pages can give the memory back.
std::vector<void*> AllocateAndKeepOnePerChunk(std::size_t bytes, std::uint64_t seed) {
  std::vector<void*> blocks;
  for (std::size_t n = 0; n < bytes; n += 32 * 1024) {
    void* p = brisk_malloc(32 * 1024);
    Fill(p, 32 * 1024, seed + n);
    blocks.push_back(p);
  }
  std::vector<void*> kept;
  for (size_t i : KeepOneBlockPerChunk(blocks, brisk_free)) kept.push_back(blocks[i]);
  return kept;
}

TEST_F(Background, FreePagesArePurgedOnlyAfterTheDelayHasPassedTwice) {
  Passes(3, 1000);  // age away whatever earlier tests left
  std::vector<void*> kept = AllocateAndKeepOnePerChunk(std::size_t{48} << 20, 1);
  // A live block in this thread's installed span of the class: an empty one would go back in
  // place once the thread is idle (purge in place, tested below), not by the decay tested here.
  void* pin = brisk_malloc(32 * 1024);
  [[maybe_unused]] std::size_t resident = ResidentBytes();
  // This thread ran slow paths: the first pass sees it busy, and leaves its chunks to it.
  EXPECT_EQ(Passes(1, 1000), 0u);
  // Idle since (BRISK_IDLE_MS=10): its freed pages are seen free and dirty; none is purged yet.
  EXPECT_EQ(Passes(1, 1000), 0u);
  // A pass before the delay is over does not age them.
  EXPECT_EQ(Passes(1, 10), 0u);
  // Free and dirty at two passes a delay apart: purged.
  std::size_t purged = Passes(1, 100);
  EXPECT_GE(purged, std::size_t{40} << 20);
#ifndef BRISK_TEST_SANITIZED
  EXPECT_LT(ResidentBytes(), resident - (std::size_t{32} << 20));
#endif
  brisk_free(pin);
  for (void* p : kept) brisk_free(p);
}

TEST_F(Background, PagesReusedBetweenPassesStayResident) {
  Passes(3, 1000);
  void* p = brisk_malloc(256 << 10);  // a medium block in every mode: its own pages
  brisk_free(p);
  EXPECT_EQ(Passes(1, 1000), 0u);  // seen free and dirty
  void* q = brisk_malloc(256 << 10);  // reused in between: the same pages, claimed again
  std::memset(q, 7, 256 << 10);
  Passes(1, 1000);
  EXPECT_EQ(static_cast<unsigned char*>(q)[12345], 7);  // still resident with its contents
  brisk_free(q);
}

TEST_F(Background, FreePagesOfExitedThreadsChunksAreReturned) {
  Passes(3, 1000);
  constexpr int kThreads = 8;
  std::vector<void*> kept;
  std::mutex m;
  std::latch all_allocated(kThreads);  // at once, so no thread adopts another's chunks
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<void*> blocks;
      for (std::size_t n = 0; n < (std::size_t{8} << 20); n += 32 * 1024) blocks.push_back(brisk_malloc(32 * 1024));
      all_allocated.arrive_and_wait();
      std::lock_guard<std::mutex> lock(m);
      for (size_t i : KeepOneBlockPerChunk(blocks, brisk_free)) kept.push_back(blocks[i]);
    });
  }
  for (auto& t : threads) t.join();  // their chunks are abandoned: no heap purges them
  EXPECT_GE(Passes(2, 1000), std::size_t{40} << 20);
  for (void* p : kept) brisk_free(p);
}

// Exited threads' spans keep one block in 97 live: orphans in the central pools whose free
// pages between live blocks no chunk decay can reach (they are inside spans). Once nothing has
// come back to them for a purge delay, the pass makes holes there (core/span_holes.h), with no
// call from the program; then the blocks are intact, and freed and allocated again.
TEST_F(Background, TheFreePagesAmongLiveBlocksOfExitedThreadsSpansAreReturned) {
  Passes(3, 1000);
  constexpr std::size_t kSize = 128;
  std::vector<void*> blocks[2];
  std::vector<bool> kept[2];
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] { blocks[t] = AllocateAndKeepOneIn97(kSize, std::size_t{8} << 20, &kept[t]); });
  for (auto& t : threads) t.join();
  // Over both threads' blocks at once: one thread's refill may take the other's span from the
  // central pool once that one has exited, so a page can hold blocks of both.
  std::vector<void*> all = blocks[0];
  all.insert(all.end(), blocks[1].begin(), blocks[1].end());
  std::vector<bool> all_kept = kept[0];
  all_kept.insert(all_kept.end(), kept[1].begin(), kept[1].end());
  const std::vector<std::uintptr_t> pages = FreeOnlyPages(all, all_kept, kSize);
  const std::size_t resident = ResidentPages(pages);
  ASSERT_GE(resident, pages.size() * 4096 / 2) << "the premise: the freed blocks' pages are resident";
  const std::size_t returned = Passes(2, 1000);
  const std::size_t after = ResidentPages(pages);
  EXPECT_LT(after, resident / 8) << resident << " -> " << after;
  EXPECT_GE(returned, (resident - after) / 2);
  for (int t = 0; t < 2; ++t) {
    for (std::size_t i = 0; i < blocks[t].size(); ++i) {
      if (!kept[t][i]) continue;
      EXPECT_TRUE(Verify(blocks[t][i], kSize, i));
      brisk_free(blocks[t][i]);
    }
  }
  std::vector<void*> again;
  for (std::size_t i = 0; i < blocks[0].size(); ++i) {
    again.push_back(brisk_malloc(kSize));
    Fill(again.back(), kSize, i);
  }
  for (std::size_t i = 0; i < again.size(); ++i) {
    EXPECT_TRUE(Verify(again[i], kSize, i));
    brisk_free(again[i]);
  }
}

// A thread exits keeping one block of a new span made over free pages that held data: the
// span's tail (its pages past the first carve), which balanced mode leaves with the span at
// the exit for the next thread short of the class to carve into, stays resident while the
// orphan is young, and the pass gives it back once the orphan has been left alone for a purge
// delay; the block is intact.
TEST_F(Background, TheTailOfAnExitedThreadsSpanIsReturnedOnceLeftAlone) {
#ifdef BRISK_TEST_SANITIZED
  GTEST_SKIP() << "the sanitizers' allocations of their own take chunk pages the set-up counts on";
#endif
  Passes(3, 1000);
  void* block = nullptr;
  brisk::SpanTail tail;
  std::thread([&] {
    block = brisk::FirstBlockOfASpanOverResidentPages(48);
    ASSERT_NE(block, nullptr) << "the new span did not take the freed resident pages";
    Fill(block, 48, 48);
    tail = brisk::TailOf(brisk::span_of(block));
  }).join();
  ASSERT_NE(tail.start, nullptr);
  ASSERT_EQ(ResidentIn({tail.start}, tail.bytes), tail.bytes) << "the premise: the exit left the tail resident";
  Passes(5, 10);  // 50 ms: younger than the purge delay
  EXPECT_EQ(ResidentIn({tail.start}, tail.bytes), tail.bytes) << "a young orphan's tail went back";
  const std::size_t returned = Passes(2, 1000);
  EXPECT_EQ(ResidentIn({tail.start}, tail.bytes), 0u) << "the orphan's tail stayed resident";
  EXPECT_GE(returned, tail.bytes);
  EXPECT_TRUE(Verify(block, 48, 48)) << "the span's live block changed";
  brisk_free(block);
}

// A worker allocates kBytes in 1 KiB blocks, another thread frees them all (remote frees,
// queued to the worker), and the worker stays alive without allocating again until destroyed.
struct IdleWorkerWithQueuedFrees {
  static constexpr std::size_t kBytes = std::size_t{32} << 20;
  std::mutex m;
  std::condition_variable cv;
  bool allocated = false, stop = false;
  std::vector<void*> blocks;
  std::thread worker;

  IdleWorkerWithQueuedFrees() {
    worker = std::thread([this] {
      for (std::size_t n = 0; n < kBytes; n += 1024) {
        void* p = brisk_malloc(1024);
        std::memset(p, 1, 1024);
        blocks.push_back(p);
      }
      std::unique_lock<std::mutex> lock(m);
      allocated = true;
      cv.notify_all();
      cv.wait(lock, [this] { return stop; });  // idle, alive
    });
    {
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [this] { return allocated; });
    }
    std::thread([this] {
      for (void* p : blocks) brisk_free(p);
      brisk_thread_collect();  // its last partial batches go out too
    }).join();
  }
  ~IdleWorkerWithQueuedFrees() {
    {
      std::lock_guard<std::mutex> lock(m);
      stop = true;
    }
    cv.notify_all();
    worker.join();
  }
};

// Only the background pass can give those spans back.
TEST_F(Background, FreesQueuedToAnIdleThreadAreReclaimed) {
  Passes(3, 1000);
  IdleWorkerWithQueuedFrees idle;
  [[maybe_unused]] std::size_t resident = ResidentBytes();
  // One pass notices the worker idle, the next reclaims its queue, two more purge the pages.
  Passes(4, 1000);
#ifndef BRISK_TEST_SANITIZED
  EXPECT_LT(ResidentBytes(), resident - IdleWorkerWithQueuedFrees::kBytes * 3 / 4);
#endif
}

// brisk_trim takes them too, at once, from a thread that is not the owner.
TEST_F(Background, TrimTakesTheFreesQueuedToOtherThreads) {
  Passes(3, 1000);
  IdleWorkerWithQueuedFrees idle;
  [[maybe_unused]] std::size_t resident = ResidentBytes();
  EXPECT_GE(brisk_trim(), IdleWorkerWithQueuedFrees::kBytes * 3 / 4);
#ifndef BRISK_TEST_SANITIZED
  EXPECT_LT(ResidentBytes(), resident - IdleWorkerWithQueuedFrees::kBytes * 3 / 4);
#endif
}

// A heap that would map a new chunk first takes the frees queued to other heaps
// (reclaim_other_queues): the spans they free wholly are free pages it can use. Run in a process
// of its own (background_fresh_test), where no chunk but the one of this thread's first
// allocations has free pages: anywhere else, free pages left by earlier tests serve first.
TEST(FreshProcess, AHeapAboutToMapAChunkFirstTakesTheSpansFreedIntoOtherQueues) {
  if (getenv("BRISK_TEST_FRESH") == nullptr) GTEST_SKIP() << "run by background_fresh_test";
  constexpr std::size_t kBytes = IdleWorkerWithQueuedFrees::kBytes;
  IdleWorkerWithQueuedFrees idle;  // kBytes of spans, every block queued to a thread that waits
  auto live_chunk_bytes = [] {
    brisk_stats st = Stats();
    return st.chunk_bytes_mapped - st.chunk_bytes_cached;
  };
  std::uint64_t before = live_chunk_bytes();
  std::vector<void*> blocks;
  for (std::size_t n = 0; n < kBytes; n += 1024) {
    void* p = brisk_malloc(1024);
    std::memset(p, 2, 1024);
    blocks.push_back(p);
  }
  std::uint64_t grown = live_chunk_bytes() - before;
  // Without the reclaim the process maps kBytes more; with it, at most a chunk's slack.
  EXPECT_LE(grown, std::uint64_t{4} << 20);
  for (void* p : blocks) brisk_free(p);
}

// The reclaim's table of spans (background.cc) is zeroed memory: a page of it whose first access
// is a read maps the kernel's shared zero page, and a write after it copies that page with a TLB
// shootdown. So no page of the table may ever be mapped to the zero page: /proc/self/pagemap
// shows each page of it present (bit 63) and mapped by this process alone (bit 56), or absent.
// Before find_slot skipped pages it had never accessed, a purge's lookups of the installed spans
// of an idle heap (which miss while those spans hold a live block) left 34 of the 38 pages
// present mapped to the zero page here. Run in a process of its own (background_span_table_test):
// elsewhere earlier passes have written most of the table.
TEST(SpanTable, NoPageOfItIsTheZeroPage) {
  if (getenv("BRISK_TEST_SPAN_TABLE") == nullptr) GTEST_SKIP() << "run by background_span_table_test";
  using namespace brisk;
  const int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) GTEST_SKIP() << "/proc/self/pagemap cannot be read here";
  // A worker with one live block in each of many classes (installed spans the purge looks up and
  // leaves) and a span's worth of blocks freed by another thread (queued, counted in the table).
  Heap* heap = nullptr;
  std::mutex m;
  std::condition_variable cv;
  bool ready = false, stop = false;
  std::vector<void*> queued;
  std::thread worker([&] {
    std::vector<void*> live;
    for (std::size_t size = 16; size <= 4096; size += 48) live.push_back(brisk_malloc(size));
    for (int i = 0; i < 64; ++i) queued.push_back(brisk_malloc(1000));
    heap = t_heap;
    std::unique_lock<std::mutex> lock(m);
    ready = true;
    cv.notify_all();
    cv.wait(lock, [&] { return stop; });  // idle, alive
    lock.unlock();
    for (void* p : live) brisk_free(p);
  });
  {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return ready; });
  }
  std::thread([&] {
    for (void* p : queued) brisk_free(p);
    brisk_thread_collect();
  }).join();
  std::size_t purged = 0;
  reclaim_queued_frees(heap, &purged);
  const void* start;
  std::size_t bytes;
  reclaim_table_for_test(&start, &bytes);
  const auto first = reinterpret_cast<std::uintptr_t>(start) / kOsPageSize;
  const auto last = (reinterpret_cast<std::uintptr_t>(start) + bytes - 1) / kOsPageSize;
  std::vector<std::uint64_t> entries(last - first + 1);
  const std::size_t want = entries.size() * sizeof(std::uint64_t);
  ASSERT_EQ(pread(fd, entries.data(), want, static_cast<off_t>(first * sizeof(std::uint64_t))), static_cast<ssize_t>(want));
  close(fd);
  std::size_t present = 0, zero_page = 0;
  for (std::uint64_t e : entries) {
    if ((e >> 63 & 1) == 0) continue;
    ++present;
    if ((e >> 56 & 1) == 0) ++zero_page;
  }
  EXPECT_GT(present, 0u) << "the reclaim used the table";
  EXPECT_EQ(zero_page, 0u) << "of " << present << " pages present, mapped to the zero page (or shared)";
  {
    std::lock_guard<std::mutex> lock(m);
    stop = true;
  }
  cv.notify_all();
  worker.join();
}

// The owner frees the one live block of a full span that is not installed while every other
// block of it sits in the owner's queue, and a reclaim runs between the free's decrement of
// used and its call to free_local_refilled (replayed step by step, as the review that found it
// did). The reclaim must leave that span alone: the owner's call reads it. Before the fix it
// released the span, and the owner's call released it again, emptying the heap's span list.
TEST_F(Background, AReclaimBetweenAFreesDecrementAndItsRefillCallLeavesTheSpan) {
  using namespace brisk;
  auto span_of = [](void* p) {
    auto a = reinterpret_cast<std::uintptr_t>(p);
    return chunk_of(a)->span_of(a);
  };
  std::thread([&] {  // a fresh heap
    std::vector<void*> blocks;
    void* first = brisk_malloc(1024);
    Span* s = span_of(first);
    blocks.push_back(first);
    void* next_span_block;
    for (;;) {  // fill s: the next block comes from another span, which is installed now
      void* p = brisk_malloc(1024);
      if (span_of(p) != s) {
        next_span_block = p;
        break;
      }
      blocks.push_back(p);
    }
    Heap* h = t_heap;
    ASSERT_NE(h->installed[s->size_class], s);
    void* x = blocks.back();
    blocks.pop_back();
    std::thread([&] {
      for (void* p : blocks) brisk_free(p);
      brisk_thread_collect();
    }).join();
    ASSERT_FALSE(h->incoming.empty());
    // free_to_own_span(h, s, x), up to and including its decrement.
    auto a = reinterpret_cast<std::uintptr_t>(x);
    FreeCode code = free_code(a);
    Block* old = s->free;
    ASSERT_EQ(old, nullptr);
    set_link(static_cast<Block*>(x), old, code.link_mask);
    static_cast<Block*>(x)->key = code.key;
    s->free = static_cast<Block*>(x);
    ASSERT_FALSE(span_used_decrement(s));
    brisk::reclaim_queued_frees(h);
    EXPECT_EQ(s->owner.load(), h) << "the reclaim released a span the owner is about to read";
    free_local_refilled(s, h);
    EXPECT_NE(h->all_spans, nullptr);
    EXPECT_TRUE(s->listed);
    // The queued blocks come home at the next drain: s empties and goes back, once.
    brisk_thread_collect();
    brisk_free(next_span_block);
  }).join();
}

// Reclaims racing with an owner that allocates and frees locally while another thread frees
// its blocks remotely: every live block keeps its contents (run under TSan too).
TEST_F(Background, ReclaimRacingWithTheOwnerLosesNothing) {
  constexpr int kRounds = 300 / kScale;
  std::atomic<bool> done{false};
  std::mutex m;
  std::vector<std::vector<void*>> handoff;
  std::condition_variable cv;
  std::thread passer([&] {
    while (!done.load()) {
      g_fake_now += 200;
      brisk::background_pass(g_fake_now.load());
      std::this_thread::yield();
    }
  });
  std::thread consumer([&] {
    for (int r = 0; r < kRounds; ++r) {
      std::vector<void*> batch;
      {
        std::unique_lock<std::mutex> lock(m);
        cv.wait(lock, [&] { return !handoff.empty(); });
        batch = std::move(handoff.back());
        handoff.pop_back();
      }
      for (void* p : batch) {
        ASSERT_EQ(FirstMismatch(p, 256, reinterpret_cast<std::uintptr_t>(p)), SIZE_MAX);
        brisk_free(p);
      }
    }
  });
  std::vector<void*> local;
  for (int r = 0; r < kRounds; ++r) {
    std::vector<void*> batch;
    for (int k = 0; k < 200; ++k) {
      void* p = brisk_malloc(256);
      Fill(p, 256, reinterpret_cast<std::uintptr_t>(p));
      (k % 3 == 0 ? local : batch).push_back(p);
    }
    {
      std::lock_guard<std::mutex> lock(m);
      handoff.push_back(std::move(batch));
    }
    cv.notify_one();
    if (r % 4 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // look idle
    while (local.size() > 100) {
      void* p = local.back();
      local.pop_back();
      ASSERT_EQ(FirstMismatch(p, 256, reinterpret_cast<std::uintptr_t>(p)), SIZE_MAX);
      brisk_free(p);
    }
  }
  consumer.join();
  done = true;
  passer.join();
  for (void* p : local) {
    ASSERT_EQ(FirstMismatch(p, 256, reinterpret_cast<std::uintptr_t>(p)), SIZE_MAX);
    brisk_free(p);
  }
}

// A thread that freed everything it allocated keeps each class's span installed (its fast paths
// use it without a lock), and then blocks for good. The background pass gives those spans'
// pages back in place (purge in place, background.cc): the thread's next allocation of each
// class rebuilds the span it left, and the blocks are sound.
TEST_F(Background, AnIdleThreadsInstalledSpansWithoutALiveBlockGiveTheirPagesBack) {
  using namespace brisk;
  Passes(3, 1000);
  const std::size_t kSizes[] = {16, 48, 256, 1024, 2048, 16 * 1024};
  constexpr std::size_t kN = std::size(kSizes);
  Span* spans[kN] = {};
  Heap* heap = nullptr;
  std::size_t resident_before[kN] = {};
  std::mutex m;
  std::condition_variable cv;
  int stage = 0;
  auto span_pages = [](Span* s) {
    auto* ch = chunk_of(reinterpret_cast<std::uintptr_t>(s->start));
    return std::pair<void*, std::size_t>{ch->page_address(s->first_page), std::size_t{s->page_count} << kPageShift};
  };
  auto resident = [&](Span* s) {
    auto [p, n] = span_pages(s);
    return platform::resident_bytes(p, n);
  };
  std::uint32_t capacity[kN] = {};
  std::thread worker([&] {
    // Every class's first span before any of them empties: a new span may take the page of a
    // span kept empty for a class not refilled lately (span_pages.cc).
    std::vector<void*> firsts;
    for (std::size_t k = 0; k < kN; ++k) firsts.push_back(brisk_malloc(kSizes[k]));
    for (std::size_t k = 0; k < kN; ++k) {
      // The class's first span, every block of it handed out and written.
      std::vector<void*> blocks{firsts[k]};
      auto a = reinterpret_cast<std::uintptr_t>(blocks[0]);
      spans[k] = chunk_of(a)->span_of(a);
      capacity[k] = spans[k]->span_bytes / spans[k]->block_size;
      while (blocks.size() < capacity[k]) blocks.push_back(brisk_malloc(kSizes[k]));
      for (void* p : blocks) {
        auto pa = reinterpret_cast<std::uintptr_t>(p);
        ASSERT_EQ(chunk_of(pa)->span_of(pa), spans[k]);
        Fill(p, kSizes[k], pa);
      }
      for (void* p : blocks) brisk_free(p);
      resident_before[k] = resident(spans[k]);
    }
    heap = t_heap;
    std::unique_lock<std::mutex> lock(m);
    stage = 1;
    cv.notify_all();
    cv.wait(lock, [&] { return stage == 2; });  // idle, alive
    lock.unlock();
    for (std::size_t k = 0; k < kN; ++k) {
      std::vector<void*> blocks;
      while (blocks.size() < capacity[k]) {
        void* p = brisk_malloc(kSizes[k]);
        Fill(p, kSizes[k], reinterpret_cast<std::uintptr_t>(p) + 1);
        blocks.push_back(p);
      }
      EXPECT_FALSE(spans[k]->idle_purged) << kSizes[k];
      for (void* p : blocks) {
        auto pa = reinterpret_cast<std::uintptr_t>(p);
        EXPECT_EQ(chunk_of(pa)->span_of(pa), spans[k]) << "the installed span serves again, " << kSizes[k];
        EXPECT_EQ(FirstMismatch(p, kSizes[k], reinterpret_cast<std::uintptr_t>(p) + 1), SIZE_MAX);
        brisk_free(p);
      }
    }
  });
  {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return stage == 1; });
  }
  Passes(3, 1000);  // the first sees the worker busy, the next idle
  for (std::size_t k = 0; k < kN; ++k) {
    unsigned c = size_to_class(kSizes[k]);
    ASSERT_EQ(heap->installed[c], spans[k]) << kSizes[k];
    EXPECT_TRUE(spans[k]->idle_purged) << kSizes[k];
    EXPECT_EQ(current_span(heap, c), &g_empty_span) << kSizes[k];
    EXPECT_GE(resident_before[k], std::size_t{60} * 1024) << kSizes[k];
    // Only the pages of the free list's head stay (a fast path under way may take it).
    EXPECT_LE(resident(spans[k]), 2 * kOsPageSize + kSizes[k]) << kSizes[k];
  }
  {
    std::lock_guard<std::mutex> lock(m);
    stage = 2;
  }
  cv.notify_all();
  worker.join();
}

// The one block a purge in place may leave live: an allocation under way when the purge
// pointed the class away from the span, which read the span and its head before (replayed step
// by step: alloc_small's loads, the purge, then alloc_small's stores). The purge keeps that
// head's pages; the owner's next slow path rebuilds the span around it, and never hands it out
// again.
TEST_F(Background, APopUnderWayWhenAnInstalledSpanIsPurgedKeepsItsBlock) {
  using namespace brisk;
  constexpr std::size_t kSize = 128;
  std::thread([&] {  // a fresh heap
    // And a fresh span: not one an earlier test's thread emptied and its class's pool kept.
    brisk_thread_collect();
    std::vector<void*> blocks;
    for (int i = 0; i < 200; ++i) {
      void* p = brisk_malloc(kSize);
      std::memset(p, 7, kSize);
      blocks.push_back(p);
    }
    for (void* p : blocks) brisk_free(p);
    Heap* h = t_heap;
    unsigned c = size_to_class(kSize);
    Span* s = current_span(h, c);
    ASSERT_EQ(s->used, 0u);
    std::uint32_t carved = s->carved_blocks;
    // alloc_small, its loads.
    Block* b = s->free;
    auto a = reinterpret_cast<std::uintptr_t>(b);
    std::size_t purged = 0;
    reclaim_queued_frees(h, &purged);
    EXPECT_GE(purged, std::size_t{48} * 1024);
    EXPECT_TRUE(s->idle_purged);
    EXPECT_EQ(current_span(h, c), &g_empty_span);
    // alloc_small, the rest: the link it reads is intact, and its stores.
    std::uintptr_t next = decoded_link(b, free_code(a).link_mask);
    EXPECT_EQ(next & ~(kChunkSize - 1), a & ~(kChunkSize - 1)) << "the head's link went with its page";
    span_used_increment(s);
    std::atomic_ref<Block*>(s->free).store(reinterpret_cast<Block*>(next), std::memory_order_release);
    b->key = 0;
    Fill(b, kSize, 99);
    // The next allocations of the class rebuild s: its other carved blocks, never b.
    std::vector<void*> again;
    for (std::uint32_t i = 0; i + 1 < carved; ++i) {
      void* p = brisk_malloc(kSize);
      ASSERT_NE(p, static_cast<void*>(b));
      auto pa = reinterpret_cast<std::uintptr_t>(p);
      ASSERT_EQ(chunk_of(pa)->span_of(pa), s);
      Fill(p, kSize, pa);
      again.push_back(p);
    }
    EXPECT_FALSE(s->idle_purged);
    EXPECT_EQ(s->used, carved);
    EXPECT_EQ(FirstMismatch(b, kSize, 99), SIZE_MAX);
    for (void* p : again) {
      EXPECT_EQ(FirstMismatch(p, kSize, reinterpret_cast<std::uintptr_t>(p)), SIZE_MAX);
      brisk_free(p);
    }
    brisk_free(b);
    EXPECT_EQ(s->used, 0u);
  }).join();
}

// An allocation under way that stored its count of used blocks by the time the purge looks
// (alloc_small stores used before the new head): the span has a live block, and is left as it is.
TEST_F(Background, APopThatCountedItsBlockBeforeThePurgeLooksLeavesTheSpan) {
  using namespace brisk;
  constexpr std::size_t kSize = 128;
  std::thread([&] {
    void* first = brisk_malloc(kSize);
    brisk_free(first);
    Heap* h = t_heap;
    unsigned c = size_to_class(kSize);
    Span* s = current_span(h, c);
    Block* b = s->free;
    auto a = reinterpret_cast<std::uintptr_t>(b);
    std::uintptr_t next = decoded_link(b, free_code(a).link_mask);
    span_used_increment(s);  // stopped before its store of the new head
    std::size_t purged = 0;
    reclaim_queued_frees(h, &purged);
    EXPECT_EQ(purged, 0u);
    EXPECT_FALSE(s->idle_purged);
    std::atomic_ref<Block*>(s->free).store(reinterpret_cast<Block*>(next), std::memory_order_release);
    b->key = 0;
    Fill(b, kSize, 5);
    EXPECT_EQ(FirstMismatch(b, kSize, 5), SIZE_MAX);
    brisk_free(b);
  }).join();
}

// The idle-thread pattern of the strategy issue: threads that freed everything they allocated,
// alive and blocked, held their classes' spans (about 3 MiB each here) until they ran again.
TEST_F(Background, IdleThreadsWithNothingLiveHoldNoSpans) {
  Passes(3, 1000);
  constexpr int kThreads = 8;
  std::mutex m;
  std::condition_variable cv;
  int ready = 0;
  bool stop = false;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      std::vector<void*> blocks;
      for (std::size_t size = 16; size <= 2048; size += 16) {
        for (std::size_t n = 0; n < 64 * 1024; n += size) {
          void* p = brisk_malloc(size);
          std::memset(p, 3, size);
          blocks.push_back(p);
        }
      }
      for (void* p : blocks) brisk_free(p);
      std::unique_lock<std::mutex> lock(m);
      ++ready;
      cv.notify_all();
      cv.wait(lock, [&] { return stop; });
    });
  }
  {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return ready == kThreads; });
  }
  [[maybe_unused]] std::size_t resident = ResidentBytes();
  std::size_t returned = Passes(4, 1000);
  EXPECT_GE(returned, std::size_t{kThreads} * (2u << 20));
#ifndef BRISK_TEST_SANITIZED
  EXPECT_LT(ResidentBytes(), resident - std::size_t{kThreads} * (2u << 20));
#endif
  {
    std::lock_guard<std::mutex> lock(m);
    stop = true;
  }
  cv.notify_all();
  for (auto& t : threads) t.join();
}

// Blocks a thread freed into other threads' spans wait in its outgoing batch until 64 of them
// (or 256 KiB) are there; a thread that then blocks for good would keep them, and the spans they
// belong to, for ever. The pass takes an idle heap's partial batches and sends them; an append
// under way (out_busy) makes it wait for a later pass.
TEST_F(Background, AnIdleThreadsPartialOutgoingBatchesAreSent) {
  using namespace brisk;
  Passes(3, 1000);
  constexpr int kBlocks = 20;  // one partial batch
  std::vector<void*> blocks;
  std::mutex m;
  std::condition_variable cv;
  int stage = 0;
  Heap* freer_heap = nullptr;
  Span* span = nullptr;
  std::thread owner([&] {
    for (int i = 0; i < kBlocks; ++i) blocks.push_back(brisk_malloc(1024));
    auto a = reinterpret_cast<std::uintptr_t>(blocks[0]);
    span = chunk_of(a)->span_of(a);
    std::unique_lock<std::mutex> lock(m);
    stage = 1;
    cv.notify_all();
    cv.wait(lock, [&] { return stage == 3; });
  });
  std::thread freer([&] {
    {
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return stage == 1; });
    }
    // A heap of its own, allocating another class than the blocks it frees, which its foreign
    // cache (threadcache/foreign_cache.h) would keep.
    void* own = brisk_malloc(16);
    for (void* p : blocks) brisk_free(p);
    freer_heap = t_heap;
    std::unique_lock<std::mutex> lock(m);
    stage = 2;
    cv.notify_all();
    cv.wait(lock, [&] { return stage == 3; });
    lock.unlock();
    brisk_free(own);
  });
  {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return stage == 2; });
  }
  auto batched = [&] {
    std::uint32_t n = 0;
    for (auto& o : freer_heap->outgoing) n += load_shared(o.count);
    return n;
  };
  ASSERT_EQ(batched(), std::uint32_t{kBlocks});
  ASSERT_EQ(load_shared(span->used), std::uint32_t{kBlocks});
  freer_heap->out_busy = 1;  // as if an append were under way
  Passes(3, 1000);
  EXPECT_EQ(batched(), std::uint32_t{kBlocks}) << "taken while an append was under way";
  freer_heap->out_busy = 0;
  Passes(3, 1000);
  EXPECT_EQ(batched(), 0u);
  // The blocks reached their owner, which is idle too: the span they emptied went back.
  EXPECT_TRUE(span->idle_purged || span->owner.load() == nullptr) << "the owner's span kept its blocks";
  {
    std::lock_guard<std::mutex> lock(m);
    stage = 3;
  }
  cv.notify_all();
  owner.join();
  freer.join();
}

// A block of a span purged in place, freed a second time: its free key went with its page, so
// free's fast path takes it for a live block (and a checked build's assertion on used stops it
// there). The owner's next slow path, which rebuilds the span, finds more frees than blocks
// handed out and reports it.
TEST(BackgroundDeathTest, ADoubleFreeIntoASpanPurgedInPlaceIsReportedWhenTheSpanIsRebuilt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  using namespace brisk;
  auto body = [] {
    std::thread([] {
      std::vector<void*> blocks;
      for (int i = 0; i < 200; ++i) blocks.push_back(brisk_malloc(128));
      for (void* p : blocks) brisk_free(p);
      std::size_t purged = 0;
      reclaim_queued_frees(t_heap, &purged);
      if (purged == 0) std::abort();  // the test's premise; the regex below would not match
      brisk_free(blocks.front());  // not the head (the last one freed): another page
      brisk_malloc(128);
    }).join();
  };
  EXPECT_EXIT(body(), testing::KilledBySignal(SIGABRT), "double free in the span of|used > 0");
}

}  // namespace
