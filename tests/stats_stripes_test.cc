// The striped counters of core/stats.h: many threads adding at once, some taking out what
// others put in, leave sums that are exact; threads alive at the same time write different
// stripes; and a sum read while it is below zero reads 0. Nothing in this process allocates
// through brisk, so only the test's threads write the counters (the TSan build runs this too).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include "core/stats.h"
#include "tests/test_util.h"

namespace {

using brisk::stats::Stripe;
using brisk::stats::kStripes;

// Thread t adds t + 1 to `mixed` and takes out what thread t + 1 adds, as a remote free's
// sender and receiver do with remote_queued_bytes, so the stripes wrap below zero and only the
// sum is meaningful; to `added` it only adds. More threads than stripes, so stripes are shared.
TEST(StatsStripes, ACounterWrittenByManyThreadsAtOnceSumsExactly) {
  constexpr unsigned kThreads = 2 * kStripes + 3;
  constexpr std::int64_t kOps = 20000 / brisk_test::kScale;
  const std::uint64_t mixed_before = brisk::stats::sum(&Stripe::remote_queued_bytes);
  const std::uint64_t added_before = brisk::stats::sum(&Stripe::large_bytes_in_use);
  std::barrier start(kThreads);
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::int64_t mine = t + 1, next = (t + 1) % kThreads + 1;
      start.arrive_and_wait();
      for (std::int64_t i = 0; i < kOps; ++i) {
        brisk::stats::add(&Stripe::remote_queued_bytes, mine);
        brisk::stats::add(&Stripe::large_bytes_in_use, mine);
        brisk::stats::add(&Stripe::remote_queued_bytes, -next);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(brisk::stats::sum(&Stripe::remote_queued_bytes), mixed_before);
  EXPECT_EQ(brisk::stats::sum(&Stripe::large_bytes_in_use) - added_before,
            std::uint64_t{kOps} * kThreads * (kThreads + 1) / 2);
}

// Past kStripes threads, stripes are shared: two threads adding to one stripe at once lose
// no add. The second thread is found by starting threads until one gets the first's stripe.
TEST(StatsStripes, TwoThreadsAddingToOneStripeAtOnceLoseNothing) {
  constexpr std::int64_t kOps = 20000000 / brisk_test::kScale;
  alarm(120);  // a hang fails the test
  const std::uint64_t before = brisk::stats::sum(&Stripe::large_bytes_mapped);
  std::atomic<const Stripe*> first{nullptr};
  std::barrier go(2);
  auto adder = [&] {
    go.arrive_and_wait();
    for (std::int64_t i = 0; i < kOps; ++i) brisk::stats::add(&Stripe::large_bytes_mapped, 1);
  };
  std::thread a([&] {
    first = brisk::stats::stripe_of_this_thread();
    adder();
  });
  while (first.load() == nullptr) std::this_thread::yield();
  std::thread b;
  for (unsigned tries = 0; tries < 4 * kStripes && !b.joinable(); ++tries) {
    enum { kUnknown, kOther, kShared };
    std::atomic<int> stripe{kUnknown};
    std::thread candidate([&] {
      bool shares = brisk::stats::stripe_of_this_thread() == first.load();
      stripe = shares ? kShared : kOther;
      if (shares) adder();
    });
    while (stripe.load() == kUnknown) std::this_thread::yield();
    if (stripe.load() == kShared) {
      b = std::move(candidate);
    } else {
      candidate.join();
    }
  }
  ASSERT_TRUE(b.joinable()) << "no thread of " << 4 * kStripes << " shared a stripe";
  a.join();
  b.join();
  alarm(0);
  EXPECT_EQ(brisk::stats::sum(&Stripe::large_bytes_mapped) - before, std::uint64_t{2 * kOps});
}

TEST(StatsStripes, ThreadsAliveAtOnceWriteStripesOfTheirOwn) {
  std::vector<const Stripe*> seen(kStripes);
  std::barrier all_assigned(kStripes);
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < kStripes; ++t) {
    threads.emplace_back([&, t] {
      brisk::stats::add(&Stripe::large_live_blocks, 1);
      seen[t] = brisk::stats::stripe_of_this_thread();
      all_assigned.arrive_and_wait();  // no thread exits before all have their stripe
      brisk::stats::add(&Stripe::large_live_blocks, -1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(std::set<const Stripe*>(seen.begin(), seen.end()).size(), std::size_t{kStripes});
}

TEST(StatsStripes, ASumBelowZeroReadsZero) {
  // Only this test writes spans_orphaned in this process.
  ASSERT_EQ(brisk::stats::sum(&Stripe::spans_orphaned), 0u);
  brisk::stats::add(&Stripe::spans_orphaned, 2);
  EXPECT_EQ(brisk::stats::sum(&Stripe::spans_orphaned), 2u);
  brisk::stats::add(&Stripe::spans_orphaned, -5);
  EXPECT_EQ(brisk::stats::sum(&Stripe::spans_orphaned), 0u) << "not 2^64 - 3";
  brisk::stats::add(&Stripe::spans_orphaned, 4);
  EXPECT_EQ(brisk::stats::sum(&Stripe::spans_orphaned), 1u);
  brisk::stats::add(&Stripe::spans_orphaned, -1);
}

}  // namespace
