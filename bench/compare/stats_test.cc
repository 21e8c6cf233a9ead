// Known-answer tests for brisk-compare's statistics.
#include "bench/compare/stats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace brisk::bench {
namespace {

TEST(Median, OddEvenAndUnsorted) {
  EXPECT_DOUBLE_EQ(median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(median({7}), 7);
  EXPECT_DOUBLE_EQ(median({5, 5, 1, 9, 5}), 5);
  EXPECT_TRUE(std::isnan(median({})));
}

TEST(Quantile, MatchesType7) {
  // numpy.quantile([1, 2, 3, 4], q) for q = 0, .25, .5, .9, 1.
  EXPECT_DOUBLE_EQ(quantile({4, 3, 2, 1}, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(quantile({4, 3, 2, 1}, 0.25), 1.75);
  EXPECT_DOUBLE_EQ(quantile({4, 3, 2, 1}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(quantile({4, 3, 2, 1}, 0.9), 3.7);
  EXPECT_DOUBLE_EQ(quantile({4, 3, 2, 1}, 1.0), 4.0);
}

TEST(PairedRatios, DividesCandidateByBaseline) {
  const std::vector<double> r = paired_ratios({2, 3, 10}, {1, 6, 4});
  ASSERT_EQ(r.size(), 3u);
  EXPECT_DOUBLE_EQ(r[0], 2.0);
  EXPECT_DOUBLE_EQ(r[1], 0.5);
  EXPECT_DOUBLE_EQ(r[2], 2.5);
  EXPECT_THROW(paired_ratios({1}, {1, 2}), std::invalid_argument);
}

TEST(Gain, IsTheSeedsFormula) {
  // (baseline/candidate - 1) * 100 with ratio = candidate/baseline.
  EXPECT_DOUBLE_EQ(gain_percent_from_time_ratio(0.5), 100.0);
  EXPECT_DOUBLE_EQ(gain_percent_from_time_ratio(2.0), -50.0);
  EXPECT_DOUBLE_EQ(gain_percent_from_time_ratio(1.0), 0.0);
}

TEST(Bootstrap, DegenerateInputs) {
  Interval one = bootstrap_median_interval({1.25});
  EXPECT_DOUBLE_EQ(one.low, 1.25);
  EXPECT_DOUBLE_EQ(one.high, 1.25);
  Interval constant = bootstrap_median_interval(std::vector<double>(25, 0.8));
  EXPECT_DOUBLE_EQ(constant.low, 0.8);
  EXPECT_DOUBLE_EQ(constant.high, 0.8);
  Interval empty = bootstrap_median_interval({});
  EXPECT_TRUE(std::isnan(empty.low));
}

TEST(Bootstrap, SmallSamplesHaveExactAnswers) {
  // {0, 1}: resample medians are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4, so the 2.5% and
  // 97.5% quantiles of 10,000 of them are 0 and 1.
  Interval two = bootstrap_median_interval({0, 1});
  EXPECT_DOUBLE_EQ(two.low, 0);
  EXPECT_DOUBLE_EQ(two.high, 1);
  // {1, 2, 3}: P(median = 1) = P(median = 3) = 7/27, far above 2.5%.
  Interval three = bootstrap_median_interval({3, 1, 2});
  EXPECT_DOUBLE_EQ(three.low, 1);
  EXPECT_DOUBLE_EQ(three.high, 3);
  // An 80% interval of {1, 2, 3} still reaches 1 and 3 (7/27 > 10%); a 40% one does not.
  Interval narrow = bootstrap_median_interval({3, 1, 2}, {.resamples = 10000, .confidence = 0.4});
  EXPECT_DOUBLE_EQ(narrow.low, 2);
  EXPECT_DOUBLE_EQ(narrow.high, 2);
}

// The exact bootstrap distribution of the median of n (odd) distinct sorted values x_1..x_n:
// P(median <= x_k) = P(Binomial(n, k/n) >= (n+1)/2). Returns the index k of the q-quantile.
std::size_t exact_bootstrap_median_index(std::size_t n, double q) {
  for (std::size_t k = 1; k <= n; ++k) {
    const double p = static_cast<double>(k) / static_cast<double>(n);
    double cdf = 0;
    for (std::size_t j = (n + 1) / 2; j <= n; ++j) {
      cdf += std::exp(std::lgamma(n + 1.0) - std::lgamma(j + 1.0) - std::lgamma(n - j + 1.0) +
                      j * std::log(p) + (n - j) * std::log1p(-p + 1e-300));
    }
    if (cdf >= q) return k;
  }
  return n;
}

TEST(Bootstrap, MatchesTheExactDistributionForTwentyFivePairs) {
  std::vector<double> values;
  for (int i = 1; i <= 25; ++i) values.push_back(i);
  Interval interval = bootstrap_median_interval(values);
  // 10,000 resamples estimate the exact quantiles to within one order statistic.
  const double exact_low = static_cast<double>(exact_bootstrap_median_index(25, 0.025));
  const double exact_high = static_cast<double>(exact_bootstrap_median_index(25, 0.975));
  EXPECT_NEAR(interval.low, exact_low, 1.0);
  EXPECT_NEAR(interval.high, exact_high, 1.0);
  EXPECT_LT(interval.low, 13);
  EXPECT_GT(interval.high, 13);
}

TEST(Bootstrap, IsDeterministicForASeed) {
  std::vector<double> values = {0.9, 1.1, 1.05, 0.97, 1.2, 0.88, 1.01};
  Interval a = bootstrap_median_interval(values);
  Interval b = bootstrap_median_interval(values);
  EXPECT_EQ(a.low, b.low);
  EXPECT_EQ(a.high, b.high);
  Interval c = bootstrap_median_interval(values, {.seed = 12345});
  EXPECT_TRUE(c.contains(median(values)));
}

// Two identical allocators: paired log-normal timings from one distribution. The 95% interval of
// the median ratio should contain 1.0 in roughly 95% of experiments, and the median ratio of
// a candidate made exactly 2x slower should come out near 2 with 1.0 far outside.
TEST(Bootstrap, IdenticalAllocatorsContainOneAndDoubledTimeGivesTwo) {
  std::mt19937_64 engine(42);
  std::normal_distribution<double> noise(0.0, 0.05);
  int contained = 0;
  const int experiments = 200;
  for (int e = 0; e < experiments; ++e) {
    std::vector<double> a, b, slow;
    for (int i = 0; i < 25; ++i) {
      a.push_back(std::exp(noise(engine)));
      b.push_back(std::exp(noise(engine)));
      slow.push_back(2.0 * std::exp(noise(engine)));
    }
    PairedSummary same = summarize_pairs(b, a, {.resamples = 2000});
    if (same.ratio_interval.contains(1.0)) ++contained;
    PairedSummary doubled = summarize_pairs(slow, a, {.resamples = 2000});
    EXPECT_NEAR(doubled.median_ratio, 2.0, 0.15);
    EXPECT_FALSE(doubled.ratio_interval.contains(1.0));
  }
  EXPECT_GE(contained, experiments * 88 / 100);
  EXPECT_LE(contained, experiments);
}

}  // namespace
}  // namespace brisk::bench
