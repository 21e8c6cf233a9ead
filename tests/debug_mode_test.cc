// Debug mode through the brisk_* API: the switch (nesting, prompt in every thread, free and
// realloc across modes), what a debug block looks like to its user, and one test per
// detection. Reports go to a callback and BRISK_DEBUG_ACTION is "report" (set_keep_going), so
// a problem is seen as a report text rather than an abort.
#include <brisk/brisk.h>

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/chunk.h"
#include "core/options.h"
#include "core/platform.h"
#include "debug/block.h"
#include "debug/block_layout.h"
#include "debug/debug_heap.h"
#include "threadcache/background.h"
#include "threadcache/heap.h"
#include "tests/debug_mode_fixture.h"
#include "tests/test_util.h"

namespace {

// A small debug block reports its requested size; a release block its class size.
bool IsDebugBlockOf24(void* p) { return brisk_usable_size(p) == 24; }

TEST_F(DebugMode, EnterAndExitNest) {
  EXPECT_NE(brisk_debug_active(), 0);
  brisk_debug_enter();
  brisk_debug_exit();
  EXPECT_NE(brisk_debug_active(), 0);
  brisk_debug_exit();
  EXPECT_EQ(brisk_debug_active(), 0);
  brisk_debug_exit();  // unbalanced: ignored
  EXPECT_EQ(brisk_debug_active(), 0);
  brisk_debug_enter();
  EXPECT_NE(brisk_debug_active(), 0);
}

TEST_F(DebugMode, ANewBlockHoldsTheAllocationPatternAndItsExactSize) {
  // The largest: a block at the fill limit, the largest with the pattern on every byte.
  for (size_t size : {size_t{1}, size_t{24}, size_t{1000}, size_t{100000}, DefaultFillLimit()}) {
    auto* p = static_cast<unsigned char*>(brisk_malloc(size));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(brisk_usable_size(p), size);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 16, 0u);
    for (size_t i = 0; i < size; i += 1 + i / 64) ASSERT_EQ(p[i], brisk::debug::kAllocByte) << size << " " << i;
    brisk_free(p);
  }
  EXPECT_EQ(brisk_check_heap(), 0);
  EXPECT_EQ(ReportCount(), 0) << Reports();
}

// The seed's correctness test: every fill byte of new blocks of 1..1025 bytes; in freed blocks
// of 1..65 and 257 bytes, each byte corrupted in turn is found at its offset, and once
// restored the next check is clean.
TEST_F(DebugMode, EveryFillByteIsSetAndEveryCorruptedFreedByteIsFoundAtItsOffset) {
  for (size_t size = 1; size <= 1025; ++size) {
    auto* p = static_cast<unsigned char*>(brisk_malloc(size));
    for (size_t i = 0; i < size; ++i) ASSERT_EQ(p[i], brisk::debug::kAllocByte) << size << " " << i;
    brisk_free(p);
  }
  std::vector<size_t> sizes;
  for (size_t size = 1; size <= 65; ++size) sizes.push_back(size);
  sizes.push_back(257);
  for (size_t size : sizes) {
    auto* p = static_cast<unsigned char*>(brisk_malloc(size));
    brisk_free(p);  // in quarantine: its bytes are the freed pattern, and still the block's
    for (size_t i = 0; i < size; ++i) {
      {
        std::lock_guard<std::mutex> g(g_reports_mutex);
        g_reports.clear();
      }
      p[i] ^= 0x5A;
      ASSERT_EQ(brisk::debug::check_block(p), 1) << size << " " << i;
      std::string want = "damaged ranges: " + std::to_string(i) + "(1)\n";
      ASSERT_NE(Reports().find(want), std::string::npos) << Reports();
      p[i] ^= 0x5A;
      ASSERT_EQ(brisk::debug::check_block(p), 0) << size << " " << i;
    }
  }
}

// BRISK_DEBUG_FILL_LIMIT: above it, the new and freed patterns and the freed check cover the
// block's first and last kFillEdgeBytes; calloc still zeroes every byte.
TEST_F(DebugMode, ABlockAboveTheFillLimitCarriesItsPatternsOnItsEdges) {
  using brisk::debug::kFillEdgeBytes;
  brisk::debug::set_fill_limit(256 * 1024);
  const size_t size = size_t{3} << 20;  // a large block
  auto* p = static_cast<unsigned char*>(brisk_malloc(size));
  ASSERT_NE(p, nullptr);
  for (size_t i = 0; i < kFillEdgeBytes; ++i) {
    ASSERT_EQ(p[i], brisk::debug::kAllocByte) << i;
    ASSERT_EQ(p[size - 1 - i], brisk::debug::kAllocByte) << i;
  }
  std::memset(p + kFillEdgeBytes, 0x11, size - 2 * kFillEdgeBytes);  // the middle is the program's
  brisk_free(p);  // in quarantine
  EXPECT_EQ(brisk::debug::check_block(p), 0) << Reports();
  for (size_t offset : {size_t{5}, kFillEdgeBytes - 1, size - kFillEdgeBytes, size - 1}) {
    {
      std::lock_guard<std::mutex> g(g_reports_mutex);
      g_reports.clear();
    }
    ASSERT_EQ(p[offset], brisk::debug::kFreedByte) << offset;
    p[offset] ^= 0x5A;
    ASSERT_EQ(brisk::debug::check_block(p), 1) << offset;
    std::string want = "damaged ranges: " + std::to_string(offset) + "(1)\n";
    EXPECT_NE(Reports().find(want), std::string::npos) << Reports();
    p[offset] ^= 0x5A;
  }
  p[size / 2] ^= 0x5A;  // beyond the edges: not checked, as documented
  EXPECT_EQ(brisk::debug::check_block(p), 0) << Reports();
  p[size / 2] ^= 0x5A;
  auto* z = static_cast<unsigned char*>(brisk_calloc(1, size));
  ASSERT_NE(z, nullptr);
  for (size_t i = 0; i < size; ++i) ASSERT_EQ(z[i], 0) << i;
  brisk_free(z);
  brisk::debug::set_fill_limit(SIZE_MAX);
  auto* whole = static_cast<unsigned char*>(brisk_malloc(size));
  for (size_t i = 0; i < size; i += 4096) ASSERT_EQ(whole[i], brisk::debug::kAllocByte) << i;
  brisk_free(whole);
  brisk::debug::set_fill_limit(DefaultFillLimit());
  EXPECT_EQ(brisk_check_heap(), 0);
}

TEST_F(DebugMode, CallocReturnsZeroesAndAlignedAllocMeetsTheAlignment) {
  for (size_t size : {size_t{24}, size_t{100000}}) {
    auto* p = static_cast<unsigned char*>(brisk_calloc(1, size));
    ASSERT_NE(p, nullptr);
    for (size_t i = 0; i < size; ++i) ASSERT_EQ(p[i], 0) << i;
    brisk_free(p);
  }
  for (size_t alignment : {size_t{32}, size_t{256}, size_t{4096}}) {
    void* p = brisk_aligned_alloc(alignment, 40);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % alignment, 0u);
    EXPECT_EQ(brisk_usable_size(p), 40u);
    brisk_free(p);
  }
  EXPECT_EQ(ReportCount(), 0) << Reports();
}

// Alignments above 4 KiB, up to 2 MiB, get debug blocks too: small, medium and large ones.
TEST_F(DebugMode, AlignmentsUpToTwoMiBGetDebugBlocks) {
  for (size_t alignment : {size_t{8192}, size_t{65536}, size_t{1} << 20, size_t{2} << 20}) {
    for (size_t size : {size_t{100}, size_t{3} << 20}) {
      auto* p = static_cast<char*>(brisk_aligned_alloc(alignment, size));
      ASSERT_NE(p, nullptr) << alignment << " " << size;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % alignment, 0u) << alignment << " " << size;
      EXPECT_EQ(brisk_usable_size(p), size) << alignment << " " << size;  // a debug block's own size
      EXPECT_EQ(static_cast<unsigned char>(p[size - 1]), brisk::debug::kAllocByte);
      p[size] = 'x';  // into the canary
      brisk_free(p);
      EXPECT_NE(Reports().find("damaged ranges: " + std::to_string(size) + "(1)"), std::string::npos)
          << alignment << " " << size << "\n" << Reports();
    }
  }
  EXPECT_EQ(ReportCount(), 8) << Reports();
}

// An aligned allocation that starts in release mode and meets the switch into debug mode at its
// refill (the switch points the thread's spans at the empty one) gets a debug block with its
// alignment. Before, the refill handed it to the debug layer's hook, which knows no alignment: a
// review's probe saw 5 of 352,687 posix_memalign blocks 16-byte aligned while another thread
// switched the mode every 50 us. Three threads allocate aligned blocks for 1.5 s while one switches.
TEST_F(DebugMode, AlignedBlocksKeepTheirAlignmentWhileTheModeSwitches) {
  brisk_debug_exit();  // the switching thread decides
  std::atomic<bool> stop{false};
  std::atomic<long> misaligned{0}, made{0};
  std::thread switcher([&] {
    while (!stop.load()) {
      brisk_debug_enter();
      usleep(50);
      brisk_debug_exit();
      usleep(50);
    }
  });
  std::vector<std::thread> workers;
  for (size_t alignment : {size_t{64}, size_t{512}, size_t{4096}}) {
    workers.emplace_back([&, alignment] {
      while (!stop.load()) {
        void* p = brisk_aligned_alloc(alignment, 100);
        if (p == nullptr) continue;
        made.fetch_add(1);
        if (reinterpret_cast<uintptr_t>(p) % alignment != 0) misaligned.fetch_add(1);
        brisk_free(p);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  stop.store(true);
  for (auto& t : workers) t.join();
  switcher.join();
  brisk_debug_enter();
  EXPECT_GT(made.load(), 1000);
  EXPECT_EQ(misaligned.load(), 0) << "of " << made.load() << " aligned blocks";
  EXPECT_EQ(ReportCount(), 0) << Reports();
  EXPECT_EQ(brisk_check_heap(), 0);
}

TEST_F(DebugMode, BlocksMoveBetweenModesThroughFreeAndRealloc) {
  brisk_debug_exit();
  void* release_block = brisk_malloc(24);
  brisk_debug_enter();
  auto* debug_block = static_cast<char*>(brisk_malloc(24));
  EXPECT_TRUE(IsDebugBlockOf24(debug_block));
  std::memcpy(debug_block, "0123456789abcdefghijklm", 24);
  brisk_free(release_block);  // a release block freed in debug mode
  brisk_debug_exit();
  auto* moved = static_cast<char*>(brisk_realloc(debug_block, 5000));  // now a release block
  ASSERT_NE(moved, nullptr);
  EXPECT_EQ(std::memcmp(moved, "0123456789abcdefghijklm", 24), 0);
  EXPECT_GE(brisk_usable_size(moved), 5000u);
  brisk_debug_enter();
  auto* back = static_cast<char*>(brisk_realloc(moved, 30));  // and a debug block again
  EXPECT_EQ(brisk_usable_size(back), 30u);
  EXPECT_EQ(std::memcmp(back, "0123456789abcdefghijklm", 24), 0);
  brisk_debug_exit();
  brisk_free(back);  // a debug block freed in release mode
  EXPECT_EQ(ReportCount(), 0) << Reports();
}

TEST_F(DebugMode, AnOverrunOfOneByteIsReportedAtFree) {
  auto* p = static_cast<char*>(brisk_malloc(24));
  p[24] = 'x';
  brisk_free(p);
  EXPECT_EQ(ReportCount(), 1);
  EXPECT_NE(Reports().find("overrun"), std::string::npos) << Reports();
  EXPECT_NE(Reports().find("24(1)"), std::string::npos) << Reports();
}

TEST_F(DebugMode, AnUnderrunOfOneByteIsReportedAtRealloc) {
  auto* p = static_cast<char*>(brisk_malloc(100));
  p[-1] = 'x';
  EXPECT_EQ(brisk_realloc(p, 200), nullptr);
  EXPECT_EQ(ReportCount(), 1);
  EXPECT_NE(Reports().find("underrun"), std::string::npos) << Reports();
}

TEST_F(DebugMode, CheckHeapCountsDamagedLiveBlocks) {
  auto* a = static_cast<char*>(brisk_malloc(40));
  auto* b = static_cast<char*>(brisk_malloc(70000));
  EXPECT_EQ(brisk_check_heap(), 0);
  a[40] = 0;
  b[70000] = 0;
  EXPECT_EQ(brisk_check_heap(), 2);
  a[40] = static_cast<char>(brisk::debug::kGuardByte);
  b[70000] = static_cast<char>(brisk::debug::kGuardByte);
  EXPECT_EQ(brisk_check_heap(), 0);
  brisk_free(a);
  brisk_free(b);
  EXPECT_EQ(ReportCount(), 2) << Reports();
}

// A debug heap's owner adds its new blocks to the live list without the lock, through a ring
// that whoever takes the lock next links (DebugHeap::made): blocks still in the ring, and
// blocks the ring spilled into the list when it filled, are all seen by brisk_check_heap and
// by another thread's frees, and a double free of either kind is named.
TEST_F(DebugMode, BlocksAnotherThreadJustMadeAreCheckedAndFreedAcrossThreads) {
  constexpr int kBlocks = 3 * brisk::debug::DebugHeap::kMadeBatch + 5;
  std::vector<char*> blocks(kBlocks);
  std::thread maker([&blocks] {
    for (char*& b : blocks) b = static_cast<char*>(brisk_malloc(48));
  });
  maker.join();
  for (char* b : blocks) ASSERT_EQ(brisk_usable_size(b), 48u);
  EXPECT_EQ(brisk_check_heap(), 0) << Reports();
  // The first block went to the list when the ring filled; the last is still in the ring.
  blocks.front()[48] = 0;
  blocks.back()[48] = 0;
  EXPECT_EQ(brisk_check_heap(), 2) << Reports();
  blocks.front()[48] = static_cast<char>(brisk::debug::kGuardByte);
  blocks.back()[48] = static_cast<char>(brisk::debug::kGuardByte);
  EXPECT_EQ(brisk_check_heap(), 0) << Reports();
  EXPECT_EQ(ReportCount(), 2) << Reports();
  for (char* b : blocks) brisk_free(b);
  EXPECT_EQ(ReportCount(), 2) << Reports();
  brisk_free(blocks.back());
  brisk_free(blocks.front());
  EXPECT_EQ(ReportCount(), 4) << Reports();
  EXPECT_NE(Reports().find("double free"), std::string::npos) << Reports();
  EXPECT_EQ(brisk_check_heap(), 0) << Reports();
}

// Each block waits in the quarantine (ctest runs this test with 64 MiB: 8 MiB a shard).
TEST_F(DebugMode, ADoubleFreeIsNamedForSmallMediumAndLargeBlocks) {
  for (size_t size : {size_t{48}, size_t{300000}, size_t{3} << 20}) {
    void* p = brisk_malloc(size);
    brisk_free(p);
    int before = ReportCount();
    brisk_free(p);
    EXPECT_EQ(ReportCount(), before + 1) << size;
  }
  std::string r = Reports();
  size_t n = 0;
  for (size_t at = r.find("brisk: double free"); at != std::string::npos; at = r.find("brisk: double free", at + 1)) ++n;
  EXPECT_EQ(n, 3u) << r;
}

// Larger than a shard's share of the quarantine (64 MiB / 8 under ctest), so it waits there
// alone until its shard's next free: its double free is still named.
TEST_F(DebugMode, ADoubleFreeOfABlockLargerThanAQuarantineShardIsNamed) {
  void* p = brisk_malloc(size_t{10} << 20);
  brisk_free(p);
  brisk_free(p);
  EXPECT_EQ(ReportCount(), 1);
  EXPECT_NE(Reports().find("brisk: double free"), std::string::npos) << Reports();
  brisk_free(brisk_malloc(16));  // its shard's next free lets it go
  EXPECT_EQ(brisk_check_heap(), 0);
}

TEST_F(DebugMode, ASizedFreeWithTheWrongSizeIsReported) {
  brisk_free_sized(brisk_malloc(24), 24);
  EXPECT_EQ(ReportCount(), 0) << Reports();
  brisk_free_sized(brisk_malloc(24), 32);
  EXPECT_EQ(ReportCount(), 1);
  EXPECT_NE(Reports().find("sized free with a size that is not the block's"), std::string::npos) << Reports();
}

TEST_F(DebugMode, ReallocOfAFreedBlockIsReported) {
  void* p = brisk_malloc(64);
  brisk_free(p);
  EXPECT_EQ(brisk_realloc(p, 128), nullptr);
  EXPECT_NE(Reports().find("realloc of a freed block"), std::string::npos) << Reports();
}

// realloc frees the old block under the lock of its check, before it copies it (block.h): the
// copy still holds the contents, and the old pointer is a freed block from then on.
TEST_F(DebugMode, ReallocFreesTheOldBlockIntoTheQuarantine) {
  auto* p = static_cast<char*>(brisk_malloc(40));
  std::memcpy(p, "0123456789abcdefghijklmnopqrstuvwxyzABC", 40);
  auto* q = static_cast<char*>(brisk_realloc(p, 80));
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(std::memcmp(q, "0123456789abcdefghijklmnopqrstuvwxyzABC", 40), 0);
  EXPECT_EQ(brisk_usable_size(q), 80u);
  EXPECT_EQ(brisk_check_heap(), 0) << Reports();  // the old block holds the freed pattern
  EXPECT_EQ(ReportCount(), 0) << Reports();
  brisk_free(p);
  EXPECT_EQ(ReportCount(), 1);
  EXPECT_NE(Reports().find("brisk: double free"), std::string::npos) << Reports();
  void* r = brisk_malloc(24);
  EXPECT_EQ(brisk_realloc(r, 0), nullptr);  // frees r
  brisk_free(r);
  EXPECT_EQ(ReportCount(), 2) << Reports();
  brisk_free(q);
  EXPECT_EQ(ReportCount(), 2) << Reports();
}

// The default fill limit is 1 MiB, the largest medium block of the speed and balanced modes: a
// block of that size carries the patterns on every byte, so a write after free into its middle
// is found; one a byte larger (a mapping of its own) on its edges only, so there it is not.
TEST_F(DebugMode, TheDefaultFillLimitIsTheLargestMediumBlock) {
  if (getenv("BRISK_DEBUG_FILL_LIMIT") != nullptr) GTEST_SKIP() << "the limit is the environment's";
  constexpr size_t kLimit = size_t{1} << 20;
  auto* whole = static_cast<unsigned char*>(brisk_malloc(kLimit));
  auto* edges = static_cast<unsigned char*>(brisk_malloc(kLimit + 1));
  ASSERT_NE(whole, nullptr);
  ASSERT_NE(edges, nullptr);
  for (size_t i = 0; i < kLimit; i += 512) ASSERT_EQ(whole[i], brisk::debug::kAllocByte) << i;
  brisk_free(whole);  // both in quarantine (BRISK_DEBUG_QUARANTINE=64m)
  brisk_free(edges);
  whole[kLimit / 2] ^= 0x5A;
  EXPECT_EQ(brisk::debug::check_block(whole), 1) << "a write into the middle of a 1 MiB block went unseen";
  whole[kLimit / 2] ^= 0x5A;
  edges[kLimit / 2] ^= 0x5A;
  EXPECT_EQ(brisk::debug::check_block(edges), 0) << "the middle of a block above the limit was checked";
  edges[kLimit / 2] ^= 0x5A;
  EXPECT_EQ(ReportCount(), 1) << Reports();
  std::lock_guard<std::mutex> g(g_reports_mutex);
  g_reports.clear();
  g_report_count = 0;
}

TEST_F(DebugMode, AnInvalidPointerIntoDebugMemoryIsReported) {
  auto* p = static_cast<char*>(brisk_malloc(64));
  brisk_free(p + 16);
  EXPECT_NE(Reports().find("invalid free"), std::string::npos) << Reports();
  brisk_free(p);
}

TEST_F(DebugMode, AWriteAfterFreeIsFoundByCheckHeapAndAtQuarantineExit) {
  auto* p = static_cast<char*>(brisk_malloc(200));
  brisk_free(p);
  p[7] = 1;  // the block is in quarantine: its memory is still the debug block's
  EXPECT_EQ(brisk_check_heap(), 1);
  EXPECT_NE(Reports().find("7(1)"), std::string::npos) << Reports();
  p[7] = static_cast<char>(brisk::debug::kFreedByte);
  EXPECT_EQ(brisk_check_heap(), 0);
  p[9] = 1;
  // Push it out of the quarantine (64 MiB under ctest) with frees of larger blocks.
  for (int i = 0; i < 160; ++i) brisk_free(brisk_malloc(1 << 20));
  EXPECT_NE(Reports().find("write after free: the freed block"), std::string::npos) << Reports();
  EXPECT_NE(Reports().find("9(1)"), std::string::npos) << Reports();
}

// A write after free that lands on a quarantined block's header (here its user size, as an
// underrun of the block after it would) is named as a damaged header by brisk_check_heap,
// which then does not trust the size to check the freed pattern with (it read 4 GiB and
// crashed). The block waits in its heap's batch (48 bytes), then in the shard (300000).
TEST_F(DebugMode, CheckHeapNamesADamagedHeaderOfAQuarantinedBlock) {
  for (size_t size : {size_t{48}, size_t{300000}}) {
    auto* p = static_cast<char*>(brisk_malloc(size));
    brisk_free(p);
    auto* user_size = reinterpret_cast<uint64_t*>(p - sizeof(brisk::debug::Header) +
                                                  offsetof(brisk::debug::Header, user_size));
    ASSERT_EQ(*user_size, size);
    *user_size = uint64_t{4} << 30;
    EXPECT_EQ(brisk_check_heap(), 1) << size;
    EXPECT_NE(Reports().find("damaged header"), std::string::npos) << Reports();
    *user_size = size;
    EXPECT_EQ(brisk_check_heap(), 0) << size;
  }
}

// BRISK_DEBUG_ACTION goes through the options table: ctest runs these two again in processes of
// their own with the variable set (debug_action_option_*); without it they skip.
TEST(DebugActionOption, ReportIsReadFromTheEnvironment) {
  const char* action = getenv("BRISK_DEBUG_ACTION");
  if (action == nullptr || std::string(action) != "report") GTEST_SKIP() << "needs BRISK_DEBUG_ACTION=report";
  EXPECT_EQ(brisk::options::get(brisk::options::Id::kDebugAction), 1);
}

TEST(DebugActionOption, AnInvalidValueIsNamedAndIgnored) {
  const char* action = getenv("BRISK_DEBUG_ACTION");
  if (action == nullptr || std::string(action) != "reprot") GTEST_SKIP() << "needs BRISK_DEBUG_ACTION=reprot";
  testing::internal::CaptureStderr();
  EXPECT_EQ(brisk::options::get(brisk::options::Id::kDebugAction), 0);  // abort, the default
  EXPECT_NE(testing::internal::GetCapturedStderr().find("brisk: ignoring an invalid value of BRISK_DEBUG_ACTION"),
            std::string::npos);
}

// A thread that loops malloc/free of one size never leaves its fast path in release mode; it
// makes a debug block within two iterations of another thread's brisk_debug_enter returning.
TEST_F(DebugMode, TheSwitchReachesAThreadLoopingOnItsFastPath) {
  brisk_debug_exit();
  std::atomic<uint64_t> iterations{0};
  std::atomic<uint64_t> first_debug{0};  // 1 + the iteration of the first debug block
  std::atomic<bool> stop{false};
  std::thread looper([&] {
    for (uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
      void* p = brisk_malloc(24);
      if (first_debug.load(std::memory_order_relaxed) == 0 && IsDebugBlockOf24(p))
        first_debug.store(i + 1, std::memory_order_relaxed);
      brisk_free(p);
      iterations.store(i + 1, std::memory_order_release);
      // Orders the count before the next iteration's loads (the switch's state): without it,
      // on x86 too, malloc i + 1 could run while the store of i + 1 still waited in this
      // core's store buffer and miss a switch that the main thread, reading the count as i,
      // made before it: first debug block at at_switch + 2 (seen under ctest -j2 beside a CI
      // run). With it and
      // enter's closing fence, either fence precedes the other in the total order: this
      // thread sees the switch, or the main thread sees the count.
      std::atomic_thread_fence(std::memory_order_seq_cst);
    }
  });
  while (iterations.load(std::memory_order_acquire) < 1000) std::this_thread::yield();
  ASSERT_EQ(first_debug.load(), 0u);
  brisk_debug_enter();
  uint64_t at_switch = iterations.load(std::memory_order_acquire);
  // Watchdog by count, not time: a thread still on its release span after a million more
  // iterations never got the switch.
  while (first_debug.load(std::memory_order_relaxed) == 0 &&
         iterations.load(std::memory_order_relaxed) < at_switch + 1000000)
    std::this_thread::yield();
  stop = true;
  looper.join();
  ASSERT_NE(first_debug.load(), 0u) << "no debug block after " << iterations.load() - at_switch << " iterations";
  // Iteration at_switch + 1 may have allocated before the switch; at_switch + 2 began after it.
  EXPECT_LE(first_debug.load() - 1, at_switch + 1);
  EXPECT_EQ(ReportCount(), 0) << Reports();
}

// Producers send filled blocks to consumers, which check and free them, while the main thread
// turns debug mode on and off: every block arrives intact and nothing is reported.
TEST_F(DebugMode, SwitchingWhileThreadsTradeBlocksLosesNothingAndReportsNothing) {
  constexpr int kPairs = 2;
  const int kPerProducer = 20000 / brisk_test::kScale;
  struct Queue {
    std::mutex m;
    std::vector<std::pair<unsigned char*, size_t>> items;
  } queues[kPairs];
  std::atomic<int> producing{kPairs};
  std::atomic<long> received{0}, bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kPairs; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerProducer; ++i) {
        size_t size = 1 + (static_cast<size_t>(i) * 7919) % (i % 64 == 0 ? 200000 : 2000);
        auto* p = static_cast<unsigned char*>(i % 3 == 0 ? brisk_calloc(1, size) : brisk_malloc(size));
        std::memset(p, static_cast<int>(size & 0xff), size);
        if (i % 5 == 0) {
          p = static_cast<unsigned char*>(brisk_realloc(p, size + 100));
          std::memset(p, static_cast<int>(size & 0xff), size);
        }
        std::lock_guard<std::mutex> g(queues[t].m);
        queues[t].items.emplace_back(p, size);
      }
      producing.fetch_sub(1);
    });
    threads.emplace_back([&, t] {
      for (;;) {
        std::vector<std::pair<unsigned char*, size_t>> batch;
        bool done = producing.load() == 0;
        {
          std::lock_guard<std::mutex> g(queues[t].m);
          batch.swap(queues[t].items);
        }
        for (auto [p, size] : batch) {
          for (size_t i = 0; i < size; i += 1 + i / 16)
            if (p[i] != static_cast<unsigned char>(size & 0xff)) bad.fetch_add(1);
          brisk_free(p);
          received.fetch_add(1);
        }
        if (done && batch.empty()) return;
      }
    });
  }
  for (int i = 0; producing.load() > 0; ++i) {
    if (i % 2 == 0) brisk_debug_exit();
    else brisk_debug_enter();
    std::this_thread::yield();
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(received.load(), static_cast<long>(kPairs) * kPerProducer);
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(brisk_check_heap(), 0);
  EXPECT_EQ(ReportCount(), 0) << Reports();
}

// Debug blocks of 100 KiB (medium: a span each) made and freed by the calling thread, past the
// quarantine (BRISK_DEBUG_QUARANTINE=64m in this test: 8 MiB per shard). Returns the oldest
// half, whose memory left the quarantine long ago: free pages of the thread's debug heap,
// resident (the freed pattern wrote them), left to the decay purge, which has not come yet.
constexpr size_t kCollectBlock = 100 * 1024;
std::vector<void*> FreeDebugBlocksPastTheQuarantine() {
  constexpr int kBlocks = 240;  // 24 MiB
  std::vector<void*> blocks;
  for (int i = 0; i < kBlocks; ++i) {
    void* p = brisk_malloc(kCollectBlock);
    EXPECT_EQ(brisk_usable_size(p), kCollectBlock) << "a debug block";
    blocks.push_back(p);
  }
  for (void* p : blocks) brisk_free(p);
  blocks.resize(kBlocks / 2);  // 12 MiB; the newest 8 MiB are still in the quarantine
  return blocks;
}

// brisk_thread_collect gives back the free pages of the calling thread's debug heap, as it does
// its thread heap's: those of the chunks whose page owner it is (a heap also takes free pages of
// other heaps' chunks before mapping a new one: collect leaves those to their owners and to
// brisk_trim, so they are not counted). Run in a process of its own (debug_collect_fresh_test):
// after other tests, the free pages they left in other chunks took up to all but 2 of the 120
// blocks counted.
TEST_F(DebugMode, ThreadCollectReturnsTheFreePagesOfTheThreadsDebugHeap) {
  if (getenv("BRISK_TEST_FRESH") == nullptr) GTEST_SKIP() << "run by debug_collect_fresh_test";
  std::vector<void*> freed;
  for (void* p : FreeDebugBlocksPastTheQuarantine()) {
    brisk::Heap* owner = brisk::chunk_of(reinterpret_cast<uintptr_t>(p))->page_owner.load();
    if (owner != nullptr && owner == brisk::t_heap->debug) freed.push_back(p);
  }
  ASSERT_GE(freed.size(), 20u) << "most blocks are in the debug heap's own chunks";
  size_t before = brisk_test::ResidentIn(freed, kCollectBlock);
  ASSERT_GE(before, freed.size() * kCollectBlock / 2);
  brisk_thread_collect();
  size_t after = brisk_test::ResidentIn(freed, kCollectBlock);
  EXPECT_LT(after, before / 16) << "resident KiB before " << (before >> 10) << ", after " << (after >> 10);
  EXPECT_EQ(ReportCount(), 0) << Reports();
}

// Runs in_worker on a new thread, then, while that thread lives on without allocating,
// on_this_thread, which returns freed blocks of kCollectBlock bytes whose pages are resident:
// brisk_trim must take them back.
template <class InWorker, class OnThisThread>
void ExpectTrimTakesBackWhileAWorkerLives(InWorker in_worker, OnThisThread on_this_thread) {
  std::atomic<int> step{0};
  std::thread worker([&] {
    in_worker();
    step.store(1);
    while (step.load() != 2) std::this_thread::yield();
  });
  while (step.load() != 1) std::this_thread::yield();
  std::vector<void*> freed = on_this_thread();
  size_t before = brisk_test::ResidentIn(freed, kCollectBlock);
  EXPECT_GE(before, freed.size() * kCollectBlock / 2);
  brisk_trim();
  size_t after = brisk_test::ResidentIn(freed, kCollectBlock);
  step.store(2);
  worker.join();
  EXPECT_LT(after, before / 16) << "resident KiB before " << (before >> 10) << ", after " << (after >> 10);
}

// brisk_trim gives back the free pages of every debug heap, here another (live) thread's.
TEST_F(DebugMode, TrimReturnsTheFreePagesOfAnotherThreadsDebugHeap) {
  std::vector<void*> freed;
  ExpectTrimTakesBackWhileAWorkerLives([&] { freed = FreeDebugBlocksPastTheQuarantine(); }, [&] { return freed; });
  EXPECT_EQ(ReportCount(), 0) << Reports();
}

// brisk_trim takes the frees queued to another thread's debug heap, as it does for thread heaps:
// a worker's debug blocks, freed by this thread, leave this thread's quarantine and go to the
// worker's queue; the worker does not allocate again, so nothing else drains it.
TEST_F(DebugMode, TrimTakesTheFreesQueuedToAnotherThreadsDebugHeap) {
  constexpr int kBlocks = 240;  // 24 MiB: the first 16 MiB leave this thread's 8 MiB shard
  std::vector<void*> blocks;
  ExpectTrimTakesBackWhileAWorkerLives(
      [&] {
        for (int i = 0; i < kBlocks; ++i) blocks.push_back(brisk_malloc(kCollectBlock));
      },
      [&] {
        for (void* p : blocks) brisk_free(p);
        blocks.resize(kBlocks / 2);
        brisk_thread_collect();  // this thread's outgoing frees reach the worker's queue
        return blocks;
      });
  EXPECT_EQ(ReportCount(), 0) << Reports();
}

// brisk_trim empties the quarantine: each block in it is checked and freed, and its pages go
// back with the rest. Before, a thread's last freed blocks stayed quarantined until newer frees
// pushed them out, and kept the spans they lay in: in a debug-mode process whose worker freed
// 100,000 small blocks in random order and exited, brisk_trim gave back 1.2 MiB of 35.
TEST_F(DebugMode, TrimEmptiesTheQuarantineAndGivesBackItsBlocksPages) {
  constexpr int kBlocks = 40;  // 4 MiB: all of them in this thread's 8 MiB shard
  std::vector<void*> blocks;
  for (int i = 0; i < kBlocks; ++i) blocks.push_back(brisk_malloc(kCollectBlock));
  for (void* p : blocks) brisk_free(p);
  size_t before = brisk_test::ResidentIn(blocks, kCollectBlock);
  ASSERT_GE(before, blocks.size() * kCollectBlock / 2) << "written with the freed pattern";
  brisk_trim();
  size_t after = brisk_test::ResidentIn(blocks, kCollectBlock);
  EXPECT_LT(after, before / 16) << "resident KiB before " << (before >> 10) << ", after " << (after >> 10);
  EXPECT_EQ(ReportCount(), 0) << Reports();
}

// ... and checks them as they leave: a write after free is reported by the trim.
TEST_F(DebugMode, TrimReportsAWriteAfterFreeInABlockItTakesOutOfTheQuarantine) {
  auto* p = static_cast<char*>(brisk_malloc(200));
  brisk_free(p);
  p[11] = 1;  // in quarantine (its heap's batch on the way there): the debug block's memory
  brisk_trim();
  EXPECT_EQ(ReportCount(), 1) << Reports();
  EXPECT_NE(Reports().find("write after free: the freed block"), std::string::npos) << Reports();
  EXPECT_NE(Reports().find("11(1)"), std::string::npos) << Reports();
}

std::atomic<std::uint64_t> g_fake_now{1'000'000};
std::uint64_t FakeClock() { return g_fake_now.load(); }

// Without a call: the background pass empties the quarantine shard that no block was pushed to
// for BRISK_IDLE_MS (a thread that stopped freeing), and the spans of those blocks go back as
// for any idle thread. Before, that RSS stayed (the process above kept 35 MiB; 5 MiB now, 1.5
// s after the worker went idle). The test process runs without the background thread
// (BRISK_BACKGROUND=0, tests/CMakeLists.txt): the passes are the test's, on a fake clock.
TEST_F(DebugMode, TheBackgroundPassEmptiesTheQuarantineOfAThreadThatStoppedFreeing) {
  ASSERT_STREQ(getenv("BRISK_BACKGROUND"), "0") << "run through ctest (debug_mode_test)";
  brisk::platform::set_clock_for_test(FakeClock);
  constexpr int kBlocks = 40;  // 4 MiB: all of them in the worker's 8 MiB shard
  std::vector<void*> blocks;
  std::atomic<int> step{0};
  std::thread worker([&] {
    for (int i = 0; i < kBlocks; ++i) blocks.push_back(brisk_malloc(kCollectBlock));
    for (void* p : blocks) brisk_free(p);
    step.store(1);
    while (step.load() != 2) std::this_thread::yield();  // alive, and idle
  });
  while (step.load() != 1) std::this_thread::yield();
  size_t before = brisk_test::ResidentIn(blocks, kCollectBlock);
  EXPECT_GE(before, blocks.size() * kCollectBlock / 2) << "written with the freed pattern";
  // Passes twice the idle time and the purge delay apart: the shard and the worker's debug heap
  // turn idle, the blocks leave, the heap's queue is reclaimed, the free pages decay.
  const auto idle_ms = static_cast<std::uint64_t>(brisk::options::get(brisk::options::Id::kIdleMs));
  const auto delay_ms = static_cast<std::uint64_t>(brisk::options::get(brisk::options::Id::kPurgeDelayMs));
  for (int pass = 0; pass < 8; ++pass) {
    g_fake_now += 2 * (idle_ms > delay_ms ? idle_ms : delay_ms);
    brisk::background_pass(g_fake_now.load());
  }
  size_t after = brisk_test::ResidentIn(blocks, kCollectBlock);
  step.store(2);
  worker.join();
  brisk::platform::set_clock_for_test(nullptr);
  EXPECT_LT(after, before / 16) << "resident KiB before " << (before >> 10) << ", after " << (after >> 10);
  EXPECT_EQ(ReportCount(), 0) << Reports();
}

// A debug heap also takes partly used spans of exited threads (central pools), whose live
// release blocks are freed the release way. Telling them from debug blocks must not read the
// header's bytes before the pointer, which belong to the block before it, another thread's data (a
// ThreadSanitizer race in the switching test below): a debug block's user pointer is never a
// block start. Here that neighbour holds what a debug header's check word would: the free is
// still a release free, with no report (before, it was taken for a debug block and reported).
// Last in the file: its exited thread leaves an abandoned chunk whose free pages later heaps
// take, which would move the debug heaps' blocks of the thread-collect and trim tests above.
TEST_F(DebugMode, AReleaseBlockInADebugHeapsSpanIsFreedTheReleaseWayWhateverItsNeighbourHolds) {
  constexpr size_t kRelease = 144, kDebugUser = 48;  // 80 + 48 + 8 = 136: the 144 B class too
  static_assert(sizeof(brisk::debug::Header) + kDebugUser + brisk::debug::kGuardBytes == 136);
  constexpr uint64_t kMagic = 0x6272697365646267ull;  // debug/block_ops.h's check word
  while (brisk_debug_active()) brisk_debug_exit();
  std::vector<char*> released;  // kept live by an exited thread, in spans with free room
  std::thread([&released] {
    std::vector<char*> all;
    for (int i = 0; i < 1024; ++i) all.push_back(static_cast<char*>(brisk_malloc(kRelease)));
    for (size_t i = 0; i < all.size(); ++i) {
      if (i % 4 == 3) brisk_free(all[i]);
      else released.push_back(all[i]);
    }
  }).join();
  brisk_debug_enter();
  std::vector<void*> debug_blocks;
  brisk::Span* shared = nullptr;
  for (int i = 0; i < 512 && shared == nullptr; ++i) {
    void* d = brisk_malloc(kDebugUser);
    debug_blocks.push_back(d);
    auto a = reinterpret_cast<uintptr_t>(d);
    brisk::Span* s = brisk::chunk_of(a)->span_of(a);
    for (char* r : released) {
      auto ra = reinterpret_cast<uintptr_t>(r);
      if (brisk::chunk_of(ra)->span_of(ra) == s) shared = s;
    }
  }
  ASSERT_NE(shared, nullptr) << "no debug block landed in an exited thread's span";
  // A release block of that span whose neighbour before it is one of ours, live.
  char* victim = nullptr;
  for (char* r : released) {
    auto ra = reinterpret_cast<uintptr_t>(r);
    if (brisk::chunk_of(ra)->span_of(ra) != shared) continue;
    if (std::find(released.begin(), released.end(), r - kRelease) != released.end()) victim = r;
  }
  ASSERT_NE(victim, nullptr);
  const uint64_t check = kMagic ^ reinterpret_cast<uintptr_t>(victim);
  std::memcpy(victim - sizeof(brisk::debug::Header), &check, sizeof check);  // the neighbour's own bytes
  brisk_free(victim);
  EXPECT_EQ(ReportCount(), 0) << Reports();
  for (char* r : released)
    if (r != victim) brisk_free(r);
  for (void* d : debug_blocks) brisk_free(d);
  EXPECT_EQ(ReportCount(), 0) << Reports();
}

}  // namespace
