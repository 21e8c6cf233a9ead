// brisk's first use in a process happens before main and from several threads at once: a
// static constructor starts threads that all make their first brisk call together. Nothing in
// this program calls brisk earlier (GoogleTest does not), so this is brisk's initialisation.
#include <brisk/brisk.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace {

constexpr int kThreads = 8;
constexpr int kBlocksPerThread = 2000;

struct EarlyResult {
  bool ran = false;
  std::atomic<int> bad{0};
  std::atomic<int> done{0};
};
EarlyResult g_early;

// Runs before main (a namespace-scope object's constructor).
struct StartThreadsBeforeMain {
  StartThreadsBeforeMain() {
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&go, t] {
        while (!go.load(std::memory_order_acquire)) {
        }
        brisk_test::Rng rng(t + 1);
        struct Block {
          void* p;
          size_t size;
          uint64_t seed;
        };
        std::vector<Block> blocks;
        for (int i = 0; i < kBlocksPerThread; ++i) {
          size_t s = brisk_test::MixedSize(rng);
          size_t alignment = size_t{64} << (i % 5);
          void* p = (i % 7 == 0) ? brisk_aligned_alloc(alignment, s) : brisk_malloc(s);
          if (p == nullptr || (i % 7 == 0 && !brisk_test::IsAligned(p, alignment)) || brisk_usable_size(p) < s) {
            g_early.bad++;
            continue;
          }
          Block b{p, s, rng.Next()};
          brisk_test::Fill(p, s, b.seed);
          blocks.push_back(b);
        }
        for (const Block& b : blocks) {
          if (!brisk_test::Verify(b.p, b.size, b.seed)) g_early.bad++;
          brisk_free(b.p);
        }
        g_early.done++;
      });
    }
    go.store(true, std::memory_order_release);
    for (auto& th : threads) th.join();
    g_early.ran = true;
  }
};
StartThreadsBeforeMain g_start_threads_before_main;

TEST(BriskInit, ConcurrentFirstUseBeforeMain) {
  ASSERT_TRUE(g_early.ran);
  EXPECT_EQ(g_early.done.load(), kThreads);
  EXPECT_EQ(g_early.bad.load(), 0) << "a block was null, misaligned, too small or overwritten during initialisation";
  // brisk is fully usable afterwards, and the early threads' heaps were released.
  brisk_stats s;
  std::memset(&s, 0, sizeof s);
  brisk_get_stats(&s);
  void* p = brisk_malloc(100);
  ASSERT_NE(p, nullptr);
  brisk_free(p);
  brisk_get_stats(&s);
  EXPECT_EQ(s.heaps_live, 1u) << "only main's heap should be attached";
}

}  // namespace
