#include "core/size_class.h"
#include "core/span.h"

#include <gtest/gtest.h>

namespace brisk {
namespace {

TEST(SizeClass, EverySizeMapsToTheSmallestClassThatFits) {
  for (std::size_t size = 1; size <= kSmallMax; ++size) {
    unsigned c = size_to_class(size);
    ASSERT_LT(c, kNumClasses);
    ASSERT_GE(kClasses[c].size, size) << size;
    if (c > 0) ASSERT_LT(kClasses[c - 1].size, size) << size;
    ASSERT_EQ(size_to_class_compute(size), c) << "table and computation disagree at " << size;
  }
  EXPECT_EQ(size_to_class(0), 0u);
}

TEST(SizeClass, ClassesAreSixteenByteMultiplesAndStrictlyIncreasing) {
  for (unsigned c = 0; c < kNumClasses; ++c) {
    EXPECT_EQ(kClasses[c].size % kMinAlign, 0u) << c;
    if (c > 0) EXPECT_GT(kClasses[c].size, kClasses[c - 1].size) << c;
  }
}

TEST(SizeClass, WasteAbove128BytesIsAtMostOneEighth) {
  for (std::size_t size = 129; size <= kSmallMax; ++size) {
    std::size_t cs = kClasses[size_to_class(size)].size;
    ASSERT_LE((cs - size) * 8, cs) << size;
  }
  // Below 128 B the 16-byte step bounds it.
  for (std::size_t size = 1; size <= 128; ++size)
    ASSERT_LT(kClasses[size_to_class(size)].size - size, 16u) << size;
}

TEST(SizeClass, SpansHoldAtLeastEightBlocksOrAreOnePageAbove16KiB) {
  for (unsigned c = 0; c < kNumClasses; ++c) {
    const SizeClassInfo& info = kClasses[c];
    if (info.size > 16 * 1024) {
      EXPECT_EQ(info.span_pages, 1u) << c;
      EXPECT_GE(info.capacity, 1u) << c;
    } else {
      EXPECT_GE(info.capacity, 8u) << c;
    }
    // The fewest pages that do: half the span would hold too few.
    if (info.span_pages > 1) EXPECT_LT(info.span_pages / 2 * kPageSize / info.size, 8u) << c;
    EXPECT_LE(info.span_pages, kMaxSmallSpanPages);
    EXPECT_EQ(info.capacity, info.span_pages * kPageSize / info.size);
  }
}

// The block-start tests of free's fast path and of the slow paths, against the plain
// arithmetic: every offset from two spans below start (wrapping) to two blocks past the span's
// end, for no, some and all blocks carved, and offsets spread over the whole 64-bit range.
TEST(SizeClass, TheBlockStartTestIsExactForEveryClassAndOffset) {
  std::uint64_t x = 0x9e3779b97f4a7c15u;
  for (unsigned c = 0; c < kNumClasses; ++c) {
    const SizeClassInfo& info = kClasses[c];
    ASSERT_EQ(std::uint64_t{info.size >> info.divisor.shift} * info.divisor.inverse, 1u) << c;
    ASSERT_EQ((info.size >> info.divisor.shift) % 2, 1u) << c;
    Span s;
    s.block_size = info.size;
    s.span_bytes = info.capacity * info.size;
    s.inverse = info.divisor.inverse;
    s.shift = info.divisor.shift;
    const std::uint64_t span = s.span_bytes;
    for (std::uint32_t carved : {0u, 1u, info.capacity / 2, info.capacity}) {
      s.carved_blocks = carved;
      auto expect = [&](std::uint64_t off) {
        bool start = off % info.size == 0;
        ASSERT_EQ(s.is_carved_block(off), start && off / info.size < carved) << "class " << c << " offset " << off;
        ASSERT_EQ(s.is_block_start(off), start && off / info.size < info.capacity) << "class " << c << " offset " << off;
      };
      for (std::uint64_t off = -2 * span; off != span + 2 * info.size; ++off) expect(off);
      for (int i = 0; i < 20000; ++i) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        expect(x);
        expect(x - x % info.size);  // a multiple, mostly far past the span
      }
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// A medium span holds one block, at offset 0, whatever its size: inverse 1, shift 0.
TEST(SizeClass, AMediumSpansOnlyBlockStartIsOffsetZero) {
  Span s;
  s.inverse = 1;
  s.shift = 0;
  s.carved_blocks = 1;
  for (std::uint32_t size : {65552u, 100000u, 4u << 20}) {
    s.block_size = s.span_bytes = size;
    for (std::uint64_t off : {std::uint64_t{0}, std::uint64_t{16}, std::uint64_t{size}, std::uint64_t{size} * 2,
                              ~std::uint64_t{0} - 15, std::uint64_t{1} << 63}) {
      EXPECT_EQ(s.is_carved_block(off), off == 0) << size << " " << off;
      EXPECT_EQ(s.is_block_start(off), off == 0) << size << " " << off;
    }
  }
}

}  // namespace
}  // namespace brisk
