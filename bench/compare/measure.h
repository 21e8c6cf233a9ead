// One measured run of a command: fork, exec with a chosen LD_PRELOAD, wait4 for its rusage.
#ifndef BRISK_BENCH_COMPARE_MEASURE_H
#define BRISK_BENCH_COMPARE_MEASURE_H

#include <optional>
#include <string>
#include <vector>

namespace brisk::bench {

struct RunResult {
  double wall_seconds = 0;    // steady_clock from fork to reaping the child
  double user_seconds = 0;    // ru_utime
  double system_seconds = 0;  // ru_stime
  long peak_rss_kib = 0;      // ru_maxrss (KiB on Linux)
  int exit_code = 0;          // exit status, or 128 + signal number
  bool exec_failed = false;
  std::string last_line;      // the last non-empty line the command wrote to stdout
  std::string stderr_tail;    // up to the last 2 KiB of stderr, for failure reports
};

struct RunOptions {
  // Empty: run with LD_PRELOAD removed from the environment. Otherwise LD_PRELOAD=preload.
  std::string preload;
  // Extra NAME=VALUE entries set in the environment: each replaces an inherited variable of the
  // same name, and a later entry replaces an earlier one.
  std::vector<std::string> environment;
  // Copy the command's stdout and stderr through to ours as well as capturing them.
  bool echo_output = false;
};

// Runs argv[0] (searched in PATH) with argv, waits for it and measures it.
RunResult run_measured(const std::vector<std::string>& argv, const RunOptions& options);

// Parses "NAME=NUMBER" (surrounding spaces allowed). Returns the name and value.
struct Metric {
  std::string name;
  double value = 0;
};
std::optional<Metric> parse_metric_line(const std::string& line);

}  // namespace brisk::bench

#endif
