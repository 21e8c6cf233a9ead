#include "bench/compare/compare.h"

#include <cstdio>
#include <map>

namespace brisk::bench {

bool metric_higher_is_better(const std::string& name) {
  const std::string suffix = "_per_sec";
  return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<std::size_t> round_order(std::size_t allocators, int round) {
  std::vector<std::size_t> order(allocators);
  const std::size_t shift = allocators == 0 ? 0 : static_cast<std::size_t>(round < 0 ? -round : round) % allocators;
  for (std::size_t i = 0; i < allocators; ++i) order[i] = (i + shift) % allocators;
  return order;
}

WorkloadResult run_workload(const Plan& plan, const Workload& workload) {
  WorkloadResult result;
  result.workload = workload;
  const std::size_t count = plan.allocators.size();
  // An allocator whose run fails is not run again in this workload: its row reports the
  // failure, and a failing baseline stops the workload.
  std::vector<bool> dropped(count, false);
  for (int round = -plan.warmup; round < plan.pairs; ++round) {
    if (dropped[plan.baseline]) break;
    if (plan.progress) {
      if (round < 0) {
        std::fprintf(stderr, "[%s] warm-up %d/%d\n", workload.name.c_str(), round + plan.warmup + 1, plan.warmup);
      } else {
        std::fprintf(stderr, "[%s] round %d/%d\n", workload.name.c_str(), round + 1, plan.pairs);
      }
    }
    const std::vector<std::size_t> order = round_order(count, round);
    for (std::size_t position = 0; position < count; ++position) {
      const std::size_t a = order[position];
      if (dropped[a]) continue;
      RunOptions options;
      options.preload = plan.allocators[a].preload;
      options.environment = plan.environment;
      const std::vector<std::string>& own = plan.allocators[a].environment;
      options.environment.insert(options.environment.end(), own.begin(), own.end());
      options.echo_output = plan.echo_output;
      Sample sample;
      sample.allocator = a;
      sample.round = round;
      sample.position = static_cast<int>(position);
      sample.run = run_measured(workload.argv, options);
      sample.metric = parse_metric_line(sample.run.last_line);
      if (sample.run.exit_code != 0) {
        dropped[a] = true;
        std::string first_error = sample.run.stderr_tail;
        while (!first_error.empty() && first_error.back() == '\n') first_error.pop_back();
        const std::size_t last_newline = first_error.rfind('\n');
        if (last_newline != std::string::npos) first_error = first_error.substr(last_newline + 1);
        std::fprintf(stderr, "[%s] %s: the command failed (exit %d)%s%s\n", workload.name.c_str(),
                     plan.allocators[a].label.c_str(), sample.run.exit_code, first_error.empty() ? "" : ": ",
                     first_error.c_str());
      }
      result.samples.push_back(std::move(sample));
    }
  }
  summarize(plan, result);
  return result;
}

std::vector<WorkloadResult> run_comparison(const Plan& plan) {
  std::vector<WorkloadResult> results;
  for (const Workload& workload : plan.workloads) results.push_back(run_workload(plan, workload));
  return results;
}

void summarize(const Plan& plan, WorkloadResult& result) {
  const std::size_t count = plan.allocators.size();
  result.summaries.assign(count, {});
  result.failed = false;
  // Per allocator, measured samples indexed by round, so pairs line up by round.
  std::vector<std::map<int, const Sample*>> by_round(count);
  for (const Sample& sample : result.samples) {
    AllocatorSummary& summary = result.summaries[sample.allocator];
    if (sample.run.exit_code != 0 && !summary.failed) {
      summary.failed = true;
      summary.failure = "exit " + std::to_string(sample.run.exit_code) + (sample.round < 0 ? " in a warm-up" : "");
    }
    if (sample.round >= 0) by_round[sample.allocator][sample.round] = &sample;
  }
  const AllocatorSummary& base_summary = result.summaries[plan.baseline];
  for (std::size_t a = 0; a < count; ++a) {
    AllocatorSummary& summary = result.summaries[a];
    summary.allocator = a;
    if (summary.failed) result.failed = true;
    summary.runs = by_round[a].size();
    std::vector<double> wall, cpu, rss, metric;
    bool all_metrics = !by_round[a].empty();
    std::string metric_name;
    for (const auto& [round, sample] : by_round[a]) {
      wall.push_back(sample->run.wall_seconds);
      cpu.push_back(sample->run.user_seconds + sample->run.system_seconds);
      rss.push_back(static_cast<double>(sample->run.peak_rss_kib));
      if (sample->metric && (metric_name.empty() || metric_name == sample->metric->name)) {
        metric_name = sample->metric->name;
        metric.push_back(sample->metric->value);
      } else {
        all_metrics = false;
      }
    }
    summary.median_wall = median(wall);
    summary.median_cpu = median(cpu);
    summary.median_rss_kib = median(rss);
    if (all_metrics) {
      summary.metric_name = metric_name;
      summary.median_metric = median(metric);
    }
    if (summary.failed || base_summary.failed) continue;

    // Pairs: the rounds in which both this allocator and the baseline ran.
    std::vector<double> c_wall, b_wall, c_rss, b_rss, c_metric, b_metric;
    bool metric_pairs = all_metrics;
    for (const auto& [round, sample] : by_round[a]) {
      auto base = by_round[plan.baseline].find(round);
      if (base == by_round[plan.baseline].end()) continue;
      c_wall.push_back(sample->run.wall_seconds);
      b_wall.push_back(base->second->run.wall_seconds);
      c_rss.push_back(static_cast<double>(sample->run.peak_rss_kib));
      b_rss.push_back(static_cast<double>(base->second->run.peak_rss_kib));
      if (metric_pairs && base->second->metric && base->second->metric->name == metric_name) {
        c_metric.push_back(sample->metric->value);
        b_metric.push_back(base->second->metric->value);
      } else {
        metric_pairs = false;
      }
    }
    if (c_wall.empty()) continue;
    summary.wall = summarize_pairs(c_wall, b_wall, plan.bootstrap);
    summary.rss = summarize_pairs(c_rss, b_rss, plan.bootstrap);
    if (metric_pairs && !c_metric.empty()) summary.metric = summarize_pairs(c_metric, b_metric, plan.bootstrap);
  }
}

}  // namespace brisk::bench
