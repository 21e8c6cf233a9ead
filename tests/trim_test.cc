// brisk_trim: every free page of the process goes back to the OS, including the free pages of
// chunks no heap owns any more (their threads exited) and of chunks that still hold one live
// block. Each test asserts that resident memory fell, never a time: the freed blocks' own pages
// (mincore), and the process's resident set (/proc/self/statm) in the release build (under
// sanitizers it also counts their shadow memory, which brisk's madvise does not release).
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <iterator>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace {

// Decay purging (BRISK_PURGE_DELAY_MS) also returns free pages, once they have stayed unused
// long enough: on a loaded machine, a pause between the frees and the tests' "still resident"
// premise let it take them first. An hour keeps this test about brisk_trim. Set before any
// brisk call, which reads the option on first use.
[[maybe_unused]] const int g_no_decay = setenv("BRISK_PURGE_DELAY_MS", "3600000", 1);

using brisk_test::AllocateAndKeepOneIn97;
using brisk_test::Fill;
using brisk_test::FreeOnlyPages;
using brisk_test::KeepOneBlockPerChunk;
using brisk_test::ResidentBytes;
using brisk_test::ResidentIn;
using brisk_test::ResidentPages;
using brisk_test::Stats;
using brisk_test::Verify;

constexpr size_t kMiB = size_t{1} << 20;

#ifdef BRISK_TEST_SANITIZED
constexpr bool kCheckProcessResident = false;
#else
constexpr bool kCheckProcessResident = true;
#endif

// Fails the test (by killing the process) if it hangs, instead of leaving it to ctest.
struct Watchdog {
  explicit Watchdog(unsigned seconds) { alarm(seconds); }
  ~Watchdog() { alarm(0); }
};

// The pattern, scaled: each thread holds 27 medium blocks of 128 KiB (its chunk nearly
// full), keeps one, frees the rest and exits. Its chunk is abandoned with 52 free, resident
// pages that no heap's decay purge ever visits.
TEST(Trim, ReturnsTheFreePagesOfChunksAbandonedByExitedThreads) {
  Watchdog dog(120);
  constexpr int kThreads = 64 / brisk_test::kScale;
  constexpr int kBlocks = 27;
  constexpr size_t kBlock = 128 * 1024;
  brisk_trim();
  size_t before = ResidentBytes();

  std::vector<void*> kept(kThreads, nullptr);
  std::vector<void*> freed_blocks(size_t{kThreads} * (kBlocks - 1), nullptr);
  std::atomic<int> bad{0};
  pthread_barrier_t all_allocated;
  pthread_barrier_init(&all_allocated, nullptr, kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      void* blocks[kBlocks];
      for (int i = 0; i < kBlocks; ++i) {
        blocks[i] = brisk_malloc(kBlock);
        if (blocks[i] == nullptr) { bad++; continue; }
        Fill(blocks[i], kBlock, t * 100 + i);
      }
      // Every thread holds its blocks at once, so no thread reuses another's freed pages.
      pthread_barrier_wait(&all_allocated);
      kept[t] = blocks[0];
      for (int i = 1; i < kBlocks; ++i) {
        freed_blocks[size_t{kBlocks - 1} * t + i - 1] = blocks[i];
        brisk_free(blocks[i]);
      }
    });
  }
  for (auto& th : threads) th.join();
  pthread_barrier_destroy(&all_allocated);
  ASSERT_EQ(bad.load(), 0);

  size_t exited = ResidentBytes();
  size_t freed = size_t{kThreads} * (kBlocks - 1) * kBlock;
  size_t freed_resident = ResidentIn(freed_blocks, kBlock);
  // Many freed pages are still resident: the premise of the test. (Not all: a heap takes
  // resident free pages in other heaps' chunks before fresh ones in its own, so a chunk may hold
  // several threads' blocks and none of their kept ones, empty entirely when they exit, and go
  // back then. Measured: 33% to 78% of the freed bytes stay resident.)
  ASSERT_GE(freed_resident, freed / 8);

  brisk_thread_collect();  // the calling thread's caches alone do not reach them
  size_t collected = ResidentBytes();
  EXPECT_GE(ResidentIn(freed_blocks, kBlock), freed_resident / 2) << "brisk_thread_collect purged abandoned chunks";

  brisk_stats s0 = Stats();
  size_t returned = brisk_trim();
  size_t trimmed = ResidentBytes();
  size_t freed_trimmed = ResidentIn(freed_blocks, kBlock);
  brisk_stats s1 = Stats();
  std::printf("freed blocks' resident KiB: %zu after exit, %zu after brisk_trim\n", freed_resident >> 10,
              freed_trimmed >> 10);
  std::printf("resident MiB: before %zu, threads exited %zu, after brisk_thread_collect %zu, after brisk_trim %zu\n",
              before / kMiB, exited / kMiB, collected / kMiB, trimmed / kMiB);
  EXPECT_GE(returned, freed_resident);
  EXPECT_GT(s1.os_decommit_calls, s0.os_decommit_calls);
  EXPECT_EQ(s1.chunk_bytes_cached, 0u) << "the empty-chunk cache goes back to the OS";
  // This thread's own allocations meanwhile may have taken a few of the freed pages.
  EXPECT_LT(freed_trimmed, freed_resident / 16);
  // The process's resident set fell with them.
  if (kCheckProcessResident) {
    EXPECT_GE(collected - trimmed, freed_resident / 4 * 3)
        << "before " << before << " after the threads " << exited << " after brisk_trim " << trimmed;
  }

  for (int t = 0; t < kThreads; ++t) {
    EXPECT_TRUE(Verify(kept[t], kBlock, t * 100)) << "live block " << t << " damaged by the trim";
    brisk_free(kept[t]);
  }
}

// One thread, one live block in every chunk: no chunk empties, so only page purging can give
// the rest back. (A build whose chunk_purge does nothing fails here.)
TEST(Trim, ReturnsFreePagesOfChunksThatStillHoldALiveBlock) {
  Watchdog dog(120);
  constexpr size_t kBlock = 256 * 1024;
  constexpr int kBlocks = static_cast<int>(96 * kMiB / kBlock) / brisk_test::kScale;
  brisk_trim();
  size_t before = ResidentBytes();

  std::vector<void*> blocks;
  for (int i = 0; i < kBlocks; ++i) {
    void* p = brisk_malloc(kBlock);
    ASSERT_NE(p, nullptr);
    Fill(p, kBlock, i);
    blocks.push_back(p);
  }
  std::vector<size_t> kept = KeepOneBlockPerChunk(blocks, brisk_free);
  size_t freed = (blocks.size() - kept.size()) * kBlock;
  ASSERT_GE(freed, size_t{kBlocks} * kBlock / 2) << "the blocks share few chunks";
  size_t dropped = ResidentBytes();
  std::vector<void*> freed_blocks;
  for (size_t i = 0, k = 0; i < blocks.size(); ++i) {
    if (k < kept.size() && kept[k] == i) ++k; else freed_blocks.push_back(blocks[i]);
  }
  size_t freed_resident = ResidentIn(freed_blocks, kBlock);
  ASSERT_GE(freed_resident, freed / 2) << "the freed blocks are still resident: the premise";

  size_t returned = brisk_trim();
  size_t trimmed = ResidentBytes();
  size_t freed_trimmed = ResidentIn(freed_blocks, kBlock);
  std::printf("freed blocks' resident KiB: %zu after the frees, %zu after brisk_trim\n", freed_resident >> 10,
              freed_trimmed >> 10);
  std::printf("resident MiB: before %zu, after the frees %zu, after brisk_trim %zu\n", before / kMiB,
              dropped / kMiB, trimmed / kMiB);
  EXPECT_GE(returned, freed / 2);
  EXPECT_LT(freed_trimmed, freed_resident / 16);
  if (kCheckProcessResident) {
    EXPECT_LT(trimmed, dropped) << "resident memory fell";
    // The kept blocks and the chunk headers may stay; the freed blocks' pages may not.
    EXPECT_LT(trimmed - before, freed / 4)
        << "before " << before << " after the frees " << dropped << " after brisk_trim " << trimmed;
  }

  for (size_t i : kept) {
    EXPECT_TRUE(Verify(blocks[i], kBlock, i)) << "live block " << i << " damaged by the trim";
    brisk_free(blocks[i]);
  }
}

// brisk_trim from one thread while others allocate, write, check and free medium and small
// blocks in their own chunks: the trim decommits only pages it claimed, so no live block loses
// its contents, and under TSan no access races.
TEST(Trim, IsSoundWhileOtherThreadsAllocateAndFree) {
  Watchdog dog(120);
  constexpr int kThreads = 3;
  constexpr int kRounds = 300 / brisk_test::kScale;
  std::atomic<int> bad{0};
  std::atomic<int> running{kThreads};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const size_t sizes[] = {48, 5000, 96 * 1024, 320 * 1024};
      void* held[8] = {};
      size_t held_size[8] = {};
      uint64_t held_seed[8] = {};
      for (int r = 0; r < kRounds; ++r) {
        for (int i = 0; i < 8; ++i) {
          size_t size = sizes[(r + i) % 4];
          uint64_t seed = static_cast<uint64_t>(t) << 32 | static_cast<uint64_t>(r * 8 + i);
          void* p = brisk_malloc(size);
          if (p == nullptr) { bad++; continue; }
          Fill(p, size, seed);
          if (!Verify(p, size, seed)) bad++;
          if (i % 2 == 0) {
            brisk_free(p);
          } else {
            // Checked after other blocks came and went and trims ran meanwhile.
            if (held[i] != nullptr && !Verify(held[i], held_size[i], held_seed[i])) bad++;
            brisk_free(held[i]);
            held[i] = p;
            held_size[i] = size;
            held_seed[i] = seed;
          }
        }
      }
      for (int i = 0; i < 8; ++i) {
        if (held[i] != nullptr && !Verify(held[i], held_size[i], held_seed[i])) bad++;
        brisk_free(held[i]);
      }
      running--;
    });
  }
  int trims = 0;
  while (running.load() > 0 || trims == 0) {
    brisk_trim();
    ++trims;
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0) << "a block lost its contents while brisk_trim ran";
  EXPECT_GT(trims, 0);
}

// brisk_trim purges other threads' installed spans that hold no live block in place, busy
// threads' too. A thread in a tight loop of a few allocations and frees of one class stays on
// its fast paths, whose pops have no fence: a pop's stores may still be in its store buffer
// when its next allocation reads the current span again. The purge's barrier on every thread
// makes at most one pop possible after it; without it this loop aborted within a second
// (a false double-free report, or a block handed out twice).
TEST(Trim, APurgeInPlaceRacingWithTightAllocationLoopsLosesNothing) {
  Watchdog dog(120);
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::atomic<long> rounds{0};
  std::vector<std::thread> owners;
  for (int t = 0; t < 2; ++t) {
    owners.emplace_back([&, t] {
      const size_t size = t == 0 ? 64 : 4096;
      for (uint64_t r = 0; !stop.load(std::memory_order_relaxed); ++r) {
        void* p[3];
        for (int i = 0; i < 3; ++i) {
          p[i] = brisk_malloc(size);
          Fill(p[i], size, r * 3 + i);
        }
        for (int i = 0; i < 3; ++i)
          if (!Verify(p[i], size, r * 3 + i)) bad++;  // also: no two of them are one block
        for (int i = 3; i-- > 0;) brisk_free(p[i]);
        rounds.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  // Two seconds of trims (a fixed count took a few milliseconds on a quiet machine and the
  // race then rarely showed): what is asserted is the blocks' contents, not a time.
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2000 / brisk_test::kScale);
  while (std::chrono::steady_clock::now() < until || rounds.load() < 1000) brisk_trim();
  stop = true;
  for (auto& th : owners) th.join();
  EXPECT_EQ(bad.load(), 0);
}

// brisk_trim also sends other threads' partial outgoing batches (heap_take_outgoing), while
// their owners append to them. Twelve threads free each other's blocks, to random others (more
// destinations than a heap's 8 batch slots, so slots switch destination all the time), between
// local allocations and frees, every block verified, while the test thread trims. Before
// switch_destination's compare-and-swap of the slot's destination, an owner switching a slot
// could overwrite the taker's mark: a helper's program like this crashed or hung (a chain sent
// twice) in 7 of 10 runs of 20 s.
TEST(Trim, TakingBatchesRacingWithRemoteFreesLosesNothing) {
  Watchdog dog(120);
  constexpr int kThreads = 12;
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::mutex m[kThreads];
  std::vector<std::pair<void*, uint64_t>> mailbox[kThreads];
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      uint64_t x = 0x9e3779b97f4a7c15ull * (t + 1);
      auto next = [&x] { return x ^= x << 13, x ^= x >> 7, x ^= x << 17; };
      for (uint64_t r = 0; !stop.load(std::memory_order_relaxed); ++r) {
        int n = 1 + static_cast<int>(next() % 16);
        for (int k = 0; k < n; ++k) {
          size_t size = 32 << (next() % 4);
          void* p = brisk_malloc(size);
          uint64_t seed = (uint64_t(t) << 48) ^ (r << 8) ^ k;
          Fill(p, 32, seed);
          int to = static_cast<int>(next() % (kThreads - 1));
          to += to >= t;
          std::lock_guard<std::mutex> lock(m[to]);
          mailbox[to].emplace_back(p, seed);
        }
        std::vector<std::pair<void*, uint64_t>> mine;
        {
          std::lock_guard<std::mutex> lock(m[t]);
          mine.swap(mailbox[t]);
        }
        for (auto& [p, seed] : mine) {
          void* a = brisk_malloc(64);  // a local pair between remote frees
          Fill(a, 64, r);
          if (!Verify(p, 32, seed) || !Verify(a, 64, r)) bad++;
          brisk_free(p);
          brisk_free(a);
        }
      }
    });
  }
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(3000 / brisk_test::kScale);
  while (std::chrono::steady_clock::now() < until) brisk_trim();
  stop = true;
  for (auto& th : threads) th.join();
  for (auto& box : mailbox)
    for (auto& [p, seed] : box) {
      if (!Verify(p, 32, seed)) bad++;
      brisk_free(p);
    }
  EXPECT_EQ(bad.load(), 0);
}

// ---- Free blocks that share their spans with live ones (core/span_holes.h) ----

// After the trim: the kept blocks are intact; the freed ones come back from malloc (filling the
// holes again), and every block, old and new, keeps its own contents (no block handed out twice).
void RefillAndVerify(std::vector<void*>& blocks, const std::vector<bool>& kept, size_t size, int* bad) {
  for (size_t i = 0; i < blocks.size(); ++i)
    if (kept[i] && !Verify(blocks[i], size, i)) ++*bad;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (kept[i]) continue;
    blocks[i] = brisk_malloc(size);
    if (blocks[i] == nullptr) std::abort();
    Fill(blocks[i], size, i + (uint64_t{1} << 40));
  }
  for (size_t i = 0; i < blocks.size(); ++i)
    if (!Verify(blocks[i], size, kept[i] ? i : i + (uint64_t{1} << 40))) ++*bad;
  for (void* p : blocks) brisk_free(p);
}

// The pages between the kept blocks are resident, then brisk_trim gives them back (all but a
// span's last carved page, which carving may have cut short of its end), and returns their bytes;
// then RefillAndVerify.
void TrimReturnsTheHolesThenRefill(std::vector<void*>& blocks, const std::vector<bool>& kept, size_t size) {
  std::vector<uintptr_t> pages = FreeOnlyPages(blocks, kept, size);
  const size_t resident = ResidentPages(pages);
  ASSERT_GE(resident, pages.size() * static_cast<size_t>(sysconf(_SC_PAGESIZE)) / 2)
      << "the freed blocks' pages are resident: the premise";
  const size_t returned = brisk_trim();
  const size_t trimmed = ResidentPages(pages);
  std::printf("%zu B: %zu KiB of pages with only freed blocks resident, %zu KiB after brisk_trim (returned %zu KiB)\n",
              size, resident >> 10, trimmed >> 10, returned >> 10);
  EXPECT_LT(trimmed, resident / 8);
  EXPECT_GE(returned, (resident - trimmed) / 2);
  int bad = 0;
  RefillAndVerify(blocks, kept, size, &bad);
  EXPECT_EQ(bad, 0);
}

// Sizes below a page, one (48 B) whose blocks straddle pages, a page, and a block of several
// pages. Before span holes, brisk_trim gave back none of these pages (a C program's 1,024-byte
// blocks, 99% freed at random: 1,013 -> 491 MiB resident, glibc's malloc_trim 59).
TEST(Trim, ReturnsThePagesOfFreeBlocksBetweenLiveOnes) {
  Watchdog dog(120);
  for (size_t size : {size_t{48}, size_t{64}, size_t{1024}, size_t{4096}, size_t{20000}}) {
    SCOPED_TRACE(size);
    brisk_trim();
    std::vector<bool> kept;
    std::vector<void*> blocks = AllocateAndKeepOneIn97(size, 24 * kMiB / brisk_test::kScale, &kept);
    TrimReturnsTheHolesThenRefill(blocks, kept, size);
  }
}

// The spans of a thread that exited are orphans in the central pools: brisk_trim makes their
// holes under the pools' locks, from any thread, and frees of their live blocks come through the
// orphan queue.
TEST(Trim, ReturnsThePagesOfFreeBlocksInExitedThreadsSpans) {
  Watchdog dog(120);
  constexpr size_t kSize = 256;
  brisk_trim();
  std::vector<bool> kept;
  std::vector<void*> blocks;
  std::thread([&] { blocks = AllocateAndKeepOneIn97(kSize, 24 * kMiB / brisk_test::kScale, &kept); }).join();
  TrimReturnsTheHolesThenRefill(blocks, kept, kSize);
}

// Spans with holes are orphans: two threads free their live blocks (each through the orphan
// queue's drain, under the class's pool lock) while the test thread allocates the class again,
// taking the spans and filling their holes under that lock, and trims again. Every block checked.
TEST(Trim, FreesIntoSpansWithHolesRacingWithTheirRefillLoseNothing) {
  Watchdog dog(120);
  constexpr size_t kSize = 64;
  for (int round = 0; round < 4; ++round) {
    std::vector<bool> kept;
    std::vector<void*> blocks = AllocateAndKeepOneIn97(kSize, 8 * kMiB / brisk_test::kScale, &kept);
    brisk_trim();
    std::vector<size_t> live;
    for (size_t i = 0; i < blocks.size(); ++i)
      if (kept[i]) live.push_back(i);
    std::atomic<int> bad{0};
    std::vector<std::thread> freers;
    for (int t = 0; t < 2; ++t) {
      freers.emplace_back([&, t] {
        for (size_t k = t; k < live.size(); k += 2) {
          if (!Verify(blocks[live[k]], kSize, live[k])) bad++;
          brisk_free(blocks[live[k]]);
        }
      });
    }
    std::vector<void*> fresh(blocks.size() / 2);
    for (size_t i = 0; i < fresh.size(); ++i) {
      fresh[i] = brisk_malloc(kSize);
      Fill(fresh[i], kSize, i + (uint64_t{1} << 40));
      if (i % 4096 == 0) brisk_trim();
    }
    for (auto& th : freers) th.join();
    for (size_t i = 0; i < fresh.size(); ++i) {
      if (!Verify(fresh[i], kSize, i + (uint64_t{1} << 40))) bad++;
      brisk_free(fresh[i]);
    }
    EXPECT_EQ(bad.load(), 0);
  }
}

// The first block of a page in a hole: one 64-byte block in 97 kept over 4 MiB, the rest freed,
// then brisk_trim (the death tests' children leave the blocks as they are).
void* ABlockInAHole() {
  std::vector<bool> kept;
  std::vector<void*> blocks = AllocateAndKeepOneIn97(64, 4 * kMiB, &kept);
  brisk_trim();
  std::vector<uintptr_t> pages = FreeOnlyPages(blocks, kept, 64);
  if (pages.empty() || ResidentPages(pages) != 0) std::abort();  // the premise: holes, no block of them listed
  return reinterpret_cast<void*>(pages[pages.size() / 2]);
}

// A block in a hole lost its free key with its page: a second free of it is reported all the
// same (the span is an orphan, so the free goes through the orphan queue's drain, which knows
// the holes), from its own thread or another.
TEST(TrimDeathTest, ASecondFreeOfABlockInAHoleIsADoubleFree) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto twice = [](bool same_thread) {
    void* victim = ABlockInAHole();
    if (same_thread) brisk_free(victim); else std::thread([victim] { brisk_free(victim); }).join();
    brisk_trim();  // drains the orphan queue
  };
  EXPECT_DEATH(twice(true), "double free of 0x.*after brisk_trim gave its page back");
  EXPECT_DEATH(twice(false), "double free of 0x.*after brisk_trim gave its page back");
}

// A second free of a block in a hole, from a thread that still holds it in its outgoing batch
// (to the orphan queue) when the test thread's refill takes the span: that free's key exchange
// wrote the key into the hole, and the fill's own exchange finds it there. Sent on after the fill
// instead, the block would reach the span's new owner and go on its list twice.
TEST(TrimDeathTest, ASecondFreeStillOnItsWayIsReportedWhenTheSpanIsTaken) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto racing = [] {
    void* victim = ABlockInAHole();
    std::mutex m;
    std::condition_variable cv;
    bool freed = false, done = false;
    std::thread other([&] {
      brisk_free(victim);  // into its outgoing batch, not sent while it waits
      std::unique_lock<std::mutex> lock(m);
      freed = true;
      cv.notify_all();
      cv.wait(lock, [&] { return done; });
    });
    {
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return freed; });
    }
    for (size_t i = 0; i < 4 * kMiB / 64; ++i) brisk_malloc(64);
    {
      std::lock_guard<std::mutex> lock(m);
      done = true;
    }
    cv.notify_all();
    other.join();
  };
  EXPECT_DEATH(racing(), "double free of 0x.*after brisk_trim gave its page back");
}

// A write into a freed block in a hole (here its free-key word, where a second free's key
// exchange writes) is found when the holes are filled again.
TEST(TrimDeathTest, AWriteIntoAHoleIsReportedWhenTheSpanIsTakenAgain) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto written = [] {
    static_cast<volatile uintptr_t*>(ABlockInAHole())[1] = 1;
    for (size_t i = 0; i < 4 * kMiB / 64; ++i) brisk_malloc(64);
  };
  EXPECT_DEATH(written(), "double free of 0x.*or written after its free");
}

}  // namespace
