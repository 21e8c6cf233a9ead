#include "bench/compare/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace brisk::bench {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// splitmix64: small, fast and fully specified, so intervals are reproducible on any platform.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, bound) by rejection, without modulo bias.
  std::size_t below(std::size_t bound) {
    const std::uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    std::uint64_t x;
    do {
      x = next();
    } while (x >= limit);
    return static_cast<std::size_t>(x % bound);
  }

 private:
  std::uint64_t state_;
};

double sorted_quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return kNaN;
  const double position = q * static_cast<double>(sorted.size() - 1);
  const std::size_t below = static_cast<std::size_t>(std::floor(position));
  const std::size_t above = std::min(below + 1, sorted.size() - 1);
  const double fraction = position - static_cast<double>(below);
  return sorted[below] + (sorted[above] - sorted[below]) * fraction;
}

}  // namespace

double median(std::vector<double> values) { return quantile(std::move(values), 0.5); }

double quantile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  return sorted_quantile(values, q);
}

std::vector<double> paired_ratios(const std::vector<double>& candidate, const std::vector<double>& baseline) {
  if (candidate.size() != baseline.size()) throw std::invalid_argument("paired_ratios: unequal lengths");
  std::vector<double> ratios(candidate.size());
  for (std::size_t i = 0; i < candidate.size(); ++i) ratios[i] = candidate[i] / baseline[i];
  return ratios;
}

Interval bootstrap_median_interval(const std::vector<double>& values, BootstrapOptions options) {
  if (values.empty()) return {kNaN, kNaN};
  SplitMix64 random(options.seed);
  const std::size_t n = values.size();
  std::vector<double> medians(static_cast<std::size_t>(options.resamples));
  std::vector<double> resample(n);
  for (double& m : medians) {
    for (double& v : resample) v = values[random.below(n)];
    // The median of the resample; nth_element is enough and keeps 10,000 resamples cheap.
    const std::size_t mid = n / 2;
    std::nth_element(resample.begin(), resample.begin() + mid, resample.end());
    double upper = resample[mid];
    if (n % 2 == 1) {
      m = upper;
    } else {
      double lower = *std::max_element(resample.begin(), resample.begin() + mid);
      m = (lower + upper) / 2;
    }
  }
  std::sort(medians.begin(), medians.end());
  const double tail = (1.0 - options.confidence) / 2;
  return {sorted_quantile(medians, tail), sorted_quantile(medians, 1.0 - tail)};
}

PairedSummary summarize_pairs(const std::vector<double>& candidate, const std::vector<double>& baseline,
                              BootstrapOptions options) {
  const std::vector<double> ratios = paired_ratios(candidate, baseline);
  PairedSummary summary;
  summary.pairs = ratios.size();
  summary.median_ratio = median(ratios);
  summary.ratio_interval = bootstrap_median_interval(ratios, options);
  return summary;
}

}  // namespace brisk::bench
