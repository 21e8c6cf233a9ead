// Large blocks: the mapping cache (reuse, merging, decay, budgets, its promises), the thread's
// large stash, and a large block's double free. Realloc of large and medium blocks:
// large_realloc_test.cc.
#include <brisk/brisk.h>
#include "tests/os_calls.h"
#include "tests/test_util.h"
#include <gtest/gtest.h>

#include <errno.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <thread>
#include <vector>

#include "core/chunk.h"
#include "core/config.h"
#include "core/large.h"
#include "core/options.h"
#include "core/platform.h"
#include "core/stats.h"
#include "threadcache/background.h"

namespace brisk {
namespace {

// Bytes of [p, p+n) resident now (mincore); 0 where nothing is mapped any more.
std::size_t ResidentOf(const void* p, std::size_t n) {
  auto a = reinterpret_cast<std::uintptr_t>(p) & ~(kOsPageSize - 1);
  std::size_t pages = (reinterpret_cast<std::uintptr_t>(p) + n - a + kOsPageSize - 1) / kOsPageSize;
  std::vector<unsigned char> vec(pages);
  if (mincore(reinterpret_cast<void*>(a), pages * kOsPageSize, vec.data()) != 0) return 0;
  std::size_t resident = 0;
  for (unsigned char v : vec) resident += (v & 1) * kOsPageSize;
  return resident;
}

// Frees p, a block large_alloc returned, as large_free's callers do.
void LargeFree(void* p) { large_free(p, large_header_of(p, region_kind(reinterpret_cast<std::uintptr_t>(p)))); }

std::atomic<std::uint64_t> g_fake_now{0};
std::uint64_t FakeNow() { return g_fake_now.load(); }

// Starts from an empty large cache, on a fake clock far beyond any real one (so no pass the
// process made before looks recent), and gives the real clock back.
class LargeCacheDecay : public ::testing::Test {
 protected:
  void SetUp() override {
    brisk_thread_collect();
    g_fake_now = std::uint64_t{1} << 50;
    platform::set_clock_for_test(FakeNow);
  }
  void TearDown() override {
    platform::set_clock_for_test(nullptr);
    brisk_thread_collect();
  }
  static std::uint64_t Delay() { return static_cast<std::uint64_t>(options::get(options::Id::kLargeDecayMs)); }
  // Allocates a block, writes every page of it and frees it now (g_fake_now): its mapping goes
  // to the cache resident. Returns the freed pointer.
  // every: write one page in that many bytes (0: the whole block).
  static char* FreeATouchedBlock(std::size_t size, std::size_t every = 0) {
    auto* p = static_cast<char*>(brisk_malloc(size));
    EXPECT_NE(p, nullptr);
    if (p == nullptr) return nullptr;
    if (every == 0) {
      std::memset(p, 0x5A, size);
    } else {
      for (std::size_t at = 0; at < size; at += every) std::memset(p + at, 0x5A, kOsPageSize);
    }
    brisk_free(p);
    if (every == 0) EXPECT_EQ(ResidentOf(p, size), size) << "freed blocks are cached as they are";
    return p;
  }
};

TEST_F(LargeCacheDecay, AFreedBlockKeepsItsPagesUntilTheDelayHasPassed) {
  constexpr std::size_t kSize = 8 << 20;
  const std::uint64_t freed = g_fake_now;
  char* p = FreeATouchedBlock(kSize);
  ASSERT_NE(p, nullptr);
  g_fake_now = freed + Delay() - 1;
  bool pending = false;
  EXPECT_EQ(large_cache_decay(g_fake_now, &pending), 0u);
  EXPECT_TRUE(pending) << "a dirty mapping is left to age";
  EXPECT_EQ(ResidentOf(p, kSize), kSize) << "one millisecond before the delay";
  g_fake_now = freed + Delay();
  EXPECT_GE(large_cache_decay(g_fake_now), kSize);
  EXPECT_EQ(ResidentOf(p, kSize), 0u) << "aged out: decommitted";
  EXPECT_GE(brisk_test::Stats().large_bytes_cached, kSize) << "and still cached for reuse";
  auto* z = static_cast<unsigned char*>(brisk_calloc(1, kSize));
  EXPECT_EQ(z, reinterpret_cast<unsigned char*>(p));
  EXPECT_EQ(brisk_test::FirstNonZero(z, kSize), SIZE_MAX);
  brisk_free(z);
}

// A mapping whose pages are locked (mlock, mlockall) cannot be decommitted: the kernel refuses
// MADV_DONTNEED. Aged out all the same, it must not be cached as reading zeros with its old data
// in it: calloc would hand that data out.
TEST_F(LargeCacheDecay, ALockedMappingAgedOutStillGivesCallocZeros) {
  constexpr std::size_t kSize = 4 << 20;  // within RLIMIT_MEMLOCK's usual 8 MiB
  const std::uint64_t freed = g_fake_now;
  auto* p = static_cast<char*>(brisk_malloc(kSize));
  ASSERT_NE(p, nullptr);
  std::memset(p, 0x5A, kSize);
  if (mlock(p, kSize) != 0) {
    brisk_free(p);
    GTEST_SKIP() << "mlock refused (RLIMIT_MEMLOCK)";
  }
  brisk_free(p);
  g_fake_now = freed + Delay();
  large_cache_decay(g_fake_now);
  auto* z = static_cast<unsigned char*>(brisk_calloc(1, kSize));
  ASSERT_NE(z, nullptr);
  EXPECT_EQ(z, reinterpret_cast<unsigned char*>(p)) << "the aged mapping is reused";
  EXPECT_EQ(brisk_test::FirstNonZero(z, kSize), SIZE_MAX) << "calloc returned the locked pages' old data";
  munlock(z, kSize);
  brisk_free(z);
}

TEST_F(LargeCacheDecay, TheBackgroundPassReturnsAgedBlocks) {
  constexpr std::size_t kSize = 8 << 20;
  const std::uint64_t freed = g_fake_now;
  char* p = FreeATouchedBlock(kSize);
  ASSERT_NE(p, nullptr);
  background_pass(freed + Delay() - 1);
  EXPECT_EQ(ResidentOf(p, kSize), kSize) << "not aged yet";
  // The pass runs its decay at most once per purge delay.
  g_fake_now = freed + Delay() + static_cast<std::uint64_t>(options::get(options::Id::kPurgeDelayMs));
  background_pass(g_fake_now);
  EXPECT_EQ(ResidentOf(p, kSize), 0u) << "the pass decommitted the aged block";
}

TEST_F(LargeCacheDecay, ALargeFreeReturnsAnAgedBlockWithoutTheBackgroundThread) {
  constexpr std::size_t kSize = 8 << 20;
  auto* other = static_cast<char*>(brisk_malloc(3 << 20));
  ASSERT_NE(other, nullptr);
  // Kept live between the two, so that other, freed, does not merge with the aged block.
  void* separator = brisk_malloc(3 << 20);
  ASSERT_NE(separator, nullptr);
  char* old_block = FreeATouchedBlock(kSize);
  ASSERT_NE(old_block, nullptr);
  g_fake_now += Delay();
  brisk_free(other);
  EXPECT_EQ(ResidentOf(old_block, kSize), 0u) << "the next large free decayed the aged block";
  brisk_free(separator);
}

// A replacement loop's blocks are carved side by side and merge into one cached entry when
// freed. The entry ages by the mean of its parts' ages weighted by their dirty bytes: bytes
// freed a moment ago are not decommitted with bytes freed long before, and the whole entry
// still goes back at most the delay after the last free into it.
TEST_F(LargeCacheDecay, AMergedEntryAgesByTheMeanOfItsParts) {
  constexpr std::size_t kSize = 8 << 20;
  const std::uint64_t t0 = g_fake_now;
  auto* a = static_cast<char*>(brisk_malloc(kSize));
  auto* b = static_cast<char*>(brisk_malloc(kSize));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  std::memset(a, 0x5A, kSize);
  std::memset(b, 0x5A, kSize);
  brisk_free(a);
  g_fake_now = t0 + Delay() / 2;
  brisk_free(b);
  // Their entry's age is about t0 + Delay / 4: not due yet, though a was freed Delay ago.
  g_fake_now = t0 + Delay();
  large_cache_decay(g_fake_now);
  EXPECT_EQ(ResidentOf(b, kSize), kSize) << "b, freed half a delay ago, kept with a";
  EXPECT_EQ(ResidentOf(a, kSize), kSize) << "a merged with b (apart, it would have aged out)";
  g_fake_now = t0 + Delay() / 2 + Delay();
  EXPECT_GE(large_cache_decay(g_fake_now), 2 * kSize);
  EXPECT_EQ(ResidentOf(a, kSize), 0u) << "the delay after the last free: decommitted";
  EXPECT_EQ(ResidentOf(b, kSize), 0u);
}

// MMtest's large test as written: blocks of 10..100 MiB allocated and freed, never touched.
TEST(LargeCache, FreeingUntouchedBlocksMakesNoSystemCall) {
  brisk_thread_collect();
  void* blocks[10];
  for (int round = 0; round < 3; ++round) {
    OsCalls before;
    for (int j = 0; j < 10; ++j) {
      blocks[j] = brisk_malloc(static_cast<std::size_t>(j + 1) * (10 << 20));
      ASSERT_NE(blocks[j], nullptr);
    }
    OsCalls allocated;
    for (void* b : blocks) brisk_free(b);
    OsCalls after;
    EXPECT_EQ(after.unmap, allocated.unmap) << "round " << round;
    EXPECT_EQ(after.decommit, allocated.decommit) << "round " << round;
    EXPECT_EQ(after.resident, allocated.resident) << "round " << round << ": no mincore per free";
    if (round > 0) EXPECT_EQ(after.map, before.map) << "round " << round << " reused every mapping";
  }
  brisk_thread_collect();
}

TEST(LargeCache, ALargerCachedMappingIsSplitAndMergedBackWithoutSystemCalls) {
  brisk_thread_collect();
  constexpr std::size_t kBig = 64 << 20, kA = 8 << 20, kB = 40 << 20;
  auto* big = static_cast<char*>(brisk_malloc(kBig));
  ASSERT_NE(big, nullptr);
  brisk_free(big);
  OsCalls before;
  auto* a = static_cast<char*>(brisk_malloc(kA));
  auto* b = static_cast<char*>(brisk_malloc(kB));
  EXPECT_EQ(a, big) << "carved from the front of the cached mapping";
  EXPECT_TRUE(b > a && b + kB <= big + kBig) << "and the next from what was left";
  brisk_test::Fill(a, kA, 1);
  brisk_test::Fill(b, kB, 2);
  EXPECT_TRUE(brisk_test::Verify(a, kA, 1));
  EXPECT_TRUE(brisk_test::Verify(b, kB, 2));
  OsCalls carved;
  EXPECT_EQ(carved.map, before.map);
  EXPECT_EQ(carved.unmap, before.unmap) << "no tail unmapped";
  // A carved block grows by moving its pages past the block after it, and stays intact.
  auto* grown = static_cast<char*>(brisk_realloc(a, 2 * kA));
  ASSERT_NE(grown, nullptr);
  EXPECT_TRUE(brisk_test::Verify(grown, kA, 1));
  EXPECT_TRUE(brisk_test::Verify(b, kB, 2));
  brisk_free(grown);
  brisk_free(b);
  brisk_thread_collect();
}

TEST_F(LargeCacheDecay, MergedNeighboursServeABiggerRequestAndCallocReadsZeros) {
  constexpr std::size_t kBig = 64 << 20, kA = 8 << 20, kB = 40 << 20;
  auto* big = static_cast<char*>(brisk_malloc(kBig));
  ASSERT_NE(big, nullptr);
  brisk_free(big);
  auto* a = static_cast<char*>(brisk_malloc(kA));
  auto* b = static_cast<char*>(brisk_malloc(kB));
  ASSERT_EQ(a, big);
  std::memset(a, 0xA5, kA);
  std::memset(b, 0xA5, kB);
  OsCalls before;
  brisk_free(b);
  brisk_free(a);
  // Decommitted as they age, the merged entry still holds the header page of b (inside it now).
  g_fake_now += Delay();
  large_cache_decay(g_fake_now);
  auto* whole = static_cast<unsigned char*>(brisk_calloc(1, kBig - (1 << 20)));
  EXPECT_EQ(whole, reinterpret_cast<unsigned char*>(big)) << "the pieces merged back";
  EXPECT_EQ(stats::g.os_map_calls.load(), before.map);
  ASSERT_NE(whole, nullptr);
  EXPECT_EQ(brisk_test::FirstNonZero(whole, kBig - (1 << 20)), SIZE_MAX);
  brisk_free(whole);
}

// A request that fits a resident (dirty) cached mapping and a smaller decommitted (clean) one
// takes the resident one, whose pages need no fault; calloc, which wants zeros, takes the
// clean one.
TEST_F(LargeCacheDecay, ARequestTakesAResidentCachedMappingOverASmallerCleanOne) {
  constexpr std::size_t kClean = 16 << 20, kDirty = 32 << 20, kRequest = 8 << 20;
  auto* clean = static_cast<char*>(brisk_malloc(kClean));
  ASSERT_NE(clean, nullptr);
  // Kept live between the two, so that the two cached mappings cannot be neighbours and merge.
  void* separator = brisk_malloc(kRequest);
  ASSERT_NE(separator, nullptr);
  std::memset(clean, 0x5A, kClean);
  brisk_free(clean);
  g_fake_now += Delay();
  large_cache_decay(g_fake_now);
  ASSERT_LE(ResidentOf(clean, kClean), kOsPageSize) << "decommitted as it aged";
  char* dirty = FreeATouchedBlock(kDirty);
  ASSERT_NE(dirty, nullptr);
  auto* p = static_cast<char*>(brisk_malloc(kRequest));
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(p >= dirty - kOsPageSize && p + kRequest <= dirty + kDirty) << "carved from the resident mapping";
  EXPECT_EQ(ResidentOf(p, kRequest), kRequest) << "its pages are there without a fault";
  auto* z = static_cast<unsigned char*>(brisk_calloc(1, kRequest));
  ASSERT_NE(z, nullptr);
  EXPECT_TRUE(reinterpret_cast<char*>(z) >= clean - kOsPageSize &&
              reinterpret_cast<char*>(z) + kRequest <= clean + kClean)
      << "calloc takes the clean mapping";
  EXPECT_EQ(brisk_test::FirstNonZero(z, kRequest), SIZE_MAX);
  brisk_free(z);
  brisk_free(p);
  brisk_free(separator);
}

// A block carved from a resident cached mapping leaves the rest of its 4 MiB region cached, where
// no other block can start: those pages go back at once, but for a block realloc moves to grow,
// which grows into them. The block's own pages stay as they were.
TEST_F(LargeCacheDecay, ABlockFromAResidentMappingGivesBackTheRestOfItsRegion) {
  constexpr std::size_t kDirty = 16 << 20, kRequest = 1536 << 10;  // above every mode's medium max
  for (bool grows : {false, true}) {
    char* dirty = FreeATouchedBlock(kDirty);
    ASSERT_NE(dirty, nullptr);
    auto* p = static_cast<char*>(large_alloc(kRequest, kMinAlign, false, nullptr, grows));
    ASSERT_NE(p, nullptr);
    ASSERT_TRUE(p >= dirty - kOsPageSize && p + kRequest <= dirty + kDirty) << "carved from the resident mapping";
    char* region = p - kOsPageSize;  // a default-aligned block starts a page into its region
    ASSERT_EQ(reinterpret_cast<std::uintptr_t>(region) % kChunkSize, 0u);
    char* rest = region + ((kOsPageSize + kRequest + kOsPageSize - 1) & ~(kOsPageSize - 1)) + kOsPageSize;
    const std::size_t rest_bytes = static_cast<std::size_t>(region + kChunkSize - rest);
    EXPECT_EQ(ResidentOf(p, kRequest), kRequest) << "the block's pages are there without a fault";
    // ResidentOf reads 0 where nothing is mapped: the rest must be mapped still (cached, clean).
    std::vector<unsigned char> vec(rest_bytes / kOsPageSize);
    EXPECT_EQ(mincore(rest, rest_bytes, vec.data()), 0) << "the rest of the region was unmapped";
    EXPECT_EQ(ResidentOf(rest - kOsPageSize, kOsPageSize), kOsPageSize) << "the rest's first page is kept";
    EXPECT_EQ(ResidentOf(region + kChunkSize, kChunkSize), kChunkSize) << "the next region's pages went too";
    if (grows) {
      EXPECT_EQ(ResidentOf(rest, rest_bytes), rest_bytes) << "a block realloc moved to grow kept the rest";
    } else {
      EXPECT_EQ(ResidentOf(rest, rest_bytes), 0u) << "the rest of the region stayed resident";
    }
    LargeFree(p);
  }
}

// A rest written in a few pages keeps them: dropping them costs a TLB shootdown for little
// memory (brisk-stress prodcons, whose 1-2 MiB blocks are written in a few pages: 1.14x the
// time on a VM where shootdowns are dear); the decay takes them later.
TEST_F(LargeCacheDecay, ABlockFromAMostlyUntouchedMappingLeavesTheRestOfItsRegionAsItIs) {
  constexpr std::size_t kDirty = 16 << 20, kRequest = 1536 << 10, kEvery = 256 << 10;
  char* dirty = FreeATouchedBlock(kDirty, kEvery);
  ASSERT_NE(dirty, nullptr);
  auto* p = static_cast<char*>(large_alloc(kRequest, kMinAlign, false, nullptr, false));
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(p >= dirty - kOsPageSize && p + kRequest <= dirty + kDirty) << "carved from the freed mapping";
  char* region = p - kOsPageSize;
  char* rest = region + ((kOsPageSize + kRequest + kOsPageSize - 1) & ~(kOsPageSize - 1)) + kOsPageSize;
  const std::size_t rest_bytes = static_cast<std::size_t>(region + kChunkSize - rest);
  const std::size_t touched = ResidentOf(rest, rest_bytes);
  EXPECT_GT(touched, 0u) << "the rest's few written pages were given back";
  EXPECT_LT(touched * 4, rest_bytes) << "the rest was written more than the test meant";
  LargeFree(p);
}

// A buffer that grows by carving (a new block a little bigger, then the old one freed, as
// MMtest's strings test does): the old block's mapping comes back merged with the rest of its
// region, which no block ever wrote, and the next block carved there leaves that rest known
// clean: no residency query (before, each such carve made a mincore of the rest, 4 us a time
// on blocks of 1-3 MiB) and nothing given back. The rest stays cached and reads as zeros.
TEST_F(LargeCacheDecay, ABlockCarvedWhereABufferGrewLeavesTheUntouchedRestWithoutAQuery) {
  constexpr std::size_t kRequest = 1536 << 10;  // above every mode's medium max
  auto* first = static_cast<char*>(large_alloc(kRequest, kMinAlign, false, nullptr, false));
  ASSERT_NE(first, nullptr);
  std::memset(first, 0x5A, kRequest);
  auto* second = static_cast<char*>(large_alloc(kRequest + 2 * kOsPageSize, kMinAlign, false, nullptr, false));
  ASSERT_NE(second, nullptr);
  std::memset(second, 0x5B, kRequest + 2 * kOsPageSize);
  LargeFree(first);
  const OsCalls before;
  auto* third = static_cast<char*>(large_alloc(kRequest + 4 * kOsPageSize, kMinAlign, false, nullptr, false));
  ASSERT_EQ(third, first) << "carved where the first block was (its mapping is the dirty fit)";
  EXPECT_EQ(stats::g.os_resident_calls.load(), before.resident) << "the untouched rest was queried";
  EXPECT_EQ(stats::g.os_decommit_calls.load(), before.decommit);
  EXPECT_EQ(static_cast<unsigned char>(third[kRequest - 1]), 0x5Au) << "the block keeps the resident pages it reuses";
  char* rest = third + kRequest + 5 * kOsPageSize;  // past the block's last page and the rest's first
  const std::size_t rest_bytes = static_cast<std::size_t>(third - kOsPageSize + kChunkSize - rest);
  EXPECT_EQ(ResidentOf(rest, rest_bytes), 0u);
  std::vector<unsigned char> vec(rest_bytes / kOsPageSize);
  EXPECT_EQ(mincore(rest, rest_bytes, vec.data()), 0) << "the rest of the region was unmapped";
  LargeFree(third);
  LargeFree(second);
}

// What the cache promises of its entries at any moment (large.cc): a clean entry has an empty
// dirty range and a dirty one a range inside it, past its first page, wide enough for its dirty
// bytes; the counts and the scan's summary words agree with the entries; entries do not
// overlap; and past its first page, outside its dirty range, an entry reads as zeros. The last
// is what lets a calloc skip zeroing there. Checked under the cache's lock (no entry changes
// meanwhile); returns a description of the first breach, or nullptr. Allocates nothing.
const char* CacheBreach(char** where) {
  static LargeCacheEntryView entries[1024];
  static unsigned char vec[std::size_t{1} << 18];  // mincore's answer for up to 1 GiB
  static char text[256];
  const char* breach = nullptr;
  *where = nullptr;
  auto fail = [&](const char* what, char* at) {
    if (breach == nullptr) {
      breach = what;
      *where = at;
    }
  };
  large_locks_acquire();
  const LargeCacheView view = large_cache_view_for_test(entries, std::size(entries));
  std::size_t n = view.entries < std::size(entries) ? view.entries : std::size(entries);
  std::size_t bytes = 0, dirty = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const LargeCacheEntryView& e = entries[i];
    bytes += e.size;
    dirty += e.dirty;
    if (!e.fit_matches) fail("the scan's summary word disagrees with the entry", e.base);
    if (e.dirty == 0 && e.dirty_begin != e.dirty_end) fail("a clean entry with a dirty range", e.base);
    if (e.dirty != 0) {
      if (e.dirty_begin >= e.dirty_end) fail("a dirty entry with an empty dirty range", e.base);
      if (e.dirty_begin < kOsPageSize || e.dirty_end > e.size) fail("a dirty range outside its entry", e.base);
      if (e.dirty > e.dirty_end - e.dirty_begin) fail("more dirty bytes than the dirty range holds", e.base);
      if (view.oldest_dirty_ms > e.freed_ms) fail("the oldest-dirty bound is above a dirty entry's age", e.base);
    }
    for (std::size_t j = 0; j < i; ++j) {
      const LargeCacheEntryView& o = entries[j];
      if (e.base < o.base + o.size && o.base < e.base + e.size) fail("two entries overlap", e.base);
    }
    const std::size_t pages = e.size / kOsPageSize;
    if (pages > sizeof vec || mincore(e.base, e.size, vec) != 0) {
      fail("an entry that mincore cannot read (not mapped, or over 1 GiB)", e.base);
      continue;
    }
    for (std::size_t page = 1; page < pages; ++page) {
      const std::size_t at = page * kOsPageSize;
      if ((e.dirty != 0 && at + kOsPageSize > e.dirty_begin && at < e.dirty_end) || (vec[page] & 1) == 0) continue;
      const auto* words = reinterpret_cast<const std::uint64_t*>(e.base + at);
      for (std::size_t w = 0; w < kOsPageSize / 8; ++w)
        if (words[w] != 0) {
          fail("data past the first page outside the dirty range", e.base + at + w * 8);
          break;
        }
    }
  }
  if (view.entries > n) fail("more entries than the check holds", nullptr);
  if (bytes != view.bytes) fail("the cache's byte count is not the sum of its entries", nullptr);
  if (dirty != view.dirty_bytes) fail("the cache's dirty count is not the sum of its entries'", nullptr);
  large_locks_release();
  if (breach == nullptr) return nullptr;
  std::snprintf(text, sizeof text, "%s (entries %zu, bytes %zu, dirty %zu)", breach, view.entries, view.bytes,
                view.dirty_bytes);
  return text;
}

// A tag in the first and last 8 bytes of each OS page of [p, p + n): what a block holds where
// the program wrote it, and what a stale page would show.
void TagPages(char* p, std::size_t n, std::uint64_t tag) {
  for (std::size_t at = 0; at < n; at += kOsPageSize) {
    std::memcpy(p + at, &tag, 8);
    const std::size_t end = at + kOsPageSize < n ? at + kOsPageSize : n;
    std::memcpy(p + end - 8, &tag, 8);
  }
}
// The first offset in [0, n) where TagPages(p, n, tag) is not found, or n.
std::size_t FirstUntagged(const char* p, std::size_t n, std::uint64_t tag) {
  for (std::size_t at = 0; at < n; at += kOsPageSize) {
    const std::size_t end = at + kOsPageSize < n ? at + kOsPageSize : n;
    std::uint64_t first, last;
    std::memcpy(&first, p + at, 8);
    std::memcpy(&last, p + end - 8, 8);
    if (first != tag) return at;
    if (last != tag) return end - 8;
  }
  return n;
}

// Random traffic of large blocks through the C API (malloc, calloc, realloc that grows in place,
// shrinks or moves, free; sizes 1.1-9 MiB and some just past the 2 MiB region size), with the
// clock moved on by up to 300 ms a step so that entries age and decay, and a brisk_trim now and
// then; after each step every entry keeps the promises above, every calloc reads zeros and
// every block keeps its contents. Also run with small budgets (large_budget_invariants_test), where
// entries are decommitted and unmapped to stay within them.
TEST_F(LargeCacheDecay, RandomTrafficKeepsEveryEntrySound) {
  std::uint64_t seed = 0x9E3779B97F4A7C15ull;
  auto next = [&seed](std::uint64_t below) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return (seed >> 33) % below;
  };
  struct Live {
    char* p;
    std::size_t n;
    std::uint64_t tag;
  };
  std::vector<Live> live;
  live.reserve(16);
  constexpr std::size_t kMiB = std::size_t{1} << 20;
  const std::size_t min_size = static_cast<std::size_t>(options::get(options::Id::kMediumMax)) + kMiB / 8;
  for (int step = 0; step < 400; ++step) {
    std::size_t n = min_size + next(8 * kMiB);
    if (next(4) == 0) n = 2 * kMiB + next(64 << 10);  // around a region's size
    const std::uint64_t tag = 0xB0B0000000000000ull + static_cast<std::uint64_t>(step);
    const std::uint64_t op = next(10);
    if (op < 5 && live.size() < 12) {
      const bool zero = op >= 3;
      auto* p = static_cast<char*>(zero ? brisk_calloc(1, n) : brisk_malloc(n));
      ASSERT_NE(p, nullptr) << "step " << step;
      if (zero) ASSERT_EQ(FirstUntagged(p, n, 0), n) << "calloc read old data, step " << step;
      TagPages(p, n, tag);
      live.push_back({p, n, tag});
    } else if (op < 7 && !live.empty()) {
      Live& b = live[next(live.size())];
      const std::size_t m = next(3) == 0 ? std::max(min_size, b.n / 2) : b.n + next(4 * kMiB);
      auto* q = static_cast<char*>(brisk_realloc(b.p, m));
      ASSERT_NE(q, nullptr) << "step " << step;
      const std::size_t kept = (std::min(b.n, m) / kOsPageSize) * kOsPageSize;
      ASSERT_EQ(FirstUntagged(q, kept, b.tag), kept) << "realloc lost contents, step " << step;
      TagPages(q, m, tag);
      b = {q, m, tag};
    } else if (!live.empty()) {
      const std::size_t k = next(live.size());
      ASSERT_EQ(FirstUntagged(live[k].p, live[k].n, live[k].tag), live[k].n) << "step " << step;
      brisk_free(live[k].p);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    }
    g_fake_now += next(300);
    if (next(50) == 0) brisk_trim();
    char* where;
    const char* breach = CacheBreach(&where);
    ASSERT_EQ(breach, nullptr) << breach << " at " << static_cast<void*>(where) << ", step " << step;
  }
  for (const Live& b : live) brisk_free(b.p);
  char* where;
  const char* breach = CacheBreach(&where);
  EXPECT_EQ(breach, nullptr) << breach << " at " << static_cast<void*>(where);
}

// Run with small budgets (tests/components.cmake: large_budget_test): freed blocks beyond them
// evict the oldest, so the cache never holds more than its budgets and keeps the newest.
TEST(LargeCacheBudget, TheBudgetsHoldAndTheOldestGoFirst) {
  const auto cache_limit = static_cast<std::size_t>(options::get(options::Id::kLargeCacheBytes));
  const auto dirty_limit = static_cast<std::size_t>(options::get(options::Id::kLargeDirtyBytes));
  if (dirty_limit > (64 << 20) || cache_limit > (128 << 20)) GTEST_SKIP() << "runs with BRISK_LARGE_*_BYTES set small";
  brisk_thread_collect();
  constexpr std::size_t kSize = 6 << 20;
  constexpr int kBlocks = 12;
  char* blocks[kBlocks];
  for (char*& p : blocks) {
    p = static_cast<char*>(brisk_malloc(kSize));
    ASSERT_NE(p, nullptr);
    std::memset(p, 0x3C, kSize);
  }
  for (int i = 0; i < kBlocks; ++i) {
    brisk_free(blocks[i]);
    std::size_t resident = 0;
    for (int j = 0; j <= i; ++j) resident += ResidentOf(blocks[j], kSize);
    EXPECT_LE(resident, dirty_limit) << "after freeing block " << i;
    EXPECT_LE(brisk_test::Stats().large_bytes_cached, cache_limit) << "after freeing block " << i;
    EXPECT_EQ(ResidentOf(blocks[i], kSize), kSize) << "the block freed last is kept as it was";
  }
  EXPECT_EQ(ResidentOf(blocks[0], kSize), 0u) << "the first freed went first";
  brisk_thread_collect();
}

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

// calloc from a cached mapping of which only some pages were written: those are written with
// zeros where they are (they stay resident, so no other CPU's TLB entry for them is shot down
// and none faults in again), and the rest stay untouched (not resident) but the last, which
// calloc writes (calloc_big). Before, a mostly untouched mapping was decommitted whole, its
// written pages with it.
TEST(LargeCache, CallocOfAPartlyWrittenCachedMappingZeroesItsResidentPagesInPlace) {
  constexpr std::size_t kSize = 8 << 20;
  constexpr std::size_t kStride = 64 * kOsPageSize;  // one page in 64 written: 2 of 128 pages
  auto* a = static_cast<unsigned char*>(brisk_malloc(kSize));
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(ResidentOf(a, kSize), 0u) << "a fresh mapping";
  for (std::size_t i = 0; i < kSize; i += kStride) a[i] = 0x5A;
  brisk_free(a);
  auto* z = static_cast<unsigned char*>(brisk_calloc(1, kSize));
  ASSERT_EQ(z, a) << "same size, same mapping";
  for (std::size_t i = 0; i < kSize; i += kStride)
    ASSERT_EQ(ResidentOf(z + i, 1), kOsPageSize) << "the written page at " << i << " was dropped";
  // The written pages (the first among them), and the last, which calloc writes (calloc_big).
  EXPECT_EQ(ResidentOf(z, kSize), kSize / kStride * kOsPageSize + kOsPageSize) << "calloc faulted in untouched pages";
  for (std::size_t i = 0; i < kSize; i += 512) ASSERT_EQ(z[i], 0) << i;
  brisk_free(z);
}

// The large stash (threadcache/medium.cc): a thread's last freed large mapping, of at most
// BRISK_LARGE_STASH_BYTES (2 MiB in balanced mode, none in low-memory, whose medium cache is
// 2 MiB as balanced's) and 2 MiB, serves its next large block that fits and uses at least half
// of it, without the cache's lock; a thread's exit
// gives it to the cache, where another thread finds it. The test's 1 MiB block is medium at
// the modes' BRISK_MEDIUM_MAX (1m), and a large block that uses less than half of a 2 MiB
// mapping cannot exist there: the test command runs this test with BRISK_MEDIUM_MAX=256k
// (large_stash_test).
TEST(LargeStash, AThreadTakesBackItsLastFreedMappingWithoutTheCacheLock) {
  constexpr std::size_t kSize = 1 << 20;
  if (static_cast<std::size_t>(options::get_for(options::Id::kMediumMax, options::Strategy::kBalanced)) >= kSize)
    GTEST_SKIP() << "1 MiB is a medium block: runs as large_stash_test";
  brisk_thread_collect();  // this thread's stash, from earlier tests, goes back to the OS
  const brisk_strategy before = brisk_get_strategy();
  brisk_set_strategy(BRISK_STRATEGY_BALANCED);
  unsigned char* kept = nullptr;
  std::thread([&] {
    auto* p = static_cast<unsigned char*>(brisk_malloc(kSize));
    ASSERT_NE(p, nullptr);
    std::memset(p, 0x5A, kSize);
    brisk_free(p);
    const LockCounts locks = large_lock_counts();
    auto* q = static_cast<unsigned char*>(brisk_malloc(kSize - 5000));
    EXPECT_EQ(q, p) << "the stashed mapping";
    EXPECT_EQ(large_lock_counts().acquisitions, locks.acquisitions) << "the cache's lock was taken";
    brisk_free(q);
    auto* z = static_cast<unsigned char*>(brisk_calloc(1, kSize));
    ASSERT_EQ(z, p);
    for (std::size_t i = 0; i < kSize; i += 512) ASSERT_EQ(z[i], 0) << i;
    brisk_free(z);
    void* small = brisk_malloc(kSize / 3);  // would use less than half of it
    EXPECT_NE(small, p);
    brisk_free(small);  // takes the stash's place; p goes to the cache
    void* again = brisk_malloc(kSize);
    EXPECT_EQ(again, p) << "from the cache";
    brisk_free(again);
    kept = p;
  }).join();
  // The thread's exit gave its stash to the cache.
  void* other = brisk_malloc(kSize);
  EXPECT_EQ(other, kept) << "the exited thread's stashed mapping is in the cache";
  // A thread that frees another thread's large block gives it to the cache, not to its stash:
  // the main thread, which allocated it, takes it back from there while the freeing thread
  // still runs.
  std::atomic<int> step{0};
  std::thread freer([&] {
    brisk_free(brisk_malloc(64));  // a heap of its own
    brisk_free(other);
    step = 1;
    while (step.load() != 2) std::this_thread::yield();
  });
  while (step.load() != 1) std::this_thread::yield();
  void* back = brisk_malloc(kSize);
  EXPECT_EQ(back, other) << "the freeing thread kept another thread's mapping";
  step = 2;
  freer.join();
  brisk_free(back);
  brisk_set_strategy(BRISK_STRATEGY_LOW_MEMORY);  // a medium cache, but no stash
  std::thread([&] {
    void* p = brisk_malloc(kSize);
    ASSERT_NE(p, nullptr);
    brisk_free(p);
    const LockCounts locks = large_lock_counts();
    void* q = brisk_malloc(kSize);
    brisk_free(q);
    EXPECT_GT(large_lock_counts().acquisitions, locks.acquisitions) << "low-memory stashes nothing";
  }).join();
  brisk_set_strategy(before);
  brisk_thread_collect();
}

TEST(LargeCache, ADoubleFreeOfALargeBlockIsReported) {
  void* a = brisk_malloc(6 << 20);
  ASSERT_NE(a, nullptr);
  brisk_free(a);
  EXPECT_DEATH(brisk_free(a), "brisk: invalid free of");
}

}  // namespace
}  // namespace brisk
