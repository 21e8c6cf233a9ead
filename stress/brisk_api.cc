// The brisk-only workloads, while prodcons's producers and consumers allocate, fill, verify and
// free (no block may be damaged or lost: prodcons verifies every one):
//   brisk:    enter and leave debug mode over and over, and switch the strategy each time; no
//             report may be made, and brisk_check_heap must find nothing;
//   strategy: switch the strategy every 2 ms, and trim the whole process every 50 ms.
//
// brisk-stress links nothing from brisk, so one binary runs under any allocator; this workload
// finds brisk's API at run time with dlsym(RTLD_DEFAULT, ...), which sees libbrisk.so whether it
// was preloaded or linked (brisk-stress-linked).
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <chrono>
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

// brisk_set_strategy(int) and brisk_trim(), or nullptr.
using SetStrategy = int (*)(int);
using Trim = std::size_t (*)();

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

// Skips workload `name` (a row saying why) unless brisk is loaded with every function looked
// up; true if skipped.
bool skipped(Context& ctx, const char* name, const std::string& missing) {
  std::string why;
  if (dlsym(RTLD_DEFAULT, "brisk_malloc") == nullptr)
    why = "brisk is not loaded (preload libbrisk.so or run brisk-stress-linked)";
  else if (!missing.empty())
    why = "brisk has no " + missing;
  if (why.empty()) return false;
  ctx.recorder.skip(name, "skipped: " + why);
  std::fprintf(stderr, "brisk-stress: workload %s skipped: %s\n", name, why.c_str());
  return true;
}

// The traffic both workloads run: half the threads produce, half consume.
struct Traffic {
  int producers, consumers;
  std::uint64_t per_producer;
  explicit Traffic(Context& ctx)
      : producers((ctx.threads() < 2 ? 2 : ctx.threads()) / 2),
        consumers((ctx.threads() < 2 ? 2 : ctx.threads()) - producers),
        per_producer(ctx.scaled(100000, 2000, 256)) {}
  int threads() const { return producers + consumers; }
  std::string describe() const {
    return std::to_string(producers) + " producers, " + std::to_string(consumers) + " consumers";
  }
};

// The traffic starts once the switcher has switched: on a loaded machine a short run could
// otherwise end before the switcher thread ran at all (a smoke run in CI did: "no switch
// happened"), and measure nothing of what the workload is for.
void wait_until(const std::atomic<bool>& flag) {
  while (!flag.load(std::memory_order_acquire)) std::this_thread::yield();
}

}  // namespace

void run_brisk_api(Context& ctx) {
  std::string missing;
  DebugApi api{lookup<void (*)()>("brisk_debug_enter", missing), lookup<void (*)()>("brisk_debug_exit", missing),
               lookup<int (*)()>("brisk_check_heap", missing),
               lookup<decltype(DebugApi::set_report_callback)>("brisk_debug_set_report_callback", missing)};
  auto set_strategy = lookup<SetStrategy>("brisk_set_strategy", missing);
  if (skipped(ctx, kName, missing)) return;
  const Traffic t(ctx);
  std::uint64_t switches = 0;
  api.set_report_callback(count_report, nullptr);
  ctx.progress.begin("brisk x" + std::to_string(t.threads()), t.per_producer * t.producers);
  ctx.recorder.measure(
      kName, t.threads(),
      [&] {
        std::atomic<bool> stop{false}, switched{false};
        std::thread switcher([&] {
          while (!stop.load(std::memory_order_relaxed)) {
            api.enter();
            set_strategy(static_cast<int>(switches % 3));
            std::this_thread::yield();
            api.exit();
            std::this_thread::yield();
            ++switches;
            switched.store(true, std::memory_order_release);
          }
          set_strategy(1);  // balanced, the default
        });
        wait_until(switched);
        std::uint64_t ops = prodcons_traffic(ctx, t.producers, t.consumers, t.per_producer);
        stop = true;
        switcher.join();
        return ops;
      },
      t.describe() + " under debug-mode and strategy switching");
  ctx.progress.end();
  const int damaged = api.check_heap();
  api.set_report_callback(nullptr, nullptr);
  const std::uint64_t reports = g_reports.load();
  std::fprintf(stderr, "brisk-stress: workload brisk: %llu debug-mode switches, %llu reports, %d damaged blocks\n",
               static_cast<unsigned long long>(switches), static_cast<unsigned long long>(reports), damaged);
  if (reports != 0 || damaged != 0) {
    std::fprintf(stderr, "brisk-stress: workload brisk FAILED\n");
    std::exit(1);
  }
}

void run_brisk_strategy(Context& ctx) {
  constexpr const char* kStrategyName = "strategy";
  std::string missing;
  auto set_strategy = lookup<SetStrategy>("brisk_set_strategy", missing);
  auto trim = lookup<Trim>("brisk_trim", missing);
  if (skipped(ctx, kStrategyName, missing)) return;
  const Traffic t(ctx);
  std::uint64_t switches = 0, trims = 0;
  ctx.progress.begin("strategy x" + std::to_string(t.threads()), t.per_producer * t.producers);
  ctx.recorder.measure(
      kStrategyName, t.threads(),
      [&] {
        std::atomic<bool> stop{false}, switched{false};
        std::thread switcher([&] {
          while (!stop.load(std::memory_order_relaxed)) {
            if (set_strategy(static_cast<int>(switches % 3)) != 0) std::abort();
            if (++switches % 25 == 0) {
              trim();
              ++trims;
            }
            switched.store(true, std::memory_order_release);
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
          }
          set_strategy(1);
        });
        wait_until(switched);
        std::uint64_t ops = prodcons_traffic(ctx, t.producers, t.consumers, t.per_producer);
        stop = true;
        switcher.join();
        return ops;
      },
      t.describe() + "; the strategy switched every 2 ms, the process trimmed every 50 ms");
  ctx.progress.end();
  std::fprintf(stderr, "brisk-stress: workload strategy: %llu switches, %llu trims\n",
               static_cast<unsigned long long>(switches), static_cast<unsigned long long>(trims));
}

}  // namespace brisk::stress
