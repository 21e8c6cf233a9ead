#include "core/chunk.h"

#include <gtest/gtest.h>

#include <cstring>

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
  ASSERT_TRUE(chunk_release_pages(c, p, 1));
  chunk_release_if_abandoned_and_empty(c);
  EXPECT_EQ(chunk_adopt(fake_owner), nullptr);
}

}  // namespace
}  // namespace brisk
