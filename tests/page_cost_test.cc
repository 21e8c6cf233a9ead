// core/page_cost.h: which way of making a fresh OS page present carving takes, from the costs it
// has measured (threadcache/carve.cc times each page; tests/span_test.cc checks the carves).
#include "core/page_cost.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "core/config.h"

namespace brisk {
namespace {

// The measurement: populate until each way has kWarmSamples samples, then the cheaper; one page
// in kSampleEvery (a hash of its address) the other way, among the timed ones (one in 8); a
// sample far above the means counts as 8 times the lower one.
TEST(PageCost, ChoosesPopulateUntilBothWaysAreMeasuredThenTheCheaperWithSamplePagesTheOtherWay) {
  using page_cost::Way;
  page_cost::set_for_test({0, 0, 0, 0}, false);
  std::uintptr_t sample = 0, plain = 0;
  unsigned samples = 0;
  for (std::uintptr_t page = std::uintptr_t{1} << 30; page < (std::uintptr_t{1} << 30) + 1600 * kOsPageSize;
       page += kOsPageSize) {
    if (!page_cost::is_sample_page(page)) {
      plain = page;
      continue;
    }
    sample = page;
    ++samples;
  }
  EXPECT_GT(samples, 1600u / page_cost::kSampleEvery / 2);  // about one in 16 ...
  EXPECT_LT(samples, 1600u / page_cost::kSampleEvery * 2);
  unsigned timed = 0;  // one in 8 is timed, every sample page among them
  for (std::uintptr_t page = std::uintptr_t{1} << 30; page < (std::uintptr_t{1} << 30) + 1600 * kOsPageSize;
       page += kOsPageSize) {
    timed += page_cost::is_timed_page(page);
    if (page_cost::is_sample_page(page)) EXPECT_TRUE(page_cost::is_timed_page(page));
  }
  EXPECT_GT(timed, 1600u / 8 / 2);
  EXPECT_LT(timed, 1600u / 8 * 2);
  EXPECT_GT(timed, samples);
  unsigned span_starts = 0;  // ... and not every span's first OS page
  for (std::uintptr_t k = 0; k < 64; ++k) span_starts += page_cost::is_sample_page((std::uintptr_t{1} << 30) + k * kPageSize);
  EXPECT_LT(span_starts, 16u);
  EXPECT_EQ(page_cost::choose(plain), Way::kPopulate);
  EXPECT_EQ(page_cost::choose(sample), Way::kFault);
  for (unsigned i = 0; i < page_cost::kWarmSamples; ++i) page_cost::record(Way::kFault, 1000);
  for (unsigned i = 0; i + 1 < page_cost::kWarmSamples; ++i) page_cost::record(Way::kPopulate, 3000);
  EXPECT_EQ(page_cost::choose(plain), Way::kPopulate) << "chose before populate had its samples";
  page_cost::record(Way::kPopulate, 3000);
  EXPECT_EQ(page_cost::choose(plain), Way::kFault);
  EXPECT_EQ(page_cost::choose(sample), Way::kPopulate);
  EXPECT_EQ(page_cost::costs().fault_ns, 1000u);
  EXPECT_EQ(page_cost::costs().populate_ns, 3000u);
  // The costs move (populate gets cheaper, as beside a thread that maps and unmaps faults get
  // dearer): the choice follows the means.
  for (int i = 0; i < 40; ++i) page_cost::record(Way::kPopulate, 200);
  EXPECT_LT(page_cost::costs().populate_ns, 1000u);
  EXPECT_EQ(page_cost::choose(plain), Way::kPopulate);
  // A preempted sample counts as at most 8 times the lower mean: here populate's, under 1000.
  const page_cost::Costs before = page_cost::costs();
  page_cost::record(Way::kFault, 1000000000);
  EXPECT_LE(page_cost::costs().fault_ns, before.fault_ns - before.fault_ns / 8 + before.populate_ns);
  // Ten of them in a row leave the mean under 8 times the lower one (it was 1.2 ms a page after
  // one run of larson when the cap followed the way's own mean).
  for (int i = 0; i < 10; ++i) page_cost::record(Way::kFault, 1000000000);
  EXPECT_LE(page_cost::costs().fault_ns, 8 * page_cost::costs().populate_ns);
  page_cost::set_for_test({0, 0, 0, 0}, false);
}

}  // namespace
}  // namespace brisk
