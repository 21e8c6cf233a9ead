// The brisk-only workload: enter and leave debug mode over and over while prodcons's producers
// and consumers allocate, fill, verify and free: no block may be damaged or lost (prodcons
// verifies every one), no report may be made, and brisk_check_heap must find nothing.
//
// brisk-stress links nothing from brisk, so one binary runs under any allocator; this workload
// finds brisk's API at run time with dlsym(RTLD_DEFAULT, ...), which sees libbrisk.so whether it
// was preloaded or linked (brisk-stress-linked). The strategy setter (brisk_set_strategy) does
// not exist yet: that part is skipped, and the row's note says so. Coupling: when it lands,
// switch strategies in the switcher loop too.
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "stress/suite.h"

namespace brisk::stress {
namespace {

constexpr const char* kName = "brisk";

struct DebugApi {
  void (*enter)();
  void (*exit)();
  int (*check_heap)();
  void (*set_report_callback)(void (*)(const char*, std::size_t, void*), void*);
};

std::atomic<std::uint64_t> g_reports{0};

void count_report(const char* text, std::size_t length, void*) {
  g_reports.fetch_add(1, std::memory_order_relaxed);
  std::fwrite(text, 1, length, stderr);
}

template <typename T>
T lookup(const char* name, std::string& missing) {
  void* p = dlsym(RTLD_DEFAULT, name);
  if (p == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
  return reinterpret_cast<T>(p);
}

}  // namespace

void run_brisk_api(Context& ctx) {
  std::string missing;
  DebugApi api{lookup<void (*)()>("brisk_debug_enter", missing), lookup<void (*)()>("brisk_debug_exit", missing),
               lookup<int (*)()>("brisk_check_heap", missing),
               lookup<decltype(DebugApi::set_report_callback)>("brisk_debug_set_report_callback", missing)};
  std::string why;
  if (dlsym(RTLD_DEFAULT, "brisk_malloc") == nullptr)
    why = "brisk is not loaded (preload libbrisk.so or run brisk-stress-linked)";
  else if (!missing.empty())
    why = "brisk has no " + missing;
  if (!why.empty()) {
    ctx.recorder.skip(kName, "skipped: " + why);
    std::fprintf(stderr, "brisk-stress: workload brisk skipped: %s\n", why.c_str());
    return;
  }
  const int threads = ctx.threads() < 2 ? 2 : ctx.threads();
  const int producers = threads / 2;
  const int consumers = threads - producers;
  const std::uint64_t per_producer = ctx.scaled(100000, 2000, 256);
  std::uint64_t switches = 0;
  api.set_report_callback(count_report, nullptr);
  ctx.progress.begin("brisk x" + std::to_string(threads), per_producer * producers);
  ctx.recorder.measure(
      kName, threads,
      [&] {
        std::atomic<bool> stop{false};
        std::thread switcher([&] {
          while (!stop.load(std::memory_order_relaxed)) {
            api.enter();
            std::this_thread::yield();
            api.exit();
            std::this_thread::yield();
            ++switches;
          }
        });
        std::uint64_t ops = prodcons_traffic(ctx, producers, consumers, per_producer);
        stop = true;
        switcher.join();
        return ops;
      },
      std::to_string(producers) + " producers, " + std::to_string(consumers) +
          " consumers under debug-mode switching; the strategy switch is skipped (no brisk_set_strategy yet)");
  ctx.progress.end();
  const int damaged = api.check_heap();
  api.set_report_callback(nullptr, nullptr);
  const std::uint64_t reports = g_reports.load();
  std::fprintf(stderr, "brisk-stress: workload brisk: %llu debug-mode switches, %llu reports, %d damaged blocks\n",
               static_cast<unsigned long long>(switches), static_cast<unsigned long long>(reports), damaged);
  if (switches == 0 || reports != 0 || damaged != 0) {
    std::fprintf(stderr, "brisk-stress: workload brisk FAILED\n");
    std::exit(1);
  }
}

}  // namespace brisk::stress
