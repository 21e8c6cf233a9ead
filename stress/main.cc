// brisk-stress: puts whatever allocator the process runs on under parallel load and verifies
// every block it hands out. See stress/README.md for usage, workloads and output.
//
// Exit status: 0 success, 1 verification failure (a "VERIFY FAILED:" line on stderr),
// 2 wrong usage (one line on stderr).
// Coupling: bench/'s brisk-compare reads the last stdout line, `ops_per_sec=<number>`.
#include <oneapi/tbb/global_control.h>

#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>

#include "stress/suite.h"

namespace brisk::stress {

const std::vector<Workload>& workloads() {
  static const std::vector<Workload> all = {
      {"small", run_small, "MMtest 1: 10..100 B blocks, realloc to 20..200 B", true, true},
      {"medium", run_medium, "MMtest 2: 10..100 KiB blocks, realloc to 20..200 KiB", true, true},
      {"large", run_large, "MMtest 3: 10..100 MiB blocks", true, false},
      {"strings", run_strings, "MMtest 4: string concatenation", true, true},
      {"small-raw", run_small_as_written, "MMtest 1 as written: no block is written or read", false, false},
      {"medium-raw", run_medium_as_written, "MMtest 2 as written", false, false},
      {"large-raw", run_large_as_written, "MMtest 3 as written: 10..100 MiB blocks never touched", false, false},
      {"strings-raw", run_strings_as_written, "MMtest 4 as written: no final check", false, false},
      {"prodcons", run_prodcons, "producers hand blocks to consumers that free them", false, true},
      {"larson", run_larson, "threads replace random slots, then hand the pool on", false, true},
      {"larson-classic", run_larson_classic, "larson as usually run: 8..999 B, 5,000 slots, 500,000 per thread", false, true},
      {"churn", run_churn, "rounds of short-lived threads; RSS must stay bounded", false, true},
      {"realloc", run_realloc_chains, "buffers grow 8 B -> 1 MiB across threads", false, true},
      {"large-replace", run_large_replace, "threads replace big blocks, 256 KiB..64 MiB; 1 in 4 touched", false, true},
      {"cache-thrash", run_cache_thrash, "threads write their own small objects: false sharing?", false, true},
      {"cache-scratch", run_cache_scratch, "the same after freeing objects main allocated side by side", false, true},
      {"xmalloc", run_xmalloc, "a ring of threads: each frees the 64 B batches its predecessor allocated", false, true},
      {"alloc-test", run_alloc_test, "random slots: free a full one, fill an empty one, 8..1023 B, all touched", false, true},
      {"sh6bench", run_sh6bench, "a stack of 1..999 B blocks, freed FIFO below a kept fifth and LIFO above", false, true},
      {"mstress", run_mstress, "rounds of threads that allocate, keep, free and trade blocks, then exit", false, true},
      {"brisk", run_brisk_api, "brisk only: debug enter/leave and strategy switches under traffic", false, false},
      {"strategy", run_brisk_strategy, "brisk only: strategy switched every 2 ms, trims, under traffic", false, false},
  };
  return all;
}

namespace {

constexpr const char* kUsage =
    "usage: brisk-stress [WORKLOAD...] [--threads N] [--scale PCT] [--duration S] [--seed S] "
    "[--json FILE] [--rows R] [--pool P] [--peak-breakdown] [--smoke]\n";

#ifndef BRISK_VERSION_STRING
#define BRISK_VERSION_STRING "unknown"
#endif

// The help text is built from the workload table, so a new workload documents itself.
void print_help() {
  std::fputs(kUsage, stdout);
  std::puts("Runs the workloads on the allocator the process uses (preload one to test it) and");
  std::puts("verifies every block. Exit status: 0 ok, 1 verification failed, 2 wrong usage.\n");
  std::puts("workloads (none named = mmtest):");
  for (const Workload& w : workloads())
    std::printf("  %-14s %s\n", w.name, w.summary);
  std::puts("  mmtest         small, medium, large and strings");
  std::puts("  mmtest-raw     small-raw, medium-raw, large-raw and strings-raw");
  std::puts("  all            every workload\n");
  std::puts("options:");
  std::puts("  --threads N    threads of the parallel runs (1..1024, default 10)");
  std::puts("  --scale PCT    work per workload as a percentage of the standard count (default 100)");
  std::puts("  --duration S   soak: repeat the workloads for S seconds (default 0: one pass)");
  std::puts("  --seed S       seed of the random sizes and orders (default 1; printed at the end)");
  std::puts("  --json FILE    also write the table and the run's settings as JSON to FILE");
  std::puts("  --rows R       workloads with a 1-thread and a parallel row: single, parallel or both");
  std::puts("  --pool P       MMtest's parallel rows on tbb (a parallel_for, default) or threads (each of");
  std::puts("                 the 10 iterations on a new std::thread, whose cache starts empty)");
  std::puts("  --peak-breakdown  sample each row's RSS every ms and print brisk's statistics at its");
  std::puts("                 highest sample (where the peak lay; the sampling thread costs time)");
  std::puts("  --smoke        every workload at a tiny count, for ctest");
  std::puts("  --version      print brisk-stress's version");
  std::puts("  --help, -h     this text");
}

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "brisk-stress: %s (try --help)\n", message.c_str());
  std::exit(2);
}

bool parse_double(const char* text, double& out) {
  if (*text == '\0') return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtod(text, &end);
  return errno == 0 && *end == '\0' && std::isfinite(out);
}

bool parse_u64(const char* text, std::uint64_t& out) {
  if (*text == '\0' || *text == '-' || *text == '+') return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtoull(text, &end, 0);
  return errno == 0 && *end == '\0';
}

void add_workload(Options& options, std::string_view name) {
  auto add = [&](const char* n) {
    for (const std::string& have : options.workloads)
      if (have == n) return;
    options.workloads.emplace_back(n);
  };
  if (name == "all") {
    for (const Workload& w : workloads()) add(w.name);
    return;
  }
  if (name == "mmtest") {
    for (const Workload& w : workloads())
      if (w.in_mmtest) add(w.name);
    return;
  }
  if (name == "mmtest-raw") {
    for (const char* n : {"small-raw", "medium-raw", "large-raw", "strings-raw"}) add(n);
    return;
  }
  for (const Workload& w : workloads()) {
    if (name == w.name) {
      add(w.name);
      return;
    }
  }
  usage_error("unknown workload '" + std::string(name) + "'");
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      print_help();
      std::exit(0);
    }
    if (arg == "--version") {
      std::printf("brisk-stress %s\n", BRISK_VERSION_STRING);
      std::exit(0);
    }
    if (arg == "--smoke") {
      options.smoke = true;
      continue;
    }
    if (arg == "--peak-breakdown") {
      options.peak_breakdown = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) {
      if (arg.size() > 1 && arg[0] == '-') usage_error("unknown option '" + arg + "'");
      add_workload(options, arg);
      continue;
    }
    std::string value;
    const std::size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg.resize(eq);
    } else if (arg == "--threads" || arg == "--scale" || arg == "--duration" || arg == "--seed" ||
               arg == "--json" || arg == "--rows" || arg == "--pool") {
      if (i + 1 >= argc) usage_error(arg + " needs a value");
      value = argv[++i];
    }
    if (arg == "--threads") {
      std::uint64_t n;
      if (!parse_u64(value.c_str(), n) || n < 1 || n > 1024)
        usage_error("--threads wants a whole number from 1 to 1024, not '" + value + "'");
      options.threads = static_cast<int>(n);
    } else if (arg == "--scale") {
      double pct;
      if (!parse_double(value.c_str(), pct) || pct <= 0 || pct > 100000)
        usage_error("--scale wants a percentage above 0, not '" + value + "'");
      options.scale_pct = pct;
      options.scale_given = true;
    } else if (arg == "--duration") {
      double s;
      if (!parse_double(value.c_str(), s) || s < 0 || s > 1e7)
        usage_error("--duration wants seconds (>= 0), not '" + value + "'");
      options.duration_s = s;
    } else if (arg == "--seed") {
      if (!parse_u64(value.c_str(), options.seed))
        usage_error("--seed wants a non-negative whole number, not '" + value + "'");
    } else if (arg == "--json") {
      if (value.empty()) usage_error("--json needs a file name");
      options.json_path = value;
    } else if (arg == "--rows") {
      if (value != "single" && value != "parallel" && value != "both")
        usage_error("--rows wants single, parallel or both, not '" + value + "'");
      options.single_row = value != "parallel";
      options.parallel_row = value != "single";
    } else if (arg == "--pool") {
      if (value != "tbb" && value != "threads")
        usage_error("--pool wants tbb or threads, not '" + value + "'");
      options.plain_threads = value == "threads";
    } else {
      usage_error("unknown option '" + arg + "'");
    }
  }
  if (options.smoke) {
    // Every workload, each at its own tiny count (Context::scaled), unless --scale is given.
    if (options.workloads.empty()) add_workload(options, "all");
  }
  if (options.workloads.empty()) {
    if (options.duration_s > 0) {
      for (const Workload& w : workloads())
        if (w.in_soak) options.workloads.emplace_back(w.name);
    } else {
      add_workload(options, "mmtest");
    }
  }
  return options;
}

std::string format_percent(double pct) {
  char text[32];
  std::snprintf(text, sizeof text, "%g%%", pct);
  return text;
}

const Workload& find(const std::string& name) {
  for (const Workload& w : workloads())
    if (name == w.name) return w;
  std::abort();  // parse() admitted only known names
}

}  // namespace
}  // namespace brisk::stress

int main(int argc, char** argv) {
  using namespace brisk::stress;
  const Options options = parse(argc, argv);

  // A task_arena of N threads gets at most max_allowed_parallelism workers, which defaults to
  // the core count; raise it so --threads 10 means 10 threads on a 2-core machine too.
  const unsigned hardware = std::thread::hardware_concurrency();
  const std::size_t parallelism =
      static_cast<std::size_t>(options.threads) > hardware ? options.threads : hardware;
  tbb::global_control parallelism_limit(tbb::global_control::max_allowed_parallelism,
                                        parallelism);

  Recorder recorder(options.peak_breakdown);
  int passes = 0;
  {
    Progress progress;
    Context ctx{options, recorder, progress};
    const double start = wall_now_ms();
    do {
      for (const std::string& name : options.workloads) {
        find(name).run(ctx);
        // Soak mode: every workload runs at least once, then the clock decides.
        if (passes > 0 && wall_now_ms() - start >= options.duration_s * 1000) break;
      }
      ++passes;
    } while (options.duration_s > 0 && wall_now_ms() - start < options.duration_s * 1000);
  }

  print_table(recorder.rows());
  const double ops_per_sec = overall_ops_per_sec(recorder.rows());
  if (!options.json_path.empty() && !write_json(options.json_path, options, recorder.rows(), ops_per_sec)) {
    std::fprintf(stderr, "brisk-stress: cannot write %s: %s\n", options.json_path.c_str(),
                 std::strerror(errno));
    return 2;
  }
  const std::string scale = options.smoke && !options.scale_given
                                ? std::string("smoke")
                                : format_percent(options.scale_pct);
  std::printf("seed=%" PRIu64 " scale=%s threads=%d passes=%d process_peak_rss_kib=%" PRIu64 "\n",
              options.seed, scale.c_str(), options.threads, passes, process_max_rss_kib());
  std::printf("ops_per_sec=%.0f\n", ops_per_sec);
  return 0;
}
