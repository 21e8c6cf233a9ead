// The stress suite's framework: options, the measured table rows, the progress bar and the
// workload registry. Call map: main.cc parses Options -> runs each Workload's function with a
// Context -> the workload wraps each measured phase in Recorder::measure -> report.cc prints
// the table, the JSON file and the closing ops_per_sec line.
#ifndef BRISK_STRESS_SUITE_H
#define BRISK_STRESS_SUITE_H

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace brisk::stress {

struct Options {
  std::vector<std::string> workloads;  // expanded: no aliases left
  int threads = 10;
  double scale_pct = 100.0;
  double duration_s = 0.0;  // > 0: soak mode
  std::uint64_t seed = 1;
  std::string json_path;
  bool smoke = false;
  bool scale_given = false;  // --smoke keeps an explicit --scale
  // MMtest's tests and the classic benchmarks make a 1-thread row and a --threads row: --rows
  // single or parallel keeps only that one, so that brisk-compare can pair each on its own.
  bool single_row = true;
  bool parallel_row = true;
  // MMtest's parallel rows: false runs the 10 iterations as tasks of a tbb::parallel_for on
  // reusable workers; true gives each iteration a new std::thread that exits after it, so every
  // iteration starts with an empty thread cache (--pool threads: the article's plain threads).
  bool plain_threads = false;
  // --peak-breakdown: while each row runs, a thread samples the process's RSS every millisecond
  // and, at each new high, reads brisk's statistics (when brisk is the allocator), so that the
  // row says where its peak lay. Off by default: the sampling thread shares the cores.
  bool peak_breakdown = false;
};

// brisk's counts for one of its locked structures (brisk_get_lock_stats) over a row's measured
// phases.
struct LockCount {
  std::string name;
  std::uint64_t acquisitions = 0;
  std::uint64_t contended = 0;
  std::uint64_t yields = 0;
};

// Where a row's peak lay (--peak-breakdown): brisk_get_stats read at the highest RSS the
// sampler saw, in KiB. brisk's fields are its own accounting (include/brisk/brisk.h), not
// pieces of the RSS: thread_caches counts uncarved room too, and brisk_resident is brisk's
// upper bound of its share. Without brisk only sampled_rss is set.
struct PeakBreakdown {
  bool sampled = false;  // the sampler saw the row
  bool brisk = false;    // and read brisk's statistics
  std::uint64_t sampled_rss_kib = 0;
  std::uint64_t in_use_kib = 0;          // bytes_in_use
  std::uint64_t brisk_resident_kib = 0;  // bytes_resident
  std::uint64_t thread_caches_kib = 0;   // thread_cache_bytes
  std::uint64_t central_kib = 0;         // central_pool_bytes
  std::uint64_t kept_kib = 0;            // kept_span_bytes (of central)
  std::uint64_t queued_kib = 0;          // remote_queued_bytes
  std::uint64_t large_cache_kib = 0;     // large_cache_resident_bytes
  std::uint64_t chunk_free_kib = 0;      // chunk_bytes_free_resident
};

// One row of the table: one workload at one thread count. In soak mode the passes of the same
// row are summed.
struct Row {
  std::string workload;
  int threads = 0;
  double wall_ms = 0;
  double cpu_ms = 0;
  double sys_ms = 0;              // of cpu_ms, in the kernel (page faults, mmap, madvise, ...)
  std::uint64_t minor_faults = 0; // page faults served without I/O: mostly fresh pages touched
  std::uint64_t peak_rss_kib = 0;
  std::uint64_t ops = 0;  // allocation operations: malloc, calloc, realloc, free, new, delete
  std::vector<LockCount> locks;   // brisk's, in its order; empty when brisk is not the allocator
  bool skipped = false;
  std::string note;
  std::vector<std::uint64_t> series_kib;  // churn: the peak RSS of each round
  PeakBreakdown peak;  // --peak-breakdown: the pass with the highest sample
  int passes = 0;
};

// Draws "what runs and how far it has got" on stderr, only when stderr is a terminal.
class Progress {
 public:
  Progress();
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void begin(const std::string& label, std::uint64_t total_units);
  // Cheap enough to call every few hundred operations from many threads.
  void advance(std::uint64_t units) {
    if (enabled_) done_.fetch_add(units, std::memory_order_relaxed);
  }
  void end();

 private:
  void draw_loop();

  bool enabled_ = false;
  std::atomic<bool> stop_{false};
  std::atomic<bool> active_{false};
  std::atomic<std::uint64_t> done_{0};
  std::atomic<std::uint64_t> total_{1};
  std::string label_;  // written by begin() while active_ is false
  std::atomic<int> label_version_{0};
  std::thread drawer_;
};

class Recorder {
 public:
  explicit Recorder(bool peak_breakdown = false) : peak_breakdown_(peak_breakdown) {}
  // Runs body as one row: body returns its operation count; wall time, CPU time and peak RSS
  // are measured around it.
  void measure(const std::string& workload, int threads, const std::function<std::uint64_t()>& body,
               std::string note = {});
  void skip(const std::string& workload, const std::string& note);
  // Adds a note or an RSS series to the most recent row of this workload.
  Row& last_row(const std::string& workload, int threads);

  const std::vector<Row>& rows() const { return rows_; }

 private:
  Row& find_or_add(const std::string& workload, int threads);
  std::vector<Row> rows_;
  bool peak_breakdown_;
};

struct Context {
  const Options& options;
  Recorder& recorder;
  Progress& progress;

  // An iteration count: `full` (the article's, or the workload's own default) scaled by
  // --scale and never below `floor`; under --smoke without --scale, `smoke` instead.
  std::uint64_t scaled(std::uint64_t full, std::uint64_t smoke, std::uint64_t floor = 1) const;
  int threads() const { return options.threads; }
  // --smoke without --scale: workloads may shrink fixed sizes (slot counts) too.
  bool tiny() const { return options.smoke && !options.scale_given; }
};

struct Workload {
  const char* name;
  void (*run)(Context&);
  const char* summary;
  bool in_mmtest;  // part of the default run and the `mmtest` alias
  bool in_soak;    // part of --duration's default mix
};

// All workloads, in the order `all` runs them.
const std::vector<Workload>& workloads();

// Workload entry points (one file each).
void run_small(Context&);
void run_medium(Context&);
void run_large(Context&);
void run_strings(Context&);
void run_small_as_written(Context&);
void run_medium_as_written(Context&);
void run_large_as_written(Context&);
void run_strings_as_written(Context&);
void run_prodcons(Context&);
void run_larson(Context&);
void run_larson_classic(Context&);
void run_churn(Context&);
void run_realloc_chains(Context&);
void run_large_replace(Context&);
void run_cache_thrash(Context&);
void run_cache_scratch(Context&);
void run_xmalloc(Context&);
void run_alloc_test(Context&);
void run_sh6bench(Context&);
void run_mstress(Context&);
void run_brisk_api(Context&);
void run_brisk_strategy(Context&);
// prodcons's traffic without a table row (the brisk workload runs it while it switches debug
// mode): the operation count; a damaged block fails the run.
// in_flight, when given: the bytes of blocks produced and not yet consumed, as each block was
// produced: their mean and their most.
struct InFlight {
  std::int64_t mean_kib = 0;
  std::int64_t most_kib = 0;
};
std::uint64_t prodcons_traffic(Context& ctx, int producers, int consumers, std::uint64_t per_producer,
                               InFlight* in_flight = nullptr);

// Process measurements (measure.cc).
double wall_now_ms();
double cpu_now_ms();              // user + system time of the whole process
void reset_peak_rss();            // best effort: /proc/self/clear_refs
std::uint64_t peak_rss_kib();     // VmHWM since the last reset (or VmRSS if no reset)
std::uint64_t current_rss_kib();  // VmRSS
std::uint64_t process_max_rss_kib();  // getrusage's ru_maxrss

// Output (report.cc).
void print_table(const std::vector<Row>& rows);  // and the peak breakdown, when sampled
bool write_json(const std::string& path, const Options& options, const std::vector<Row>& rows,
                double ops_per_sec);
double overall_ops_per_sec(const std::vector<Row>& rows);

}  // namespace brisk::stress

#endif  // BRISK_STRESS_SUITE_H
