// brisk-compare: runs a command under several allocators, preloaded, in alternating paired
// rounds, and reports each allocator's median time ratio to a baseline with a bootstrap interval.
// See bench/README.md for the method and how to read the table.
#include <gnu/libc-version.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/compare/allocators.h"
#include "bench/compare/compare.h"
#include "bench/compare/report.h"

#ifndef BRISK_BENCH_BRISK_LIB
#define BRISK_BENCH_BRISK_LIB ""
#endif
#ifndef BRISK_BENCH_STRESS
#define BRISK_BENCH_STRESS ""
#endif
#ifndef BRISK_BENCH_PROBE
#define BRISK_BENCH_PROBE ""
#endif

namespace brisk::bench {
namespace {

constexpr const char* kUsage =
    "usage: brisk-compare [--pairs N] [--warmup N] [--alloc NAME]... [--baseline LABEL] [--json FILE]\n"
    "                     [--svg FILE] [--brisk-lib PATH] [--stress PATH] [--env NAME=VALUE]... [--echo]\n"
    "                     (--suite mmtest|mmtest-rows|mmtest-threads|stress [--scale PCT] | -- COMMAND [ARGS...])\n"
    "Runs the workload under each allocator, preloaded, in alternating pairs, and reports each one's\n"
    "median time ratio to the baseline with a 95% bootstrap interval (bench/README.md).\n"
    "\n"
    "  --pairs N          measured rounds per allocator (default 25; suites 7)\n"
    "  --warmup N         unmeasured rounds first (default 3; suites 1)\n"
    "  --alloc NAME       an allocator to run: brisk system jemalloc tcmalloc mimalloc tbbmalloc all,\n"
    "                     a path to a .so, or LABEL=NAME|PATH; repeatable (default all)\n"
    "  --alloc LABEL=NAME|PATH,VAR=VALUE[,VAR=VALUE...]\n"
    "                     the same with variables set for this allocator's runs only, e.g.\n"
    "                     brisk-debug=brisk,BRISK_DEBUG=1 or glibc-perturb=system,MALLOC_PERTURB_=165\n"
    "  --baseline LABEL   the allocator the ratios divide by (default brisk)\n"
    "  --json FILE        also write every sample and the summary as JSON\n"
    "  --svg FILE         also draw the ratios and intervals as an SVG chart\n"
    "  --brisk-lib PATH   libbrisk.so to use for brisk (default: this build's; env BRISK_LIB)\n"
    "  --stress PATH      brisk-stress for the suites (default: this build's; env BRISK_STRESS)\n"
    "  --env NAME=VALUE   set a variable for every run; repeatable\n"
    "  --echo             show the workload's own output\n"
    "  --quiet            no progress line\n"
    "  --suite NAME       mmtest (MMtest's tests, verified and as written) or stress (prodcons,\n"
    "                     larson, churn, realloc, cache-thrash, cache-scratch, large-replace,\n"
    "                     larson-classic, xmalloc, alloc-test, sh6bench, mstress), one row per workload;\n"
    "                     mmtest-rows: MMtest's 1-thread and 10-way runs of small, medium, large\n"
    "                     and strings as rows of their own; mmtest-threads: MMtest's 10-way runs, verified\n"
    "                     and as written, on 10 new threads each (brisk-stress --pool threads)\n"
    "  --scale PCT        with --suite: the workloads' --scale instead of each one's default\n"
    "  -- COMMAND ARGS    any program to time instead of a suite\n"
    "  --version          print brisk-compare's version\n";

#ifndef BRISK_VERSION_STRING
#define BRISK_VERSION_STRING "unknown"
#endif

// Suites: the brisk-stress workloads, each a row of its own. Scales keep `scripts/mmtest.sh`
// (brisk and system, 7 pairs) to a few minutes on a 2-core machine.
struct SuiteWorkload {
  const char* name;
  double scale;  // percent of the full workload, passed as --scale
  const char* rows = nullptr;   // brisk-stress --rows (single or parallel), or the whole workload
  const char* label = nullptr;  // the row's name when it is not the workload's
  const char* pool = nullptr;   // brisk-stress --pool (threads: MMtest's 10-way rows on new threads)
};

struct Suite {
  const char* name;
  std::vector<SuiteWorkload> workloads;
};

const std::vector<Suite>& suites() {
  static const std::vector<Suite> all = {
      // Measured under glibc on the 2-core development machine: medium and large at 0.1% take 4-6 s
      // (at 1% they take 30-45 s, mostly in mmap/munmap), small at 50% and strings at 100% about 1 s.
      // The *-raw rows run the same tests as written, touching no block: the original measures
      // mapping costs where the verified rows also pay page faults.
      {"mmtest", {{"small", 50}, {"medium", 0.1}, {"large", 0.1}, {"strings", 100},
                  {"small-raw", 50}, {"medium-raw", 0.1}, {"large-raw", 1}, {"strings-raw", 100}}},
      // MMtest's halves paired on their own: the 1-thread run (at ten times the scale, as much
      // work as the 10-way run) and the 10-way parallel for.
      {"mmtest-rows", {{"small", 500, "single", "small x1"}, {"small", 50, "parallel", "small x10"},
                       {"medium", 1, "single", "medium x1"}, {"medium", 0.1, "parallel", "medium x10"},
                       {"large", 1, "single", "large x1"}, {"large", 0.1, "parallel", "large x10"},
                       {"strings", 1000, "single", "strings x1"}, {"strings", 100, "parallel", "strings x10"}}},
      // MMtest's 10-way halves on 10 new std::threads (`--pool threads`), as the article ran them:
      // every thread's cache starts empty and is given back at its exit.
      {"mmtest-threads", {{"small", 50, "parallel", "small threads", "threads"},
                          {"medium", 0.1, "parallel", "medium threads", "threads"},
                          {"large", 0.1, "parallel", "large threads", "threads"},
                          {"strings", 100, "parallel", "strings threads", "threads"},
                          {"small-raw", 50, "parallel", "small-raw threads", "threads"},
                          {"medium-raw", 0.1, "parallel", "medium-raw threads", "threads"},
                          {"large-raw", 1, "parallel", "large-raw threads", "threads"},
                          {"strings-raw", 100, "parallel", "strings-raw threads", "threads"}}},
      // prodcons, larson and realloc at 10% take about 1 s, churn at 5% about 2 s.
      // cache-thrash and cache-scratch at 100% take about 0.1 s each; large-replace at 1%
      // about 2-3 s, most of it the first touch of each thread's blocks. The classic benchmarks
      // (each a 1-thread and a 10-thread row) take 0.3-1 s under brisk at these scales:
      // larson-classic at 5% (5 rounds of 5,000 per generation), xmalloc at 50% (50 batches per
      // thread), alloc-test at 5% (200,000 steps per thread), sh6bench at 50% (50 walks),
      // mstress at 20% (load 10, 25 rounds).
      {"stress", {{"prodcons", 10}, {"larson", 10}, {"churn", 5}, {"realloc", 10},
                  {"cache-thrash", 100}, {"cache-scratch", 100}, {"large-replace", 1},
                  {"larson-classic", 5}, {"xmalloc", 50}, {"alloc-test", 5}, {"sh6bench", 50},
                  {"mstress", 20}}},
  };
  return all;
}

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "brisk-compare: %s (see --help)\n", message.c_str());
  std::exit(2);
}

bool parse_int(const std::string& text, int minimum, int* out) {
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value < minimum || value > 1000000) return false;
  *out = static_cast<int>(value);
  return true;
}

std::string directory_of_self() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return ".";
  std::string self(path, static_cast<std::size_t>(n));
  return self.substr(0, self.rfind('/'));
}

std::string quote(const std::string& arg) {
  if (!arg.empty() && arg.find_first_of(" \t'\"$\\") == std::string::npos) return arg;
  std::string out = "'";
  for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%d %H:%M UTC", &tm);
  return buffer;
}

std::string host_description() {
  utsname name{};
  uname(&name);
  std::string cpu;
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  return std::string(name.sysname) + " " + name.release + " " + name.machine + ", " +
         std::to_string(std::thread::hardware_concurrency()) + " CPUs" + (cpu.empty() ? "" : ", " + cpu);
}

std::string first_existing(std::initializer_list<std::string> candidates) {
  for (const std::string& c : candidates) {
    if (!c.empty() && access(c.c_str(), X_OK | R_OK) == 0) return c;
  }
  return "";
}

int run(int argc, char** argv) {
  Plan plan;
  bool pairs_set = false, warmup_set = false;
  std::vector<std::string> alloc_specs;
  std::string baseline_label, json_path, svg_path, suite_name;
  std::string brisk_lib = std::getenv("BRISK_LIB") ? std::getenv("BRISK_LIB") : BRISK_BENCH_BRISK_LIB;
  std::string stress_path = std::getenv("BRISK_STRESS") ? std::getenv("BRISK_STRESS") : BRISK_BENCH_STRESS;
  double scale = 0;  // 0: each suite workload's own default
  std::vector<std::string> command;

  std::string command_line = "brisk-compare";
  for (int i = 1; i < argc; ++i) command_line += " " + quote(argv[i]);

  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--") {
      for (++i; i < argc; ++i) command.emplace_back(argv[i]);
      break;
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--version") {
      std::printf("brisk-compare %s\n", BRISK_VERSION_STRING);
      return 0;
    } else if (arg == "--pairs") {
      if (!parse_int(value(), 1, &plan.pairs)) usage_error("--pairs needs an integer >= 1");
      pairs_set = true;
    } else if (arg == "--warmup") {
      if (!parse_int(value(), 0, &plan.warmup)) usage_error("--warmup needs an integer >= 0");
      warmup_set = true;
    } else if (arg == "--alloc") {
      alloc_specs.push_back(value());
    } else if (arg == "--baseline") {
      baseline_label = value();
    } else if (arg == "--json") {
      json_path = value();
    } else if (arg == "--svg") {
      svg_path = value();
    } else if (arg == "--brisk-lib") {
      brisk_lib = value();
    } else if (arg == "--stress") {
      stress_path = value();
    } else if (arg == "--suite") {
      suite_name = value();
    } else if (arg == "--scale") {
      const std::string text = value();
      char* end = nullptr;
      scale = std::strtod(text.c_str(), &end);
      if (text.empty() || *end != '\0' || !(scale > 0)) usage_error("--scale needs a percentage above 0");
    } else if (arg == "--env") {
      const std::string env = value();
      if (env.find('=') == std::string::npos || env[0] == '=') usage_error("--env needs NAME=VALUE");
      plan.environment.push_back(env);
    } else if (arg == "--echo") {
      plan.echo_output = true;
    } else if (arg == "--quiet") {
      plan.progress = false;
    } else if (!arg.empty() && arg[0] != '-') {
      usage_error("'" + arg + "' is not an option; to time a program, put it after --: -- " + arg + " ...");
    } else {
      usage_error("unknown option " + arg);
    }
  }

  ReportContext context;
  context.command_line = command_line;
  context.date = utc_now();
  context.host = host_description();

  // The workloads.
  if (!suite_name.empty() && !command.empty()) usage_error("give either --suite or -- COMMAND, not both");
  if (suite_name.empty() && command.empty()) usage_error("no command: give --suite NAME or -- COMMAND [ARGS]");
  if (!suite_name.empty()) {
    const Suite* suite = nullptr;
    for (const Suite& s : suites()) {
      if (suite_name == s.name) suite = &s;
    }
    if (suite == nullptr) usage_error("unknown suite " + suite_name + " (expected mmtest, mmtest-rows, mmtest-threads or stress)");
    if (!pairs_set) plan.pairs = 7;
    if (!warmup_set) plan.warmup = 1;
    stress_path = first_existing({stress_path});
    if (stress_path.empty()) {
      std::fprintf(stderr, "brisk-compare: brisk-stress not found; build target brisk-stress or pass --stress PATH\n");
      return 1;
    }
    std::string scales;
    for (const SuiteWorkload& workload : suite->workloads) {
      char text[32];
      std::snprintf(text, sizeof text, "%g", scale > 0 ? scale : workload.scale);
      std::vector<std::string> argv = {stress_path, workload.name, "--scale", text};
      if (workload.rows != nullptr) argv.insert(argv.end(), {"--rows", workload.rows});
      if (workload.pool != nullptr) argv.insert(argv.end(), {"--pool", workload.pool});
      const char* label = workload.label != nullptr ? workload.label : workload.name;
      plan.workloads.push_back({label, argv});
      scales += std::string(scales.empty() ? "" : ", ") + label + " " + text + "%";
      if (workload.rows != nullptr) scales += std::string(" --rows ") + workload.rows;
      if (workload.pool != nullptr) scales += std::string(" --pool ") + workload.pool;
    }
    context.notes.push_back("suite " + suite_name + ": `" + stress_path + " WORKLOAD --scale PCT` with " + scales +
                            " of the full workloads" +
                            (pairs_set || warmup_set ? "" : "; suites default to 7 pairs and 1 warm-up (the seed's method uses 25 and 3)"));
  } else {
    if (scale != 0) usage_error("--scale applies to --suite only");
    std::string name = command[0].substr(command[0].rfind('/') + 1);
    for (std::size_t i = 1; i < command.size(); ++i) name += " " + command[i];
    plan.workloads.push_back({name, command});
  }

  // The allocators: resolve, then check each preload really took effect.
  if (alloc_specs.empty()) alloc_specs.push_back("all");
  std::vector<std::string> expanded;
  for (const std::string& spec : alloc_specs) {
    if (spec == "all") {
      for (const std::string& name : known_allocator_names()) expanded.push_back(name);
    } else {
      expanded.push_back(spec);
    }
  }
  std::string probe = first_existing({BRISK_BENCH_PROBE, directory_of_self() + "/brisk-preload-probe"});
  if (probe.empty()) {
    std::fprintf(stderr, "brisk-compare: brisk-preload-probe not found next to brisk-compare\n");
    return 1;
  }
  std::set<std::string> labels;
  for (const std::string& spec : expanded) {
    std::string note, detail;
    bool unknown = false;
    std::optional<Allocator> allocator = resolve_allocator(spec, brisk_lib, &note, &unknown);
    if (unknown) usage_error(note);
    if (!allocator) {
      std::fprintf(stderr, "brisk-compare: %s\n", note.c_str());
      context.notes.push_back(note);
      continue;
    }
    if (labels.count(allocator->label)) {
      // "--alloc all --alloc jemalloc" names jemalloc twice; run it once.
      continue;
    }
    if (std::string warning = environment_warning(*allocator, gnu_get_libc_version()); !warning.empty()) {
      std::fprintf(stderr, "brisk-compare: warning: %s\n", warning.c_str());
      context.notes.push_back("warning: " + warning);
    }
    if (!preload_took_effect(*allocator, probe, &note, &detail)) {
      std::fprintf(stderr, "brisk-compare: %s\n", note.c_str());
      context.notes.push_back(note);
      continue;
    }
    labels.insert(allocator->label);
    plan.allocators.push_back(*allocator);
  }
  if (plan.allocators.empty()) {
    std::fprintf(stderr, "brisk-compare: no allocator left to run\n");
    return 1;
  }
  const std::string wanted = baseline_label.empty() ? "brisk" : baseline_label;
  bool found = false;
  for (std::size_t a = 0; a < plan.allocators.size(); ++a) {
    if (plan.allocators[a].label == wanted) {
      plan.baseline = a;
      found = true;
    }
  }
  if (!found) {
    if (!baseline_label.empty()) usage_error("--baseline " + baseline_label + " is not among the allocators run");
    plan.baseline = 0;
    context.notes.push_back("brisk is not among the allocators run; the baseline is " + plan.allocators[0].label);
  }

  std::vector<WorkloadResult> results = run_comparison(plan);

  write_markdown(std::cout, plan, results, context);
  std::cout.flush();
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    write_json(out, plan, results, context);
    if (!out) {
      std::fprintf(stderr, "brisk-compare: cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  if (!svg_path.empty()) {
    std::ofstream out(svg_path);
    write_svg(out, plan, results, context);
    if (!out) {
      std::fprintf(stderr, "brisk-compare: cannot write %s\n", svg_path.c_str());
      return 1;
    }
  }
  for (const WorkloadResult& result : results) {
    if (result.failed) {
      std::fprintf(stderr, "brisk-compare: some runs failed; their rows report no ratio\n");
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace brisk::bench

int main(int argc, char** argv) { return brisk::bench::run(argc, argv); }
