// Realloc of large blocks (mremap growth, growth into the cached space after a mapping, moves)
// and in-place realloc of medium blocks, and the medium limit realloc crosses.
#include <brisk/brisk.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "core/chunk.h"
#include "core/config.h"
#include "core/large.h"
#include "core/options.h"
#include "core/platform.h"
#include "core/stats.h"
#include "tests/os_calls.h"
#include "tests/test_util.h"

namespace brisk {
namespace {

TEST(LargeRealloc, GrowsAndShrinksKeepingContentsAndAlignment) {
  std::size_t size = 3 << 20;
  auto* p = static_cast<unsigned char*>(brisk_aligned_alloc(1 << 20, size));
  ASSERT_NE(p, nullptr);
  for (std::size_t i = 0; i < size; i += 997) p[i] = static_cast<unsigned char>(i * 7);
  for (std::size_t grow = size * 2; grow <= (48u << 20); grow *= 2) {
    auto* q = static_cast<unsigned char*>(brisk_realloc(p, grow));
    ASSERT_NE(q, nullptr);
    for (std::size_t i = 0; i < size; i += 997) ASSERT_EQ(q[i], static_cast<unsigned char>(i * 7)) << i;
    EXPECT_GE(brisk_usable_size(q), grow);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(q) % kOsPageSize, 0u);
    p = q;
  }
  auto* s = static_cast<unsigned char*>(brisk_realloc(p, size));
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s, p) << "a large shrink stays in place";
  for (std::size_t i = 0; i < size; i += 997) ASSERT_EQ(s[i], static_cast<unsigned char>(i * 7)) << i;
  EXPECT_GE(brisk_usable_size(s), size);
  EXPECT_LT(brisk_usable_size(s), size * 2) << "the shrink gave the tail back";
  brisk_free(s);
}

// Between a realloc's move of a large block's pages and its update of the region map, the
// vacated address space is free: another thread may map a large block there at once, and mark
// the region as its own. The hook stands in for that thread, doing what large_alloc does for a
// block mapped at the old base.
void* g_moved_from = nullptr;
std::uint8_t g_newcomer_kind = kRegionNone;
void NewcomerTakesTheRegion(void* old_p) {
  g_moved_from = old_p;
  region_set(reinterpret_cast<std::uintptr_t>(old_p), g_newcomer_kind);
}

// A large block grows into the cached space right after its mapping, without a system call:
// a block carved from the front of a fresh mapping has the rest of it cached there, which made
// mremap in place fail and every growth move to fresh pages.
TEST(LargeRealloc, GrowsInPlaceIntoTheCachedSpaceAfterIt) {
  brisk_thread_collect();  // an empty cache: the block comes from a fresh mapping
  constexpr std::size_t kSize = 3 << 20;
  auto* p = static_cast<char*>(brisk_malloc(kSize));
  ASSERT_NE(p, nullptr);
  brisk_test::Fill(p, kSize, 7);
  const auto cached = static_cast<std::int64_t>(stats::sum(&stats::Stripe::large_bytes_cached));
  ASSERT_GT(cached, std::int64_t{6} << 20) << "the rest of the fresh mapping is cached";
  OsCalls before;
  auto* q = static_cast<char*>(brisk_realloc(p, 5 << 20));
  ASSERT_EQ(q, p) << "grown in place";
  std::memset(q + kSize, 0x33, (5 << 20) - kSize);
  auto* r = static_cast<char*>(brisk_realloc(q, 9 << 20));
  ASSERT_EQ(r, p) << "and again";
  OsCalls after;
  EXPECT_EQ(after.map, before.map) << "no mapping made";
  EXPECT_EQ(after.unmap, before.unmap);
  EXPECT_GE(brisk_usable_size(r), std::size_t{9} << 20);
  EXPECT_LE(static_cast<std::int64_t>(stats::sum(&stats::Stripe::large_bytes_cached)), cached - (std::int64_t{6} << 20))
      << "the growth came out of the cache";
  EXPECT_TRUE(brisk_test::Verify(r, kSize, 7));
  for (std::size_t i = kSize; i < (std::size_t{5} << 20); i += 4096) ASSERT_EQ(r[i], 0x33) << i;
  std::memset(r + (5 << 20), 0x44, std::size_t{4} << 20);
  brisk_free(r);
  brisk_thread_collect();
}

// A block that realloc grows past 256 KiB and must move becomes a large block even below
// BRISK_MEDIUM_MAX, and then grows in place; malloc of the same size still makes a medium block.
TEST(LargeRealloc, ABlockGrownPast256KiBBecomesLargeAndKeepsGrowingInPlace) {
  brisk_thread_collect();
  if (static_cast<std::size_t>(options::get(options::Id::kMediumMax)) < (std::size_t{512} << 10))
    GTEST_SKIP() << "BRISK_MEDIUM_MAX below 512 KiB";
  auto* p = static_cast<char*>(brisk_malloc(100));
  ASSERT_NE(p, nullptr);
  brisk_test::Fill(p, 100, 3);
  auto* q = static_cast<char*>(brisk_realloc(p, 300 << 10));  // a small block must move
  ASSERT_NE(q, nullptr);
  EXPECT_TRUE(region_is_large(region_kind(reinterpret_cast<std::uintptr_t>(q)))) << "grown: large";
  EXPECT_TRUE(brisk_test::Verify(q, 100, 3));
  std::memset(q + 100, 0x21, (300 << 10) - 100);
  auto* r = static_cast<char*>(brisk_realloc(q, 480 << 10));
  EXPECT_EQ(r, q) << "grown in place";
  EXPECT_TRUE(brisk_test::Verify(r, 100, 3));
  for (std::size_t i = 100; i < (std::size_t{300} << 10); i += 1000) ASSERT_EQ(r[i], 0x21) << i;
  void* m = brisk_malloc(300 << 10);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(region_kind(reinterpret_cast<std::uintptr_t>(m)), kRegionChunk) << "malloc: medium";
  auto* s = static_cast<char*>(brisk_realloc(r, 200 << 10));  // below 256 KiB: back to a span
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(region_kind(reinterpret_cast<std::uintptr_t>(s)), kRegionChunk) << "shrunk: medium";
  EXPECT_TRUE(brisk_test::Verify(s, 100, 3));
  brisk_free(m);
  brisk_free(s);
  brisk_thread_collect();
}

TEST(LargeRealloc, AMoveLeavesTheVacatedRegionToItsNextOwner) {
  // At least kMinGrow (64 MiB), and from an empty cache, so that no cached space lies after the
  // mapping for it to grow into (growth is then mremap's).
  brisk_thread_collect();
  constexpr std::size_t kSize = 65 << 20;
  void* p = brisk_malloc(kSize);
  ASSERT_NE(p, nullptr);
  auto a = reinterpret_cast<std::uintptr_t>(p);
  LargeHeader* h = large_header_of(p, region_kind(a));
  ASSERT_NE(h, nullptr);
  // Take the page right after the mapping (unless something holds it already), so that growth
  // cannot stay in place.
  char* end = h->base + h->map_size;
  void* blocker = mmap(end, kOsPageSize, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  ASSERT_TRUE(blocker == end || (blocker == MAP_FAILED && errno == EEXIST));
  g_moved_from = nullptr;
  g_newcomer_kind = region_kind(a);
  g_large_moved_test_hook.store(NewcomerTakesTheRegion);
  void* q = brisk_realloc(p, 2 * kSize);
  g_large_moved_test_hook.store(nullptr);
  ASSERT_NE(q, nullptr);
  ASSERT_EQ(g_moved_from, p) << "the realloc moved the block";
  EXPECT_EQ(int{region_kind(a)}, int{g_newcomer_kind})
      << "the move cleared the region of the block mapped there since";
  region_set(a, kRegionNone);  // the newcomer was a stand-in
  EXPECT_EQ(brisk_usable_size(q), 2 * kSize);
  brisk_free(q);
  if (blocker == end) munmap(end, kOsPageSize);
}

TEST(MediumRealloc, GrowsInPlaceIntoFreeNeighbourPages) {
  brisk_thread_collect();
  auto* p = static_cast<unsigned char*>(brisk_malloc(100 * 1024));
  ASSERT_NE(p, nullptr);
  std::memset(p, 0x3C, 100 * 1024);
  // Grow step by step to the largest medium block: with nothing allocated after it in a fresh
  // chunk, every step stays in place.
  void* original = p;
  const auto max = static_cast<std::size_t>(options::get(options::Id::kMediumMax));
  for (std::size_t size = 132 * 1024; size <= max; size += 32 * 1024) {
    auto* q = static_cast<unsigned char*>(brisk_realloc(p, size));
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q, original) << "moved at " << size;
    EXPECT_EQ(q[100 * 1024 - 1], 0x3C);
    EXPECT_GE(brisk_usable_size(q), size);
    p = q;
  }
  // And shrinks in place, giving pages back.
  auto* s = static_cast<unsigned char*>(brisk_realloc(p, 70 * 1024));
  EXPECT_EQ(s, original);
  EXPECT_EQ(brisk_usable_size(s), 70 * 1024u);
  EXPECT_EQ(chunk_of(reinterpret_cast<std::uintptr_t>(s))->span_of(reinterpret_cast<std::uintptr_t>(s))->page_count, 2u)
      << "the pages past the new size went back to the chunk";
  EXPECT_EQ(s[70 * 1024 - 1], 0x3C);
  brisk_free(s);
}

unsigned PagesOfRun(const void* p) {
  auto a = reinterpret_cast<std::uintptr_t>(p);
  return chunk_of(a)->span_of(a)->page_count;
}

// A block that must move to grow by less than half gets pages for half its new size again, so
// its next small steps stay in place; one that grows by half or more gets only the pages it
// needs (a block doubled once, as MMtest medium does, would not use them).
TEST(MediumRealloc, ABlockMovedByASmallStepGetsRoomToGrowInPlace) {
  std::thread([] {
    constexpr std::size_t kK = 1024;
    auto* a = static_cast<unsigned char*>(brisk_malloc(100 * kK));  // two 64 KiB pages
    void* blocker = brisk_malloc(100 * kK);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(blocker, nullptr);
    ASSERT_EQ(static_cast<unsigned char*>(blocker), a + 2 * kPageSize) << "a new thread's blocks were expected side by side";
    for (std::size_t i = 0; i < 100 * kK; ++i) a[i] = static_cast<unsigned char>(i * 7);
    auto* b = static_cast<unsigned char*>(brisk_realloc(a, 140 * kK));  // three pages: a must move
    ASSERT_NE(b, nullptr);
    ASSERT_NE(b, a) << "the neighbour was expected to make the block move";
    EXPECT_EQ(PagesOfRun(b), 4u) << "pages for 210 KiB: 140 KiB and half again";
    EXPECT_EQ(brisk_usable_size(b), 140 * kK);
    void* blocker2 = brisk_malloc(100 * kK);  // takes the pages after b's run, if free
    ASSERT_NE(blocker2, nullptr);
    auto* c = static_cast<unsigned char*>(brisk_realloc(b, 250 * kK));
    EXPECT_EQ(c, b) << "the next step grew into the room";
    for (std::size_t i = 0; i < 100 * kK; ++i) ASSERT_EQ(c[i], static_cast<unsigned char>(i * 7)) << i;

    auto* d = static_cast<unsigned char*>(brisk_malloc(100 * kK));
    void* blocker3 = brisk_malloc(100 * kK);
    ASSERT_NE(d, nullptr);
    ASSERT_NE(blocker3, nullptr);
    ASSERT_EQ(static_cast<unsigned char*>(blocker3), d + 2 * kPageSize);
    auto* e = static_cast<unsigned char*>(brisk_realloc(d, 200 * kK));
    ASSERT_NE(e, nullptr);
    ASSERT_NE(e, d);
    EXPECT_EQ(PagesOfRun(e), 4u) << "a step of half or more: only the pages 200 KiB needs";
    for (void* q : {blocker, blocker2, blocker3, static_cast<void*>(c), static_cast<void*>(e)}) brisk_free(q);
    brisk_thread_collect();
  }).join();
}

TEST(MediumRealloc, MovesWhenTheNeighbourIsTaken) {
  auto* a = static_cast<unsigned char*>(brisk_malloc(100 * 1024));
  void* b = brisk_malloc(100 * 1024);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  for (int i = 0; i < 100 * 1024; ++i) a[i] = static_cast<unsigned char>(i);
  auto* c = static_cast<unsigned char*>(brisk_realloc(a, 600 * 1024));
  ASSERT_NE(c, nullptr);
  if (reinterpret_cast<unsigned char*>(b) == a + 2 * kPageSize) EXPECT_NE(c, a);
  for (int i = 0; i < 100 * 1024; ++i) ASSERT_EQ(c[i], static_cast<unsigned char>(i)) << i;
  brisk_free(b);
  brisk_free(c);
}


// BRISK_MEDIUM_MAX (1m balanced, 512k low-memory): a block above it is a mapping of its own, so a
// big block does not need a long run of free pages in a chunk. Switching moves the next
// allocation; realloc across the limit moves a block, keeping its contents, and a large block
// grows as a large block.
TEST(MediumMax, LowMemoryMakesBlocksAbove512KiBLargeAndReallocCrossesTheLimit) {
  const brisk_strategy before = brisk_get_strategy();
  brisk_set_strategy(BRISK_STRATEGY_BALANCED);
  void* m = brisk_malloc(1 << 20);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(region_kind(reinterpret_cast<std::uintptr_t>(m)), kRegionChunk) << "balanced: 1 MiB is medium";
  brisk_set_strategy(BRISK_STRATEGY_LOW_MEMORY);
  void* l = brisk_malloc(1 << 20);
  ASSERT_NE(l, nullptr);
  EXPECT_TRUE(region_is_large(region_kind(reinterpret_cast<std::uintptr_t>(l)))) << "low-memory: 1 MiB is large";
  void* at_limit = brisk_malloc(512 * 1024);
  EXPECT_EQ(region_kind(reinterpret_cast<std::uintptr_t>(at_limit)), kRegionChunk) << "512 KiB is still medium";
  auto* r = static_cast<unsigned char*>(brisk_malloc(300 * 1024));
  ASSERT_NE(r, nullptr);
  for (std::size_t i = 0; i < 300 * 1024; ++i) r[i] = static_cast<unsigned char>(i * 7);
  r = static_cast<unsigned char*>(brisk_realloc(r, 700 * 1024));
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(region_is_large(region_kind(reinterpret_cast<std::uintptr_t>(r)))) << "grown past the limit";
  r = static_cast<unsigned char*>(brisk_realloc(r, 900 * 1024));
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(region_is_large(region_kind(reinterpret_cast<std::uintptr_t>(r))));
  for (std::size_t i = 0; i < 300 * 1024; ++i) ASSERT_EQ(r[i], static_cast<unsigned char>(i * 7)) << i;
  brisk_set_strategy(before);
  brisk_free(m);
  brisk_free(l);
  brisk_free(at_limit);
  brisk_free(r);
}

}  // namespace
}  // namespace brisk
