// Threads a program starts in its own constructors, allocating while BRISK_DEBUG=1's enter
// (debug/mode.cc's constructor) turns debug mode on. In a static link the program's
// constructors and mode.cc's can run before the one that installs debug/'s hooks, and the
// allocating threads then read the hooks init installs: they must see them through an acquire
// (alloc_refill's debug_mode_on_ordered), and the hooks are installed first of all (constructor
// priority 101). Under ThreadSanitizer (the test command's thread stage, halt_on_error) a
// missing order is a race report. Run with BRISK_DEBUG=1, in a process of its own.
#include <brisk/brisk.h>

#include <gtest/gtest.h>

#include "tests/test_util.h"

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

namespace {

constexpr int kThreads = 3;
constexpr size_t kSize = 40;  // a debug block's usable size is its size; a release block's, 48
std::atomic<bool> g_stop{false};
std::atomic<int> g_debug_blocks[kThreads];
std::vector<std::thread>* g_threads = nullptr;

void allocate_until_stopped(int t) {
  while (!g_stop.load()) {
    void* p = brisk_malloc(kSize);
    if (p == nullptr) continue;
    std::memset(p, t + 1, kSize);
    if (brisk_usable_size(p) == kSize) g_debug_blocks[t].fetch_add(1);
    brisk_free(p);
  }
}

// Started before main, before brisk's constructors of default priority.
struct EarlyThreads {
  EarlyThreads() {
    g_threads = new std::vector<std::thread>;
    for (int t = 0; t < kThreads; ++t) g_threads->emplace_back(allocate_until_stopped, t);
  }
} g_early;

TEST(DebugEarlyThreads, ThreadsStartedInConstructorsMakeSoundDebugBlocksOnceTheModeIsOn) {
  ASSERT_NE(brisk_debug_active(), 0) << "run with BRISK_DEBUG=1";
  brisk_test::WaitUntilEachCounted(g_debug_blocks);
  g_stop.store(true);
  for (std::thread& th : *g_threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_GT(g_debug_blocks[t].load(), 0) << "thread " << t;
  EXPECT_EQ(brisk_check_heap(), 0);
}

}  // namespace
