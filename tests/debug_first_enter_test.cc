// The first brisk_debug_enter of a process while other threads allocate. debug::init writes the
// debug layer's state (stack depth and depot, the quarantine's rings) before the mode turns on;
// a thread that sees the mode on and makes its first debug block must see that state too. Under
// ThreadSanitizer (the test command's thread stage, halt_on_error) a missing order is a race
// report. In a process of its own: the mode must never have been on before.
#include <brisk/brisk.h>

#include <gtest/gtest.h>

#include "tests/test_util.h"

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

namespace {

TEST(DebugFirstEnter, ThreadsAllocatingAsTheModeFirstTurnsOnMakeSoundDebugBlocks) {
  ASSERT_EQ(brisk_debug_active(), 0) << "the mode was on before: this test needs its first enter";
  constexpr int kThreads = 2;
  constexpr size_t kSize = 40;  // a debug block's usable size is its size; a release block's, 48
  std::atomic<bool> stop{false};
  std::atomic<int> running{0};
  std::vector<std::atomic<int>> debug_blocks(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      running.fetch_add(1);
      while (!stop.load()) {
        void* p = brisk_malloc(kSize);
        ASSERT_NE(p, nullptr);
        std::memset(p, t + 1, kSize);
        if (brisk_usable_size(p) == kSize) debug_blocks[static_cast<size_t>(t)].fetch_add(1);
        brisk_free(p);
      }
    });
  }
  while (running.load() != kThreads) std::this_thread::yield();
  brisk_debug_enter();
  // The switch is prompt: each thread's next allocation makes a debug block.
  brisk_test::WaitUntilEachCounted(debug_blocks);
  stop.store(true);
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_GT(debug_blocks[static_cast<size_t>(t)].load(), 0) << "thread " << t;
  EXPECT_EQ(brisk_check_heap(), 0);
  brisk_debug_exit();
}

}  // namespace
