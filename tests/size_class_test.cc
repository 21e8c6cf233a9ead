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

TEST(SizeClass, SpansHoldAtLeastEightBlocksOrFourAbove16KiBAndTheReciprocalIsExact) {
  for (unsigned c = 0; c < kNumClasses; ++c) {
    const SizeClassInfo& info = kClasses[c];
    EXPECT_GE(info.capacity, info.size > 16 * 1024 ? 4u : 8u) << c;
    // The fewest pages that do: half the span would hold too few.
    if (info.span_pages > 1) EXPECT_LT(info.span_pages / 2 * kPageSize / info.size, info.size > 16 * 1024 ? 4u : 8u) << c;
    EXPECT_LE(info.span_pages, kMaxSmallSpanPages);
    EXPECT_EQ(info.capacity, info.span_pages * kPageSize / info.size);
    Span s;
    s.block_size = info.size;
    s.reciprocal = info.reciprocal;
    for (std::uintptr_t off = 0; off < std::uintptr_t{info.capacity} * info.size; off += (off % 977) + 1)
      ASSERT_EQ(s.is_block_start(off), off % info.size == 0) << "class " << c << " offset " << off;
    for (std::uint32_t i = 0; i < info.capacity; ++i) ASSERT_TRUE(s.is_block_start(std::uintptr_t{i} * info.size));
  }
}

}  // namespace
}  // namespace brisk
