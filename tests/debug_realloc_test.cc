// Debug mode's realloc: the new pattern past the bytes kept, the canary at the new end, in
// place where the block's memory has room or grows, moved otherwise (and always with
// BRISK_DEBUG_REALLOC_MOVES), placed to grow again, and a failed realloc that leaves the block
// as it was.
#include <brisk/brisk.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/chunk.h"
#include "debug/block.h"
#include "debug/block_layout.h"
#include "tests/debug_mode_fixture.h"
#include "tests/test_util.h"

namespace {

// A block of `from` bytes, filled with `byte`, then reallocated to `to`: the pointer before and
// the one realloc returned (both null when the malloc failed).
struct Resized {
  unsigned char* before;
  unsigned char* after;
};
Resized FillAndRealloc(size_t from, size_t to, unsigned char byte) {
  auto* p = static_cast<unsigned char*>(brisk_malloc(from));
  if (p == nullptr) return {nullptr, nullptr};
  std::memset(p, byte, from);
  return {p, static_cast<unsigned char*>(brisk_realloc(p, to))};
}

static_assert(sizeof(brisk::debug::Header) + 40 + brisk::debug::kGuardBytes == 128, "the in-place resizes below");

// The address of the block that debug block p is carved from.
std::uintptr_t underlying_of(void* p) {
  using brisk::debug::Header;
  return reinterpret_cast<std::uintptr_t>(brisk::debug::underlying_of(reinterpret_cast<Header*>(static_cast<char*>(p) - sizeof(Header))));
}

// realloc gives the new block the new pattern only past the bytes it copies (the copy would
// overwrite the rest at once), or, resizing in place, past the old size: the result is the old
// bytes, then the new pattern up to the new size (on a block above the fill limit, where its
// edges carry it), then an intact canary, for growth and shrinking within and across small,
// medium and large blocks; with BRISK_DEBUG_REALLOC_MOVES, every one of them moves.
TEST_F(DebugMode, AReallocatedBlockHoldsTheOldBytesThenTheNewPatternThenItsCanary) {
  using brisk::debug::kFillEdgeBytes;
  brisk::debug::set_fill_limit(256 * 1024);
  const struct {
    size_t from, to;
  } moves[] = {{40, 100}, {100, 40}, {40, 48}, {5000, 70000}, {70000, 9000}, {70000, 70100}, {70000, 600000},
               {600000, size_t{3} << 20}, {size_t{3} << 20, size_t{4} << 20}, {size_t{4} << 20, size_t{3} << 20},
               // Above the limit, copies that end inside the first edge and inside the last.
               {100, 300000}, {298000, 300000}};
  for (bool always_move : {true, false}) {
    brisk::debug::set_realloc_moves(always_move);
    for (const auto& m : moves) {
      auto [p, q] = FillAndRealloc(m.from, m.to, 0x11);
      ASSERT_NE(q, nullptr);
      if (always_move) {
        ASSERT_NE(q, p) << m.from << " -> " << m.to << ": BRISK_DEBUG_REALLOC_MOVES moves every block";
      }
      const size_t kept = std::min(m.from, m.to);
      const bool edges = m.to > 256 * 1024;
      // The copied bytes sampled (never past their end), every byte after them.
      for (size_t i = 0; i < m.to; i += (i < kept ? std::min(1 + i / 16, kept - i) : 1)) {
        if (i < kept) {
          ASSERT_EQ(q[i], 0x11) << m.from << " -> " << m.to << " at " << i;
        } else if (!edges || i < kFillEdgeBytes || i >= m.to - kFillEdgeBytes) {
          ASSERT_EQ(q[i], brisk::debug::kAllocByte) << m.from << " -> " << m.to << " at " << i;
        }
      }
      EXPECT_EQ(brisk_usable_size(q), m.to);
      EXPECT_EQ(brisk::debug::check_block(q), 0) << m.from << " -> " << m.to << Reports();
      brisk_free(q);
    }
  }
  brisk::debug::set_realloc_moves(false);
  brisk::debug::set_fill_limit(DefaultFillLimit());
  EXPECT_EQ(ReportCount(), 0) << Reports();
  EXPECT_EQ(brisk_check_heap(), 0) << Reports();
}

// Debug mode resizes a block where it lies when the memory it is carved from has room (a small
// block's class, a medium run's last page) or grows there: the pointer stays, the canary moves
// to the new end (an overrun of one byte past it is caught, a write where the old canary was is
// not), and the header's new size is sealed (brisk_check_heap finds the block sound).
TEST_F(DebugMode, AReallocWithRoomResizesInPlaceAndMovesTheCanary) {
  const struct {
    size_t from, to;
  } resizes[] = {{32, 40},  // 80 + 32 + 8 = 120 B in the 128 B class, which holds 40 as well
                 {48, 24},
                 {70000, 70100},
                 {200000, 80000},
                 {size_t{3} << 20, (size_t{3} << 20) + 100},
                 {size_t{3} << 20, size_t{1} << 20}};  // the mapping shrinks
  for (const auto& r : resizes) {
    auto [p, q] = FillAndRealloc(r.from, r.to, 0x22);
    ASSERT_NE(p, nullptr);
    ASSERT_EQ(q, p) << r.from << " -> " << r.to << ": the block had room where it lies";
    EXPECT_EQ(brisk_usable_size(q), r.to);
    EXPECT_EQ(brisk_check_heap(), 0) << r.from << " -> " << r.to << Reports();
    std::memset(q, 0x33, r.to);  // over the old canary when the block grew
    EXPECT_EQ(brisk::debug::check_block(q), 0) << r.from << " -> " << r.to << Reports();
    q[r.to] ^= 0x01;
    EXPECT_EQ(brisk::debug::check_block(q), 1) << r.from << " -> " << r.to << ": an overrun past the new size went unseen";
    q[r.to] ^= 0x01;
    EXPECT_EQ(brisk::debug::check_block(q), 0) << r.from << " -> " << r.to << Reports();
    brisk_free(q);
  }
  EXPECT_EQ(ReportCount(), static_cast<int>(sizeof resizes / sizeof resizes[0])) << Reports();
  std::lock_guard<std::mutex> g(g_reports_mutex);
  g_reports.clear();
  g_report_count = 0;
}

// A block that realloc moves to grow is placed for its next steps (debug::Growth, which the
// entry layer's grow_elsewhere asks for): with room, its medium run takes pages for the room,
// so growing into them stays in place whatever lies after the run; large, it is carved from a
// large block even below the medium sizes' bound.
TEST_F(DebugMode, AGrowingBlockIsPlacedToGrowAgainInPlace) {
  auto* p = static_cast<unsigned char*>(brisk::debug::allocate(250000, 16, brisk::debug::Kind::kMalloc, false, {375000, false}));
  ASSERT_NE(p, nullptr);
  std::uintptr_t u = underlying_of(p);
  ASSERT_EQ(brisk::region_kind(u), brisk::kRegionChunk);
  EXPECT_GE(brisk::chunk_of(u)->span_of(u)->page_count * brisk::kPageSize, 375000 + sizeof(brisk::debug::Header) + brisk::debug::kGuardBytes)
      << "the run took no pages for the room";
  std::memset(p, 0x44, 250000);
  auto* q = static_cast<unsigned char*>(brisk_realloc(p, 370000));
  EXPECT_EQ(q, p) << "growing into the room moved the block";
  EXPECT_EQ(q[249999], 0x44);
  EXPECT_EQ(q[250000], brisk::debug::kAllocByte);
  EXPECT_EQ(brisk::debug::check_block(q), 0) << Reports();
  brisk_free(q);

  auto* l = static_cast<unsigned char*>(brisk::debug::allocate(300000, 16, brisk::debug::Kind::kMalloc, false, {0, true}));
  ASSERT_NE(l, nullptr);
  EXPECT_NE(brisk::region_kind(underlying_of(l)), brisk::kRegionChunk) << "a 300 KB block asked to be large is in a chunk";
  EXPECT_EQ(brisk_usable_size(l), 300000u);
  EXPECT_EQ(brisk::debug::check_block(l), 0) << Reports();
  brisk_free(l);
  EXPECT_EQ(ReportCount(), 0) << Reports();
}

// A shrink keeps no more than release mode would: a block that falls to half its small class
// or less, a medium block that would fit a small class, a large one at 256 KiB or less move.
TEST_F(DebugMode, AShrinkThatReleaseModeWouldMoveMoves) {
  const struct {
    size_t from, to;
  } shrinks[] = {{1000, 100}, {200000, 100}, {200000, 60000}, {size_t{3} << 20, 200000}};
  for (const auto& r : shrinks) {
    auto [p, q] = FillAndRealloc(r.from, r.to, 0x55);
    ASSERT_NE(q, nullptr);
    EXPECT_NE(q, p) << r.from << " -> " << r.to << ": the block kept memory release mode gives back";
    EXPECT_EQ(q[r.to - 1], 0x55);
    EXPECT_EQ(brisk::debug::check_block(q), 0) << Reports();
    brisk_free(q);
  }
  EXPECT_EQ(ReportCount(), 0) << Reports();
}

// The entry layer places a debug block that realloc must move to grow as it places a release
// block (grow_elsewhere): past 256 KiB a large block, and by less than half again a medium run
// with room for half again (a small block cannot grow into the medium sizes where it lies, so
// both moves are certain).
TEST_F(DebugMode, ReallocPlacesAMovedGrowingBlockToGrowAgain) {
  void* p = brisk_malloc(62000);
  ASSERT_EQ(brisk::region_kind(underlying_of(p)), brisk::kRegionChunk);
  void* q = brisk_realloc(p, 92000);
  ASSERT_NE(q, nullptr);
  std::uintptr_t u = underlying_of(q);
  ASSERT_EQ(brisk::region_kind(u), brisk::kRegionChunk);
  // 92,000 bytes and the header would take two 64 KiB pages; the room for 138,000 takes three.
  EXPECT_GE(brisk::chunk_of(u)->span_of(u)->page_count, 3) << "the moved block got no room to grow";
  brisk_free(q);
  p = brisk_malloc(60000);
  q = brisk_realloc(p, 300000);
  ASSERT_NE(q, nullptr);
  EXPECT_NE(brisk::region_kind(underlying_of(q)), brisk::kRegionChunk) << "a block grown past 256 KiB is not large";
  EXPECT_EQ(brisk::debug::check_block(q), 0) << Reports();
  brisk_free(q);
  EXPECT_EQ(ReportCount(), 0) << Reports();
}

// A block resized in place past the fill limit carries its freed pattern on its edges only, and
// one shrunk below it on every byte again: the header's flag follows the size (an edges-only
// flag left on a block shrunk below two edges would make the fills run past its start).
TEST_F(DebugMode, AResizeInPlaceAcrossTheFillLimitMovesTheFilledParts) {
  brisk::debug::set_fill_limit(100000);
  auto* p = static_cast<unsigned char*>(brisk::debug::allocate(70000, 16, brisk::debug::Kind::kMalloc, false, {200000, false}));
  ASSERT_NE(p, nullptr);
  auto* q = static_cast<unsigned char*>(brisk_realloc(p, 150000));
  ASSERT_EQ(q, p) << "the room did not take the growth";
  brisk_free(q);
  q[75000] = 0x12;  // after the free, in the middle: unseen above the limit
  EXPECT_EQ(brisk::debug::check_block(q), 0) << "a block grown past the fill limit was checked whole" << Reports();
  q[75000] = brisk::debug::kFreedByte;

  p = static_cast<unsigned char*>(brisk::debug::allocate(150000, 16, brisk::debug::Kind::kMalloc, false));
  ASSERT_NE(p, nullptr);
  q = static_cast<unsigned char*>(brisk_realloc(p, 80000));
  ASSERT_EQ(q, p) << "a medium shrink moved";
  brisk_free(q);
  q[40000] = 0x12;
  EXPECT_EQ(brisk::debug::check_block(q), 1) << "a block shrunk below the fill limit was checked on its edges only";
  q[40000] = brisk::debug::kFreedByte;
  brisk::debug::set_fill_limit(DefaultFillLimit());
  EXPECT_EQ(ReportCount(), 1) << Reports();
  std::lock_guard<std::mutex> g(g_reports_mutex);
  g_reports.clear();
  g_report_count = 0;
}

// A new[] block reallocated (a misuse, reported) is a malloc block afterwards, as a moved one
// would be: freeing it with free is no second misuse.
TEST_F(DebugMode, ABlockReallocatedInPlaceIsAMallocBlock) {
  void* p = brisk::debug::allocate(32, 16, brisk::debug::Kind::kNewArray, false);
  ASSERT_NE(p, nullptr);
  void* q = brisk_realloc(p, 36);  // within the 128 B class, as the resize test's 32 -> 40
  ASSERT_EQ(q, p) << "32 -> 36 moved";
  EXPECT_EQ(ReportCount(), 1) << Reports();
  brisk_free(q);
  EXPECT_EQ(ReportCount(), 1) << "the free of the reallocated block was reported as well:\n" << Reports();
  std::lock_guard<std::mutex> g(g_reports_mutex);
  g_reports.clear();
  g_report_count = 0;
}

TEST_F(DebugMode, AFailedReallocLeavesTheBlockLiveAndIntact) {
  auto* p = static_cast<char*>(brisk_malloc(40));
  std::memcpy(p, "0123456789abcdefghijklmnopqrstuvwxyzABC", 40);
  errno = 0;
  EXPECT_EQ(brisk_realloc(p, std::size_t{1} << 62), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  EXPECT_EQ(std::memcmp(p, "0123456789abcdefghijklmnopqrstuvwxyzABC", 40), 0);
  EXPECT_EQ(brisk_usable_size(p), 40u);
  EXPECT_EQ(brisk_check_heap(), 0) << Reports();
  auto* q = static_cast<char*>(brisk_realloc(p, 60));  // live again: realloc and free work
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(std::memcmp(q, "0123456789abcdefghijklmnopqrstuvwxyzABC", 40), 0);
  brisk_free(q);
  EXPECT_EQ(ReportCount(), 0) << Reports();
}

// Under a limit on address space, a large debug block first gets the room that freed blocks
// hold: the quarantine's, and the chunks and cached mappings they went back to (as release
// mode's large blocks do).
TEST_F(DebugMode, ALargeDebugBlockGetsTheRoomFreedBlocksHeldBeforeItFails) {
  constexpr size_t kMiB = size_t{1} << 20;
  const int code = brisk_test::ExitStatusUnderAddressLimit(512 * kMiB, [] {
    std::vector<void*> small;
    for (size_t i = 0; i < 200 * kMiB / (16 << 10); ++i) {
      void* b = brisk_malloc(16 << 10);  // debug blocks in new chunks, 200 MiB of them
      if (b == nullptr) return 12;
      small.push_back(b);
    }
    for (void* b : small) brisk_free(b);  // the quarantine holds some; their chunks stay mapped
    // With the quarantine's 64 MiB (BRISK_DEBUG_QUARANTINE under ctest) still in their chunks,
    // this does not fit.
    char* whole = static_cast<char*>(brisk_malloc(480 * kMiB));
    if (whole == nullptr) return 13;
    whole[0] = whole[480 * kMiB - 1] = 1;
    brisk_free(whole);
    return 0;
  });
  ASSERT_GE(code, 0) << "the child died";
  EXPECT_NE(code, 13) << "a 480 MiB debug block failed while freed blocks held the room";
  EXPECT_EQ(code, 0) << "10: no VmSize; 11: setrlimit refused; 12: 200 MiB of 16 KiB blocks did not fit";
}

}  // namespace
