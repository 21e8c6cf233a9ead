// Time, CPU, RSS and brisk lock-count measurement, and the Recorder that turns a measured phase
// into a row.
#include <dlfcn.h>
#include <sys/resource.h>
#include <time.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "include/brisk/brisk.h"  // brisk_lock_stats only: brisk's functions are found with dlsym
#include "stress/suite.h"

namespace brisk::stress {
namespace {

// Set once the kernel accepted a high-water-mark reset; until then VmHWM is the peak of the
// whole process, so peak_rss_kib() falls back to the current RSS after the row.
bool g_peak_reset_works = false;

std::uint64_t status_field_kib(const char* field) {
  std::FILE* f = std::fopen("/proc/self/status", "re");
  if (f == nullptr) return 0;
  char line[256];
  std::uint64_t value = 0;
  const std::size_t len = std::strlen(field);
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, field, len) == 0 && line[len] == ':') {
      value = std::strtoull(line + len + 1, nullptr, 10);
      break;
    }
  }
  std::fclose(f);
  return value;
}

// brisk's lock counts, read through dlsym(RTLD_DEFAULT, ...) so that the same binary runs
// under any allocator (nothing is read when brisk is not loaded). A fixed array: reading them
// allocates nothing.
struct LockSnapshot {
  static constexpr std::size_t kMax = 32;
  brisk_lock_stats entries[kMax];
  std::size_t count = 0;

  void read() {
    using GetLockStats = std::size_t (*)(brisk_lock_stats*, std::size_t);
    static const auto get = reinterpret_cast<GetLockStats>(dlsym(RTLD_DEFAULT, "brisk_get_lock_stats"));
    if (get == nullptr) return;
    std::size_t n = get(entries, kMax);
    count = n < kMax ? n : kMax;
  }
};

// Adds after - before, structure by structure, to the row's counts.
void add_lock_deltas(Row& row, const LockSnapshot& before, const LockSnapshot& after) {
  if (after.count == 0 || after.count != before.count) return;
  if (row.locks.size() != after.count) row.locks.assign(after.count, LockCount{});
  for (std::size_t i = 0; i < after.count; ++i) {
    const brisk_lock_stats& a = after.entries[i];
    const brisk_lock_stats& b = before.entries[i];
    LockCount& l = row.locks[i];
    l.name = a.name;
    l.acquisitions += a.acquisitions - b.acquisitions;
    l.contended += a.contended - b.contended;
    l.yields += a.yields - b.yields;
  }
}

}  // namespace

double wall_now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double cpu_now_ms() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

void reset_peak_rss() {
  // Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0). Containers may
  // forbid it; then rows report the RSS left after them instead of their peak.
  std::FILE* f = std::fopen("/proc/self/clear_refs", "we");
  if (f == nullptr) return;
  const bool ok = std::fputs("5", f) >= 0;
  g_peak_reset_works = (std::fclose(f) == 0) && ok;
}

std::uint64_t peak_rss_kib() {
  return g_peak_reset_works ? status_field_kib("VmHWM") : status_field_kib("VmRSS");
}

std::uint64_t current_rss_kib() { return status_field_kib("VmRSS"); }

std::uint64_t process_max_rss_kib() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<std::uint64_t>(ru.ru_maxrss);  // KiB on Linux
}

std::uint64_t Context::scaled(std::uint64_t full, std::uint64_t smoke,
                              std::uint64_t floor) const {
  if (options.smoke && !options.scale_given) return smoke;
  const double n = std::llround(static_cast<double>(full) * options.scale_pct / 100.0);
  return n < static_cast<double>(floor) ? floor : static_cast<std::uint64_t>(n);
}

Row& Recorder::find_or_add(const std::string& workload, int threads) {
  for (Row& row : rows_)
    if (row.workload == workload && row.threads == threads) return row;
  rows_.push_back(Row{});
  rows_.back().workload = workload;
  rows_.back().threads = threads;
  return rows_.back();
}

Row& Recorder::last_row(const std::string& workload, int threads) {
  return find_or_add(workload, threads);
}

void Recorder::measure(const std::string& workload, int threads,
                       const std::function<std::uint64_t()>& body, std::string note) {
  reset_peak_rss();
  LockSnapshot locks0, locks1;
  locks0.read();
  rusage ru0;
  getrusage(RUSAGE_SELF, &ru0);
  const double wall0 = wall_now_ms();
  const double cpu0 = cpu_now_ms();
  const std::uint64_t ops = body();
  const double wall1 = wall_now_ms();
  const double cpu1 = cpu_now_ms();
  rusage ru1;
  getrusage(RUSAGE_SELF, &ru1);
  locks1.read();
  const std::uint64_t rss = peak_rss_kib();

  Row& row = find_or_add(workload, threads);
  row.wall_ms += wall1 - wall0;
  row.cpu_ms += cpu1 - cpu0;
  auto ms = [](const timeval& t) { return t.tv_sec * 1e3 + t.tv_usec / 1e3; };
  row.sys_ms += ms(ru1.ru_stime) - ms(ru0.ru_stime);
  row.minor_faults += static_cast<std::uint64_t>(ru1.ru_minflt - ru0.ru_minflt);
  row.ops += ops;
  add_lock_deltas(row, locks0, locks1);
  if (rss > row.peak_rss_kib) row.peak_rss_kib = rss;
  if (!note.empty()) row.note = std::move(note);
  ++row.passes;
}

void Recorder::skip(const std::string& workload, const std::string& note) {
  Row& row = find_or_add(workload, 0);
  row.skipped = true;
  row.note = note;
  ++row.passes;
}

}  // namespace brisk::stress
