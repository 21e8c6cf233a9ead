// debug/fill_check: the seed's correctness test (every fill byte for sizes 1 to 1025; every byte
// of freed blocks of sizes 1 to 65 and 257 corrupted and restored in turn), multi-range damage,
// more than kMaxDamagedRanges ranges, and reads that stay inside the block, run against each
// implementation directly and through the dispatcher.
#include "debug/fill_check.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

namespace brisk::debug {
// Found by argument-dependent lookup from the comparisons and printing of std::vector.
bool operator==(const DamagedRange& a, const DamagedRange& b) { return a.offset == b.offset && a.length == b.length; }
void PrintTo(const DamagedRange& r, std::ostream* os) { *os << r.offset << "(" << r.length << ")"; }
}  // namespace brisk::debug

namespace {

using brisk::debug::check_fill_with;
using brisk::debug::DamagedRange;
using brisk::debug::FillCheckImpl;
using brisk::debug::FillDamage;
using brisk::debug::kMaxDamagedRanges;

constexpr std::uint8_t kFreedPattern = 0xA5;

// The parameter: an implementation called directly, or kDispatched for the entry points the
// allocator calls (find_fill_damage's inline path up to kInlineCheckMax, then the dispatch).
constexpr int kDispatched = -1;

std::vector<int> Impls() {
  std::vector<int> impls = {kDispatched};
  for (int i = 0; i < static_cast<int>(FillCheckImpl::kCount); ++i)
    if (brisk::debug::fill_check_supported(static_cast<FillCheckImpl>(i))) impls.push_back(i);
  return impls;
}

std::size_t Find(int impl, const void* block, std::size_t size, std::uint8_t pattern) {
  if (impl == kDispatched) return brisk::debug::find_fill_damage(block, size, pattern);
  return brisk::debug::find_fill_damage_with(static_cast<FillCheckImpl>(impl), block, size, pattern);
}

bool Check(int impl, const void* block, std::size_t size, std::uint8_t pattern, FillDamage* damage) {
  if (impl == kDispatched) return brisk::debug::check_fill(block, size, pattern, damage);
  return check_fill_with(static_cast<FillCheckImpl>(impl), block, size, pattern, damage);
}

class FillCheck : public ::testing::TestWithParam<int> {};

std::string ImplName(const ::testing::TestParamInfo<int>& info) {
  return info.param == kDispatched ? "dispatched" : brisk::debug::fill_check_name(static_cast<FillCheckImpl>(info.param));
}

// Every byte of a filled block holds the fill byte, for every size 1..1025 and every
// misalignment 0..7, and the check calls it intact.
TEST_P(FillCheck, EveryFilledByteHoldsThePatternForSizes1To1025) {
  std::vector<std::uint8_t> buffer(1025 + 64, 0);
  for (std::size_t size = 1; size <= 1025; ++size) {
    for (std::size_t misalign = 0; misalign < 8; ++misalign) {
      std::uint8_t* block = buffer.data() + misalign;
      const auto pattern = static_cast<std::uint8_t>(size * 7 + misalign);
      std::memset(buffer.data(), static_cast<std::uint8_t>(~pattern), buffer.size());
      brisk::debug::fill_block(block, size, pattern);
      for (std::size_t i = 0; i < size; ++i) ASSERT_EQ(block[i], pattern) << "size " << size << " byte " << i;
      ASSERT_EQ(block[size], static_cast<std::uint8_t>(~pattern)) << "fill ran past the end, size " << size;
      ASSERT_EQ(Find(GetParam(), block, size, pattern), size) << "size " << size;
      FillDamage damage;
      ASSERT_TRUE(Check(GetParam(), block, size, pattern, &damage)) << "size " << size;
    }
  }
}

// The seed's freed-block test: corrupt each byte in turn; the check reports exactly that byte as
// one range of length 1; restore it and the next check is clean. The bytes around the block
// differ from the pattern, so a read outside the block would show as damage.
TEST_P(FillCheck, EachCorruptedByteOfAFreedBlockIsReportedAndARestoredBlockIsClean) {
  std::vector<std::size_t> sizes;
  for (std::size_t s = 1; s <= 65; ++s) sizes.push_back(s);
  sizes.push_back(257);
  std::vector<std::uint8_t> buffer(257 + 64 + 16);
  for (std::size_t size : sizes) {
    for (std::size_t misalign : {0, 3}) {
      std::memset(buffer.data(), 0x00, buffer.size());
      std::uint8_t* block = buffer.data() + 8 + misalign;
      brisk::debug::fill_block(block, size, kFreedPattern);
      for (std::size_t i = 0; i < size; ++i) {
        for (std::uint8_t bad : {std::uint8_t{0x00}, std::uint8_t{kFreedPattern ^ 0x80}}) {
          block[i] = bad;
          FillDamage damage;
          ASSERT_FALSE(Check(GetParam(), block, size, kFreedPattern, &damage)) << size << "/" << i;
          ASSERT_EQ(damage.first_offset, i) << "size " << size;
          ASSERT_EQ(damage.range_count, 1) << "size " << size << " byte " << i;
          ASSERT_EQ(damage.ranges[0].offset, i);
          ASSERT_EQ(damage.ranges[0].length, 1u);
          ASSERT_FALSE(damage.more_ranges);
          ASSERT_EQ(Find(GetParam(), block, size, kFreedPattern), i);
          block[i] = kFreedPattern;
          ASSERT_TRUE(Check(GetParam(), block, size, kFreedPattern, &damage)) << size << "/" << i;
        }
      }
    }
  }
}

std::vector<DamagedRange> Ranges(const FillDamage& damage) {
  return std::vector<DamagedRange>(damage.ranges, damage.ranges + damage.range_count);
}

TEST_P(FillCheck, SeveralDamagedRangesAreEachReportedWithOffsetAndLength) {
  constexpr std::size_t kSize = 4096 + 13;
  std::vector<std::uint8_t> block(kSize, kFreedPattern);
  const std::vector<DamagedRange> expected = {{0, 3}, {31, 2}, {127, 130}, {1000, 1}, {4095, 1}, {kSize - 5, 5}};
  for (const DamagedRange& r : expected) std::memset(block.data() + r.offset, 0x11, r.length);
  FillDamage damage;
  ASSERT_FALSE(Check(GetParam(), block.data(), kSize, kFreedPattern, &damage));
  EXPECT_EQ(damage.first_offset, 0u);
  EXPECT_EQ(Ranges(damage), expected);
  EXPECT_FALSE(damage.more_ranges);
}

TEST_P(FillCheck, AWhollyOverwrittenBlockIsOneRange) {
  std::vector<std::uint8_t> block(65536, 0);
  FillDamage damage;
  ASSERT_FALSE(Check(GetParam(), block.data(), block.size(), kFreedPattern, &damage));
  EXPECT_EQ(Ranges(damage), (std::vector<DamagedRange>{{0, 65536}}));
  EXPECT_FALSE(damage.more_ranges);
}

TEST_P(FillCheck, ExactlyTheRangeLimitIsNotMoreButOneBeyondIs) {
  std::vector<std::uint8_t> block(64 * 1024, kFreedPattern);
  std::vector<DamagedRange> expected;
  for (int r = 0; r < kMaxDamagedRanges; ++r) {
    const std::size_t offset = 100 + static_cast<std::size_t>(r) * 1500;
    block[offset] = 0;
    block[offset + 1] = 0;
    expected.push_back({offset, 2});
  }
  FillDamage damage;
  ASSERT_FALSE(Check(GetParam(), block.data(), block.size(), kFreedPattern, &damage));
  EXPECT_EQ(Ranges(damage), expected);
  EXPECT_FALSE(damage.more_ranges);

  block[block.size() - 1] = 0;  // a 33rd range
  ASSERT_FALSE(Check(GetParam(), block.data(), block.size(), kFreedPattern, &damage));
  EXPECT_EQ(Ranges(damage), expected);
  EXPECT_TRUE(damage.more_ranges);
}

TEST_P(FillCheck, EveryOtherByteDamagedFillsTheRangesAndSaysThereIsMore) {
  std::vector<std::uint8_t> block(257, kFreedPattern);
  for (std::size_t i = 1; i < block.size(); i += 2) block[i] = 0;
  FillDamage damage;
  ASSERT_FALSE(Check(GetParam(), block.data(), block.size(), kFreedPattern, &damage));
  ASSERT_EQ(damage.range_count, kMaxDamagedRanges);
  for (int r = 0; r < kMaxDamagedRanges; ++r) {
    EXPECT_EQ(damage.ranges[r].offset, 1u + 2u * static_cast<std::size_t>(r));
    EXPECT_EQ(damage.ranges[r].length, 1u);
  }
  EXPECT_TRUE(damage.more_ranges);
}

TEST_P(FillCheck, AZeroSizeBlockIsIntact) {
  FillDamage damage;
  std::uint8_t byte = 0;
  EXPECT_TRUE(Check(GetParam(), &byte, 0, kFreedPattern, &damage));
  EXPECT_EQ(Find(GetParam(), &byte, 0, kFreedPattern), 0u);
}

// Blocks that end where an inaccessible page begins: a load past the block's end would fault.
TEST_P(FillCheck, ChecksReadNothingPastTheBlockEnd) {
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  auto* area = static_cast<std::uint8_t*>(mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(area, MAP_FAILED);
  ASSERT_EQ(mprotect(area + page, page, PROT_NONE), 0);
  for (std::size_t size = 0; size <= 600; ++size) {
    std::uint8_t* block = area + page - size;
    brisk::debug::fill_block(block, size, kFreedPattern);
    FillDamage damage;
    ASSERT_TRUE(Check(GetParam(), block, size, kFreedPattern, &damage)) << size;
    if (size > 0) {
      block[size - 1] = 0;
      ASSERT_FALSE(Check(GetParam(), block, size, kFreedPattern, &damage)) << size;
      ASSERT_EQ(damage.first_offset, size - 1);
    }
  }
  munmap(area, 2 * page);
}

INSTANTIATE_TEST_SUITE_P(EachImplementation, FillCheck, ::testing::ValuesIn(Impls()), ImplName);

TEST(FillCheckDispatch, ThePortableAndSse2ImplementationsExistOnX86) {
  EXPECT_TRUE(brisk::debug::fill_check_supported(FillCheckImpl::kPortable));
#if defined(__x86_64__)
  EXPECT_TRUE(brisk::debug::fill_check_supported(FillCheckImpl::kSse2));
#endif
}

TEST(FillCheckDispatch, TheDispatchedCheckIsTheWidestTheCpuHasAndFindsDamage) {
  const FillCheckImpl selected = brisk::debug::fill_check_selected();
  EXPECT_TRUE(brisk::debug::fill_check_supported(selected));
  for (int i = static_cast<int>(selected) + 1; i < static_cast<int>(FillCheckImpl::kCount); ++i)
    EXPECT_FALSE(brisk::debug::fill_check_supported(static_cast<FillCheckImpl>(i)))
        << "a wider check is supported but not chosen: " << brisk::debug::fill_check_name(static_cast<FillCheckImpl>(i));
  std::vector<std::uint8_t> block(300, kFreedPattern);
  EXPECT_EQ(brisk::debug::find_fill_damage(block.data(), block.size(), kFreedPattern), 300u);
  block[299] = 1;
  block[7] = 1;
  FillDamage damage;
  ASSERT_FALSE(brisk::debug::check_fill(block.data(), block.size(), kFreedPattern, &damage));
  EXPECT_EQ(Ranges(damage), (std::vector<DamagedRange>{{7, 1}, {299, 1}}));
}

}  // namespace
