#include "core/chunk.h"

#include <brisk/brisk.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/platform.h"
#include "core/stats.h"

namespace brisk {
namespace {

TEST(Chunk, CreateRegistersTheRegionAndAlignsTheChunk) {
  Chunk* c = chunk_create(nullptr);
  ASSERT_NE(c, nullptr);
  auto a = reinterpret_cast<std::uintptr_t>(c);
  EXPECT_EQ(a & kChunkMask, 0u);
  EXPECT_EQ(region_kind(a), kRegionChunk);
  EXPECT_EQ(region_kind(a + kChunkSize - 1), kRegionChunk);
  EXPECT_EQ(c->free_pages.load(), kAllPagesFree);
  chunk_destroy(c);
}

TEST(Chunk, ClaimsRunsAndReleasesThemBack) {
  Chunk* c = chunk_create(nullptr);
  ASSERT_NE(c, nullptr);
  unsigned a = chunk_claim_pages(c, 8);
  unsigned b = chunk_claim_pages(c, 8);
  EXPECT_EQ(a, 1u) << "page 0 is the header";
  EXPECT_EQ(b, 9u);
  // Fill the chunk: 63 pages in all.
  unsigned rest = chunk_claim_pages(c, 63 - 16);
  EXPECT_EQ(rest, 17u);
  EXPECT_EQ(chunk_claim_pages(c, 1), 0u) << "a full chunk has no page left";
  EXPECT_FALSE(chunk_release_pages(c, a, 8));
  // A run of 9 does not fit in the hole of 8; a run of 8 does, in the same place.
  EXPECT_EQ(chunk_claim_pages(c, 9), 0u);
  EXPECT_EQ(chunk_claim_pages(c, 8), a);
  EXPECT_FALSE(chunk_release_pages(c, a, 8));
  EXPECT_FALSE(chunk_release_pages(c, b, 8));
  EXPECT_TRUE(chunk_release_pages(c, rest, 63 - 16)) << "the last release empties the chunk";
  chunk_destroy(c);
}

TEST(Chunk, ClaimAtGrowsOnlyIntoFreeNeighbours) {
  Chunk* c = chunk_create(nullptr);
  ASSERT_NE(c, nullptr);
  unsigned a = chunk_claim_pages(c, 2);
  unsigned b = chunk_claim_pages(c, 2);
  EXPECT_FALSE(chunk_claim_pages_at(c, a + 2, 1)) << "taken by b";
  EXPECT_TRUE(chunk_claim_pages_at(c, b + 2, 3));
  EXPECT_FALSE(chunk_claim_pages_at(c, b + 2, 1)) << "already claimed";
  EXPECT_FALSE(chunk_claim_pages_at(c, 62, 3)) << "past the end";
  EXPECT_FALSE(chunk_claim_pages_at(c, 0, 1)) << "the header page";
  chunk_release_pages(c, a, 2);
  EXPECT_TRUE(chunk_release_pages(c, b, 5));
  chunk_destroy(c);
}

// No free run is resident over its whole length: the claim takes the run with the most resident
// pages, not the lowest free one, and a run half resident counts as resident for the heaps'
// first choice of pages (span_pages.cc), so that a medium block reuses freed pages of other
// sizes before it faults in fresh ones.
TEST(Chunk, ClaimPrefersTheRunWithTheMostResidentPages) {
  Chunk* c = chunk_create(nullptr);
  ASSERT_NE(c, nullptr);
  unsigned low = chunk_claim_pages(c, 12);   // pages 1-12
  unsigned wall = chunk_claim_pages(c, 1);   // 13: keeps the two runs apart
  unsigned high = chunk_claim_pages(c, 8);   // 14-21
  ASSERT_EQ(low, 1u);
  ASSERT_EQ(high, 14u);
  std::memset(c->page_address(low), 0xAB, 12 * kPageSize);
  std::memset(c->page_address(high), 0xCD, 8 * kPageSize);
  chunk_release_pages(c, low, 12);
  chunk_release_pages(c, high, 8);
  // Pages 1-10 purged: of the low run only 11-12 stay resident; 14-21 are all resident, and the
  // pages above 21 were never used.
  ASSERT_EQ(chunk_purge(c, ((std::uint64_t{1} << 10) - 1) << 1), 10 * kPageSize);
  EXPECT_TRUE(chunk_has_resident_run(c, 10)) << "pages 14-23: 8 of 10 resident";
  EXPECT_FALSE(chunk_has_resident_run(c, 20)) << "no run of 20 has 10 resident pages";
  std::uint64_t dirty = 0;
  ASSERT_EQ(chunk_claim_pages(c, 10, &dirty), high) << "the lowest run, 1-10, has no resident page";
  EXPECT_EQ(dirty, 0xffu) << "pages 14-21 of the run 14-23 held data";
  chunk_release_pages(c, wall, 1);
  EXPECT_TRUE(chunk_release_pages(c, high, 10));
  chunk_destroy(c);
}

// A dirty page is resident only in the OS pages its last span wrote (os_pages in chunk.h): a
// one-page span that will write 12 OS pages takes the page whose first 12 are all resident,
// the fewest beyond, not the lowest dirty page; a page claimed clean forgets what it held.
TEST(Chunk, OnePageClaimTakesThePageResidentWhereItsSpanWillWrite) {
  Chunk* c = chunk_create(nullptr);
  ASSERT_NE(c, nullptr);
  const unsigned one = chunk_claim_pages(c, 1);    // page 1: its span writes 1 OS page
  const unsigned whole = chunk_claim_pages(c, 1);  // page 2: all 16
  const unsigned most = chunk_claim_pages(c, 1);   // page 3: 14
  ASSERT_EQ(one, 1u);
  ASSERT_EQ(most, 3u);
  chunk_release_pages(c, one, 1, 0x1);
  chunk_release_pages(c, whole, 1, 0xffff);
  chunk_release_pages(c, most, 1, 0x3fff);
  EXPECT_EQ(c->os_pages[one].load(), 0x1u);
  EXPECT_TRUE(chunk_has_resident_run(c, 1, 12));
  EXPECT_TRUE(chunk_has_resident_run(c, 1, 16));
  std::uint64_t dirty = 0;
  EXPECT_EQ(chunk_claim_pages(c, 1, &dirty, 12), most) << "page 3 covers 12 with the fewest to spare";
  EXPECT_EQ(dirty, 1u);
  EXPECT_EQ(chunk_claim_pages(c, 1, nullptr, 12), whole);
  EXPECT_FALSE(chunk_has_resident_run(c, 1, 2)) << "page 1 has one resident OS page";
  EXPECT_EQ(chunk_claim_pages(c, 1, nullptr, 12), one) << "none fits: the one covering the most";
  EXPECT_EQ(c->os_pages[one].load(), 0x1u) << "claimed dirty: its OS pages are still resident";
  // A span releasing page 1 having written OS pages 0-3: the record keeps both uses.
  chunk_release_pages(c, one, 1, 0xf);
  EXPECT_EQ(c->os_pages[one].load(), 0xfu);
  // Purged, then claimed: clean, so the record is cleared.
  ASSERT_EQ(chunk_purge(c, std::uint64_t{1} << one), kPageSize);
  EXPECT_FALSE(chunk_has_resident_run(c, 1, 1)) << "a purged page is not dirty";
  dirty = 1;
  ASSERT_EQ(chunk_claim_pages(c, 1, &dirty, 4), one) << "the lowest free page, as without a need";
  EXPECT_EQ(dirty, 0u);
  EXPECT_EQ(c->os_pages[one].load(), 0u);
  // A decommit inside a claimed page forgets its OS pages.
  chunk_release_pages(c, one, 1, 0xff);
  ASSERT_EQ(chunk_claim_pages(c, 1, nullptr, 8), one);
  const auto base = reinterpret_cast<std::uintptr_t>(c->page_address(one));
  chunk_forget_os_pages(c, base + 2 * kOsPageSize, base + 6 * kOsPageSize);
  EXPECT_EQ(c->os_pages[one].load(), 0xc3u);
  // Without a mask, and for runs of more than 4 pages, a release counts every OS page written.
  chunk_release_pages(c, one, 1);
  EXPECT_EQ(c->os_pages[one].load(), 0xffffu);
  const unsigned run = chunk_claim_pages(c, 5);
  ASSERT_NE(run, 0u);
  chunk_release_pages(c, run, 5, 0x1);
  for (unsigned i = run; i < run + 5; ++i) EXPECT_EQ(c->os_pages[i].load(), 0xffffu) << "page " << i;
  // A run of 2-4 pages: 16 bits of the mask per page. Claimed again (dirty), its record stays;
  // a page noted as written without a release (a kept span's page handed on) takes its pages.
  const unsigned pair = 40;  // never used
  ASSERT_TRUE(chunk_claim_pages_at(c, pair, 2));
  EXPECT_EQ(c->os_pages[pair].load(), 0u) << "claimed clean";
  chunk_release_pages(c, pair, 2, 0x3ffff);
  EXPECT_EQ(c->os_pages[pair].load(), 0xffffu);
  EXPECT_EQ(c->os_pages[pair + 1].load(), 0x3u);
  ASSERT_TRUE(chunk_claim_pages_at(c, pair, 2));
  EXPECT_EQ(c->os_pages[pair + 1].load(), 0x3u) << "claimed dirty";
  chunk_note_written(c, pair + 1, 1, 0x30);
  EXPECT_EQ(c->os_pages[pair + 1].load(), 0x33u);
  chunk_release_pages(c, pair, 2, 0);
  ASSERT_EQ(chunk_purge(c, std::uint64_t{3} << pair), 2 * kPageSize);
  ASSERT_TRUE(chunk_claim_pages_at(c, pair, 2));
  EXPECT_EQ(c->os_pages[pair].load(), 0u) << "claimed clean after the purge";
  EXPECT_EQ(c->os_pages[pair + 1].load(), 0u);
  chunk_release_pages(c, pair, 2);
  chunk_release_pages(c, most, 1);
  EXPECT_TRUE(chunk_release_pages(c, whole, 1));
  chunk_destroy(c);
}

TEST(Chunk, PurgeDecommitsFreedPagesOnly) {
  Chunk* c = chunk_create(nullptr);
  ASSERT_NE(c, nullptr);
  unsigned keep = chunk_claim_pages(c, 1);
  unsigned drop = chunk_claim_pages(c, 2);
  std::memset(c->page_address(keep), 0xAB, kPageSize);
  std::memset(c->page_address(drop), 0xCD, 2 * kPageSize);
  chunk_release_pages(c, drop, 2);
  EXPECT_EQ(chunk_purge(c), 2 * kPageSize);
  EXPECT_EQ(chunk_purge(c), 0u) << "nothing dirty is left";
  EXPECT_EQ(static_cast<unsigned char>(c->page_address(keep)[100]), 0xABu) << "live pages keep their data";
  EXPECT_EQ(c->page_address(drop)[100], 0) << "decommitted pages read back as zero";
  EXPECT_EQ(c->free_pages.load() & (std::uint64_t{3} << drop), std::uint64_t{3} << drop)
      << "purged pages are free again";
  EXPECT_TRUE(chunk_release_pages(c, keep, 1));
  chunk_destroy(c);
}

// n pages of c claimed one at a time, each written whole with 0x5C; fewer if a claim failed.
std::vector<unsigned> ClaimWrittenPages(Chunk* c, unsigned n) {
  std::vector<unsigned> pages;
  for (unsigned i = 0; i < n; ++i) {
    const unsigned p = chunk_claim_pages(c, 1);
    if (p == 0) break;
    std::memset(c->page_address(p), 0x5C, kPageSize);
    pages.push_back(p);
  }
  return pages;
}

// Free dirty pages in separate runs go back in one system call where the kernel batches
// process_madvise ranges (platform::decommit_all), a madvise per run otherwise; live pages
// between them keep their data. (The decommit counter is process-wide: this binary starts no
// thread, so no background thread adds to it.)
TEST(Chunk, PurgeGivesBackSeparateRunsTogether) {
  Chunk* c = chunk_create(nullptr);
  ASSERT_NE(c, nullptr);
  const std::vector<unsigned> pages = ClaimWrittenPages(c, 8);
  ASSERT_EQ(pages.size(), 8u);
  // Every other page back: four runs of one page, each between two live ones.
  for (unsigned i = 1; i < 8; i += 2) chunk_release_pages(c, pages[i], 1);
  std::uint64_t mask = 0;
  for (unsigned i = 1; i < 8; i += 2) mask |= std::uint64_t{1} << pages[i];
  const std::uint64_t calls = stats::g.os_decommit_calls.load();
  EXPECT_EQ(chunk_purge(c, mask), 4 * kPageSize);
  const std::uint64_t made = stats::g.os_decommit_calls.load() - calls;
  EXPECT_EQ(made, platform::decommit_all_batches() ? 1u : 4u);
  for (unsigned i = 0; i < 8; ++i)
    EXPECT_EQ(static_cast<unsigned char>(c->page_address(pages[i])[100]), i % 2 == 0 ? 0x5Cu : 0u) << "page " << i;
  for (unsigned i = 0; i < 6; i += 2) chunk_release_pages(c, pages[i], 1);
  EXPECT_TRUE(chunk_release_pages(c, pages[6], 1)) << "the chunk is empty";
  chunk_destroy(c);
}

// The same for a lazy purge (MADV_FREE: speed mode's BRISK_PURGE_ADVICE=1).
TEST(ChunkLazyPurge, SeparateRunsGoBackTogether) {
  Chunk* c = chunk_create(nullptr);
  ASSERT_NE(c, nullptr);
  const std::vector<unsigned> pages = ClaimWrittenPages(c, 4);
  ASSERT_EQ(pages.size(), 4u);
  chunk_release_pages(c, pages[1], 1);
  chunk_release_pages(c, pages[3], 1);
  const std::uint64_t mask = (std::uint64_t{1} << pages[1]) | (std::uint64_t{1} << pages[3]);
  const std::uint64_t calls = stats::g.os_decommit_calls.load();
  EXPECT_EQ(chunk_purge(c, mask, true), 2 * kPageSize);
  EXPECT_EQ(stats::g.os_decommit_calls.load() - calls, platform::decommit_all_batches() ? 1u : 2u);
  EXPECT_EQ(c->lazy_pages.load() & mask, mask) << "given back lazily";
  EXPECT_EQ(static_cast<unsigned char>(c->page_address(pages[0])[100]), 0x5Cu) << "a live page kept its data";
  chunk_release_pages(c, pages[0], 1);
  EXPECT_TRUE(chunk_release_pages(c, pages[2], 1)) << "the chunk is empty";
  chunk_destroy(c);
}

// Two chunks of `owner`, each with n pages written and every other one released: n / 2 runs of
// one free dirty page between live ones (ma, mb: those pages). The rest are freed and the chunks
// destroyed after the test.
class ChunkPurgeBatchTest : public ::testing::Test {
 protected:
  void Make(Heap* owner, unsigned n) {
    for (int i = 0; i < 2; ++i) {
      chunk_[i] = chunk_create(owner);
      ASSERT_NE(chunk_[i], nullptr);
      pages_[i] = ClaimWrittenPages(chunk_[i], n);
      ASSERT_EQ(pages_[i].size(), n);
      for (std::size_t k = 1; k < n; k += 2) {
        chunk_release_pages(chunk_[i], pages_[i][k], 1);
        mask_[i] |= std::uint64_t{1} << pages_[i][k];
      }
    }
    a = chunk_[0], b = chunk_[1], ma = mask_[0], mb = mask_[1];
  }
  void TearDown() override {
    for (int i = 0; i < 2; ++i) {
      if (chunk_[i] == nullptr) continue;
      for (std::size_t k = 0; k < pages_[i].size(); k += 2) chunk_release_pages(chunk_[i], pages_[i][k], 1);
      EXPECT_EQ(chunk_[i]->free_pages.load(), kAllPagesFree);
      EXPECT_TRUE(chunk_destroy(chunk_[i]));
    }
  }
  // Byte 100 of the k-th page of chunk i: 0x5C if it kept its data, 0 if given back.
  unsigned char Byte(int i, std::size_t k) const {
    return static_cast<unsigned char>(chunk_[i]->page_address(pages_[i][k])[100]);
  }

  Chunk* a = nullptr;
  Chunk* b = nullptr;
  std::uint64_t ma = 0, mb = 0;

 private:
  Chunk* chunk_[2] = {};
  std::vector<unsigned> pages_[2];
  std::uint64_t mask_[2] = {};
};

// Free pages of several chunks go back in one system call where the kernel batches (the
// background pass's decay and brisk_trim sweep every chunk this way): the pages stay claimed,
// so no one takes them, until the call; live pages keep their data.
TEST_F(ChunkPurgeBatchTest, SeveralChunksGoBackInOneCall) {
  ASSERT_NO_FATAL_FAILURE(Make(nullptr, 8));
  const std::uint64_t calls = stats::g.os_decommit_calls.load();
  {
    ChunkPurgeBatch batch;
    EXPECT_EQ(batch.add(a), 4 * kPageSize);
    EXPECT_EQ(batch.add(b), 4 * kPageSize);
    EXPECT_EQ(stats::g.os_decommit_calls.load(), calls) << "nothing sent before the batch is full or flushed";
    EXPECT_EQ(a->free_pages.load() & ma, 0u) << "the pages are claimed until they are given back";
    EXPECT_EQ(b->free_pages.load() & mb, 0u);
    const unsigned other = chunk_claim_pages(a, 1);
    ASSERT_NE(other, 0u);
    EXPECT_EQ((ma >> other) & 1, 0u) << "a claim passes over them";
    chunk_release_pages(a, other, 1);
  }
  EXPECT_EQ(stats::g.os_decommit_calls.load() - calls, platform::decommit_all_batches() ? 1u : 8u);
  EXPECT_EQ(a->free_pages.load() & ma, ma) << "handed back after the call";
  EXPECT_EQ(b->free_pages.load() & mb, mb);
  EXPECT_EQ(a->dirty_pages.load() & ma, 0u) << "clean";
  for (std::size_t k = 0; k < 8; ++k) {
    EXPECT_EQ(Byte(0, k), k % 2 == 0 ? 0x5Cu : 0u) << "page " << k;
    EXPECT_EQ(Byte(1, k), k % 2 == 0 ? 0x5Cu : 0u) << "page " << k;
  }
}

// A batch that cannot take the next chunk's runs sends what it holds first: two chunks of 20
// runs each (a batch holds 32) take two calls, and the first chunk's pages are back before the
// second's call.
TEST_F(ChunkPurgeBatchTest, SendsWhatItHoldsWhenTheNextChunksRunsDoNotFit) {
  ASSERT_NO_FATAL_FAILURE(Make(nullptr, 40));
  const std::uint64_t calls = stats::g.os_decommit_calls.load();
  const std::uint64_t per_chunk = platform::decommit_all_batches() ? 1u : 20u;
  {
    ChunkPurgeBatch batch;
    EXPECT_EQ(batch.add(a), 20 * kPageSize);
    EXPECT_EQ(stats::g.os_decommit_calls.load(), calls);
    EXPECT_EQ(batch.add(b), 20 * kPageSize);
    EXPECT_EQ(stats::g.os_decommit_calls.load() - calls, per_chunk) << "the first chunk went out";
    EXPECT_EQ(a->free_pages.load() & ma, ma);
    EXPECT_EQ(b->free_pages.load() & mb, 0u) << "the second waits for the flush";
  }
  EXPECT_EQ(stats::g.os_decommit_calls.load() - calls, 2 * per_chunk);
  EXPECT_EQ(b->free_pages.load() & mb, mb);
  EXPECT_EQ(Byte(1, 1), 0u);
  EXPECT_EQ(Byte(1, 2), 0x5Cu);
}

// The background pass's decay sweeps every chunk with one batch: the stale pages of two chunks
// go back in one call (the pass looks only at the chunks of a heap the test names).
Heap* const kDecayingOwner = reinterpret_cast<Heap*>(0x2000);
bool DecaysOnlyTheTestsChunks(const Heap* page_owner) { return page_owner == kDecayingOwner; }

TEST_F(ChunkPurgeBatchTest, DecayPassGivesBackStalePagesOfEveryChunkInOneCall) {
  ASSERT_NO_FATAL_FAILURE(Make(kDecayingOwner, 6));
  bool pending = false;
  const std::uint64_t calls = stats::g.os_decommit_calls.load();
  EXPECT_EQ(chunk_decay_all(&pending, false, DecaysOnlyTheTestsChunks), 0u) << "the first pass only ages them";
  EXPECT_TRUE(pending);
  EXPECT_EQ(chunk_decay_all(&pending, false, DecaysOnlyTheTestsChunks), 6 * kPageSize);
  EXPECT_EQ(stats::g.os_decommit_calls.load() - calls, platform::decommit_all_batches() ? 1u : 6u);
  EXPECT_EQ(a->dirty_pages.load() & ma, 0u);
  EXPECT_EQ(b->dirty_pages.load() & mb, 0u);
  EXPECT_EQ(Byte(1, 1), 0u);
  EXPECT_EQ(Byte(1, 0), 0x5Cu);
}

TEST(Chunk, AbandonedChunkIsAdoptedOrFreedWhenEmpty) {
  Chunk* c = chunk_create(nullptr);
  ASSERT_NE(c, nullptr);
  unsigned p = chunk_claim_pages(c, 1);
  chunk_abandon(c);
  Heap* fake_owner = reinterpret_cast<Heap*>(0x1000);
  Chunk* adopted = chunk_adopt(fake_owner);
  ASSERT_EQ(adopted, c);
  EXPECT_EQ(c->page_owner.load(), fake_owner);
  EXPECT_EQ(chunk_adopt(fake_owner), nullptr);
  chunk_abandon(c);
  // The last page released by anyone frees the abandoned chunk: it may not be adopted after.
  chunk_release_span_pages(c, p, 1);
  EXPECT_EQ(chunk_adopt(fake_owner), nullptr);
}

// brisk_trim's sweep reaches chunks no heap owns: their free pages are decommitted, their live
// pages keep their data.
TEST(Chunk, PurgeAllDecommitsTheFreePagesOfAnAbandonedChunk) {
  Chunk* c = chunk_create(nullptr);
  ASSERT_NE(c, nullptr);
  unsigned keep = chunk_claim_pages(c, 1);
  unsigned drop = chunk_claim_pages(c, 3);
  std::memset(c->page_address(keep), 0xAB, kPageSize);
  std::memset(c->page_address(drop), 0xCD, 3 * kPageSize);
  chunk_release_pages(c, drop, 3);
  chunk_abandon(c);
  EXPECT_GE(chunk_purge_all(), 3 * kPageSize);
  EXPECT_EQ(c->page_address(drop)[100], 0) << "decommitted pages read back as zero";
  EXPECT_EQ(static_cast<unsigned char>(c->page_address(keep)[100]), 0xABu) << "live pages keep their data";
  chunk_release_span_pages(c, keep, 1);
  EXPECT_EQ(chunk_adopt(reinterpret_cast<Heap*>(0x1000)), nullptr);
}

// The last release into an abandoned chunk can find pages taken by a purge for a moment, and
// then skips freeing the chunk: it is left listed, empty. brisk_trim frees such chunks.
TEST(Chunk, AnEmptyChunkLeftOnTheAbandonedListIsFreedByTheTrimSweep) {
  Chunk* c = chunk_create(nullptr);
  ASSERT_NE(c, nullptr);
  unsigned p = chunk_claim_pages(c, 1);
  chunk_abandon(c);
  ASSERT_TRUE(chunk_release_pages(c, p, 1));  // not chunk_release_span_pages
  chunk_destroy_empty_abandoned();
  Chunk* adopted = chunk_adopt(reinterpret_cast<Heap*>(0x1000));
  EXPECT_EQ(adopted, nullptr) << "the empty chunk stayed on the abandoned list";
  if (adopted != nullptr) chunk_destroy(adopted);
}

// The same race from the purge's side: the last release into an abandoned chunk finds the pages
// a purge claimed still taken, so the chunk does not look empty to it. The purge's hand-back is
// what empties it: the hand-back notes that, and a purging pass (chunk_purge_all,
// chunk_decay_all) sweeps once it lets go of the registry lock; here the batch is made by hand
// and the pass after it decays nothing. (Before, such chunks waited for the next background
// pass: the difftest's memory check failed in about 1 run in 6 with a purge delay of 1 ms, up
// to twelve chunks left mapped.)
TEST(Chunk, AnAbandonedChunkThatAPurgeHandBackEmptiesIsFreedByThePurgingPass) {
  Chunk* c = chunk_create(nullptr);
  ASSERT_NE(c, nullptr);
  unsigned keep = chunk_claim_pages(c, 1);
  unsigned drop = chunk_claim_pages(c, 2);
  std::memset(c->page_address(drop), 0xCD, 2 * kPageSize);
  chunk_release_pages(c, drop, 2);  // free and dirty: a purge takes them
  chunk_abandon(c);
  {
    ChunkPurgeBatch batch;
    ASSERT_EQ(batch.add(c), 2 * kPageSize);
    chunk_release_span_pages(c, keep, 1);  // the last live page, while the purge holds two
  }
  bool pending = false;
  chunk_decay_all(&pending, false, [](const Heap*) { return false; });  // a pass that decays nothing
  Chunk* adopted = chunk_adopt(reinterpret_cast<Heap*>(0x1000));
  EXPECT_EQ(adopted, nullptr) << "the chunk emptied by the hand-back stayed on the abandoned list";
  if (adopted != nullptr) chunk_destroy(adopted);
}

// Bytes of [p, p+n) that are not zero.
std::size_t NonZeroBytes(const char* p, std::size_t n) {
  std::size_t count = 0;
  for (std::size_t i = 0; i < n; ++i) count += p[i] != 0;
  return count;
}

// The race of issue 7: between a claim's read of the bitmaps and its compare-and-swap, the same
// pages are claimed, written and released again (a medium block grown in place, then shrunk).
// free_pages is back to what the claim read, so its compare-and-swap succeeds; the pages are
// dirty now. The hook runs that interleaving at exactly that point, once.
int g_interleaved_runs = 0;
void ClaimWriteRelease(Chunk* c, unsigned first, unsigned n) {
  g_chunk_claim_test_hook.store(nullptr);
  ++g_interleaved_runs;
  if (!chunk_claim_pages_at(c, first, n)) return;
  std::memset(c->page_address(first), 0xAB, std::size_t{n} << kPageShift);
  chunk_release_pages(c, first, n);
}

TEST(Chunk, ClaimSaysZeroedOnlyForPagesThatReadAsZeros) {
  Chunk* c = chunk_create(nullptr);
  ASSERT_NE(c, nullptr);
  // Control: fresh pages, nothing in between: zeroed, and they are.
  std::uint64_t dirty = ~std::uint64_t{0};
  unsigned clean = chunk_claim_pages(c, 2, &dirty);
  ASSERT_NE(clean, 0u);
  EXPECT_EQ(dirty, 0u) << "pages never used since the chunk was mapped read as zeros";
  EXPECT_EQ(NonZeroBytes(c->page_address(clean), 2 * kPageSize), 0u);

  g_interleaved_runs = 0;
  g_chunk_claim_test_hook.store(ClaimWriteRelease);
  dirty = 0;
  unsigned first = chunk_claim_pages(c, 2, &dirty);
  g_chunk_claim_test_hook.store(nullptr);
  ASSERT_EQ(g_interleaved_runs, 1);
  ASSERT_NE(first, 0u);
  std::size_t dirty_bytes = NonZeroBytes(c->page_address(first), 2 * kPageSize);
  EXPECT_GT(dirty_bytes, 0u) << "the interleaved claim wrote the same pages";
  EXPECT_NE(dirty, 0u) << dirty_bytes << " non-zero bytes in pages the claim called zeroed";
  chunk_release_pages(c, clean, 2);
  EXPECT_TRUE(chunk_release_pages(c, first, 2));
  chunk_destroy(c);
}

TEST(Chunk, CallocReadsZerosWhenItsPagesAreReusedDuringTheClaim) {
  // The same interleaving under a medium calloc, whose memset is skipped for pages the claim
  // calls zeroed. Purge first, so that every free page is clean when the claim reads them.
  brisk_thread_collect();
  g_interleaved_runs = 0;
  g_chunk_claim_test_hook.store(ClaimWriteRelease);
  constexpr std::size_t kSize = 3 * kPageSize;
  auto* p = static_cast<char*>(brisk_calloc(1, kSize));
  g_chunk_claim_test_hook.store(nullptr);
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(g_interleaved_runs, 1);
  EXPECT_EQ(NonZeroBytes(p, kSize), 0u);
  brisk_free(p);
}

}  // namespace
}  // namespace brisk

namespace brisk {
namespace {

// A lazy purge (MADV_FREE, the speed strategy's BRISK_PURGE_ADVICE=1) leaves the pages' dirty
// bits set, since they may still read as their old data: a claim of them must not be told they
// read as zeros (calloc would skip its memset). A second lazy purge skips them; an eager purge
// (brisk_trim) takes them too, and then they read as zeros.
TEST(ChunkLazyPurge, LazyPagesStayDirtyAreSkippedByTheNextLazyPurgeAndTakenByAnEagerOne) {
  Chunk* c = chunk_create(nullptr);
  ASSERT_NE(c, nullptr);
  unsigned first = chunk_claim_pages(c, 4);
  ASSERT_NE(first, 0u);
  std::memset(c->page_address(first), 0x5a, 4 * kPageSize);
  chunk_release_pages(c, first, 4);
  std::uint64_t run = ((std::uint64_t{1} << 4) - 1) << first;
  EXPECT_EQ(chunk_purge(c, run, true), 4 * kPageSize);
  EXPECT_EQ(chunk_purge(c, run, true), 0u) << "given back lazily already";
  std::uint64_t dirty = 0;
  ASSERT_EQ(chunk_claim_pages_at(c, first, 4), true);
  chunk_release_pages(c, first, 4);  // claimed and released again: dirty, not lazy
  EXPECT_EQ(chunk_purge(c, run, true), 4 * kPageSize) << "a claim clears the lazy bits";
  unsigned again = chunk_claim_pages(c, 4, &dirty);
  ASSERT_EQ(again, first);
  EXPECT_EQ(dirty, 0xfu) << "lazily freed pages may still hold old data";
  chunk_release_pages(c, first, 4);
  chunk_purge(c, run, true);
  EXPECT_EQ(chunk_purge(c, run, false), 4 * kPageSize) << "an eager purge takes lazy pages too";
  again = chunk_claim_pages(c, 4, &dirty);
  ASSERT_EQ(again, first);
  EXPECT_EQ(dirty, 0u);
  EXPECT_EQ(c->page_address(first)[123], 0);
  chunk_release_pages(c, first, 4);
  EXPECT_TRUE(chunk_destroy(c));
}

}  // namespace
}  // namespace brisk
