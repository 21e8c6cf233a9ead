// The statistics behind brisk-compare: medians, paired ratios and a deterministic bootstrap
// interval for the paired median (the method of ../../shared seed "fill-pattern-check": medians
// of alternating process pairs, 10,000 bootstrap resamples, 95% interval).
//
// Everything here is pure and deterministic: the same input and seed always give the same
// interval, so a table can be regenerated from the raw samples in the --json file.
#ifndef BRISK_BENCH_COMPARE_STATS_H
#define BRISK_BENCH_COMPARE_STATS_H

#include <cstddef>
#include <cstdint>
#include <vector>

namespace brisk::bench {

// The median; the mean of the two middle values for an even count. NaN for an empty input.
double median(std::vector<double> values);

// The q-quantile (0 <= q <= 1) by linear interpolation between order statistics (R's type 7,
// numpy's default). NaN for an empty input.
double quantile(std::vector<double> values, double q);

// candidate[i] / baseline[i] for each pair. Both vectors must have the same length.
std::vector<double> paired_ratios(const std::vector<double>& candidate,
                                  const std::vector<double>& baseline);

struct Interval {
  double low = 0;
  double high = 0;
  bool contains(double x) const { return low <= x && x <= high; }
};

struct BootstrapOptions {
  int resamples = 10000;
  double confidence = 0.95;
  std::uint64_t seed = 0x62726973u;  // "bris"
};

// Percentile bootstrap interval for the median of `values`: draws `resamples` resamples with
// replacement (from a fixed-seed generator that does not depend on the standard library's
// distributions), takes each one's median, and returns the (1-c)/2 and (1+c)/2 quantiles of
// those medians. An empty input gives {NaN, NaN}.
Interval bootstrap_median_interval(const std::vector<double>& values, BootstrapOptions options = {});

// The seed's throughput gain in percent, (baseline/candidate - 1) * 100, from a time ratio
// candidate/baseline.
inline double gain_percent_from_time_ratio(double time_ratio) { return (1.0 / time_ratio - 1.0) * 100.0; }

// A paired comparison of one quantity: the median of candidate/baseline ratios and its interval.
struct PairedSummary {
  std::size_t pairs = 0;
  double median_ratio = 0;
  Interval ratio_interval;
};

PairedSummary summarize_pairs(const std::vector<double>& candidate, const std::vector<double>& baseline,
                              BootstrapOptions options = {});

}  // namespace brisk::bench

#endif
