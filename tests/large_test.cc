// Large blocks (mapping cache, mremap growth) and in-place realloc of medium blocks.
#include <brisk/brisk.h>
#include "tests/test_util.h"
#include <gtest/gtest.h>

#include <errno.h>
#include <sys/mman.h>

#include <cstring>

#include "core/chunk.h"
#include "core/config.h"
#include "core/large.h"

namespace brisk {
namespace {

TEST(LargeCache, AFreedMappingIsReusedForTheSameSize) {
  constexpr std::size_t kSize = 8 << 20;
  void* a = brisk_malloc(kSize);
  ASSERT_NE(a, nullptr);
  std::memset(a, 0x5A, kSize);
  brisk_stats live = brisk_test::Stats();
  EXPECT_GE(live.large_live_blocks, 1u);
  brisk_free(a);
  brisk_stats cached = brisk_test::Stats();
  EXPECT_GE(cached.large_bytes_cached, kSize) << "the mapping went to the cache";
  void* b = brisk_malloc(kSize);
  EXPECT_EQ(b, a) << "same size, same mapping";
  EXPECT_EQ(brisk_test::Stats().os_map_calls, cached.os_map_calls) << "no new mmap";
  brisk_free(b);
  // calloc from the cache must still read zeros.
  auto* z = static_cast<unsigned char*>(brisk_calloc(1, kSize));
  ASSERT_NE(z, nullptr);
  for (std::size_t i = 0; i < kSize; i += 4096) ASSERT_EQ(z[i], 0) << i;
  brisk_free(z);
  brisk_thread_collect();
  EXPECT_EQ(brisk_test::Stats().large_bytes_cached, 0u) << "collect returns the cache to the OS";
}

TEST(LargeCache, ADoubleFreeOfALargeBlockIsReported) {
  void* a = brisk_malloc(6 << 20);
  ASSERT_NE(a, nullptr);
  brisk_free(a);
  EXPECT_DEATH(brisk_free(a), "brisk: invalid free of");
}

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

TEST(LargeRealloc, AMoveLeavesTheVacatedRegionToItsNextOwner) {
  constexpr std::size_t kSize = 3 << 20;
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
  // Grow step by step to 1 MiB: with nothing allocated after it in a fresh chunk, every step
  // stays in place.
  void* original = p;
  for (std::size_t size = 200 * 1024; size <= kMediumMax; size += 200 * 1024) {
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
  EXPECT_EQ(brisk_usable_size(s), 2 * kPageSize);
  EXPECT_EQ(s[70 * 1024 - 1], 0x3C);
  brisk_free(s);
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

}  // namespace
}  // namespace brisk
