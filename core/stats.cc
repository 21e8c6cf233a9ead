#include "core/stats.h"

namespace brisk::stats {

Counters g;
Stripe g_stripes[kStripes];
__thread Stripe* t_stripe __attribute__((tls_model("initial-exec"))) = nullptr;

namespace {
std::atomic<unsigned> g_next_stripe{0};  // taken once per thread that writes a striped counter
}  // namespace

Stripe* assign_stripe() {
  t_stripe = &g_stripes[g_next_stripe.fetch_add(1, std::memory_order_relaxed) % kStripes];
  return t_stripe;
}

std::uint64_t sum(StripedCounter c) {
  std::uint64_t total = 0;
  for (const Stripe& s : g_stripes) total += (s.*c).load(std::memory_order_relaxed);
  return static_cast<std::int64_t>(total) < 0 ? 0 : total;
}

}  // namespace brisk::stats
