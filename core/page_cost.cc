#include "core/page_cost.h"

#include <algorithm>
#include <atomic>

namespace brisk::page_cost {

namespace {

// Per way: the mean (an exponential moving average with weight 1/8, in nanoseconds) and the
// number of samples, saturating at kWarmSamples (only "warm or not" is read).
struct WayCost {
  std::atomic<std::uint64_t> mean_ns{0};
  std::atomic<std::uint32_t> samples{0};
};
WayCost g_cost[2];
std::atomic<bool> g_fixed{false};

WayCost& of(Way w) { return g_cost[static_cast<unsigned>(w)]; }

}  // namespace

Way choose(std::uintptr_t page) {
  const bool sample = is_sample_page(page);
  Way best = Way::kPopulate;
  if (of(Way::kFault).samples.load(std::memory_order_relaxed) >= kWarmSamples &&
      of(Way::kPopulate).samples.load(std::memory_order_relaxed) >= kWarmSamples &&
      of(Way::kFault).mean_ns.load(std::memory_order_relaxed) < of(Way::kPopulate).mean_ns.load(std::memory_order_relaxed))
    best = Way::kFault;
  if (!sample || g_fixed.load(std::memory_order_relaxed)) return best;
  return best == Way::kFault ? Way::kPopulate : Way::kFault;
}

void record(Way way, std::uint64_t ns) {
  if (g_fixed.load(std::memory_order_relaxed)) return;
  WayCost& c = of(way);
  const WayCost& other = of(way == Way::kFault ? Way::kPopulate : Way::kFault);
  const std::uint32_t n = c.samples.load(std::memory_order_relaxed);
  std::uint64_t mean = c.mean_ns.load(std::memory_order_relaxed);
  // The cap: 8 times the lower of the two means (the other's once it is warm). Against the
  // way's own mean alone, a few preempted samples in a row (a thread descheduled inside the
  // timed window, or a populate call waiting for mmap_lock behind a munmap) each raised it by
  // 7/8, and one run of larson left populate's mean at 1.2 ms a page, which then took dozens
  // of samples to come down.
  std::uint64_t cap = 8 * mean;
  if (other.samples.load(std::memory_order_relaxed) >= kWarmSamples)
    cap = std::min(cap, 8 * other.mean_ns.load(std::memory_order_relaxed));
  if (n == 0) {
    mean = ns;
  } else {
    if (ns > cap) ns = cap;
    mean = mean - mean / 8 + ns / 8;
  }
  c.mean_ns.store(mean, std::memory_order_relaxed);
  if (n < kWarmSamples) c.samples.store(n + 1, std::memory_order_relaxed);
}

Costs costs() {
  return Costs{of(Way::kFault).mean_ns.load(std::memory_order_relaxed),
               of(Way::kPopulate).mean_ns.load(std::memory_order_relaxed),
               of(Way::kFault).samples.load(std::memory_order_relaxed),
               of(Way::kPopulate).samples.load(std::memory_order_relaxed)};
}

void set_for_test(const Costs& c, bool fixed) {
  of(Way::kFault).mean_ns.store(c.fault_ns, std::memory_order_relaxed);
  of(Way::kPopulate).mean_ns.store(c.populate_ns, std::memory_order_relaxed);
  of(Way::kFault).samples.store(c.fault_samples, std::memory_order_relaxed);
  of(Way::kPopulate).samples.store(c.populate_samples, std::memory_order_relaxed);
  g_fixed.store(fixed, std::memory_order_relaxed);
}

}  // namespace brisk::page_cost
