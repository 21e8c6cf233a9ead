// brisk-compare's outputs: the markdown table, the raw-sample JSON and the SVG chart.
#ifndef BRISK_BENCH_COMPARE_REPORT_H
#define BRISK_BENCH_COMPARE_REPORT_H

#include <ostream>
#include <string>
#include <vector>

#include "bench/compare/compare.h"

namespace brisk::bench {

struct ReportContext {
  std::string command_line;  // how brisk-compare was invoked
  std::string date;          // UTC, ISO 8601
  std::string host;          // uname and CPU count
  std::vector<std::string> notes;  // skipped peers, suite scale, ...
};

void write_markdown(std::ostream& out, const Plan& plan, const std::vector<WorkloadResult>& results,
                    const ReportContext& context);
void write_json(std::ostream& out, const Plan& plan, const std::vector<WorkloadResult>& results,
                const ReportContext& context);
void write_svg(std::ostream& out, const Plan& plan, const std::vector<WorkloadResult>& results,
               const ReportContext& context);

// Formats a duration in seconds as "12.3 ms" / "1.23 s".
std::string format_seconds(double seconds);

}  // namespace brisk::bench

#endif
