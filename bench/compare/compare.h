// The paired comparison: warm-ups, then rounds of one run per allocator in rotated order, then
// per-allocator paired ratios against the baseline with bootstrap intervals.
//
// Call map: run_comparison -> (per workload) run_workload -> run_measured (measure.h)
//           summarize -> summarize_pairs (stats.h)
#ifndef BRISK_BENCH_COMPARE_COMPARE_H
#define BRISK_BENCH_COMPARE_COMPARE_H

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "bench/compare/allocators.h"
#include "bench/compare/measure.h"
#include "bench/compare/stats.h"

namespace brisk::bench {

struct Workload {
  std::string name;               // row label, e.g. "small" or the command's file name
  std::vector<std::string> argv;  // the command
};

struct Plan {
  std::vector<Workload> workloads;
  std::vector<Allocator> allocators;  // already resolved and probed
  std::size_t baseline = 0;           // index into allocators
  int pairs = 25;
  int warmup = 3;
  std::vector<std::string> environment;  // extra NAME=VALUE for every run
  bool echo_output = false;
  bool progress = true;  // one status line per round on stderr
  BootstrapOptions bootstrap;
};

struct Sample {
  std::size_t allocator = 0;
  int round = 0;     // warm-ups are rounds -warmup..-1; measured rounds 0..pairs-1
  int position = 0;  // 0-based place in the round's order
  RunResult run;
  std::optional<Metric> metric;
};

struct AllocatorSummary {
  std::size_t allocator = 0;
  bool failed = false;          // some run exited non-zero: no ratios are reported
  std::string failure;          // the first failure, for the report
  std::size_t runs = 0;         // measured (non-warm-up) runs
  double median_wall = 0;       // seconds
  double median_cpu = 0;        // user + system seconds
  double median_rss_kib = 0;
  PairedSummary wall;           // candidate / baseline wall time
  PairedSummary rss;            // candidate / baseline peak RSS
  std::optional<PairedSummary> metric;  // candidate / baseline workload metric
  std::string metric_name;
  double median_metric = 0;
};

struct WorkloadResult {
  Workload workload;
  std::vector<Sample> samples;
  std::vector<AllocatorSummary> summaries;  // one per allocator, in plan order
  bool failed = false;
};

// True when a larger value of the metric is better (names ending in "_per_sec").
bool metric_higher_is_better(const std::string& name);

// The order of allocator indices in a round: 0 1 2, then 1 2 0, then 2 0 1, ...
std::vector<std::size_t> round_order(std::size_t allocators, int round);

WorkloadResult run_workload(const Plan& plan, const Workload& workload);
std::vector<WorkloadResult> run_comparison(const Plan& plan);

// Recomputes result.summaries from result.samples.
void summarize(const Plan& plan, WorkloadResult& result);

}  // namespace brisk::bench

#endif
