// The outputs: the table on stdout, the same rows as JSON, and the overall operation rate.
#include <cinttypes>
#include <cstdio>

#include "stress/suite.h"

namespace brisk::stress {
namespace {

void json_string(std::FILE* f, const std::string& s) {
  std::fputc('"', f);
  for (char c : s) {
    if (c == '"' || c == '\\') std::fputc('\\', f);
    if (static_cast<unsigned char>(c) < 0x20) {
      std::fprintf(f, "\\u%04x", c);
      continue;
    }
    std::fputc(c, f);
  }
  std::fputc('"', f);
}

double row_ops_per_sec(const Row& row) {
  return row.wall_ms > 0 ? static_cast<double>(row.ops) * 1000.0 / row.wall_ms : 0.0;
}

// The table's lock columns: acquisitions and contended acquisitions of every brisk structure,
// summed, and the structure taken most often; "-" when brisk was not the allocator.
struct LockColumns {
  char acquisitions[24] = "-";
  char contended[24] = "-";
  std::string top = "-";
  explicit LockColumns(const Row& row) {
    if (row.locks.empty()) return;
    std::uint64_t acq = 0, cont = 0;
    const LockCount* top_lock = &row.locks[0];
    for (const LockCount& l : row.locks) {
      acq += l.acquisitions;
      cont += l.contended;
      if (l.acquisitions > top_lock->acquisitions) top_lock = &l;
    }
    std::snprintf(acquisitions, sizeof acquisitions, "%" PRIu64, acq);
    std::snprintf(contended, sizeof contended, "%" PRIu64, cont);
    if (top_lock->acquisitions != 0) top = top_lock->name;
  }
};

// brisk's figures in --peak-breakdown's table and JSON, in their order: one list, so that the
// two outputs name the same fields.
struct BreakdownField {
  const char* heading;  // the table's
  int width;
  const char* json;
  std::uint64_t PeakBreakdown::*kib;
};
constexpr BreakdownField kBreakdownFields[] = {
    {"in_use", 9, "in_use_kib", &PeakBreakdown::in_use_kib},
    {"resident", 9, "brisk_resident_kib", &PeakBreakdown::brisk_resident_kib},
    {"thr_cache", 9, "thread_caches_kib", &PeakBreakdown::thread_caches_kib},
    {"central", 9, "central_kib", &PeakBreakdown::central_kib},
    {"kept", 9, "kept_kib", &PeakBreakdown::kept_kib},
    {"queued", 9, "queued_kib", &PeakBreakdown::queued_kib},
    {"large_cache", 11, "large_cache_kib", &PeakBreakdown::large_cache_kib},
    {"chunk_free", 10, "chunk_free_kib", &PeakBreakdown::chunk_free_kib},
};

// --peak-breakdown's table, after the main one: per row, the highest RSS sampled and brisk's
// statistics read then (MiB), or "-" under another allocator.
void print_peak_breakdown(const std::vector<Row>& rows) {
  bool any = false;
  for (const Row& row : rows) any |= !row.skipped && row.peak.sampled;
  if (!any) return;
  std::printf("\npeak breakdown, MiB (brisk_get_stats at the highest RSS sampled every ms):\n");
  std::printf("%-14s %7s %9s %9s", "workload", "threads", "peak_rss", "sampled");
  for (const BreakdownField& field : kBreakdownFields) std::printf(" %*s", field.width, field.heading);
  std::printf("\n");
  auto mib = [](std::uint64_t kib) { return static_cast<double>(kib) / 1024.0; };
  for (const Row& row : rows) {
    if (row.skipped || !row.peak.sampled) continue;
    const PeakBreakdown& p = row.peak;
    std::printf("%-14s %7d %9.1f %9.1f", row.workload.c_str(), row.threads, mib(row.peak_rss_kib),
                mib(p.sampled_rss_kib));
    for (const BreakdownField& field : kBreakdownFields) {
      if (p.brisk) std::printf(" %*.1f", field.width, mib(p.*field.kib));
      else std::printf(" %*s", field.width, "-");
    }
    std::printf("\n");
  }
}

void json_peak_breakdown(std::FILE* f, const PeakBreakdown& p) {
  std::fprintf(f, ", \"peak_breakdown\": ");
  if (!p.sampled) {
    std::fprintf(f, "null");
    return;
  }
  std::fprintf(f, "{\"sampled_rss_kib\": %" PRIu64, p.sampled_rss_kib);
  if (p.brisk) {
    for (const BreakdownField& field : kBreakdownFields) std::fprintf(f, ", \"%s\": %" PRIu64, field.json, p.*field.kib);
  }
  std::fprintf(f, "}");
}

}  // namespace

double overall_ops_per_sec(const std::vector<Row>& rows) {
  double ms = 0;
  std::uint64_t ops = 0;
  for (const Row& row : rows) {
    if (row.skipped) continue;
    ms += row.wall_ms;
    ops += row.ops;
  }
  return ms > 0 ? static_cast<double>(ops) * 1000.0 / ms : 0.0;
}

void print_table(const std::vector<Row>& rows) {
  std::printf("%-14s %7s %11s %11s %10s %12s %13s %14s %10s %9s %-15s  %s\n", "workload", "threads",
              "wall_ms", "cpu_ms", "sys_ms", "minor_faults", "peak_rss_kib", "ops_per_sec", "lock_acq",
              "contended", "top_lock", "note");
  for (const Row& row : rows) {
    if (row.skipped) {
      std::printf("%-14s %7s %11s %11s %10s %12s %13s %14s %10s %9s %-15s  %s\n", row.workload.c_str(), "-",
                  "-", "-", "-", "-", "-", "-", "-", "-", "-", row.note.c_str());
      continue;
    }
    const LockColumns locks(row);
    std::printf("%-14s %7d %11.1f %11.1f %10.1f %12" PRIu64 " %13" PRIu64 " %14.0f %10s %9s %-15s  %s\n",
                row.workload.c_str(), row.threads, row.wall_ms, row.cpu_ms, row.sys_ms,
                row.minor_faults, row.peak_rss_kib, row_ops_per_sec(row), locks.acquisitions,
                locks.contended, locks.top.c_str(), row.note.c_str());
  }
  print_peak_breakdown(rows);
}

bool write_json(const std::string& path, const Options& options, const std::vector<Row>& rows,
                double ops_per_sec) {
  std::FILE* f = std::fopen(path.c_str(), "we");
  if (f == nullptr) return false;
  std::fprintf(f, "{\n  \"seed\": %" PRIu64 ",\n  \"scale_pct\": %g,\n  \"threads\": %d,\n",
               options.seed, options.scale_pct, options.threads);
  std::fprintf(f, "  \"duration_s\": %g,\n  \"smoke\": %s,\n  \"pool\": \"%s\",\n", options.duration_s,
               options.smoke ? "true" : "false", options.plain_threads ? "threads" : "tbb");
  std::fprintf(f, "  \"rows\": [");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    std::fprintf(f, "%s\n    {\"workload\": ", i == 0 ? "" : ",");
    json_string(f, row.workload);
    std::fprintf(f, ", \"skipped\": %s, \"threads\": %d, \"passes\": %d", row.skipped ? "true" : "false",
                 row.threads, row.passes);
    if (!row.skipped) {
      std::fprintf(f, ", \"wall_ms\": %.3f, \"cpu_ms\": %.3f, \"sys_ms\": %.3f, \"minor_faults\": %" PRIu64
                   ", \"peak_rss_kib\": %" PRIu64 ", \"ops\": %" PRIu64 ", \"ops_per_sec\": %.1f",
                   row.wall_ms, row.cpu_ms, row.sys_ms, row.minor_faults, row.peak_rss_kib, row.ops,
                   row_ops_per_sec(row));
    }
    if (!row.skipped) {
      // brisk's lock counts per structure, or null under another allocator.
      std::fprintf(f, ", \"locks\": ");
      if (row.locks.empty()) std::fprintf(f, "null");
      for (std::size_t k = 0; k < row.locks.size(); ++k) {
        const LockCount& l = row.locks[k];
        std::fprintf(f, "%s", k == 0 ? "{" : ", ");
        json_string(f, l.name);
        std::fprintf(f, ": {\"acquisitions\": %" PRIu64 ", \"contended\": %" PRIu64 ", \"yields\": %" PRIu64 "}",
                     l.acquisitions, l.contended, l.yields);
      }
      if (!row.locks.empty()) std::fprintf(f, "}");
      json_peak_breakdown(f, row.peak);
    }
    if (!row.series_kib.empty()) {
      std::fprintf(f, ", \"rss_kib_per_round\": [");
      for (std::size_t k = 0; k < row.series_kib.size(); ++k)
        std::fprintf(f, "%s%" PRIu64, k == 0 ? "" : ", ", row.series_kib[k]);
      std::fprintf(f, "]");
    }
    std::fprintf(f, ", \"note\": ");
    json_string(f, row.note);
    std::fprintf(f, "}");
  }
  std::fprintf(f, "\n  ],\n  \"process_peak_rss_kib\": %" PRIu64 ",\n  \"ops_per_sec\": %.1f\n}\n",
               process_max_rss_kib(), ops_per_sec);
  return std::fclose(f) == 0;
}

}  // namespace brisk::stress
