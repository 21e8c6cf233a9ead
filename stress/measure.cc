// Time, CPU, RSS and brisk lock-count measurement, and the Recorder that turns a measured phase
// into a row.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

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

// The RSS from /proc/self/statm, read with open and read into a stack buffer: no allocation,
// so the sampler below adds no blocks to the heap it measures.
std::uint64_t statm_rss_kib() {
  const int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char text[128];
  const ssize_t n = read(fd, text, sizeof text - 1);
  close(fd);
  if (n <= 0) return 0;
  text[n] = '\0';
  char* end = nullptr;
  std::strtoull(text, &end, 10);  // size; resident follows
  const std::uint64_t pages = std::strtoull(end, nullptr, 10);
  return pages * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE)) / 1024;
}

// --peak-breakdown's sampler: a thread that reads the RSS every millisecond and, at each new
// high, brisk's statistics (brisk_get_stats_sized, found with dlsym: nothing when brisk is not
// the allocator). A new high is one above the last by more than 1/64: the RSS a row reached
// while it allocated often stays, or creeps up a page, after it frees, and the figures of the
// moment it got there say more than those of its end. One sample at the start and one at the
// stop too, so that a row shorter than the period has its figures. The row's VmHWM may lie
// between two samples: the table shows the sampled RSS beside it.
class PeakSampler {
 public:
  explicit PeakSampler(bool on) {
    if (!on) return;
    sample();
    thread_ = std::thread([this] {
      const timespec period{0, 1'000'000};
      while (!stop_.load(std::memory_order_relaxed)) {
        nanosleep(&period, nullptr);
        sample();
      }
    });
  }
  ~PeakSampler() { stop(); }
  PeakSampler(const PeakSampler&) = delete;
  PeakSampler& operator=(const PeakSampler&) = delete;

  // Ends the sampling (the thread's samples happen before the join) and returns the highest.
  const PeakBreakdown& stop() {
    if (thread_.joinable()) {
      stop_.store(true, std::memory_order_relaxed);
      thread_.join();
      sample();
    }
    return best_;
  }

 private:
  void sample() {
    const std::uint64_t rss = statm_rss_kib();
    if (best_.sampled && rss <= best_.sampled_rss_kib + best_.sampled_rss_kib / 64) return;
    best_.sampled = true;
    best_.sampled_rss_kib = rss;
    using GetStats = std::size_t (*)(brisk_stats*, std::size_t);
    static const auto get = reinterpret_cast<GetStats>(dlsym(RTLD_DEFAULT, "brisk_get_stats_sized"));
    if (get == nullptr) return;
    brisk_stats s{};
    get(&s, sizeof s);
    best_.brisk = true;
    best_.in_use_kib = s.bytes_in_use / 1024;
    best_.brisk_resident_kib = s.bytes_resident / 1024;
    best_.thread_caches_kib = s.thread_cache_bytes / 1024;
    best_.central_kib = s.central_pool_bytes / 1024;
    best_.kept_kib = s.kept_span_bytes / 1024;
    best_.queued_kib = s.remote_queued_bytes / 1024;
    best_.large_cache_kib = s.large_cache_resident_bytes / 1024;
    best_.chunk_free_kib = s.chunk_bytes_free_resident / 1024;
  }

  std::atomic<bool> stop_{false};
  std::thread thread_;
  PeakBreakdown best_;
};

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
  PeakSampler sampler(peak_breakdown_);
  rusage ru0;
  getrusage(RUSAGE_SELF, &ru0);
  const double wall0 = wall_now_ms();
  const double cpu0 = cpu_now_ms();
  const std::uint64_t ops = body();
  const double wall1 = wall_now_ms();
  const double cpu1 = cpu_now_ms();
  rusage ru1;
  getrusage(RUSAGE_SELF, &ru1);
  const PeakBreakdown& peak = sampler.stop();
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
  if (peak.sampled && peak.sampled_rss_kib >= row.peak.sampled_rss_kib) row.peak = peak;
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
