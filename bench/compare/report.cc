#include "bench/compare/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace brisk::bench {
namespace {

std::string format(const char* pattern, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, pattern, value);
  return buffer;
}

std::string format_kib(double kib) {
  if (kib >= 1024.0 * 1024.0) return format("%.2f GiB", kib / (1024.0 * 1024.0));
  if (kib >= 1024.0) return format("%.1f MiB", kib / 1024.0);
  return format("%.0f KiB", kib);
}

std::string format_ratio(const PairedSummary& s) {
  return format("%.3f", s.median_ratio) + " [" + format("%.3f", s.ratio_interval.low) + ", " +
         format("%.3f", s.ratio_interval.high) + "]";
}

std::string format_gain(const PairedSummary& s) {
  // The gain falls as the time ratio rises, so the interval's ends swap.
  return format("%+.1f%%", gain_percent_from_time_ratio(s.median_ratio)) + " [" +
         format("%+.1f", gain_percent_from_time_ratio(s.ratio_interval.high)) + ", " +
         format("%+.1f", gain_percent_from_time_ratio(s.ratio_interval.low)) + "]";
}

std::string markdown_cell(std::string s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

std::string format_value(double v) { return std::fabs(v) >= 1000 ? format("%.0f", v) : format("%.4g", v); }

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof buffer, "\\u%04x", c);
          out += buffer;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  return format("%.9g", v);
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

std::string format_seconds(double seconds) {
  if (!std::isfinite(seconds)) return "-";
  if (seconds < 1.0) return format("%.1f ms", seconds * 1000.0);
  return format("%.2f s", seconds);
}

void write_markdown(std::ostream& out, const Plan& plan, const std::vector<WorkloadResult>& results,
                    const ReportContext& context) {
  const std::string& base = plan.allocators[plan.baseline].label;
  out << "## brisk-compare: " << base << " is the baseline\n\n";
  out << "- date: " << context.date << "\n";
  out << "- host: " << context.host << "\n";
  out << "- command: `" << context.command_line << "`\n";
  out << "- method: " << plan.warmup << " warm-up round(s), then " << plan.pairs
      << " rounds of one run per allocator in rotated order; per allocator, the median of the paired "
         "ratios (this run / the baseline's run in the same round) with a "
      << format("%.0f", plan.bootstrap.confidence * 100) << "% interval from " << plan.bootstrap.resamples
      << " bootstrap resamples\n";
  out << "- time ratio < 1 and gain > 0 mean this allocator was faster than " << base
      << "; gain = (" << base << " time / this time - 1) * 100\n";
  for (const std::string& note : context.notes) out << "- " << note << "\n";
  for (const Allocator& allocator : plan.allocators) {
    if (allocator.environment.empty()) continue;
    out << "- " << allocator.label << " runs with";
    for (const std::string& variable : allocator.environment) out << " `" << variable << "`";
    out << "\n";
  }
  out << "\n";
  out << "| workload | allocator | wall (median) | time ratio vs " << base << " [95% CI] | gain [95% CI] "
      << "| CPU user+sys (median) | peak RSS (median) | RSS ratio | metric ratio [95% CI] |\n";
  out << "|---|---|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const WorkloadResult& result : results) {
    for (std::size_t a = 0; a < plan.allocators.size(); ++a) {
      const AllocatorSummary& s = result.summaries[a];
      out << "| " << markdown_cell(result.workload.name) << " | " << markdown_cell(plan.allocators[a].label) << " | ";
      if (s.runs == 0) {
        out << "- | " << (s.failed ? "FAILED (" + s.failure + ")" : "not run") << " | | | | | |\n";
        continue;
      }
      out << format_seconds(s.median_wall) << " | ";
      std::string metric_text;
      if (!s.metric_name.empty()) metric_text = s.metric_name + " " + format_value(s.median_metric);
      if (s.failed) {
        out << "FAILED (" << s.failure << ") | | " << format_seconds(s.median_cpu) << " | "
            << format_kib(s.median_rss_kib) << " | | |\n";
      } else if (result.summaries[plan.baseline].failed) {
        out << "no ratio: the baseline failed | | " << format_seconds(s.median_cpu) << " | "
            << format_kib(s.median_rss_kib) << " | | |\n";
      } else if (a == plan.baseline) {
        out << "1 (baseline) | | " << format_seconds(s.median_cpu) << " | " << format_kib(s.median_rss_kib)
            << " | 1 | " << (metric_text.empty() ? "" : metric_text + " (baseline)") << " |\n";
      } else {
        out << format_ratio(s.wall) << " | " << format_gain(s.wall) << " | " << format_seconds(s.median_cpu)
            << " | " << format_kib(s.median_rss_kib) << " | " << format("%.2f", s.rss.median_ratio) << " | ";
        if (s.metric) {
          out << metric_text << ": " << format_ratio(*s.metric)
              << (metric_higher_is_better(s.metric_name) ? " (higher is better)" : " (lower is better)");
        }
        out << " |\n";
      }
    }
  }
}

void write_json(std::ostream& out, const Plan& plan, const std::vector<WorkloadResult>& results,
                const ReportContext& context) {
  out << "{\n  \"tool\": \"brisk-compare\",\n";
  out << "  \"date\": " << json_string(context.date) << ",\n";
  out << "  \"host\": " << json_string(context.host) << ",\n";
  out << "  \"command\": " << json_string(context.command_line) << ",\n";
  out << "  \"pairs\": " << plan.pairs << ",\n  \"warmup\": " << plan.warmup << ",\n";
  out << "  \"bootstrap\": {\"resamples\": " << plan.bootstrap.resamples
      << ", \"confidence\": " << json_number(plan.bootstrap.confidence) << ", \"seed\": " << plan.bootstrap.seed
      << "},\n";
  out << "  \"notes\": [";
  for (std::size_t i = 0; i < context.notes.size(); ++i) out << (i ? ", " : "") << json_string(context.notes[i]);
  out << "],\n  \"baseline\": " << json_string(plan.allocators[plan.baseline].label) << ",\n";
  out << "  \"allocators\": [";
  for (std::size_t a = 0; a < plan.allocators.size(); ++a) {
    out << (a ? ", " : "") << "{\"label\": " << json_string(plan.allocators[a].label)
        << ", \"preload\": " << json_string(plan.allocators[a].preload) << ", \"environment\": [";
    for (std::size_t v = 0; v < plan.allocators[a].environment.size(); ++v)
      out << (v ? ", " : "") << json_string(plan.allocators[a].environment[v]);
    out << "]}";
  }
  out << "],\n  \"workloads\": [\n";
  for (std::size_t w = 0; w < results.size(); ++w) {
    const WorkloadResult& result = results[w];
    out << "    {\"name\": " << json_string(result.workload.name) << ", \"argv\": [";
    for (std::size_t i = 0; i < result.workload.argv.size(); ++i)
      out << (i ? ", " : "") << json_string(result.workload.argv[i]);
    out << "],\n     \"summary\": [\n";
    for (std::size_t a = 0; a < result.summaries.size(); ++a) {
      const AllocatorSummary& s = result.summaries[a];
      out << "       {\"allocator\": " << json_string(plan.allocators[a].label) << ", \"failed\": "
          << (s.failed ? "true" : "false") << ", \"runs\": " << s.runs
          << ", \"median_wall_s\": " << json_number(s.median_wall) << ", \"median_cpu_s\": " << json_number(s.median_cpu)
          << ", \"median_peak_rss_kib\": " << json_number(s.median_rss_kib);
      if (s.wall.pairs > 0) {
        out << ", \"wall_ratio\": {\"median\": " << json_number(s.wall.median_ratio) << ", \"low\": "
            << json_number(s.wall.ratio_interval.low) << ", \"high\": " << json_number(s.wall.ratio_interval.high)
            << ", \"pairs\": " << s.wall.pairs << "}, \"gain_percent\": "
            << json_number(gain_percent_from_time_ratio(s.wall.median_ratio))
            << ", \"rss_ratio\": {\"median\": " << json_number(s.rss.median_ratio) << ", \"low\": "
            << json_number(s.rss.ratio_interval.low) << ", \"high\": " << json_number(s.rss.ratio_interval.high) << "}";
      }
      if (s.metric) {
        out << ", \"metric\": {\"name\": " << json_string(s.metric_name) << ", \"median\": "
            << json_number(s.median_metric) << ", \"ratio\": " << json_number(s.metric->median_ratio)
            << ", \"low\": " << json_number(s.metric->ratio_interval.low) << ", \"high\": "
            << json_number(s.metric->ratio_interval.high) << "}";
      }
      out << "}" << (a + 1 < result.summaries.size() ? "," : "") << "\n";
    }
    out << "     ],\n     \"samples\": [\n";
    for (std::size_t i = 0; i < result.samples.size(); ++i) {
      const Sample& sample = result.samples[i];
      out << "       {\"allocator\": " << json_string(plan.allocators[sample.allocator].label)
          << ", \"round\": " << sample.round << ", \"warmup\": " << (sample.round < 0 ? "true" : "false")
          << ", \"position\": " << sample.position << ", \"wall_s\": " << json_number(sample.run.wall_seconds)
          << ", \"user_s\": " << json_number(sample.run.user_seconds)
          << ", \"sys_s\": " << json_number(sample.run.system_seconds)
          << ", \"peak_rss_kib\": " << sample.run.peak_rss_kib << ", \"exit\": " << sample.run.exit_code;
      if (sample.metric) {
        out << ", \"metric\": {\"name\": " << json_string(sample.metric->name)
            << ", \"value\": " << json_number(sample.metric->value) << "}";
      }
      out << "}" << (i + 1 < result.samples.size() ? "," : "") << "\n";
    }
    out << "     ]}" << (w + 1 < results.size() ? "," : "") << "\n";
  }
  out << "  ]\n}\n";
}

void write_svg(std::ostream& out, const Plan& plan, const std::vector<WorkloadResult>& results,
               const ReportContext& context) {
  const std::string& base = plan.allocators[plan.baseline].label;
  // One horizontal bar per (workload, non-baseline allocator), drawn on a log2 axis from the
  // 1.0 line to the median time ratio, with a whisker for the interval.
  struct Bar {
    std::string workload, allocator;
    const AllocatorSummary* summary;
  };
  std::vector<Bar> bars;
  double low = 0.5, high = 2.0;
  for (const WorkloadResult& result : results) {
    for (std::size_t a = 0; a < plan.allocators.size(); ++a) {
      if (a == plan.baseline) continue;
      const AllocatorSummary& s = result.summaries[a];
      bars.push_back({result.workload.name, plan.allocators[a].label, &s});
      if (s.wall.pairs > 0 && std::isfinite(s.wall.ratio_interval.low)) {
        low = std::min(low, s.wall.ratio_interval.low);
        high = std::max(high, s.wall.ratio_interval.high);
      }
    }
  }
  const double log_low = std::floor(std::log2(low)), log_high = std::ceil(std::log2(high));
  const int label_width = 260, plot_width = 520, value_width = 240, row = 22, top = 70, group_gap = 10;
  std::size_t groups = 0;
  for (std::size_t i = 0; i < bars.size(); ++i) {
    if (i == 0 || bars[i].workload != bars[i - 1].workload) ++groups;
  }
  const int height = top + static_cast<int>(bars.size()) * row + static_cast<int>(groups) * group_gap + 60;
  const int width = label_width + plot_width + value_width;
  auto x_of = [&](double ratio) {
    const double t = (std::log2(ratio) - log_low) / (log_high - log_low);
    return label_width + std::clamp(t, 0.0, 1.0) * plot_width;
  };
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  out << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  out << "<text x=\"10\" y=\"20\" font-size=\"15\" font-weight=\"bold\">Wall time relative to " << xml_escape(base)
      << " (median of " << plan.pairs << " paired runs, " << format("%.0f", plan.bootstrap.confidence * 100)
      << "% bootstrap interval)</text>\n";
  out << "<text x=\"10\" y=\"38\" fill=\"#444\">Orange, left of 1: faster than " << xml_escape(base)
      << ". Blue, right of 1: slower. Whiskers: the interval. " << xml_escape(context.date) << "</text>\n";
  const int plot_bottom = height - 45;
  for (double e = log_low; e <= log_high + 1e-9; e += 1.0) {
    const double ratio = std::exp2(e);
    const double x = x_of(ratio);
    out << "<line x1=\"" << x << "\" y1=\"" << top - 8 << "\" x2=\"" << x << "\" y2=\"" << plot_bottom
        << "\" stroke=\"#ddd\"/>\n";
    out << "<text x=\"" << x << "\" y=\"" << plot_bottom + 16 << "\" text-anchor=\"middle\">" << format("%g", ratio)
        << "</text>\n";
  }
  out << "<text x=\"" << label_width + plot_width / 2 << "\" y=\"" << plot_bottom + 34
      << "\" text-anchor=\"middle\">time ratio (allocator / " << xml_escape(base) << "), log scale</text>\n";
  int y = top;
  for (std::size_t i = 0; i < bars.size(); ++i) {
    const Bar& bar = bars[i];
    if (i == 0 || bar.workload != bars[i - 1].workload) {
      y += group_gap;
      out << "<text x=\"10\" y=\"" << y + 4 << "\" font-weight=\"bold\">" << xml_escape(bar.workload) << "</text>\n";
    }
    out << "<text x=\"" << label_width - 8 << "\" y=\"" << y + 15 << "\" text-anchor=\"end\">"
        << xml_escape(bar.allocator) << "</text>\n";
    const AllocatorSummary& s = *bar.summary;
    if (s.wall.pairs == 0) {
      out << "<text x=\"" << label_width + 6 << "\" y=\"" << y + 15 << "\" fill=\"#b00\">"
          << (s.failed ? "failed (" + xml_escape(s.failure) + ")" : std::string("no ratio")) << "</text>\n";
      y += row;
      continue;
    }
    const double one = x_of(1.0), at = x_of(s.wall.median_ratio);
    const char* colour = s.wall.median_ratio < 1.0 ? "#d9822b" : "#3b78c2";
    out << "<rect x=\"" << std::min(one, at) << "\" y=\"" << y + 4 << "\" width=\"" << std::max(1.0, std::fabs(at - one))
        << "\" height=\"" << row - 8 << "\" fill=\"" << colour << "\"/>\n";
    const double wl = x_of(s.wall.ratio_interval.low), wh = x_of(s.wall.ratio_interval.high), mid = y + row / 2.0;
    out << "<line x1=\"" << wl << "\" y1=\"" << mid << "\" x2=\"" << wh << "\" y2=\"" << mid
        << "\" stroke=\"black\" stroke-width=\"1.5\"/>\n";
    out << "<line x1=\"" << wl << "\" y1=\"" << mid - 5 << "\" x2=\"" << wl << "\" y2=\"" << mid + 5
        << "\" stroke=\"black\" stroke-width=\"1.5\"/>\n";
    out << "<line x1=\"" << wh << "\" y1=\"" << mid - 5 << "\" x2=\"" << wh << "\" y2=\"" << mid + 5
        << "\" stroke=\"black\" stroke-width=\"1.5\"/>\n";
    out << "<text x=\"" << label_width + plot_width + 8 << "\" y=\"" << y + 15 << "\">"
        << format("%.3f", s.wall.median_ratio) << " [" << format("%.3f", s.wall.ratio_interval.low) << ", "
        << format("%.3f", s.wall.ratio_interval.high) << "] gain " << format("%+.1f%%", gain_percent_from_time_ratio(s.wall.median_ratio))
        << "</text>\n";
    y += row;
  }
  const double one = x_of(1.0);
  out << "<line x1=\"" << one << "\" y1=\"" << top - 8 << "\" x2=\"" << one << "\" y2=\"" << plot_bottom
      << "\" stroke=\"black\" stroke-width=\"2\"/>\n";
  out << "<text x=\"" << one << "\" y=\"" << top - 12 << "\" text-anchor=\"middle\">" << xml_escape(base) << " = 1</text>\n";
  out << "</svg>\n";
}

}  // namespace brisk::bench
